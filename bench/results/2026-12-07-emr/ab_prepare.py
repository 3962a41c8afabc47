"""The bound blocked forward (the API's remembered call, 86bd2ef) against binding on
every call (``blocked_fwd``), interleaved per layer at batch 1."""

import statistics
import time

import numpy as np

import convengine as ce
from convengine import api
from convengine.algorithms.blocked import forward as blocked
from convengine.bench import suites

ce.set_num_threads(2)
ce.set_tuning("off")
rng = np.random.default_rng(0)
speeds = []
for name in ("mobilenet_v2", "resnet50"):
    for layer in suites.suite(name, batch=1):
        if layer.groups != 1:
            continue
        kw = {k: v for k, v in layer.conv_args().items() if k != "layout"}
        x = rng.standard_normal((layer.x[0], *layer.x[2:], layer.x[1])).astype(np.float32)
        w = rng.standard_normal((layer.w[0], *layer.w[2:], layer.w[1])).astype(np.float32)
        ce.conv(x, w, layout="NHWC", algo="blocked", **kw)
        entry = next(e for k, e in api._CALLS.items() if k[1] == x.shape and k[3] == w.shape
                     and e[2].name == "blocked" and e[1].pass_ == "forward")
        problem, bound = entry[1], entry[3]
        fns = {"prepared": lambda b=bound, x=x, w=w: b(x, w),
               "per_call_bind": lambda p=problem, x=x, w=w: blocked.blocked_fwd(p, x, w)}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for r in range(9):
            for k in list(fns) if r % 2 else list(fns)[::-1]:
                start = time.perf_counter()
                for _ in range(20):
                    fns[k]()
                times[k].append((time.perf_counter() - start) / 20)
        each, once = statistics.median(times["per_call_bind"]), statistics.median(times["prepared"])
        speeds.append(each / once)
        print(f"{name:<13} {layer.name:<18} bind each call {each * 1e6:8.1f} us  prepared "
              f"{once * 1e6:8.1f} us  saved {1e6 * (each - once):5.1f} us  x{each / once:.3f}")
print(f"geomean x{statistics.geometric_mean(speeds):.3f}")
