"""The GPU algorithms per pass, with ``supports()`` reasons and workspace, and their
launches on canonical torch tensors (activations ``(N, D, H, W, C)``, weights
``(O, KD, KH, KW, C // g)``, contiguous, on the device).

``gpu_implicit_gemm`` (tensor cores, groups == 1) and ``gpu_direct`` (any groups,
FMA loops) serve forward, backward-data and backward-weight; block sizes come from
:mod:`.tuning` (``triton.autotune`` on a GPU, one fixed small configuration under
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton

from ..epilogue_codes import GPU, Activation, Epilogue
from ..problem import ConvProblem
from . import kernels, tuning

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
ACTIVATIONS: dict[str | None, Activation] = {
    None: Activation.NONE, **{a.label: a for a in GPU if a != Activation.NONE}}


@dataclass(frozen=True)
class GpuAlgorithm:
    """One GPU algorithm for one pass: ``supports(problem) -> None | reason``,
    ``run(problem, a, b, bias, activation) -> result`` on canonical tensors."""

    name: str
    pass_: str
    supports: Callable[[ConvProblem], str | None]
    run: Callable[..., torch.Tensor]
    workspace_bytes: Callable[[ConvProblem], int] = lambda problem: 0


def _float_only(problem: ConvProblem) -> str | None:
    if problem.dtype not in FLOAT_DTYPES:
        return f"dtype {problem.dtype} (GPU float paths take {', '.join(FLOAT_DTYPES)})"
    return None


def _gemm_supports(problem: ConvProblem) -> str | None:
    if problem.groups != 1:
        return f"groups={problem.groups} (the implicit GEMM takes groups == 1; gpu_direct serves groups)"
    return _float_only(problem)


def three(values: tuple[int, ...], fill: int) -> list[int]:
    """1-D/2-D geometry padded to 3-D with unit dims in front."""
    return [fill] * (3 - len(values)) + list(values)


def geometry(problem: ConvProblem, backward_data: bool) -> list[int]:
    """``S, P, DL, V`` per dim (12 ints) of the kernels' coordinate rule."""
    stride, dil = three(problem.stride, 1), three(problem.dilation, 1)
    pads = three(tuple(lo for lo, _ in problem.padding), 0)
    if backward_data:
        return [1, 1, 1, *pads, *(-d for d in dil), *stride]
    return [*stride, *(-p for p in pads), *dil, 1, 1, 1]


def activation_code(activation: str | None) -> int:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    return int(ACTIVATIONS[activation])


def _tf32() -> bool:
    return bool(torch.backends.cuda.matmul.allow_tf32)


def _dot_f32(t: torch.Tensor) -> bool:
    """Whether the dot runs in float32 (bfloat16 under the interpreter, see .kernels)."""
    return tuning.INTERPRET and t.dtype == torch.bfloat16


def launch_conv(problem: ConvProblem, a: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                *, backward_data: bool, direct: bool, bias: torch.Tensor | None = None,
                act: int = 0, epi: int = Epilogue.FLOAT,
                quant: tuple[Any, ...] | None = None) -> None:
    """Forward (``a`` = x, ``out`` = y) or backward-data (``a`` = dy, ``out`` = dx) on
    canonical tensors, by the implicit GEMM or the direct kernel. ``quant``: the int8
    epilogue's ``(mult, zero-point pairs or per-q zero points, a_zp, out_zp, lo, hi)``."""
    n_, ad, ah, aw, ca = a.shape
    _, pd, ph, pw, q = out.shape
    o, kd, kh, kw, cg = w.shape
    taps = kd * kh * kw
    g = problem.groups
    m = n_ * pd * ph * pw
    if m == 0 or q == 0:
        return
    geo = geometry(problem, backward_data)
    bias_t = out if bias is None else bias
    mult, zps, a_zp, out_zp, lo, hi = quant if quant is not None else (out, out, 0, 0.0, 0.0, 0.0)
    common = dict(HAS_BIAS=bias is not None, ACT=int(act), EPI=int(epi))
    fused = {} if tuning.INTERPRET else {"enable_fp_fusion": False}
    if (backward_data and not direct and epi == Epilogue.FLOAT
            and any(v > 1 for v in problem.stride)):
        _launch_phased(problem, a, w, out, bias_t if bias is not None else None, act)
        return
    if not direct:
        r = ca
        # forward: B[r=c, q=o] = w[o, tap, c]; backward-data: B[r=o, q=c]
        sb_q, sb_r = (taps * cg, 1) if not backward_data else (1, taps * cg)
        kern = tuning.igemm(m, q, r * taps, epi != Epilogue.FLOAT, problem)
        kern(a, w, out, bias_t, mult, zps, m, q, r, ad, ah, aw, pd, ph, pw, kd, kh, kw, *geo,
             sb_q, sb_r, cg, a_zp, out_zp, lo, hi, TF32=_tf32(), DOT_F32=_dot_f32(a), **common,
             **fused)
        return
    if not backward_data:  # y[q=o] sums c = g * cg + r, w[o, tap, r]
        r, qg, sb_q, sb_g, sb_r = cg, o // g, taps * cg, 0, 1
    else:  # dx[q=c] sums o = g * og + r, w[o, tap, c - g * cg]
        og = o // g
        r, qg, sb_q, sb_g, sb_r = og, cg, 1, og * taps * cg - cg, taps * cg
    bm, bn = tuning.direct_blocks(q)
    grid = (triton.cdiv(m, bm), triton.cdiv(q, bn))
    kernels.direct_kernel[grid](
        a, w, out, bias_t, mult, zps, m, q, r, qg, ca, ad, ah, aw, pd, ph, pw, kd, kh, kw,
        *geo, sb_q, sb_g, sb_r, cg, a_zp, out_zp, lo, hi, BLOCK_M=bm, BLOCK_N=bn,
        **common, **fused)


