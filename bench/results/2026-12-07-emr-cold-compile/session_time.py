"""One convengine ONNX session, timed for SECONDS after 3 warm runs (2 threads): median,
min, p10, p90 and the two halves' medians (ms). Lab script.

    python session_time.py MODEL.onnx BATCH SECONDS
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import convengine as ce
from convengine.onnx import Session


def main() -> None:
    path, batch, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ce.set_num_threads(2)
    session = Session(path)
    feed = {session.get_inputs()[0].name:
            np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    for _ in range(3):
        session.run(None, feed)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - t0) * 1e3)
    deciles = statistics.quantiles(times, n=10)
    half = len(times) // 2
    print(f"median {statistics.median(times):.2f} min {min(times):.2f} p10 {deciles[0]:.2f} "
          f"p90 {deciles[-1]:.2f} first-half {statistics.median(times[:half]):.2f} "
          f"second {statistics.median(times[half:]):.2f}")


if __name__ == "__main__":
    main()
