"""Side-by-side int8 conv benchmark: convengine.qconv against PyTorch's quantized conv.

Candidates, run interleaved (A B C D A B C D ...) for ``--rounds`` rounds, median kept:

- ``ours``: ``convengine.qconv`` (channels-last uint8 input, per-channel int8 weights,
  float bias, fused ReLU, uint8 output; weights prepacked on the first call and cached);
- ``fbgemm``, ``x86``, ``onednn``: ``torch.ops.quantized.conv2d_relu`` with weights
  prepacked per engine, channels-last input.

Symmetric weights (zero points 0), the usual deployment, so x86 runs oneDNN. Input zero
point 120 (``--x-zero-point 0`` for a ReLU's output, the usual input inside a network,
where oneDNN skips its zero-point compensation and runs faster). Threads
fixed to ``--threads`` on both sides; nothing else is set: PyTorch runs in its default
configuration (convengine's own pool waits passively, see ``convengine.threads``).
GOPS = 2 * multiply-adds / time; ``% peak``: ours as a share of the host's measured
int8 peak on the same threads (a ``vpdpbusd`` loop, :mod:`convengine.peak`: measured
once per CPU and cached; not measured without AVX-512 VNNI, then ``-``). Ratios are
``torch / ours`` time (above 1: convengine faster); geometric means per group:
ResNet-50 (dense), MobileNetV2 dense and MobileNetV2 depthwise. Targets (issue 5):
dense >= 1.0x fbgemm; depthwise >= 1.0x the best PyTorch engine.

    python bench/bench_int8.py --suite resnet50,mobilenet_v2 --batch 4 --rounds 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
import warnings
from typing import Any

import numpy as np

import convengine as ce
from convengine import peak
from convengine.bench import suites
from convengine.quant import int8_path

ENGINES = ("fbgemm", "x86", "onednn")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        sys.exit("bench_int8 needs PyTorch: pip install 'convengine[torch]'")
    return torch


def _setup(layer: suites.Layer, rng: np.random.Generator, torch: Any,
           xzp: int = 120) -> dict[str, Any]:
    """Operands and one zero-argument callable per candidate (input zero point ``xzp``)."""
    n, c, h, w_ = layer.x
    o = layer.w[0]
    x = rng.integers(0, 256, layer.x).astype(np.uint8)
    w = rng.integers(-127, 128, layer.w).astype(np.int8)
    ws = rng.uniform(1e-3, 1e-2, o)
    bias = rng.normal(0, 1, o).astype(np.float32)
    xs, ys, yzp = 0.02, 0.1, 10
    x_nhwc = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    w_nhwc = np.ascontiguousarray(np.moveaxis(w, 1, -1))
    geo = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation,
               groups=layer.groups)

    def ours() -> Any:
        return ce.qconv(x_nhwc, xs, xzp, w_nhwc, ws, 0, bias, out_scale=ys, out_zero_point=yzp,
                        relu=True, layout="NHWC", **geo)

    cands = {"ours": ours}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), xs, xzp)
        tx = tx.contiguous(memory_format=torch.channels_last)
        tw = torch._make_per_channel_quantized_tensor(
            torch.from_numpy(w), torch.from_numpy(ws), torch.zeros(o, dtype=torch.int64), 0)
    pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
    for engine in ENGINES:
        torch.backends.quantized.engine = engine
        packed = torch.ops.quantized.conv2d_prepack(
            tw, torch.from_numpy(bias), pair(layer.stride), pair(layer.padding),
            pair(layer.dilation), layer.groups)

        def run(packed: Any = packed, engine: str = engine) -> Any:
            torch.backends.quantized.engine = engine
            return torch.ops.quantized.conv2d_relu(tx, packed, ys, yzp)

        cands[engine] = run
    return cands


def _time(fn: Any, min_s: float) -> float:
    """Seconds per call: repeat until min_s has passed, at least once."""
    reps, t0 = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            return elapsed / reps


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="resnet50,mobilenet_v2")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.02, help="seconds per timing")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", default="", help="comma-separated layer-name filter")
    ap.add_argument("--x-zero-point", type=int, default=120,
                    help="input zero point (0: a ReLU's output, as inside a quantized "
                         "network, where oneDNN skips its zero-point compensation)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch = _torch()
    torch.set_num_threads(args.threads)
    import numba

    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows = []
    measured = peak.peak(args.threads)
    print(f"int8 path: {int8_path()}, threads {args.threads}, batch {args.batch}, "
          f"x zero point {args.x_zero_point}, torch {torch.__version__}")
    print(f"measured peak on {args.threads} threads: int8 "
          + (f"{measured.int8_gops:.0f} GOPS" if measured.int8_gops else f"- ({measured.note})")
          + f", float32 {measured.fp32_gflops:.0f} GFLOP/s")
    head = (f"{'layer':34s} {'GOPS ours':>9s} {'% peak':>6s} "
            + " ".join(f"{e:>7s}" for e in ENGINES))
    print(head + "   ratio vs " + "/".join(ENGINES))
    for name in args.suite.split(","):
        for layer in suites.suite(name, batch=args.batch):
            if args.layers and not any(f in layer.name for f in args.layers.split(",")):
                continue
            if layer.x[1] < 4:  # the 3-channel stem: not an int8 layer in practice
                continue
            problem = layer.problem(dtype="uint8")
            cands = _setup(layer, rng, torch, args.x_zero_point)
            ref = cands["fbgemm"]().int_repr().numpy()
            got = np.moveaxis(cands["ours"](), -1, 1)
            depthwise = problem.is_depthwise
            if not depthwise:  # fbgemm's depthwise may saturate; dense must agree exactly
                assert np.array_equal(got, ref), f"{layer.name}: ours != fbgemm"
            times: dict[str, list[float]] = {k: [] for k in cands}
            for _ in range(args.rounds):
                for key, fn in cands.items():
                    times[key].append(_time(fn, args.min_time))
            med = {k: statistics.median(v) for k, v in times.items()}
            gops = {k: problem.flops / t / 1e9 for k, t in med.items()}
            ratio = {e: med[e] / med["ours"] for e in ENGINES}
            group = (f"{name} depthwise" if depthwise else f"{name} dense")
            fraction = gops["ours"] / measured.int8_gops if measured.int8_gops else None
            rows.append(dict(layer=layer.name, suite=name, group=group, gops=gops, ratio=ratio,
                             best_torch=min(med[e] for e in ENGINES) / med["ours"],
                             peak_fraction=fraction))
            shown = "-" if fraction is None else f"{100 * fraction:.1f}"
            print(f"{name[:8]}:{layer.name:25s} {gops['ours']:9.0f} {shown:>6s} "
                  + " ".join(f"{gops[e]:7.0f}" for e in ENGINES) + "   "
                  + " ".join(f"{ratio[e]:5.2f}x" for e in ENGINES), flush=True)
    print("\ngeometric means of torch time / ours time:")
    for group in dict.fromkeys(r["group"] for r in rows):
        sel = [r for r in rows if r["group"] == group]
        parts = " ".join(f"{e} {geomean([r['ratio'][e] for r in sel]):.2f}x" for e in ENGINES)
        best = geomean([r["best_torch"] for r in sel])
        print(f"  {group:26s} ({len(sel):2d} layers): {parts}  best-torch {best:.2f}x")
    dense = [r for r in rows if r["group"].endswith("dense")]
    dw = [r for r in rows if r["group"].endswith("depthwise")]
    if dense:
        g = geomean([r["ratio"]["fbgemm"] for r in dense])
        print(f"target dense >= 1.0x fbgemm: {g:.2f}x -> {'met' if g >= 1 else 'missed'}")
    if dw:
        g = geomean([r["best_torch"] for r in dw])
        print(f"target depthwise >= 1.0x best torch: {g:.2f}x -> {'met' if g >= 1 else 'missed'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(args=vars(args), path=int8_path(), peak=dataclasses.asdict(measured),
                           rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
