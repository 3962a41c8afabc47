"""convengine's Triton GPU algorithms against PyTorch's cuDNN on the ResNet-50 layers.

Needs a CUDA GPU and the ``gpu`` extra. First correctness on the hardware (forward,
backward-data, backward-weight in fp32/fp16/bf16 against float64 PyTorch; int8
bit-exact with the CPU ``qconv``), then per layer, interleaved round by round, medians
of CUDA-event times:

- bf16 and fp16 forward: ``ce.conv`` on channels-last (NHWC) tensors vs ``F.conv2d``
  on ``channels_last`` tensors with ``torch.backends.cudnn.benchmark = True``;
- bf16 and fp16 backward (data + weight): ``ce.conv_backward_data`` +
  ``ce.conv_backward_weight`` vs ``aten.convolution_backward``;
- int8 forward: ``ce.qconv`` (uint8 x int8, requantized) vs PyTorch's quantized CUDA
  conv where this build has one (else "n/a"), and vs cuDNN bf16 for scale.

    python bench/bench_gpu.py [--batch 32] [--rounds 20] [--quick] [--json FILE]

``--quick`` takes four layers; a full run is meant to stay under ten minutes (Triton
compiles and autotunes each kernel variant and size bucket on its first call, which
the warm-up rounds absorb).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Fn = Callable[[], Any]


def _time(fns: dict[str, Fn], rounds: int, warmup: int = 3) -> dict[str, float]:
    """Median milliseconds per candidate, the candidates interleaved in every round."""
    import torch

    for _ in range(warmup):
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {k: statistics.median(v) for k, v in times.items()}


def check_correctness() -> list[str]:
    """Failures (empty when every check passes) on small shapes, on the GPU."""
    import torch
    import torch.nn.functional as F

    import convengine as ce

    failures = []
    gen = torch.Generator().manual_seed(0)
    cases = [((2, 32, 15, 13), (48, 32, 3, 3), dict(stride=2, padding=1), 1),
             ((2, 64, 9, 9), (64, 1, 3, 3), dict(padding=1), 64),
             ((1, 16, 6, 7, 5), (32, 16, 3, 3, 3), dict(padding=1, dilation=(1, 2, 1)), 1)]
    for xs, ws, kw, g in cases:
        x64 = torch.randn(xs, generator=gen, dtype=torch.float64)
        w64 = torch.randn(ws, generator=gen, dtype=torch.float64)
        conv = {4: F.conv2d, 5: F.conv3d}[len(xs)]
        y64 = conv(x64, w64, groups=g, **kw)
        dy64 = torch.randn(y64.shape, generator=gen, dtype=torch.float64)
        dx64, dw64 = torch.autograd.grad(
            conv(x64.requires_grad_(), w64.requires_grad_(), groups=g, **kw), (x64, w64), dy64)
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)):
            x, w, dy = (t.detach().to("cuda", dtype) for t in (x64, w64, dy64))
            got = {"forward": ce.conv(x, w, groups=g, **kw),
                   "backward_data": ce.conv_backward_data(dy, w, xs, groups=g, **kw),
                   "backward_weight": ce.conv_backward_weight(x, dy, ws, groups=g, **kw)}
            for (name, t), want in zip(got.items(), (y64, dx64, dw64)):
                err = float((t.double().cpu() - want).abs().max() / want.abs().max())
                if not t.is_cuda or err > tol:
                    failures.append(f"{name} {xs} {ws} {dtype}: error {err:.2e} (> {tol:.0e})"
                                    f"{'' if t.is_cuda else ', not on the GPU'}")
    rng = np.random.default_rng(0)
    for groups in (1, 4):
        xq = rng.integers(0, 256, (2, 32, 14, 14)).astype(np.uint8)
        wq = rng.integers(-128, 128, (64, 32 // groups, 3, 3)).astype(np.int8)
        for mode, bias in (("float", rng.normal(size=64).astype(np.float32)),
                           ("int32", rng.integers(-999, 999, 64).astype(np.int32))):
            args = dict(out_scale=0.3, out_zero_point=5, bias_mode=mode, padding=1,
                        groups=groups, stride=2)
            want = ce.qconv(xq, 0.02, 3, wq, 0.01, 0, bias, **args)
            got = ce.qconv(torch.from_numpy(xq).cuda(), 0.02, 3, torch.from_numpy(wq).cuda(),
                           0.01, 0, bias, **args)
            bad = int((got.cpu().numpy() != want).sum())
            if bad:
                failures.append(f"qconv groups={groups} bias_mode={mode}: {bad} values differ")
    return failures


def _torch_qconv(x: Any, w: Any, layer: Any) -> Fn | None:
    """PyTorch's quantized CUDA conv for this layer, or None where the build has none."""
    import torch

    try:
        qx = torch.quantize_per_tensor(x.float(), 0.02, 0, torch.qint8)
        qw = torch.quantize_per_tensor(w.float(), 0.01, 0, torch.qint8)
        packed = torch.ops.quantized.conv2d_prepack(qw, None, [layer.stride] * 2,
                                                    [layer.padding] * 2, [1, 1], 1)
        fn: Fn = lambda: torch.ops.quantized.conv2d(qx, packed, 0.3, 0)  # noqa: E731
        fn()
        return fn
    except (RuntimeError, NotImplementedError):
        return None


