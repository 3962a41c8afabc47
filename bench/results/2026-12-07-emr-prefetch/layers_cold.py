"""blocked's forward on one layer shape with N distinct weights called in turn (each
call's weights cold, as in a network) and with one weight called N times (hot), for
the ``ahead`` values given; medians per call (us). Lab figures.

    python layers_cold.py 8,0
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import convengine as ce
from convengine.algorithms.blocked import forward as blocked
from convengine.problem import make_problem

N = 12
LAYERS = ((2048, 1000, 1, 1), (1280, 1000, 1, 1), (2048, 512, 7, 1), (512, 512, 7, 3),
          (256, 64, 56, 1), (960, 160, 7, 1))


def main() -> None:
    aheads = [int(v) for v in sys.argv[1].split(",")]
    ce.set_num_threads(2)
    for cin, cout, hw, k in LAYERS:
        rng = np.random.default_rng(0)
        x = np.abs(rng.standard_normal((1, hw, hw, cin))).astype(np.float32)
        ws = [(rng.standard_normal((cout, k, k, cin)) / np.sqrt(cin * k * k)).astype(np.float32)
              for _ in range(N)]
        p = make_problem("forward", x.shape, ws[0].shape, layout="NHWC", dtype=np.float32,
                         padding=k // 2)
        nr = blocked.VEC * blocked.panel_vectors(cout)
        packed = [blocked.pack_weight(w, 2, nr) for w in ws]
        line = []
        for ahead in aheads:
            fs = [blocked.bind_forward(p, wp, params={"ahead": ahead}) for wp in packed]
            for name, calls in (("cold", fs), ("hot", [fs[0]] * N)):
                for f in calls:
                    f(x, None, "none")
                ts = []
                for _ in range(15):
                    t0 = time.perf_counter()
                    for f in calls:
                        f(x, None, "none")
                    ts.append((time.perf_counter() - t0) / N)
                line.append(f"ahead={ahead} {name} {statistics.median(ts) * 1e6:.0f}")
        print(f"{cin}->{cout}@{hw} k{k}: " + ", ".join(line), flush=True)


if __name__ == "__main__":
    main()
