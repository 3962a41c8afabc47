import sys, time, json, os
import numpy as np, convengine as ce
ce.set_num_threads(2)
ce.config.set(tuning="cache-only")
from convengine.bench import suites
rng = np.random.default_rng(0)
out = {}
for name in sys.argv[1].split(","):
    calls = []
    for layer in suites.suite(name, batch=int(sys.argv[2])):
        x = rng.standard_normal(layer.x, dtype=np.float32); w = rng.standard_normal(layer.w, dtype=np.float32)
        calls.append((x, w, layer.conv_args()))
    for x, w, kw in calls: ce.conv(x, w, **kw); ce.conv(x, w, **kw)
    ts = []
    for r in range(7):
        t = time.perf_counter()
        for x, w, kw in calls: ce.conv(x, w, **kw)
        ts.append(time.perf_counter() - t)
    out[name] = round(1e3 * float(np.median(ts)), 2)
print(json.dumps({"cpu": os.environ.get("NUMBA_CPU_NAME"), **out}))
