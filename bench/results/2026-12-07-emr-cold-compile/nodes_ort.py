"""ONNX Runtime (session defaults: its threads spin) with its profiler, 300 passes:
per-node kernel-time medians (us) to OUT.json. Lab script.

    python nodes_ort.py MODEL.onnx BATCH OUT.json
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort


def main() -> None:
    path, batch, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.enable_profiling = True
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name:
            np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    for _ in range(20):
        session.run(None, feed)
    whole = []
    for _ in range(300):
        t0 = time.perf_counter()
        session.run(None, feed)
        whole.append(time.perf_counter() - t0)
    profile = session.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    times: dict[str, list[float]] = collections.defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            times[event["name"][:-len("_kernel_time")]].append(event["dur"])
    medians = {k: statistics.median(v[-300:]) for k, v in times.items()}
    print(f"whole {statistics.median(whole) * 1e3:.2f} ms, node sum "
          f"{sum(medians.values()) / 1e3:.2f} ms")
    with open(out, "w") as f:
        json.dump(medians, f)


if __name__ == "__main__":
    main()
