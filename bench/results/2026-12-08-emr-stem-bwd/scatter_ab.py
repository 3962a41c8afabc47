"""``narrow.scatter`` as committed against one variant of it, both compiled here from
its source and timed interleaved in this process (25 rounds, medians), on the two
stems' backward-data at batch 8 and 1. Lab script.

    python scatter_ab.py add_run     # the masked-vector run adds against a scalar loop
    python scatter_ab.py order       # pixels outer (as committed) against runs outer
"""

from __future__ import annotations

import inspect
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

import convengine as ce
from convengine.algorithms.blocked import narrow

ADD = "add_run(dxf, d0, tile, s0, (hi - lo) * c_)"
SCALAR = ("for e in range((hi - lo) * c_):\n"
          "                                        dxf[d0 + e] += tile[s0 + e]")


def runs_outer(src: str) -> str:
    """The kernel with its loops over a tile's pixels and its runs swapped."""
    start = src.index("                        for r in range(mr):")
    stop = src.index("    if CHECKED and bad[0]:")
    lines = src[start:stop].splitlines()
    body = [lines[1][4:], "    " + lines[0], *lines[2:]]
    return src[:start] + "\n".join(body) + "\n" + src[stop:]


def variants(which: str) -> dict[str, Callable[..., Any]]:
    src = textwrap.dedent(inspect.getsource(narrow.scatter.py_func))
    src = src[src.index("def scatter"):]
    other = ({"scalar loop": src.replace(ADD, SCALAR)} if which == "add_run"
             else {"runs outer": runs_outer(src)})
    compiled = {}
    for name, code in {"committed": src, **other}.items():
        namespace = dict(narrow.__dict__)
        exec(code, namespace)  # noqa: S102 - the module's own source, one line changed
        compiled[name] = numba.njit(parallel=True, nogil=True)(namespace["scatter"])
    return compiled


def case(fns: dict[str, Callable[..., Any]], n: int, o: int, k: int, pad: int) -> None:
    c, h, s = 3, 224, 2
    oh = (h + 2 * pad - k) // s + 1
    rng = np.random.default_rng(0)
    dy = rng.standard_normal((n, oh, oh, o), dtype=np.float32)
    w = rng.standard_normal((o, k, k, c), dtype=np.float32)
    packed, runs, starts = narrow.pack(w, 1)
    geometry = np.array([s, s, pad, pad, 1, 1], np.int64)
    band = narrow.band_rows(k, s, 1)
    outs = []
    for f in fns.values():
        dx = np.zeros((n, h, h, c), np.float32)
        f(dy, packed, runs, starts, dx, geometry, band)
        outs.append(dx)
    assert all(np.allclose(outs[0], other, rtol=1e-5, atol=1e-4) for other in outs[1:])
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(25):
        for name, f in fns.items():
            dx = np.zeros((n, h, h, c), np.float32)
            t = time.perf_counter()
            f(dy, packed, runs, starts, dx, geometry, band)
            times[name].append(time.perf_counter() - t)
    flops = 2 * n * oh * oh * o * k * k * c
    cells = [f"{name} {statistics.median(v) * 1e3:.2f} ms "
             f"({flops / statistics.median(v) / 1e9:.0f} GFLOP/s)" for name, v in times.items()]
    print(f"batch {n} {k}x{k}/2 O={o}: " + ", ".join(cells))


def main() -> None:
    ce.set_num_threads(2)
    fns = variants(sys.argv[1])
    for n, o, k, pad in [(8, 64, 7, 3), (1, 64, 7, 3), (8, 32, 3, 1), (1, 32, 3, 1)]:
        case(fns, n, o, k, pad)


if __name__ == "__main__":
    main()
