"""``direct``: compiled (numba) direct convolution for every problem and all passes.

Every problem is seen as 3-D: a 1-D or 2-D problem gets leading singleton spatial
dims (views, no copy), so x is ``(N, D, H, W, C)``, w ``(O, KD, KH, KW, C // g)``
and y ``(N, OD, OH, OW, O)``. Padding is never materialised: each kernel tap checks
its input coordinate.

Two loop nests: over the output pixels (forward, backward-weight), parallel over
the output rows (backward-weight: over slices of them, one partial dw per slice,
summed at the end), and over the input pixels (backward-data, a gather: no scatter, no races),
parallel over the input rows. The work of a tap, by the innermost contiguous axis:

- dense (``C // g > 1``): the weights are repacked so the channels of a group are
  innermost; vectorised over the output channels (forward) or the input channels.
- channel-wise (``C // g == 1``: depthwise, any channel multiplier): vectorised over
  the channels themselves.

1-D and 2-D depthwise problems with one output channel per input channel go to the
generated kernels of ``depthwise.py`` (forward, and backward-data at stride 1), the
gathering kernel of ``depthwise/data.py`` (backward-data at larger strides) and the
generated kernels of ``depthwise/weight.py`` (backward-weight).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit, prange
from numba.extending import overload

from .. import memory
from .._kernel_cache import kernel
from ..params import Params, Space
from ..problem import ConvProblem
from ..registry import Bound, Run, register
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


def _geometry(problem: ConvProblem) -> tuple[int, ...]:
    """(kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw): kernel, stride, pad_lo and
    dilation, each padded to 3 spatial dims."""
    lead = 3 - problem.ndim
    kernel = (1,) * lead + problem.kernel
    stride = (1,) * lead + problem.stride
    pad = (0,) * lead + tuple(lo for lo, _ in problem.padding)
    dilation = (1,) * lead + problem.dilation
    return (*kernel, *stride, *pad, *dilation)


def _as3d(a: np.ndarray, ndim: int) -> np.ndarray:
    """(N, *S, C) with 1-3 spatial dims -> (N, D, H, W, C) view."""
    return a.reshape(a.shape[0], *(1,) * (3 - ndim), *a.shape[1:])


def _weight(problem: ConvProblem, w: np.ndarray, outputs_last: bool) -> np.ndarray:
    """w (O, *K, Cg) repacked for the kernels, channels innermost: channel-wise
    (Cg == 1) (KD, KH, KW, O); dense (G, KD, KH, KW, Cg, Og) (``outputs_last``) or
    (G, KD, KH, KW, Og, Cg)."""
    w5 = _as3d(w, problem.ndim)
    if problem.in_per_group == 1:
        return np.ascontiguousarray(w5[..., 0].transpose(1, 2, 3, 0))
    g, og = problem.groups, problem.out_per_group
    last = (5, 1) if outputs_last else (1, 5)
    return np.ascontiguousarray(w5.reshape(g, og, *w5.shape[1:]).transpose(0, 2, 3, 4, *last))


# --------------------------------------------------------------------- work of a tap
#
# Compiled code calls _tap and _data_tap; which body they run, dense or channel-wise,
# is chosen by the rank of the weights (or partial dw) when the kernel compiles.


def _dense_tap(pixel, xp, acc, kd, kh, kw, m, weight_grad):  # noqa: PLR0913
    """A tap of a dense conv: output pixel (O,), input pixel xp (C,). Forward: acc the
    weights (G,KD,KH,KW,Cg,Og), pixel += w^T xp. Backward-weight: acc a partial dw
    (G,KD,KH,KW,Og,Cg), dw += pixel (of dy) outer xp."""
    g_, a_, b_ = acc.shape[0], acc.shape[4], acc.shape[5]
    for g in range(g_):
        if weight_grad:
            for o in range(a_):
                gv = pixel[g * a_ + o]
                for c in range(b_):
                    acc[g, kd, kh, kw, o, c] += gv * xp[g * b_ + c]
        else:
            for c in range(a_):
                xv = xp[g * a_ + c]
                for o in range(b_):
                    pixel[g * b_ + o] += xv * acc[g, kd, kh, kw, c, o]


def _channel_tap(pixel, xp, acc, kd, kh, kw, m, weight_grad):  # noqa: PLR0913
    """A tap of a channel-wise conv (O = m * C, output channel o reads input channel
    o // m): output pixel (O,), input pixel xp (C,). Forward: acc the weights
    (KD,KH,KW,O), pixel += xp * w. Backward-weight: acc a partial dw (KD,KH,KW,O),
    dw += pixel (of dy) * xp."""
    tap = acc[kd, kh, kw]
    if weight_grad and m == 1:
        for o in range(tap.shape[0]):
            tap[o] += pixel[o] * xp[o]
    elif weight_grad:
        for o in range(tap.shape[0]):
            tap[o] += pixel[o] * xp[o // m]
    elif m == 1:
        for o in range(tap.shape[0]):
            pixel[o] += xp[o] * tap[o]
    else:
        for o in range(tap.shape[0]):
            pixel[o] += xp[o // m] * tap[o]


def _tap(pixel, xp, acc, kd, kh, kw, m, weight_grad):  # noqa: PLR0913
    """_dense_tap for a 6-D acc, else _channel_tap (compiled code only)."""


@overload(_tap, inline="always")
def _tap_by_rank(pixel, xp, acc, kd, kh, kw, m, weight_grad):  # noqa: PLR0913
    return _dense_tap if acc.ndim == 6 else _channel_tap


def _dense_data_tap(out, grad, wt, kd, kh, kw, m):  # noqa: PLR0913
    """A tap of a dense conv's backward-data: dx pixel out (C,) += w grad, grad the dy
    pixel (O,), wt the weights (G,KD,KH,KW,Og,Cg)."""
    og, cg = wt.shape[4], wt.shape[5]
    for g in range(wt.shape[0]):
        for o in range(og):
            gv = grad[g * og + o]
            for c in range(cg):
                out[g * cg + c] += gv * wt[g, kd, kh, kw, o, c]


def _channel_data_tap(out, grad, wt, kd, kh, kw, m):  # noqa: PLR0913
    """A tap of a channel-wise conv's backward-data: dx pixel out (C,) += the sum over
    its m output channels of grad (O,) * w, wt the weights (KD,KH,KW,O)."""
    tap = wt[kd, kh, kw]
    if m == 1:
        for c in range(out.shape[0]):
            out[c] += grad[c] * tap[c]
    else:
        for c in range(out.shape[0]):
            for j in range(m):
                out[c] += grad[c * m + j] * tap[c * m + j]


def _data_tap(out, grad, wt, kd, kh, kw, m):  # noqa: PLR0913
    """_dense_data_tap for a 6-D wt, else _channel_data_tap (compiled code only)."""


@overload(_data_tap, inline="always")
def _data_tap_by_rank(out, grad, wt, kd, kh, kw, m):  # noqa: PLR0913
    return _dense_data_tap if wt.ndim == 6 else _channel_data_tap


def _sums(copy, row, taps):
    """Where the taps of an output pixel work (compiled code only): dense ones (7-D
    taps) on ``copy``, a local array holding the pixel's sums (forward) or its dy
    (backward-weight): on the pixel's ``row`` itself, which might alias the weights,
    the forward pass takes twice the time; channel-wise ones on ``row`` (a copy costs
    them some 5%)."""


@overload(_sums, inline="always")
def _sums_by_rank(copy, row, taps):
    if taps.ndim == 7:
        return lambda copy, row, taps: copy
    return lambda copy, row, taps: row


# ------------------------------------------------------------------------ loop nests


@njit(inline="always")
def _output_pixels(x, pixels, taps, geo, weight_grad):
    """The loop nest over the output pixels, and per pixel the taps landing inside x
    (N,D,H,W,C), of two passes (``weight_grad`` a constant in the kernels that inline
    it: each compiles only its own branches):

    - forward: pixels y (N,OD,OH,OW,O), overwritten; taps[0] the weights;
    - backward-weight: pixels dy; taps (P, ...) partial dw sums, overwritten: slice p
      of the output rows adds into taps[p]; the caller sums over p.

    Parallel over the output rows (forward) or P slices of them (backward-weight).
    """
    kd_, kh_, kw_, sd, sh, sw, pd, ph, pw, dd, dh, dw = geo
    n_, d_, h_, w_, c_ = x.shape
    _, od_, oh_, ow_, o_ = pixels.shape
    m = o_ // c_  # channel-wise: output channels per input channel
    rows = n_ * od_ * oh_
    p_ = taps.shape[0] if weight_grad else rows
    for p in prange(p_):
        acc = taps[p] if weight_grad else taps[0]
        if weight_grad:
            acc[...] = 0
        copy = np.empty(o_, dtype=pixels.dtype)
        for r in range(p * rows // p_, (p + 1) * rows // p_):
            n, od, oh = r // (od_ * oh_), (r // oh_) % od_, r % oh_
            for ow in range(ow_):
                # taps.ndim, not a variable set outside the parallel loop: that one
                # would be tested at run time
                row = pixels[n, od, oh, ow]
                pixel = _sums(copy, row, taps)
                if not weight_grad:
                    pixel[:] = 0
                elif taps.ndim == 7:
                    pixel[:] = row
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
                            _tap(pixel, x[n, i_d, ih, iw], acc, kd, kh, kw, m, weight_grad)
                if taps.ndim == 7 and not weight_grad:
                    row[:] = pixel


@kernel(parallel=True, nogil=True)
def direct_forward(x, wp, y, geo):
    """x (N,D,H,W,C), wp (1,G,KD,KH,KW,Cg,Og) or (1,KD,KH,KW,O) -> y (N,OD,OH,OW,O),
    overwritten; geo: see _geometry."""
    _output_pixels(x, y, wp, geo, False)


@kernel(parallel=True, nogil=True)
def direct_backward_weight(x, dy, part, geo):
    """x (N,D,H,W,C), dy (N,OD,OH,OW,O) -> part (P,G,KD,KH,KW,Og,Cg) or (P,KD,KH,KW,O),
    overwritten; the caller sums over p."""
    _output_pixels(x, dy, part, geo, True)


@kernel(parallel=True, nogil=True)
def direct_backward_data(dy, wt, dx, geo):
    """dy (N,OD,OH,OW,O) -> dx (N,D,H,W,C), overwritten, the loop nest over the input
    pixels; wt (G,KD,KH,KW,Og,Cg) or (KD,KH,KW,O). Gathers: each dx pixel sums the taps
    whose output coordinate is whole and inside."""
    kd_, kh_, kw_, sd, sh, sw, pd, ph, pw, dd, dh, dw = geo
    n_, od_, oh_, ow_, o_ = dy.shape
    _, d_, h_, w_, c_ = dx.shape
    m = o_ // c_  # channel-wise: output channels per input channel
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
                        _data_tap(out, dy[n, td // sd, th // sh, tw // sw], wt, kd, kh, kw, m)


# --------------------------------------------------------------------------- entries


def backward_data_plan(
    problem: ConvProblem, params: Params | None = None,
) -> depthwise.DepthwisePlan | depthwise_data.DepthwiseDataPlan | None:
    """A depthwise backward-data plan: at stride 1 the forward kernels with the taps
    reversed, else (or where those do not serve) the gathering kernel; None if
    neither serves."""
    return (depthwise.backward_data_plan(problem, params)
            or depthwise_data.backward_data_plan(problem, params))


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


def _forward(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    y = memory.empty(problem.y_shape("NHWC"), dtype=problem.compute_dtype)
    wp = _weight(problem, w, outputs_last=True)
    direct_forward(_as3d(x, problem.ndim), wp[None], _as3d(y, problem.ndim), _geometry(problem))
    return y


def _backward_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    dx = memory.empty(problem.x_shape("NHWC"), dtype=problem.compute_dtype)
    wt = _weight(problem, w, outputs_last=False)
    direct_backward_data(_as3d(dy, problem.ndim), wt, _as3d(dx, problem.ndim), _geometry(problem))
    return dx


def _backward_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    k5 = (1,) * (3 - problem.ndim) + problem.kernel
    p = _slices(problem)
    dtype = problem.compute_dtype
    if problem.in_per_group == 1:
        part = np.empty((p, *k5, problem.out_channels), dtype=dtype)
    else:
        g, og, cg = problem.groups, problem.out_per_group, problem.in_per_group
        part = np.empty((p, g, *k5, og, cg), dtype=dtype)
    direct_backward_weight(_as3d(x, problem.ndim), _as3d(dy, problem.ndim), part,
                           _geometry(problem))
    # the partial sums add up in numpy (numpy_math=False: NaN and inf propagate silently)
    with np.errstate(invalid="ignore", over="ignore"):
        dw = part.sum(axis=0)
    if problem.in_per_group == 1:  # (KD, KH, KW, O) -> (O, KD, KH, KW, 1)
        dw = dw.transpose(3, 0, 1, 2)[..., None]
    else:  # (G, KD, KH, KW, Og, Cg) -> (O, KD, KH, KW, Cg)
        dw = dw.transpose(0, 4, 1, 2, 3, 5).reshape(-1, *k5, problem.in_per_group)
    return np.ascontiguousarray(dw.reshape(problem.w_shape("NHWC")), dtype=dtype)


PlanOf = Callable[[ConvProblem, "Params | None"], "Bound | None"]


def _planned(plan_of: PlanOf, loops: Run) -> Callable[..., np.ndarray]:
    """A pass of ``direct``: the generated kernels' plan where ``plan_of`` finds one,
    else the loop nests above."""
    def run(problem: ConvProblem, a: np.ndarray, b: np.ndarray,
            params: Params | None = None) -> np.ndarray:
        plan = plan_of(problem, params)
        return loops(problem, a, b) if plan is None else plan(a, b)
    return run


def _serial_choice(plan_of: PlanOf) -> Callable[[ConvProblem], Space]:
    """The depthwise plans' one parameter, ``serial`` (:func:`.depthwise.forward.serial_param`),
    the multiply-add rule's answer first; none where the plans do not serve or
    cannot share the work out (one thread, one row)."""
    def space(problem: ConvProblem) -> Space:
        default = plan_of(problem, None)
        alone, shared = plan_of(problem, {"serial": 1}), plan_of(problem, {"serial": 0})
        if default is None or alone == shared:
            return {}
        serial = int(default == alone)
        return {"serial": (serial, 1 - serial)}
    return space


for _pass, _plan_of, _loops in (("forward", forward_plan, _forward),
                                ("backward_data", backward_data_plan, _backward_data),
                                ("backward_weight", backward_weight_plan, _backward_weight)):
    register("direct", _pass, supports=_supports, workspace_bytes=_workspace, accuracy=2,
             numpy_math=False, prepare=_plan_of, tunables=_serial_choice(_plan_of))(
        _planned(_plan_of, _loops))
