"""``direct``: compiled (numba) direct convolution for every problem and all passes.

Every problem is seen as 3-D: a 1-D or 2-D problem gets leading singleton spatial
dims (views, no copy), so x is ``(N, D, H, W, C)``, w ``(O, KD, KH, KW, C // g)``
and y ``(N, OD, OH, OW, O)``. Padding is never materialised: each kernel tap checks
its input coordinate. Parallel over output rows (forward, backward-data: no scatter,
no races) or over slices of the batch (backward-weight: one partial dw per slice,
summed at the end).

Two loop nests, by the innermost contiguous axis:

- dense (``C // g > 1``): the weights are repacked so the output channels of a group
  are innermost; each output pixel accumulates an ``O // g`` row, vectorised over
  output channels.
- channel-wise (``C // g == 1``: depthwise, any channel multiplier): vectorised over
  the channels themselves.

1-D and 2-D depthwise problems with one output channel per input channel go to the
generated kernels of ``depthwise.py`` (forward, and backward-data at stride 1), the
gathering kernel of ``depthwise/data.py`` (backward-data at larger strides) and the
generated kernels of ``depthwise/weight.py`` (backward-weight).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .. import memory
from .._kernel_cache import kernel
from ..problem import ConvProblem
from ..registry import register
from ._common import too_large
from .depthwise import data as depthwise_data
from .depthwise import forward as depthwise
from .depthwise.forward import NOALIAS, forward_plan
from .depthwise.weight import backward_weight_plan

__all__ = ["NOALIAS"]  # re-exported for the other generated kernels


DEPTHWISE_MAX_WORKSPACE = 64 * 2**20
"""Bytes of depthwise buffers beyond which direct refuses: they grow with the padded
width an output row spans (padding 10**7 around a 4x4 input: 5.5 s a call filling
them), and ``im2col`` serves such problems in milliseconds."""


def _supports(problem: ConvProblem) -> str | None:
    space = _workspace(problem)
    if problem.is_depthwise and space > DEPTHWISE_MAX_WORKSPACE:
        return (f"depthwise buffers of {space:,} bytes (padding far wider than x) exceed "
                f"direct.DEPTHWISE_MAX_WORKSPACE ({DEPTHWISE_MAX_WORKSPACE:,})")
    return too_large(problem, space)


def _geometry(problem: ConvProblem) -> tuple[tuple[int, ...], ...]:
    """(stride, pad_lo, dilation) each padded to 3 spatial dims."""
    lead = 3 - problem.ndim
    stride = (1,) * lead + problem.stride
    pad = (0,) * lead + tuple(lo for lo, _ in problem.padding)
    dilation = (1,) * lead + problem.dilation
    return stride, pad, dilation


def _as3d(a: np.ndarray, ndim: int) -> np.ndarray:
    """(N, *S, C) with 1-3 spatial dims -> (N, D, H, W, C) view."""
    return a.reshape(a.shape[0], *(1,) * (3 - ndim), *a.shape[1:])


def _dense_weight(problem: ConvProblem, w: np.ndarray) -> np.ndarray:
    """w (O, *K, Cg) -> (G, KD, KH, KW, Cg, Og): a group's output channels innermost."""
    g, og = problem.groups, problem.out_per_group
    w5 = _as3d(w, problem.ndim)
    return np.ascontiguousarray(
        w5.reshape(g, og, *w5.shape[1:]).transpose(0, 2, 3, 4, 5, 1)
    )


def _channel_weight(problem: ConvProblem, w: np.ndarray) -> np.ndarray:
    """w (O, *K, 1) -> (KD, KH, KW, O): channels innermost."""
    w5 = _as3d(w, problem.ndim)
    return np.ascontiguousarray(w5[..., 0].transpose(1, 2, 3, 0))


# --------------------------------------------------------------------------- forward


