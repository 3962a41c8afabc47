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
  the channels themselves, with the 2-D stride-1 interior served by kernels generated
  per (kernel shape, channel block) with every tap unrolled (see ``_depthwise2d``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange
from numba.core import cpu, options

from ..problem import ConvProblem
from ..registry import register

# numba's compiler has a ``noalias`` flag (LLVM ``noalias`` on every array argument)
# but no public njit option for it; map one, so that kernels whose arrays never
# overlap vectorise without LLVM's runtime overlap checks (too many to emit here).
if not hasattr(cpu.CPUTargetOptions, "noalias"):
    cpu.CPUTargetOptions.noalias = options._mapping("noalias")
NOALIAS: dict[str, Any] = {"nogil": True, "noalias": True, "fastmath": {"contract"}}


def _supports(problem: ConvProblem) -> None:
    return None


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


@njit(parallel=True, cache=True, nogil=True)
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


@njit(parallel=True, cache=True, nogil=True)
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


# ------------------------------------------------- depthwise 2-D, generated kernels


@njit(cache=True, nogil=True)
def _dw_edge(x, wk, y, n, oh, ow, sh, sw, ph, pw, dh, dw):  # noqa: PLR0913
    """One output pixel of a depthwise conv with every tap bounds-checked."""
    _, h_, w_, c_ = x.shape
    kh_, kw_, _ = wk.shape
    for c in range(c_):
        y[n, oh, ow, c] = 0
    for kh in range(kh_):
        ih = oh * sh - ph + kh * dh
        if ih < 0 or ih >= h_:
            continue
        for kw in range(kw_):
            iw = ow * sw - pw + kw * dw
            if iw < 0 or iw >= w_:
                continue
            for c in range(c_):
                y[n, oh, ow, c] += x[n, ih, iw, c] * wk[kh, kw, c]


def _dw_block_source(kh_: int, kw_: int, wb: int, name: str, sw: int, dh: int, dw: int) -> str:
    """Source of a function computing ``wb`` adjacent output pixels of one row, every
    tap unrolled with literal offsets (so LLVM shares the loads that coincide),
    vectorised over channels, accumulators in registers."""
    taps = [(i, j) for i in range(kh_) for j in range(kw_)]
    body = [f"def {name}(x, wk, y, n, oh, ow, ih0, iw0):"]
    body += [f"    r{i} = x[n, ih0 + {i * dh}]" for i in range(kh_)]
    body += ["    out = y[n, oh]", "    for c in range(x.shape[3]):"]
    body += [f"        w{i}_{j} = wk[{i}, {j}, c]" for i, j in taps]
    for b in range(wb):
        terms = " + ".join(f"r{i}[iw0 + {b * sw + j * dw}, c] * w{i}_{j}" for i, j in taps)
        body.append(f"        out[ow + {b}, c] = {terms}")
    return "\n".join(body) + "\n"


_DW_KERNELS: dict[tuple[int, ...], object] = {}
DW_BLOCK = 4  # output pixels per register block


def depthwise2d_kernel(kh_: int, kw_: int, sw_: int, dh_: int, dw_: int):
    """The compiled depthwise 2-D forward for a (KH, KW) kernel, multiplier 1, width
    stride ``sw_`` and dilations ``dh_, dw_``:
    ``kernel(x (N,H,W,C), wk (KH,KW,C), y (N,OH,OW,C), sh, sw, ph, pw, dh, dw)``."""
    key = (kh_, kw_, sw_, dh_, dw_)
    if key not in _DW_KERNELS:
        scope: dict[str, object] = {}
        exec(_dw_block_source(kh_, kw_, DW_BLOCK, "block", sw_, dh_, dw_), scope)  # noqa: S102
        exec(_dw_block_source(kh_, kw_, 1, "single", sw_, dh_, dw_), scope)  # noqa: S102
        block = njit(**NOALIAS)(scope["block"])
        single = njit(**NOALIAS)(scope["single"])

        @njit(nogil=True)
        def row(x, wk, y, n, oh, sh, sw, ph, pw, dh, dw):  # noqa: PLR0913
            h_, w_ = x.shape[1], x.shape[2]
            ow_ = y.shape[2]
            ih0 = oh * sh - ph
            if ih0 < 0 or ih0 + (kh_ - 1) * dh >= h_:
                for ow in range(ow_):
                    _dw_edge(x, wk, y, n, oh, ow, sh, sw, ph, pw, dh, dw)
                return
            # columns whose taps all fall inside the input: [lo, hi)
            lo = min(ow_, max(0, (pw + sw - 1) // sw))
            hi = max(lo, min(ow_, (w_ - 1 + pw - (kw_ - 1) * dw) // sw + 1))
            for ow in range(lo):
                _dw_edge(x, wk, y, n, oh, ow, sh, sw, ph, pw, dh, dw)
            ow = lo
            while ow + DW_BLOCK <= hi:
                block(x, wk, y, n, oh, ow, ih0, ow * sw - pw)
                ow += DW_BLOCK
            while ow < hi:
                single(x, wk, y, n, oh, ow, ih0, ow * sw - pw)
                ow += 1
            for ow in range(hi, ow_):
                _dw_edge(x, wk, y, n, oh, ow, sh, sw, ph, pw, dh, dw)

        @njit(parallel=True, nogil=True)
        def kernel(x, wk, y, sh, sw, ph, pw, dh, dw):  # noqa: PLR0913
            rows = y.shape[0] * y.shape[1]
            for r in prange(rows):
                row(x, wk, y, r // y.shape[1], r % y.shape[1], sh, sw, ph, pw, dh, dw)

        _DW_KERNELS[key] = kernel
    return _DW_KERNELS[key]


def _depthwise2d(problem: ConvProblem) -> bool:
    """Whether the generated depthwise kernels serve this forward problem: float32,
    1-D or 2-D, one output channel per input channel, at most 9 taps (larger kernels
    take the generic loops: compile time grows with the unrolled taps)."""
    return (
        problem.ndim <= 2
        and problem.in_per_group == 1
        and problem.out_per_group == 1
        and math.prod(problem.kernel) <= 9
        and problem.compute_dtype == np.float32
    )


# --------------------------------------------------------------------- backward data


@njit(parallel=True, cache=True, nogil=True)
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


@njit(parallel=True, cache=True, nogil=True)
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


@njit(parallel=True, cache=True, nogil=True)
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


@njit(parallel=True, cache=True, nogil=True)
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


def _slices(problem: ConvProblem) -> int:
    """How many partial dw buffers backward-weight uses: one per thread (>= 1)."""
    from numba import get_num_threads

    rows = problem.batch * int(np.prod(problem.out_size[:-1]))
    return max(1, min(get_num_threads(), rows))


def _workspace(problem: ConvProblem) -> int:
    w_bytes = problem.out_channels * int(np.prod(problem.kernel)) * problem.in_per_group
    w_bytes *= problem.compute_dtype.itemsize
    if problem.pass_ == "backward_weight":
        return _slices(problem) * w_bytes
    return w_bytes  # the repacked weights


@register("direct", "forward", supports=_supports, workspace_bytes=_workspace, accuracy=2)
def direct_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    geo = [v for t in _geometry(problem) for v in t]
    x5 = _as3d(x, problem.ndim)
    y = np.empty(problem.y_shape("NHWC"), dtype=problem.compute_dtype)
    y5 = _as3d(y, problem.ndim)
    if _depthwise2d(problem):
        wk = _channel_weight(problem, w)[0]
        kernel = depthwise2d_kernel(wk.shape[0], wk.shape[1], geo[2], geo[7], geo[8])
        kernel(x5[:, 0], wk, y5[:, 0], *geo[1:3], *geo[4:6], *geo[7:9])
    elif problem.in_per_group == 1:
        direct_fwd_channel(x5, _channel_weight(problem, w), y5, *geo)
    else:
        direct_fwd_dense(x5, _dense_weight(problem, w), y5, *geo)
    return y


@register(
    "direct", "backward_data", supports=_supports, workspace_bytes=_workspace, accuracy=2
)
def direct_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    geo = [v for t in _geometry(problem) for v in t]
    dy5 = _as3d(dy, problem.ndim)
    dx = np.empty(problem.x_shape("NHWC"), dtype=problem.compute_dtype)
    dx5 = _as3d(dx, problem.ndim)
    extents = (1,) * (3 - problem.ndim) + problem.effective_kernel
    lows = (0,) * (3 - problem.ndim) + tuple(lo for lo, _ in problem.padding)
    highs = (0,) * (3 - problem.ndim) + tuple(hi for _, hi in problem.padding)
    if (_depthwise2d(problem) and all(s == 1 for s in problem.stride)
            and all(max(lo, hi) < e for lo, hi, e in zip(lows, highs, extents))):
        # stride 1: the forward depthwise conv of dy with the flipped kernel
        wk = np.ascontiguousarray(_channel_weight(problem, w)[0, ::-1, ::-1])
        pad = [e - 1 - lo for e, lo in zip(extents, lows)]
        kernel = depthwise2d_kernel(wk.shape[0], wk.shape[1], 1, geo[7], geo[8])
        kernel(dy5[:, 0], wk, dx5[:, 0], 1, 1, pad[1], pad[2], *geo[7:9])
    elif problem.in_per_group == 1:
        direct_bwd_data_channel(dy5, _channel_weight(problem, w), dx5, *geo)
    else:
        g, og = problem.groups, problem.out_per_group
        w5 = _as3d(w, problem.ndim)
        wt = np.ascontiguousarray(w5.reshape(g, og, *w5.shape[1:]).transpose(0, 2, 3, 4, 1, 5))
        direct_bwd_data_dense(dy5, wt, dx5, *geo)
    return dx


@register(
    "direct", "backward_weight", supports=_supports, workspace_bytes=_workspace, accuracy=2
)
def direct_bwd_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    geo = [v for t in _geometry(problem) for v in t]
    x5, dy5 = _as3d(x, problem.ndim), _as3d(dy, problem.ndim)
    k5 = (1,) * (3 - problem.ndim) + problem.kernel
    p = _slices(problem)
    dtype = problem.compute_dtype
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
