"""``blocked``: direct convolution with a register-blocked AVX-512 micro-kernel (fp32).

The conv with the fewest moving parts that still runs near the FMA peak: x is
zero-padded once (channels-last), the weights are packed as ``(O / NR, *K, C, NR)``,
and a micro-kernel computes ``MR`` adjacent output pixels of one row times ``NR``
output channels with every accumulator in a zmm register, walking the reduction
(kernel rows x kernel columns x input channels) straight through the padded input:
no column matrix, no transforms. It suits layers whose reduction is short or whose
im2col GEMM is thin, above all the 3-channel stems (7x7 and 3x3 stride 2).

Serves forward, float32, dense (groups 1), 1-D and 2-D, output channels a multiple
of 16; backward-data, input channels a multiple of 16: at stride 1 as the forward
conv of dy with the flipped kernel (the stride-1 transpose rule), at larger strides
(dilation 1) as one such conv per phase of the stride (:mod:`.blocked_strided`). The micro-kernel
spells out ``<16 x float>`` FMAs (``llvm.fma.v16f32``): LLVM's own choice for this CPU
would be 256-bit vectors.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._kernel_cache import Source, load
from ..problem import ConvProblem
from ..registry import register
from . import blocked_strided
from ._common import too_large
from ._fma import row_pointers, splat, store_rows
from ._transforms import backward_data_as_forward, backward_data_as_forward_reason, flipped_weight
from .weight_cache import WeightCache

MR = 6  # output pixels per micro-tile (a row segment)
# packed weights of recent calls (matched bit-exactly on w): packing is a strided copy
# of every weight, about as long as a batch-1 layer's kernel. Each entry holds the
# packed panels and a copy of w; a whole ResNet-50 takes 190 MB (380 MB with its
# backward-data panels), and a network that does not fit cycles through the LRU
# missing every call (measured: ResNet-50 b1 in network order 52 ms at 128 MiB)
PACKED = WeightCache(512 * 2**20)
VEC = 16  # float32 lanes of a zmm register
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, VEC)


def _make_ukernel(mr_rows: int, nvec: int) -> Any:
    """Micro-kernel of ``mr_rows`` output pixels x ``16 * nvec`` output channels:

    ``ukernel(x, x_off, ps, hs, ws, kh, kw, c, w, w_off, mr, y, y_off, ys)`` sets, for
    pixels ``r < mr`` and lanes ``j < 16 * nvec``,
    ``y[y_off + r * ys + j] = sum_{a<kh, b<kw, k<c} x[x_off + r*ps + a*hs + b*ws + k]
    * w[w_off + ((a * kw + b) * c + k) * 16 * nvec + j]``.
    Pixels ``r >= mr`` recompute pixel ``mr - 1`` and are not stored.
    """
    nr = VEC * nvec

    def ukernel(typingctx, x, x_off, ps, hs, ws, kh, kw, c, w, w_off, mr, y, y_off, ys):
        i = types.intp
        sig = types.void(x, i, i, i, i, i, i, i, w, i, i, y, i, i)

        def codegen(context, builder, signature, args):
            x_arr = context.make_array(signature.args[0])(context, builder, args[0])
            w_arr = context.make_array(signature.args[8])(context, builder, args[8])
            y_arr = context.make_array(signature.args[11])(context, builder, args[11])
            (_, x_off_v, ps_v, hs_v, ws_v, kh_v, kw_v, c_v, _, w_off_v, mr_v, _,
             y_off_v, ys_v) = args
            intp = x_off_v.type
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), "llvm.fma.v16f32")
            rows = row_pointers(builder, builder.gep(x_arr.data, [x_off_v]), mr_rows, mr_v, ps_v)
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_VF, None))
                     for _ in range(nvec)] for _ in range(mr_rows)]
            w_pos = cgutils.alloca_once_value(builder, builder.gep(w_arr.data, [w_off_v]))
            with cgutils.for_range(builder, kh_v) as a_loop:
                off_a = builder.mul(a_loop.index, hs_v)
                with cgutils.for_range(builder, kw_v) as b_loop:
                    off_ab = builder.add(off_a, builder.mul(b_loop.index, ws_v))
                    with cgutils.for_range(builder, c_v) as k_loop:
                        off = builder.add(off_ab, k_loop.index)
                        wp = builder.load(w_pos)
                        wv = [builder.load(builder.bitcast(
                            builder.gep(wp, [ir.Constant(intp, VEC * j)]), _VF.as_pointer()),
                            align=4) for j in range(nvec)]
                        builder.store(builder.gep(wp, [ir.Constant(intp, nr)]), w_pos)
                        for r in range(mr_rows):
                            xs = builder.load(builder.gep(rows[r], [off]))
                            xv = splat(builder, xs, _VF)
                            for j in range(nvec):
                                acc = accs[r][j]
                                builder.store(builder.call(fma, [xv, wv[j], builder.load(acc)]), acc)
            store_rows(builder, accs, builder.gep(y_arr.data, [y_off_v]), mr_v, ys_v, 4)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_{mr_rows}x{nr}"
    return intrinsic(ukernel)


@cache
def _driver(nvec: int) -> Any:
    """The compiled forward for ``NR = 16 * nvec`` output channels per micro-tile:
    ``run(xp (N,Hp,Wp,C), h0, w0, wp (O/NR,KH,KW,C,NR), y, y0, yn, yh, yw, oh, ow,
    sh, sw, dh, dw)`` reads the input window of ``xp`` from row ``h0``, column ``w0``
    and writes output ``(n, i, j, o)`` at ``y[y0 + n*yn + i*yh + j*yw + o]`` of the
    flat ``y`` (a strided slice of a larger array, or a whole contiguous one)."""
    mr = MR * 4 // nvec  # 24 accumulators whatever NR is
    nr = VEC * nvec
    # compiled in a kernel module, cached on disk (numba's own cache cannot key a
    # closure over an intrinsic)
    src = Source(__name__, f"blocked_nr{nr}")
    src.expr("ukernel", f"_make_ukernel({mr}, {nvec})")
    ukernel = None  # bound in the kernel module

    def run(xp, h0, w0, wp, yf, y0, yn, yh, yw, oh_, ow_, sh, sw, dh, dw):  # noqa: PLR0913
        n_, hp, wpx, c_ = xp.shape
        blocks, kh_, kw_ = wp.shape[0], wp.shape[1], wp.shape[2]
        xf, wf = xp.reshape(-1), wp.reshape(-1)
        segments = (ow_ + mr - 1) // mr
        wblock = kh_ * kw_ * c_ * nr
        # unit column dilation: a kernel row's taps are one contiguous run of kw * c
        taps, run_len = (1, kw_ * c_) if dw == 1 else (kw_, c_)
        for t in prange(n_ * oh_ * blocks):
            n, oh, ob = t // (oh_ * blocks), (t // blocks) % oh_, t % blocks
            for s in range(segments):
                ow0 = s * mr
                x_off = ((n * hp + h0 + oh * sh) * wpx + w0 + ow0 * sw) * c_
                y_off = y0 + n * yn + oh * yh + ow0 * yw + ob * nr
                ukernel(xf, x_off, sw * c_, dh * wpx * c_, dw * c_, kh_, taps, run_len,
                        wf, ob * wblock, min(mr, ow_ - ow0), yf, y_off, yw)

    src.function(run, parallel=True, nogil=True)
    return load(src).run


@njit(parallel=True, nogil=True, cache=True)
def _pad_rows(x, xp, top, left):
    """Copy x (N,H,W,C) into xp (N,Hp,Wp,C) at offset (top, left), zeroing the rest."""
    n_, h_, w_, _ = x.shape
    _, hp, wp, _ = xp.shape
    for t in prange(n_ * hp):
        n, i = t // hp, t % hp
        row = xp[n, i]
        if i < top or i >= top + h_:
            row[:] = 0
            continue
        row[:left] = 0
        row[left:left + w_] = x[n, i - top]
        row[left + w_:] = 0


def padded_input(x: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """x (N, *S, C) zero-padded as the problem says, as (N, Hp, Wp, C) (a view if unpadded)."""
    return pad(x, problem.ndim, problem.padding)


def pad(x: np.ndarray, ndim: int, padding: tuple[tuple[int, int], ...]) -> np.ndarray:
    """x (N, *S, C) (any strides) zero-padded by ``padding`` ((lo, hi) per spatial dim)
    as C-contiguous (N, Hp, Wp, C); x itself (as a view) when unpadded and contiguous."""
    x4 = _as2d(x, ndim)
    if all(p == (0, 0) for p in padding):
        return np.ascontiguousarray(x4)
    pads = ((0, 0),) * (2 - ndim) + padding
    (top, bottom), (left, right) = pads
    n, h, w, c = x4.shape
    xp = np.empty((n, h + top + bottom, w + left + right, c), x.dtype)
    _pad_rows(x4, xp, top, left)
    return xp


def _nvec(out_channels: int) -> int:
    """Vectors per micro-tile: 4 (64 channels) when O allows it, else 2 or 1."""
    return next(v for v in (4, 2, 1) if out_channels % (VEC * v) == 0)


def _supports(problem: ConvProblem) -> str | None:
    if problem.compute_dtype != np.float32:
        return f"float32 only (compute dtype {problem.compute_dtype})"
    if problem.groups != 1:
        return f"dense convs only (groups={problem.groups})"
    if problem.ndim > 2:
        return f"1-D and 2-D only (got {problem.ndim}-D)"
    if problem.out_channels % VEC:
        return f"output channels must be a multiple of {VEC} (got {problem.out_channels})"
    return too_large(problem, _workspace(problem), "the padded copy of x and packed weights")


def _as2d(a: np.ndarray, ndim: int) -> np.ndarray:
    """(N, *S, C) with 1 or 2 spatial dims -> (N, H, W, C) view."""
    return a.reshape(a.shape[0], *(1,) * (2 - ndim), *a.shape[1:])


def pack_weight(w: np.ndarray, ndim: int, nr: int) -> np.ndarray:
    """w (O, *K, C) -> (O / nr, KH, KW, C, nr), contiguous."""
    w4 = _as2d(w, ndim)
    o, kh, kw, c = w4.shape
    return np.ascontiguousarray(w4.reshape(o // nr, nr, kh, kw, c).transpose(0, 2, 3, 4, 1))


def _workspace(problem: ConvProblem) -> int:
    """The padded copy of x (none when unpadded) plus the packed weights."""
    padded = 0
    if any(p != (0, 0) for p in problem.padding):
        sizes = [n + lo + hi for n, (lo, hi) in zip(problem.in_size, problem.padding)]
        padded = problem.batch * math.prod(sizes) * problem.in_channels
    weights = problem.out_channels * math.prod(problem.kernel) * problem.in_channels
    return 4 * (padded + weights)


def _forward(problem: ConvProblem, x: np.ndarray, wp: np.ndarray) -> np.ndarray:
    """The forward conv of x (N, *S, C) by packed weights wp (:func:`pack_weight`)."""
    y = np.empty(problem.y_shape("NHWC"), np.float32)
    run_into(y, (0, 0), (1, 1), problem, padded_input(x, problem), (0, 0), wp)
    return y


def run_into(out: np.ndarray, first: tuple[int, int], step: tuple[int, int],
             problem: ConvProblem, xp: np.ndarray, origin: tuple[int, int],
             wp: np.ndarray) -> None:
    """The forward conv of ``problem`` written into ``out`` (N, *S, O), C-contiguous:
    output pixel ``(i, j)`` to ``out[:, first[0] + i*step[0], first[1] + j*step[1]]``
    (as (row, column) of the 2-D view); the padded input ``xp`` (N, Hp, Wp, C) is read
    from (row, column) ``origin``."""
    lead = 2 - problem.ndim
    sh, sw = (1,) * lead + problem.stride
    dh, dw = (1,) * lead + problem.dilation
    oh, ow = (1,) * lead + problem.out_size
    _, hh, ww, o = _as2d(out, problem.ndim).shape
    y0 = (first[0] * ww + first[1]) * o
    _driver(wp.shape[-1] // VEC)(xp, origin[0], origin[1], wp, out.reshape(-1), y0,
                                  hh * ww * o, step[0] * ww * o, step[1] * o, oh, ow,
                                  sh, sw, dh, dw)


@register("blocked", "forward", supports=_supports, workspace_bytes=_workspace, accuracy=2,
          numpy_math=False)
def blocked_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    nr = VEC * _nvec(problem.out_channels)
    wp, _ = PACKED.get(w, ("forward", problem.ndim, nr),
                       lambda w: pack_weight(w, problem.ndim, nr))
    return _forward(problem, x, wp)


def _supports_bwd_data(problem: ConvProblem) -> str | None:
    if all(s == 1 for s in problem.stride):
        reason = backward_data_as_forward_reason(problem)
        if reason is not None:
            return f"{reason} (served via the stride-1 transpose rule)"
        return _supports(backward_data_as_forward(problem))
    reason = blocked_strided.reason(problem)
    if reason is not None:
        return f"{reason} (strided backward-data runs by phases)"
    return _supports(backward_data_as_forward(problem)) or too_large(
        problem, blocked_strided.workspace(problem), "the phases' dy copies and weights")


def _workspace_bwd_data(problem: ConvProblem) -> int:
    if all(s == 1 for s in problem.stride):
        return _workspace(backward_data_as_forward(problem))
    return blocked_strided.workspace(problem)


@register("blocked", "backward_data", supports=_supports_bwd_data,
          workspace_bytes=_workspace_bwd_data, accuracy=2, numpy_math=False)
def blocked_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Stride 1: the forward conv of dy with the flipped kernel; else by phases
    (:mod:`.blocked_strided`)."""
    nr = VEC * _nvec(problem.in_channels)
    if all(s == 1 for s in problem.stride):
        wp, _ = PACKED.get(w, ("flipped", problem.ndim, nr),
                           lambda w: pack_weight(flipped_weight(w), problem.ndim, nr))
        return _forward(backward_data_as_forward(problem), dy, wp)
    live = blocked_strided.phases(problem)
    dx = (np.empty if len(live) == math.prod(problem.stride) else np.zeros)(
        problem.x_shape("NHWC"), np.float32)
    dyp = pad(dy, problem.ndim, blocked_strided.dy_padding(problem))
    for phase in live:
        wp, _ = PACKED.get(w, ("phase", problem.stride, phase, nr), lambda w, phase=phase:
                           pack_weight(blocked_strided.sub_kernel(w, problem, phase),
                                       problem.ndim, nr))
        first, step, origin = blocked_strided.placement(problem, phase)
        run_into(dx, first, step, blocked_strided.sub_problem(problem, phase), dyp, origin, wp)
    return dx
