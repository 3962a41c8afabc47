"""Fail when a module uses a private name (``_x``) owned by a package it is not in.

A private name belongs to the package that holds it: ``convengine._host`` to
``convengine`` (every module of convengine may use it), ``convengine.algorithms._fma``
and ``convengine.algorithms.blocked._as2d`` to ``convengine.algorithms`` (not to
``convengine.quant``). Checked for every import,
lazy ones included, and for attribute access on an imported convengine module
(``api._run``). Usage: ``python .ci/check_private_imports.py src/convengine``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def owner_of_private(dotted: str, root: Path) -> str | None:
    """The package owning the first private segment of ``dotted`` (None: no such): the
    package it is in, or for a private name inside a module, that module's package."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            holder = parts[:i]
            if not root.parent.joinpath(*holder).is_dir():  # a module: its package owns it
                holder = holder[:-1]
            return ".".join(holder)
    return None


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def check(root: Path) -> list[str]:
    problems = []
    top = root.name
    for path in sorted(root.rglob("*.py")):
        module, is_package = module_name(path, root)
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}  # local name -> imported convengine module
        targets: list[tuple[int, str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == top:
                        targets.append((node.lineno, a.name))
                        aliases[a.asname or a.name.split(".")[0]] = a.asname and a.name or top
            elif isinstance(node, ast.ImportFrom):
                base = absolute(module, is_package, node.level, node.module)
                if base.split(".")[0] != top:
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append((node.lineno, full))
                    aliases[a.asname or a.name] = full
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                targets.append((node.lineno, f"{aliases[node.value.id]}.{node.attr}"))
        for line, dotted in targets:
            owner = owner_of_private(dotted, root)
            if owner is not None and not inside(module, owner):
                problems.append(f"{path}:{line}: {module} uses {dotted}, private to {owner}")
    return problems


if __name__ == "__main__":
    found = check(Path(sys.argv[1] if len(sys.argv) > 1 else "src/convengine"))
    print("\n".join(found) or "no cross-package private names")
    sys.exit(1 if found else 0)