def phase_table(problem: ConvProblem) -> tuple[list[list[int]], int]:
    """Per stride phase (D, H, W phases, D-major) and dim: ``[J, phi, k0, count, base,
    dstep, kstep, stride]`` of dgrad_phased_kernel (J dx positions ``phi + stride * j``,
    reached by taps ``k0 + m * kstep`` from dy index ``j + base - m * dstep``); and the
    most rows (N x J_d x J_h x J_w) of any phase."""
    dims = []
    for s, d, (lo, _), k, x in zip(three(problem.stride, 1), three(problem.dilation, 1),
                                   [(0, 0)] * (3 - problem.ndim) + list(problem.padding),
                                   three(problem.kernel, 1), three(problem.in_size, 1)):
        per_phase = []
        kstep = s // math.gcd(d, s)
        for phi in range(s):
            taps = [t for t in range(k) if (phi + lo - t * d) % s == 0]
            j = max(0, -(-(x - phi) // s))
            if taps:
                k0 = taps[0]
                per_phase.append([j, phi, k0, len(taps), (phi + lo - k0 * d) // s,
                                  kstep * d // s, kstep, s])
            else:
                per_phase.append([j, phi, 0, 0, 0, 0, kstep, s])
        dims.append(per_phase)
    table = [pd + ph + pw for pd in dims[0] for ph in dims[1] for pw in dims[2]]
    most = max(problem.batch * t[0] * t[8] * t[16] for t in table)
    return table, most


@functools.lru_cache(maxsize=256)
def _device_phase_table(problem: ConvProblem, device: torch.device) -> tuple[torch.Tensor, int]:
    """:func:`phase_table` on the device, copied there once per problem."""
    table, most = phase_table(problem)
    return torch.tensor(table, dtype=torch.int32, device=device), most


def _launch_phased(problem: ConvProblem, dy: torch.Tensor, w: torch.Tensor, dx: torch.Tensor,
                   bias: torch.Tensor | None, act: int) -> None:
    """Backward-data at stride > 1 by stride phases (see kernels.dgrad_phased_kernel)."""
    n_, ad, ah, aw, o = dy.shape
    _, xd, xh, xw, c = dx.shape
    _, kd, kh, kw, cg = w.shape
    tab, most = _device_phase_table(problem, dy.device)
    kern = tuning.dgrad_phased(most, tab.shape[0], c, o * kd * kh * kw, problem)
    fused = {} if tuning.INTERPRET else {"enable_fp_fusion": False}
    kern(dy, w, dx, dx if bias is None else bias, tab, n_, c, o, ad, ah, aw, xd, xh, xw,
         kh, kw, 1, kd * kh * kw * cg, cg, HAS_BIAS=bias is not None, ACT=act, TF32=_tf32(),
         DOT_F32=_dot_f32(dy), **fused)


def launch_wgrad(problem: ConvProblem, x: torch.Tensor, dy: torch.Tensor, dw: torch.Tensor,
                 *, direct: bool) -> None:
    """dw ``(O, KD, KH, KW, C // g)`` from canonical x and dy."""
    n_, xd, xh, xw, c = x.shape
    _, pd, ph, pw, o = dy.shape
    _, kd, kh, kw, cg = dw.shape
    p = n_ * pd * ph * pw
    geo = geometry(problem, False)[:9]
    if p == 0:
        dw.zero_()
        return
    if not direct:
        bm, bn, bk = tuning.wgrad_blocks(o, c)
        taps = kd * kh * kw
        split = tuning.wgrad_split(triton.cdiv(o, bm) * triton.cdiv(c, bn) * taps, p, bk)
        out = dw if split == 1 else dw.new_empty((split, *dw.shape), dtype=torch.float32)
        grid = (triton.cdiv(o, bm), triton.cdiv(c, bn), taps * split)
        kernels.wgrad_kernel[grid](x, dy, out, p, o, c, taps, split, xd, xh, xw, pd, ph, pw,
                                   kh, kw, *geo, TF32=_tf32(), DOT_F32=_dot_f32(x),
                                   BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
        if split > 1:  # the partial sums, added in a fixed order
            dw.copy_(out.sum(0))
        return
    bp, bn = tuning.wgrad_direct_blocks(o * cg)
    taps = kd * kh * kw
    grid_direct = (triton.cdiv(o * cg, bn), taps)
    kernels.wgrad_direct_kernel[grid_direct](x, dy, dw, p, o, o // problem.groups, cg, c, taps,
                                             xd, xh, xw, pd, ph, pw, kh, kw, *geo,
                                             BLOCK_P=bp, BLOCK_N=bn)


def wgrad_workspace(problem: ConvProblem) -> int:
    """Bytes of the implicit GEMM's partial dw sums (float32, one dw per run)."""
    o, c, taps = problem.out_channels, problem.in_channels, math.prod(problem.kernel)
    bm, bn, bk = tuning.wgrad_blocks(o, c)
    positions = problem.batch * math.prod(problem.out_size)
    split = tuning.wgrad_split(triton.cdiv(o, bm) * triton.cdiv(c, bn) * taps, positions, bk)
    return 0 if split == 1 else split * o * taps * c * 4


def _run_conv(direct: bool, backward_data: bool) -> Callable[..., torch.Tensor]:
    """The run of the forward pass (x, w -> y) or of backward-data (dy, w -> dx): the
    canonical result ``(N, D, H, W, channels)`` filled by :func:`launch_conv`."""
    def run(problem: ConvProblem, a: torch.Tensor, w: torch.Tensor,
            bias: torch.Tensor | None = None, act: int = 0) -> torch.Tensor:
        size, channels = ((problem.in_size, problem.in_channels) if backward_data
                          else (problem.out_size, problem.out_channels))
        out = a.new_empty((problem.batch, *three(size, 1), channels))
        launch_conv(problem, a, w, out, backward_data=backward_data, direct=direct, bias=bias,
                    act=act)
        return out
    return run


def _run_backward_weight(direct: bool) -> Callable[..., torch.Tensor]:
    def run(problem: ConvProblem, x: torch.Tensor, dy: torch.Tensor,
            bias: torch.Tensor | None = None, act: int = 0) -> torch.Tensor:
        shape = (problem.out_channels, *three(problem.kernel, 1), problem.in_per_group)
        # fp16/bf16 partial sums stay fp32 inside; the result is stored in x's dtype
        dw = x.new_empty(shape)
        launch_wgrad(problem, x, dy, dw, direct=direct)
        return dw
    return run


ALGORITHMS: dict[str, dict[str, GpuAlgorithm]] = {
    "forward": {
        "gpu_implicit_gemm": GpuAlgorithm("gpu_implicit_gemm", "forward", _gemm_supports,
                                          _run_conv(False, backward_data=False)),
        "gpu_direct": GpuAlgorithm("gpu_direct", "forward", _float_only,
                                   _run_conv(True, backward_data=False)),
    },
    "backward_data": {
        "gpu_implicit_gemm": GpuAlgorithm("gpu_implicit_gemm", "backward_data", _gemm_supports,
                                          _run_conv(False, backward_data=True)),
        "gpu_direct": GpuAlgorithm("gpu_direct", "backward_data", _float_only,
                                   _run_conv(True, backward_data=True)),
    },
    "backward_weight": {
        "gpu_implicit_gemm": GpuAlgorithm("gpu_implicit_gemm", "backward_weight",
                                          _gemm_supports, _run_backward_weight(False),
                                          wgrad_workspace),
        "gpu_direct": GpuAlgorithm("gpu_direct", "backward_weight", _float_only,
                                   _run_backward_weight(True)),
    },
}
