"""Per node in one process: ONNX Runtime's profiler (its intra-op threads not spinning,
so that they take no core from ours) and convengine's session steps timed one by one,
in alternated blocks of 5 runs; writes {"ours": {node: us}, "ort": {node: us}} medians.

    python nodes_vs_ort.py MODEL.onnx BATCH ROUNDS OUT.json
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

import convengine as ce
from convengine.onnx import Session


def main() -> None:
    path, batch, rounds, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ce.set_num_threads(2)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    peer = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    ours = Session(path)
    name = ours.get_inputs()[0].name
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    for _ in range(10):
        peer.run(None, {name: x})
        ours.run(None, {name: x})
    steps: dict[str, list[float]] = collections.defaultdict(list)
    totals: dict[str, list[float]] = {"ort": [], "ours": []}
    for _ in range(rounds):
        for _ in range(5):
            t0 = time.perf_counter()
            peer.run(None, {name: x})
            totals["ort"].append(time.perf_counter() - t0)
        for _ in range(5):
            t0 = time.perf_counter()
            env = ours._feeds({name: x})
            for run, sources, outputs, frees, node in ours._steps:
                t1 = time.perf_counter()
                values = run([env.get(n, c) for n, c in sources])
                steps[node.name].append(time.perf_counter() - t1)
                for i, value_name in outputs:
                    if i < len(values):
                        env[value_name] = values[i]
                for value_name in frees:
                    env.pop(value_name, None)
            totals["ours"].append(time.perf_counter() - t0)
    with open(peer.end_profiling()) as f:
        events = json.load(f)
    kernels: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            kernels[e["name"][:-len("_kernel_time")]].append(e["dur"] * 1e-6)
    medians = {"ours": {k: statistics.median(v) * 1e6 for k, v in steps.items()},
               "ort": {k: statistics.median(v[10:]) * 1e6 for k, v in kernels.items()}}
    with open(out, "w") as f:
        json.dump(medians, f, indent=0)
    print(f"whole runs ms: ONNX Runtime {statistics.median(totals['ort']) * 1e3:.2f}, "
          f"ours (steps timed) {statistics.median(totals['ours']) * 1e3:.2f}; node sums us: "
          f"{sum(medians['ort'].values()):.0f} and {sum(medians['ours'].values()):.0f}")


if __name__ == "__main__":
    main()
