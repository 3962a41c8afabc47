"""Batch-1 1x1 layers: the blocked kernel bound (packed weights held), the same with
the weight cache's comparison of w before it, ``convengine.conv``, and the comparison
alone; medians of 15 alternated rounds of about 10 ms each (microseconds)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

import convengine as ce
from convengine.algorithms.blocked import forward as blocked
from convengine.algorithms.weight_cache import same_bits
from convengine.problem import make_problem

LAYERS = ((160, 960, 7), (960, 160, 7), (96, 576, 14), (512, 2048, 7))


def variants(cin: int, cout: int, hw: int, rng: np.random.Generator
             ) -> dict[str, Callable[[], object]]:
    x = rng.standard_normal((1, hw, hw, cin), dtype=np.float32)
    w = rng.standard_normal((cout, 1, 1, cin), dtype=np.float32)
    w_copy = w.copy()
    p = make_problem("forward", x.shape, w.shape, layout="NHWC", dtype=np.float32)
    nr = blocked.VEC * blocked.panel_vectors(cout)
    bound = blocked.bind_forward(p, blocked.pack_weight(w, 2, nr))
    return {"bound": lambda: bound(x, None, "none"),
            "bound+cmp": lambda: (same_bits(w, w_copy), bound(x, None, "none")),
            "ce.conv": lambda: ce.conv(x, w, layout="NHWC", algo="blocked"),
            "cmp": lambda: same_bits(w, w_copy)}


def main() -> None:
    ce.set_num_threads(2)
    rng = np.random.default_rng(0)
    for cin, cout, hw in LAYERS:
        fns = variants(cin, cout, hw, rng)
        times: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn()
        for r in range(15):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 0.01:
                    fns[name]()
                    n += 1
                times[name].append((time.perf_counter() - t0) / n)
        print(f"{cin}->{cout}@{hw} " + " ".join(
            f"{name}:{statistics.median(v) * 1e6:.1f}" for name, v in times.items()))


if __name__ == "__main__":
    main()
