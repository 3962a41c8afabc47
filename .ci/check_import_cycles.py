"""Fail on any import cycle between convengine's modules, lazy imports included.

The layers contract (``lint-imports``) orders the top-level modules and packages;
this checks every module, inside packages too. Usage:
``python .ci/check_import_cycles.py convengine``.
"""

from __future__ import annotations

import sys

import grimp


def cycles(package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph = grimp.build_graph(package)
    # a package's __init__ re-exporting its modules is the package, not a cycle
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m)
                 if not m.startswith(t + ".")}
             for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:  # iterative: deep import chains
        nonlocal counter
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


if __name__ == "__main__":
    found = cycles(sys.argv[1] if len(sys.argv) > 1 else "convengine")
    for component in found:
        print("import cycle:", " <-> ".join(component))
    print(f"{len(found)} import cycles")
    sys.exit(1 if found else 0)
