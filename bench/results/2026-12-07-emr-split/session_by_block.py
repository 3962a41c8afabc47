"""One fresh process: an ONNX session's steady time (median over 6 s of runs) with the
blocked kernels' ``by_block`` default (``off``) or set by the rule "packed weights over
RATIO times x's bytes, more than one block, weights not read whole per tile" (``rule``).

    python session_by_block.py off|rule MODEL.onnx BATCH [RATIO]
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any

import numpy as np

import convengine as ce
from convengine.algorithms.blocked import forward as blocked


def main() -> None:
    mode, path, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ratio = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    ce.set_num_threads(2)
    original, picked = blocked._binding, []

    def binding(problem: Any, nr: int, walk: Any, weight_bytes: int, bias: Any,
                params: Any) -> Any:
        blocks = -(-problem.out_channels // nr)
        x_bytes = 4 * math.prod(problem.x_shape("NHWC"))
        if (mode == "rule" and weight_bytes > blocked.BLOCKS_INSIDE_BYTES and blocks >= 2
                and weight_bytes > ratio * x_bytes):
            params = dict(params or {}, by_block=1)
            picked.append(problem)
        return original(problem, nr, walk, weight_bytes, bias, params)

    blocked._binding = binding
    from convengine.onnx import Session

    session = Session(path)
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    feed = {session.get_inputs()[0].name: x}
    for _ in range(10):
        session.run(None, feed)
    times, end = [], time.perf_counter() + 6
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t0)
    print(f"{mode} {path.rsplit('/', 1)[-1]} b{batch} picked {len(picked)} "
          f"median {statistics.median(times) * 1e3:.2f} ms n {len(times)}")


if __name__ == "__main__":
    main()
