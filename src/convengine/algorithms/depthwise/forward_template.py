"""Kernel template (see ``convengine._kernel_cache``): the depthwise forward for one
(KH, KW) kernel shape, width stride ``SW`` and dilations ``DH``, ``DW`` (full vectors
of y stored non-temporally if ``STREAMING``; ``act(conv + bias)`` if ``EPILOGUE``),
over the generated row kernels ``span`` and ``edge`` of
:func:`convengine.algorithms.depthwise.forward.row_kernels`; made by
:func:`~convengine.algorithms.depthwise.forward.depthwise2d_kernel`, whose docstring
says what ``parallel`` and ``serial`` compute. In checked mode (:mod:`convengine.checked`)
span and edge check each register block's y, x (or buf), wk and bias ranges before
calling it (``forward._block_inside``), skip a block reaching outside, and the kernel
raises BoundsError after its parallel loop."""

import numpy as np
from numba import prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.depthwise.forward import (
    GRAIN,
    NOALIAS,
    _cache_line_aligned,
    _fill,
    row_kernels,
)
from convengine.algorithms.fma import store_fence
from convengine.checked import CHECKED, fail, violations

KH, KW, SW, DH, DW, STREAMING, EPILOGUE = parameters(
    __name__, "KH", "KW", "SW", "DH", "DW", "STREAMING", "EPILOGUE")
rows_module = row_kernels(KH, KW, SW, DW, STREAMING, EPILOGUE)
span, edge = rows_module.span, rows_module.edge
REACH = (KW - 1) * DW + 1  # input columns one output pixel reads
BUFFERS = ("y", "x", "buf", "wk", "bias")  # the sites of forward._block_inside


@compiled(**NOALIAS)
def task(x, wk, y, buf, r0, r1, c0, sh, ph, pw, bias, act, bad):  # noqa: PLR0913
    """Output rows r0:r1 (over n and oh) of channels c0:c0+cb, cb = buf.shape[2].
    Pixels read x in place: tap rows above or below x masked off, the first and
    last columns with only the taps inside x. Where some pixel has no tap column
    inside x, every row (where a row has no tap row inside x, that row) reads
    zero-padded copies of its input rows in buf (KH, Wp, cb) instead. ``bad``: checked
    mode's record of a block outside its buffers (passed to span and edge), else None."""
    h_, w_, c_ = x.shape[1], x.shape[2], x.shape[3]
    oh_, ow_ = y.shape[1], y.shape[2]
    cb = buf.shape[2]
    plane = buf.shape[1] * cb
    buf4 = buf.reshape(1, buf.shape[0], buf.shape[1], cb)
    zero = np.int64(0)
    # columns whose taps all fall inside x: [lo, hi)
    lo = min(ow_, (pw + SW - 1) // SW)
    hi = max(lo, min(ow_, (w_ - 1 + pw - (REACH - 1)) // SW + 1))
    # the other columns' taps inside x, j0 <= j < j1; rows of buf if one is empty
    windows = np.empty((ow_, 2), dtype=np.intp)
    padded = False
    for ow in range(ow_):
        first = ow * SW - pw
        j0 = min(KW, max(0, (-first + DW - 1) // DW))
        j1 = max(0, min(KW, (w_ - 1 - first) // DW + 1))
        windows[ow, 0], windows[ow, 1] = j0, j1
        padded = padded or j0 >= j1
    every_row = (1 << KH) - 1
    for r in range(r0, r1):
        n, oh = r // oh_, r % oh_
        ih0 = oh * sh - ph
        yo = (n * oh_ + oh) * ow_ * c_ + c0
        # the tap rows inside x (an int64 from the start: a literal 0 would have numba's
        # first typing pass compile span and edge once more for it)
        rows = np.int64(0)
        for i in range(KH):
            if 0 <= ih0 + i * DH < h_:
                rows |= 1 << i
        if padded or rows == 0:
            for i in range(KH):
                _fill(buf, i, x, n, ih0 + i * DH, -pw, buf.shape[1], c0)
            # buf seen as 4-D, as x is, and int64 zeros, not literal 0s: span compiled
            # for one signature, not two (0.6-0.9 s of a cold kernel's compile)
            span(y, yo, buf4, zero, plane, cb, wk, c0, cb, zero, ow_, zero, every_row, bias,
                 act, bad)
            continue
        row = ((n * h_ + ih0) * w_) * c_ + c0  # tap row 0, which may lie outside x
        for ow in range(lo):
            edge(y, yo + ow * c_, x, row + (ow * SW - pw) * c_, DH * w_ * c_, c_, wk,
                 c0, cb, windows[ow, 0], windows[ow, 1], rows, bias, act, bad)
        span(y, yo, x, row, DH * w_ * c_, c_, wk, c0, cb, lo, hi, lo * SW - pw, rows,
             bias, act, bad)
        for ow in range(hi, ow_):
            edge(y, yo + ow * c_, x, row + (ow * SW - pw) * c_, DH * w_ * c_, c_, wk,
                 c0, cb, windows[ow, 0], windows[ow, 1], rows, bias, act, bad)
    if STREAMING:
        store_fence()


def kernel(x, wk, oh_, ow_, sh, ph, pw, row_parts, channel_parts, raw,  # noqa: PLR0913
           bias, act):
    """row_parts x channel_parts tasks (:func:`task`) over y (N, OH, OW, C)."""
    n_, c_ = x.shape[0], x.shape[3]
    y = _cache_line_aligned(raw, n_, oh_, ow_, c_)
    rows = y.shape[0] * y.shape[1]
    wp_ = (y.shape[2] - 1) * SW + REACH
    chunks = (c_ + GRAIN - 1) // GRAIN
    if CHECKED:
        bad = violations()
    else:
        bad = None  # (the checks compiled out: nothing to pass)
    for task_id in prange(row_parts * channel_parts):
        p, g = task_id // channel_parts, task_id % channel_parts
        c0 = min(c_, g * chunks // channel_parts * GRAIN)
        c1 = min(c_, (g + 1) * chunks // channel_parts * GRAIN)
        buf = np.empty((KH, wp_, c1 - c0), dtype=y.dtype)
        task(x, wk, y, buf, p * rows // row_parts, (p + 1) * rows // row_parts,
             c0, sh, ph, pw, bias, act, bad)
    if CHECKED and bad[0]:
        fail("depthwise forward kernel", BUFFERS, bad)
    return y


parallel = compiled("parallel", parallel=True, nogil=True)(kernel)
serial = compiled("serial", nogil=True)(kernel)
