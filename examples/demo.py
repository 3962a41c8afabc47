"""The main job's demo: convolve, explain the choice, check against the reference.

Runs a few layers of different kinds through convengine (auto-selected algorithm),
prints what was chosen and why, and the error against the float64 reference.
Exits non-zero if any result is off.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import convengine as ce

LAYERS = {
    "resnet 3x3 (NHWC)": ((8, 28, 28, 128), (128, 3, 3, 128), dict(padding=1, layout="NHWC")),
    "resnet 1x1 (NHWC)": ((8, 28, 28, 256), (64, 1, 1, 256), dict(layout="NHWC")),
    "stem 7x7/2 (NCHW)": ((2, 3, 112, 112), (64, 3, 7, 7), dict(stride=2, padding=3)),
    "depthwise 3x3 (NHWC)": ((8, 28, 28, 96), (96, 3, 3, 1), dict(padding=1, groups=96, layout="NHWC")),
    "conv1d dilated": ((4, 64, 400), (64, 64, 3), dict(dilation=4, padding="same")),
    "conv3d": ((1, 16, 16, 16, 16), (16, 16, 3, 3, 3), dict(padding=1)),
}


def main() -> int:
    rng = np.random.default_rng(0)
    worst = 0.0
    print(f"convengine {ce.__version__}")
    for name, (x_shape, w_shape, kw) in LAYERS.items():
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
        ce.conv(x, w, **kw)  # first call: compiles kernels and, if tuning is on, tunes
        explanation = ce.explain(x, w, **kw)
        start = time.perf_counter()
        y = ce.conv(x, w, **kw)
        seconds = time.perf_counter() - start
        expected = ce.conv(x.astype(np.float64), w.astype(np.float64), **kw, algo="reference")
        error = float(np.abs(y - expected).max() / np.abs(expected).max())
        worst = max(worst, error)
        gflops = explanation.problem.flops / seconds / 1e9
        print(f"\n== {name}: y{y.shape} by {explanation.chosen!r} in {seconds * 1e3:.1f} ms "
              f"({gflops:.1f} GFLOP/s, second call); "
              f"max rel. error vs float64 {error:.2e}")
        print(explanation)
    ok = worst < 1e-4
    print(f"\nworst relative error {worst:.2e}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
