"""Two ONNX sessions of one model in one process, alternated: A with convengine's
defaults, B with ``ahead=0`` (no weight prefetch) in blocked (``b``) and/or Winograd
(``w``), or with blocked's ``chunk`` at its tunable value (``c``); medians (ms).

    python session_ab.py MODEL.onnx BATCH SECONDS b|w|wb|c
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np

import convengine as ce
from convengine.algorithms.blocked import forward as blocked
from convengine.algorithms.winograd import kernels as winograd
from convengine.onnx import Session


def main() -> None:
    path, batch, seconds, which = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    ce.set_num_threads(2)
    mode = ["A"]
    winograd_fwd, binding = winograd.winograd_fwd, blocked._binding

    def winograd_b(problem: Any, x: Any, up: Any, m: int, params: Any = None) -> Any:
        if mode[0] == "B" and "w" in which:
            params = dict(params or {}, ahead=0)
        return winograd_fwd(problem, x, up, m, params)

    def binding_b(problem: Any, nr: int, walk: Any, weight_bytes: int, bias: Any,
                  params: Any) -> Any:
        extra: dict[str, int] = {}
        if "b" in which:
            extra["ahead"] = 0
        if "c" in which:
            extra["chunk"] = blocked.reduction_chunk(problem, nr)
        return binding(problem, nr, walk, weight_bytes, bias, dict(params or {}, **extra))

    winograd.winograd_fwd = winograd_b
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    a = Session(path)
    feed = {a.get_inputs()[0].name: x}
    ya = a.run(None, feed)[0]
    blocked._binding = binding_b
    mode[0] = "B"
    b = Session(path)
    yb = b.run(None, feed)[0]
    blocked._binding = binding
    print("largest difference", float(np.abs(ya - yb).max()), "of", float(np.abs(ya).max()))
    times: dict[str, list[float]] = {"A": [], "B": []}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for session, name in ((a, "A"), (b, "B")):
            mode[0] = name
            for _ in range(3):
                t0 = time.perf_counter()
                session.run(None, feed)
                times[name].append(time.perf_counter() - t0)
    ma, mb = (statistics.median(times[k]) for k in "AB")
    print(f"{path.rsplit('/', 1)[-1]} batch {batch} B={which}: A {ma * 1e3:.2f} ms, "
          f"B {mb * 1e3:.2f} ms, B / A {mb / ma:.3f} (n {len(times['A'])})")


if __name__ == "__main__":
    main()
