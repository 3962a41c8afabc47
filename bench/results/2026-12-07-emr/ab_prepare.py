import time, statistics, numpy as np, convengine as ce
from convengine import api
from convengine.algorithms.blocked import forward as bf
from convengine.bench import suites
ce.set_num_threads(2); ce.set_tuning("off")
rng = np.random.default_rng(0)
res = []
for name in ("mobilenet_v2", "resnet50"):
    for L in suites.suite(name, batch=1):
        if L.groups != 1: continue
        kw = {k: v for k, v in L.conv_args().items() if k != "layout"}
        x = rng.standard_normal((L.x[0], *L.x[2:], L.x[1])).astype(np.float32)
        w = rng.standard_normal((L.w[0], *L.w[2:], L.w[1])).astype(np.float32)
        ce.conv(x, w, layout="NHWC", algo="blocked", **kw)
        (entry,) = [e for k, e in api._CALLS.items() if k[1] == x.shape and k[3] == w.shape and e[2].name == "blocked" and e[1].pass_ == "forward"][:1]
        problem, bound = entry[1], entry[3]
        f = {"prepared": lambda: bound(x, w), "per_call_bind": lambda: bf.blocked_fwd(problem, x, w)}
        for g in f.values(): g()
        t = {k: [] for k in f}
        for r in range(9):
            for k in (list(f) if r % 2 else list(f)[::-1]):
                s = time.perf_counter()
                for _ in range(20): f[k]()
                t[k].append((time.perf_counter() - s) / 20)
        a, b = statistics.median(t["per_call_bind"]), statistics.median(t["prepared"])
        res.append(a / b)
        print(f"{name:<13} {L.name:<18} bind each call {a*1e6:8.1f} us  prepared {b*1e6:8.1f} us  saved {1e6*(a-b):5.1f} us  x{a/b:.3f}", flush=True)
print("geomean x%.3f" % statistics.geometric_mean(res))
