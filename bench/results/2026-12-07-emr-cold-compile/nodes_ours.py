"""convengine's session steps timed one by one over RUNS passes (2 threads): per-node
medians (us) to OUT.json. Lab script.

    python nodes_ours.py MODEL.onnx BATCH RUNS OUT.json
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import time

import numpy as np

import convengine as ce
from convengine.onnx import Session


def main() -> None:
    path, batch, runs, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ce.set_num_threads(2)
    session = Session(path)
    name = session.get_inputs()[0].name
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    for _ in range(5):
        session.run(None, {name: x})
    times: dict[str, list[float]] = collections.defaultdict(list)
    whole = []
    for _ in range(runs):
        env = {name: x}
        start = time.perf_counter()
        for run, sources, outputs, frees, node in session._steps:
            t0 = time.perf_counter()
            values = run([env.get(n, const) for n, const in sources])
            times[node.name].append(time.perf_counter() - t0)
            for i, tensor in outputs:
                if i < len(values):
                    env[tensor] = values[i]
            for tensor in frees:
                env.pop(tensor, None)
        whole.append(time.perf_counter() - start)
    medians = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    print(f"ours whole {statistics.median(whole) * 1e3:.2f} ms, node sum "
          f"{sum(medians.values()) / 1e3:.2f} ms")
    with open(out, "w") as f:
        json.dump(medians, f)


if __name__ == "__main__":
    main()
