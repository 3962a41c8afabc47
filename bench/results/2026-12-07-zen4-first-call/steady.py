"""Steady-state time of every conv of the suites in argv[1] (batch argv[2]): median of
7 passes after 2, tuning cache-only; prints the LLVM CPU compiled for and the medians
in ms. Run once natively and once with CONVENGINE_TARGET=x86-64-v4-vnni, alternating."""

import json
import os
import sys
import time

import numpy as np

import convengine as ce
from convengine.bench import suites

ce.set_num_threads(2)
ce.config.set(tuning="cache-only")
rng = np.random.default_rng(0)
out = {}
for name in sys.argv[1].split(","):
    calls = []
    for layer in suites.suite(name, batch=int(sys.argv[2])):
        x = rng.standard_normal(layer.x, dtype=np.float32)
        w = rng.standard_normal(layer.w, dtype=np.float32)
        calls.append((x, w, layer.conv_args()))
    for _ in range(2):
        for x, w, kw in calls:
            ce.conv(x, w, **kw)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for x, w, kw in calls:
            ce.conv(x, w, **kw)
        times.append(time.perf_counter() - start)
    out[name] = round(1e3 * float(np.median(times)), 2)
print(json.dumps({"cpu": os.environ.get("NUMBA_CPU_NAME"), **out}))