def _float_ratios(layer: Any, dtype: Any, rounds: int) -> tuple[float, float, float, float]:
    """(cuDNN / ce forward, its ms, cuDNN / ce backward (data + weight), its ms)."""
    import torch
    import torch.nn.functional as F

    import convengine as ce

    s, p = layer.stride, layer.padding
    x_cl = torch.randn(layer.x, device="cuda", dtype=dtype).contiguous(
        memory_format=torch.channels_last)
    w_cl = (torch.randn(layer.w, device="cuda", dtype=dtype) * 0.05).contiguous(
        memory_format=torch.channels_last)
    dy_cl = torch.randn_like(F.conv2d(x_cl, w_cl, stride=s, padding=p))
    dy_cl = dy_cl.contiguous(memory_format=torch.channels_last)
    x, w, dy = (t.permute(0, 2, 3, 1) for t in (x_cl, w_cl, dy_cl))  # NHWC views, no copies
    nhwc = dict(stride=s, padding=p, layout="NHWC")
    fwd = _time({"ce": lambda: ce.conv(x, w, **nhwc),
                 "cudnn": lambda: F.conv2d(x_cl, w_cl, stride=s, padding=p)}, rounds)
    bwd = _time({
        "ce": lambda: (ce.conv_backward_data(dy, w, x.shape, **nhwc),
                       ce.conv_backward_weight(x, dy, w.shape, **nhwc)),
        "cudnn": lambda: torch.ops.aten.convolution_backward(
            dy_cl, x_cl, w_cl, None, [s, s], [p, p], [1, 1], False, [0, 0], 1,
            [True, True, False]),
    }, rounds)
    return fwd["cudnn"] / fwd["ce"], fwd["ce"], bwd["cudnn"] / bwd["ce"], bwd["ce"]


def _int8_ratio(layer: Any, rounds: int) -> tuple[float, float | None]:
    """(ce qconv ms, PyTorch quantized CUDA / ce, None where the build has none)."""
    import torch

    import convengine as ce

    n, c, h, wd = layer.x
    o, _, kh, kw = layer.w
    xq = torch.randint(0, 256, (n, h, wd, c), device="cuda", dtype=torch.uint8)
    wq = torch.randint(-128, 128, (o, kh, kw, c), device="cuda", dtype=torch.int8)
    fns: dict[str, Fn] = {"ce": lambda: ce.qconv(
        xq, 0.02, 3, wq, 0.01, 0, None, out_scale=0.3, out_zero_point=5,
        stride=layer.stride, padding=layer.padding, layout="NHWC")}
    tq = _torch_qconv(torch.randn(layer.x, device="cuda"), torch.randn(layer.w, device="cuda"),
                      layer)
    if tq is not None:
        fns["torch_q"] = tq
    t = _time(fns, rounds)
    return t["ce"], (t["torch_q"] / t["ce"] if "torch_q" in t else None)


def bench(batch: int, rounds: int, quick: bool) -> list[dict[str, Any]]:
    import torch

    from convengine.bench.suites import suite

    torch.backends.cudnn.benchmark = True
    layers = suite("resnet50", batch=batch)
    rows = []
    for layer in layers[:4] if quick else layers:
        row: dict[str, Any] = {"layer": layer.name, "count": layer.count}
        for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            (row[f"{tag}_fwd"], row[f"{tag}_fwd_ms"], row[f"{tag}_bwd"],
             row[f"{tag}_bwd_ms"]) = _float_ratios(layer, dtype, rounds)
        row["int8_ms"], row["int8_vs_torch_q"] = _int8_ratio(layer, rounds)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="four layers only")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU here; nothing to measure", file=sys.stderr)
        return 2
    start = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures = check_correctness()
    print("correctness: " + ("all checks pass" if not failures else "; ".join(failures)))
    if failures:
        return 1
    rows = bench(args.batch, args.rounds, args.quick)
    print("\n| layer | bf16 fwd | bf16 bwd | fp16 fwd | fp16 bwd | int8 vs torch quantized |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        q = "n/a" if r["int8_vs_torch_q"] is None else f"{r['int8_vs_torch_q']:.2f}"
        print(f"| {r['layer']} | {r['bf16_fwd']:.2f} | {r['bf16_bwd']:.2f} | {r['fp16_fwd']:.2f} "
              f"| {r['fp16_bwd']:.2f} | {q} |")
    cols = ("bf16_fwd", "bf16_bwd", "fp16_fwd", "fp16_bwd")
    means = {k: _geomean([r[k] for r in rows]) for k in cols}
    print("| geometric mean (x cuDNN, > 1 faster) | "
          + " | ".join(f"{means[k]:.2f}" for k in cols) + " | |")
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
