"""One ONNX Runtime session (session defaults, 2 intra-op threads), timed for SECONDS
after 5 warm runs: median (ms). Lab script.

    python ort_session_time.py MODEL.onnx BATCH SECONDS
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import onnxruntime as ort


def main() -> None:
    path, batch, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name:
            np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    for _ in range(5):
        session.run(None, feed)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"ort {statistics.median(times):.2f} ms n={len(times)}")


if __name__ == "__main__":
    main()