@kernel(parallel=True, nogil=True)
def direct_fwd_dense(x, wp, y, sd, sh, sw, pd, ph, pw, dd, dh, dw):  # noqa: PLR0913
    """x (N,D,H,W,C), wp (G,KD,KH,KW,Cg,Og) -> y (N,OD,OH,OW,O), overwritten."""
    n_, d_, h_, w_, _ = x.shape
    g_, kd_, kh_, kw_, cg, og = wp.shape
    _, od_, oh_, ow_, _ = y.shape
    for r in prange(n_ * od_ * oh_):
        n, od, oh = r // (od_ * oh_), (r // oh_) % od_, r % oh_
        acc = np.empty(og, dtype=y.dtype)
        for ow in range(ow_):
            for g in range(g_):
                acc[:] = 0
                for kd in range(kd_):
                    i_d = od * sd - pd + kd * dd
                    if i_d < 0 or i_d >= d_:
                        continue
                    for kh in range(kh_):
                        ih = oh * sh - ph + kh * dh
                        if ih < 0 or ih >= h_:
                            continue
                        for kw in range(kw_):
                            iw = ow * sw - pw + kw * dw
                            if iw < 0 or iw >= w_:
                                continue
                            for c in range(cg):
                                xv = x[n, i_d, ih, iw, g * cg + c]
                                for o in range(og):
                                    acc[o] += xv * wp[g, kd, kh, kw, c, o]
                y[n, od, oh, ow, g * og:(g + 1) * og] = acc


