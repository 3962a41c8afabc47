"""Error of each forward algorithm against the float64 reference on real layers.

For every ResNet-50 3x3 stride-1 layer (batch 1, float32 operands drawn N(0, 1) for
x and He-scaled for w), prints max |y - y64| / max |y64| and the RMS relative error
of winograd (F(2x2,3x3)), winograd4 (F(4x4,3x3)), direct and PyTorch if installed.
Measured 2026-11-29 23:31 UTC (fused kernel, GEMM partial sums of 128 channels): max
2.9e-7..4.6e-7 (F2) and 4.5e-6..8.8e-6 (F4), against 2.5e-7..3.3e-7 for PyTorch.

    python bench/winograd_error.py
"""

from __future__ import annotations

import math

import numpy as np

import convengine as ce
from convengine.bench import suites

ALGOS = ("winograd", "winograd4", "direct")


def errors(y: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    diff = y.astype(np.float64) - ref
    return (float(np.abs(diff).max() / np.abs(ref).max()),
            float(np.sqrt(np.mean(diff**2) / np.mean(ref**2))))


def main() -> int:
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    names = [*ALGOS, *(("torch",) if torch else ())]
    print(f"{'layer':<12}" + "".join(f"{n:>22}" for n in names))
    print(f"{'':<12}" + "".join(f"{'max':>11}{'rms':>11}" for _ in names))
    for layer in suites.suite("resnet50", batch=1):
        if layer.w[2:] != (3, 3) or layer.stride != 1:
            continue
        x = rng.standard_normal(layer.x, dtype=np.float32)
        w = (rng.standard_normal(layer.w) * math.sqrt(2 / math.prod(layer.w[1:]))).astype(
            np.float32)
        args = {k: v for k, v in layer.conv_args().items() if k != "layout"}
        ref = ce.conv(x.astype(np.float64), w.astype(np.float64), algo="reference", **args)
        row = [errors(ce.conv(x, w, algo=a, **args), ref) for a in ALGOS]
        if torch:
            y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                           padding=args["padding"]).numpy()
            row.append(errors(y, ref))
        print(f"{layer.name:<12}" + "".join(f"{m:>11.1e}{r:>11.1e}" for m, r in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