@kernel(parallel=True, nogil=True)
def direct_fwd_channel(x, wc, y, sd, sh, sw, pd, ph, pw, dd, dh, dw):  # noqa: PLR0913
    """Channel-wise (C // g == 1): x (N,D,H,W,C), wc (KD,KH,KW,O) -> y (N,OD,OH,OW,O)."""
    n_, d_, h_, w_, c_ = x.shape
    kd_, kh_, kw_, o_ = wc.shape
    _, od_, oh_, ow_, _ = y.shape
    m = o_ // c_
    for r in prange(n_ * od_ * oh_):
        n, od, oh = r // (od_ * oh_), (r // oh_) % od_, r % oh_
        for ow in range(ow_):
            out = y[n, od, oh, ow]
            out[:] = 0
            for kd in range(kd_):
                i_d = od * sd - pd + kd * dd
                if i_d < 0 or i_d >= d_:
                    continue
                for kh in range(kh_):
                    ih = oh * sh - ph + kh * dh
                    if ih < 0 or ih >= h_:
                        continue
                    for kw in range(kw_):
                        iw = ow * sw - pw + kw * dw
                        if iw < 0 or iw >= w_:
                            continue
                        if m == 1:
                            for o in range(o_):
                                out[o] += x[n, i_d, ih, iw, o] * wc[kd, kh, kw, o]
                        else:
                            for o in range(o_):
                                out[o] += x[n, i_d, ih, iw, o // m] * wc[kd, kh, kw, o]


# --------------------------------------------------------------------- backward data


@kernel(parallel=True, nogil=True)
def direct_bwd_data_dense(dy, wt, dx, sd, sh, sw, pd, ph, pw, dd, dh, dw):  # noqa: PLR0913
    """dy (N,OD,OH,OW,O), wt (G,KD,KH,KW,Og,Cg) -> dx (N,D,H,W,C), overwritten.

    Gathers: each dx pixel sums the taps whose output coordinate is whole and inside.
    """
    n_, od_, oh_, ow_, _ = dy.shape
    g_, kd_, kh_, kw_, og, cg = wt.shape
    _, d_, h_, w_, _ = dx.shape
    for r in prange(n_ * d_ * h_):
        n, i_d, ih = r // (d_ * h_), (r // h_) % d_, r % h_
        for iw in range(w_):
            out = dx[n, i_d, ih, iw]
            out[:] = 0
            for kd in range(kd_):
                td = i_d + pd - kd * dd
                if td < 0 or td % sd or td // sd >= od_:
                    continue
                for kh in range(kh_):
                    th = ih + ph - kh * dh
                    if th < 0 or th % sh or th // sh >= oh_:
                        continue
                    for kw in range(kw_):
                        tw = iw + pw - kw * dw
                        if tw < 0 or tw % sw or tw // sw >= ow_:
                            continue
                        grad = dy[n, td // sd, th // sh, tw // sw]
                        for g in range(g_):
                            for o in range(og):
                                gv = grad[g * og + o]
                                for c in range(cg):
                                    out[g * cg + c] += gv * wt[g, kd, kh, kw, o, c]


@kernel(parallel=True, nogil=True)
def direct_bwd_data_channel(dy, wc, dx, sd, sh, sw, pd, ph, pw, dd, dh, dw):  # noqa: PLR0913
    """Channel-wise: dy (N,OD,OH,OW,O), wc (KD,KH,KW,O) -> dx (N,D,H,W,C)."""
    n_, od_, oh_, ow_, o_ = dy.shape
    kd_, kh_, kw_, _ = wc.shape
    _, d_, h_, w_, c_ = dx.shape
    m = o_ // c_
    for r in prange(n_ * d_ * h_):
        n, i_d, ih = r // (d_ * h_), (r // h_) % d_, r % h_
        for iw in range(w_):
            out = dx[n, i_d, ih, iw]
            out[:] = 0
            for kd in range(kd_):
                td = i_d + pd - kd * dd
                if td < 0 or td % sd or td // sd >= od_:
                    continue
                for kh in range(kh_):
                    th = ih + ph - kh * dh
                    if th < 0 or th % sh or th // sh >= oh_:
                        continue
                    for kw in range(kw_):
                        tw = iw + pw - kw * dw
                        if tw < 0 or tw % sw or tw // sw >= ow_:
                            continue
                        grad = dy[n, td // sd, th // sh, tw // sw]
                        if m == 1:
                            for c in range(c_):
                                out[c] += grad[c] * wc[kd, kh, kw, c]
                        else:
                            for c in range(c_):
                                for j in range(m):
                                    out[c] += grad[c * m + j] * wc[kd, kh, kw, c * m + j]


# ------------------------------------------------------------------- backward weight


@kernel(parallel=True, nogil=True)
def direct_bwd_weight_dense(x, dy, part, sd, sh, sw, pd, ph, pw, dd, dh, dw):  # noqa: PLR0913
    """x (N,D,H,W,C), dy (N,OD,OH,OW,O) -> part (P,G,KD,KH,KW,Og,Cg): slice p of the
    output rows adds into part[p]; the caller sums over p."""
    n_, d_, h_, w_, _ = x.shape
    _, od_, oh_, ow_, _ = dy.shape
    p_, g_, kd_, kh_, kw_, og, cg = part.shape
    rows = n_ * od_ * oh_
    for p in prange(p_):
        acc = part[p]
        acc[...] = 0
        for r in range(p * rows // p_, (p + 1) * rows // p_):
            n, od, oh = r // (od_ * oh_), (r // oh_) % od_, r % oh_
            for ow in range(ow_):
                grad = dy[n, od, oh, ow]
                for kd in range(kd_):
                    i_d = od * sd - pd + kd * dd
                    if i_d < 0 or i_d >= d_:
                        continue
                    for kh in range(kh_):
                        ih = oh * sh - ph + kh * dh
                        if ih < 0 or ih >= h_:
                            continue
                        for kw in range(kw_):
                            iw = ow * sw - pw + kw * dw
                            if iw < 0 or iw >= w_:
                                continue
                            pix = x[n, i_d, ih, iw]
                            for g in range(g_):
                                for o in range(og):
                                    gv = grad[g * og + o]
                                    for c in range(cg):
                                        acc[g, kd, kh, kw, o, c] += gv * pix[g * cg + c]


@kernel(parallel=True, nogil=True)
def direct_bwd_weight_channel(x, dy, part, sd, sh, sw, pd, ph, pw, dd, dh, dw):  # noqa: PLR0913
    """Channel-wise: x (N,D,H,W,C), dy (N,OD,OH,OW,O) -> part (P,KD,KH,KW,O)."""
    n_, d_, h_, w_, c_ = x.shape
    _, od_, oh_, ow_, o_ = dy.shape
    p_, kd_, kh_, kw_, _ = part.shape
    m = o_ // c_
    rows = n_ * od_ * oh_
    for p in prange(p_):
        acc = part[p]
        acc[...] = 0
        for r in range(p * rows // p_, (p + 1) * rows // p_):
            n, od, oh = r // (od_ * oh_), (r // oh_) % od_, r % oh_
            for ow in range(ow_):
                grad = dy[n, od, oh, ow]
                for kd in range(kd_):
                    i_d = od * sd - pd + kd * dd
                    if i_d < 0 or i_d >= d_:
                        continue
                    for kh in range(kh_):
                        ih = oh * sh - ph + kh * dh
                        if ih < 0 or ih >= h_:
                            continue
                        for kw in range(kw_):
                            iw = ow * sw - pw + kw * dw
                            if iw < 0 or iw >= w_:
                                continue
                            pix = x[n, i_d, ih, iw]
                            tap = acc[kd, kh, kw]
                            if m == 1:
                                for o in range(o_):
                                    tap[o] += grad[o] * pix[o]
                            else:
                                for o in range(o_):
                                    tap[o] += grad[o] * pix[o // m]


# --------------------------------------------------------------------------- entries


def backward_data_plan(
    problem: ConvProblem,
) -> depthwise.DepthwisePlan | depthwise_data.DepthwiseDataPlan | None:
    """A depthwise backward-data plan: at stride 1 the forward kernels with the taps
    reversed, else (or where those do not serve) the gathering kernel; None if
    neither serves."""
    return depthwise.backward_data_plan(problem) or depthwise_data.backward_data_plan(problem)


def _slices(problem: ConvProblem) -> int:
    """How many partial dw buffers backward-weight uses: one per thread (>= 1)."""
    from numba import get_num_threads

    rows = problem.batch * int(np.prod(problem.out_size[:-1]))
    return max(1, min(get_num_threads(), rows))


def _workspace(problem: ConvProblem) -> int:
    plan: depthwise.DepthwisePlan | depthwise_data.DepthwiseDataPlan | None = None
    if problem.pass_ == "forward":
        plan = forward_plan(problem)
    elif problem.pass_ == "backward_data":
        plan = backward_data_plan(problem)
    if plan is not None:
        return plan.workspace_bytes(problem.compute_dtype.itemsize)
    w_bytes = problem.out_channels * int(np.prod(problem.kernel)) * problem.in_per_group
    w_bytes *= problem.compute_dtype.itemsize
    if problem.pass_ == "backward_weight":
        weight_plan = backward_weight_plan(problem)
        if weight_plan is not None:
            return weight_plan.workspace_bytes(problem.compute_dtype.itemsize)
        return _slices(problem) * w_bytes
    return w_bytes  # the repacked weights


@register("direct", "forward", supports=_supports, workspace_bytes=_workspace, accuracy=2,
          numpy_math=False, prepare=forward_plan)
def direct_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    plan = forward_plan(problem)
    if plan is not None:
        return plan(x, w)
    geo = [v for t in _geometry(problem) for v in t]
    x5 = _as3d(x, problem.ndim)
    y = memory.empty(problem.y_shape("NHWC"), dtype=problem.compute_dtype)
    y5 = _as3d(y, problem.ndim)
    if problem.in_per_group == 1:
        direct_fwd_channel(x5, _channel_weight(problem, w), y5, *geo)
    else:
        direct_fwd_dense(x5, _dense_weight(problem, w), y5, *geo)
    return y


@register(
    "direct", "backward_data", supports=_supports, workspace_bytes=_workspace, accuracy=2,
    numpy_math=False, prepare=backward_data_plan,
)
def direct_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    plan = backward_data_plan(problem)
    if plan is not None:
        return plan(dy, w)
    geo = [v for t in _geometry(problem) for v in t]
    dy5 = _as3d(dy, problem.ndim)
    dx = memory.empty(problem.x_shape("NHWC"), dtype=problem.compute_dtype)
    dx5 = _as3d(dx, problem.ndim)
    if problem.in_per_group == 1:
        direct_bwd_data_channel(dy5, _channel_weight(problem, w), dx5, *geo)
    else:
        g, og = problem.groups, problem.out_per_group
        w5 = _as3d(w, problem.ndim)
        wt = np.ascontiguousarray(w5.reshape(g, og, *w5.shape[1:]).transpose(0, 2, 3, 4, 1, 5))
        direct_bwd_data_dense(dy5, wt, dx5, *geo)
    return dx


@register(
    "direct", "backward_weight", supports=_supports, workspace_bytes=_workspace, accuracy=2,
    numpy_math=False, prepare=backward_weight_plan,
)
def direct_bwd_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    plan = backward_weight_plan(problem)
    if plan is not None:
        return plan(x, dy)
    geo = [v for t in _geometry(problem) for v in t]
    x5, dy5 = _as3d(x, problem.ndim), _as3d(dy, problem.ndim)
    k5 = (1,) * (3 - problem.ndim) + problem.kernel
    p = _slices(problem)
    dtype = problem.compute_dtype
    # the partial sums add up in numpy (numpy_math=False: NaN and inf propagate silently)
    with np.errstate(invalid="ignore", over="ignore"):
        if problem.in_per_group == 1:
            part = np.empty((p, *k5, problem.out_channels), dtype=dtype)
            direct_bwd_weight_channel(x5, dy5, part, *geo)
            dw = part.sum(axis=0).transpose(3, 0, 1, 2)[..., None]
        else:
            g, og, cg = problem.groups, problem.out_per_group, problem.in_per_group
            part = np.empty((p, g, *k5, og, cg), dtype=dtype)
            direct_bwd_weight_dense(x5, dy5, part, *geo)
            dw = part.sum(axis=0).transpose(0, 4, 1, 2, 3, 5).reshape(-1, *k5, cg)
    return np.ascontiguousarray(dw.reshape(problem.w_shape("NHWC")), dtype=dtype)
