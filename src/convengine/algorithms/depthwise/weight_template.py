"""Kernel template (see ``convengine._kernel_cache``): the depthwise backward-weight
for one (KH, KW) kernel shape, width stride ``SW`` and width dilation ``DW``, over the
generated rows intrinsic of :func:`convengine.algorithms.depthwise.weight._rows_intrinsic`;
made by :func:`~convengine.algorithms.depthwise.weight.weight_kernel`, whose docstring
says what ``parallel`` and ``serial`` compute. In checked mode (:mod:`convengine.checked`)
each call of the rows intrinsic is checked first (:func:`inside`: its acc, x, dy and info
ranges), skipped if it reaches outside one, and the kernel raises BoundsError after its
parallel loop."""

import numpy as np
from numba import njit, prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.depthwise.forward import NOALIAS, VECTOR_BYTES, row_reach
from convengine.algorithms.depthwise.weight import NVEC, _rows_intrinsic
from convengine.checked import CHECKED, fail, violations, within

KH, KW, SW, DW = parameters(__name__, "KH", "KW", "SW", "DW")
rows = _rows_intrinsic(KH, KW, SW, DW)
REACH = (KW - 1) * DW + 1  # input columns one output pixel reads
BUFFERS = ("acc", "x", "dy", "info")


@njit(inline="always")
def extremes(col0, pa, pb, j, w_):  # noqa: ANN001, ANN201
    """(lowest, highest, any) of the columns ``col0 + p*SW + j*DW`` inside ``[0, w_)``
    over the pixels ``pa <= p < pb``."""
    base = col0 + j * DW
    p_lo = max(pa, -(base // SW))  # the first p with base + p*SW >= 0
    p_hi = min(pb - 1, (w_ - 1 - base) // SW)  # the last with base + p*SW < w_
    return base + p_lo * SW, base + p_hi * SW, p_lo <= p_hi


@njit(inline="always")
def inside(bad, acc, x, dy, info, c0, rs, cs, r0, r1, ow_, lo, hi, col0, w_,  # noqa: ANN001, ANN201, PLR0913
           valid):
    """Whether one ``rows`` call (its arguments as passed) stays inside its buffers
    (checked mode). Its exact footprint, from the intrinsic's code (prefetches, which
    never fault, aside), with ``used = min(valid, NVEC*L)`` (L: lanes of a vector of
    acc's dtype) the lanes its masks let through (every load and store of acc, x and dy
    is masked to them), for rows ``r0 <= r < r1`` taking ``xo, dyo, bits =
    info[r]`` and pixels ``p < ow_`` (0 <= lo <= hi <= ow_, as task passes them):

    - info: its rows r0:r1, 3 values each (plain loads);
    - acc: taps ``t < KH*KW`` at ``t*cs + c0``, ``used`` lanes each, read and written;
    - dy: every pixel of each row, ``dyo + c0 + p*cs``, ``used`` lanes;
    - x: tap rows ``i`` whose bit is set (the others are masked off: no load), at
      ``xo + c0 + i*rs + col*cs``, ``used`` lanes, over the columns ``col = col0 +
      p*SW + j*DW``: where every bit is set, those of the pixels ``lo <= p < hi``
      unclipped (read unchecked), and of the other pixels only those inside ``[0,
      w_)`` (a tap outside is masked off at x's start: no load).
    """
    used = min(valid, NVEC * (VECTOR_BYTES // acc.itemsize))
    if r1 > r0 and not within(bad, 4, info.size, 3 * r0, 3 * r1):
        return False
    if used <= 0:  # every lane masked off: only info is read
        return True
    taps = KH * KW
    if not within(bad, 1, acc.size, c0 + min(0, (taps - 1) * cs),
                  c0 + max(0, (taps - 1) * cs) + used):
        return False
    full = (1 << KH) - 1
    flat = info.reshape(-1)
    for r in range(r0, r1):
        xo, dyo, bits = flat[3 * r], flat[3 * r + 1], flat[3 * r + 2]
        if ow_ > 0 and not within(bad, 3, dy.size, dyo + c0 + min(0, (ow_ - 1) * cs),
                                  dyo + c0 + max(0, (ow_ - 1) * cs) + used):
            return False
        row_lo, row_hi, any_row = row_reach(bits, KH, rs)
        if not any_row:
            continue
        unchecked = bits == full and hi > lo
        # the checked pixels: [0, lo) and [hi, ow_) where every bit is set, else all
        a0, a1, b0, b1 = (0, lo, hi, ow_) if unchecked else (0, ow_, ow_, ow_)
        col_lo, col_hi, any_col = 0, 0, False
        if unchecked:
            col_lo, col_hi, any_col = col0 + lo * SW, col0 + (hi - 1) * SW + (KW - 1) * DW, True
        for j in range(KW):
            for pa, pb in ((a0, a1), (b0, b1)):
                first, last, some = extremes(col0, pa, pb, j, w_)
                if some:
                    col_lo = first if not any_col else min(col_lo, first)
                    col_hi = last if not any_col else max(col_hi, last)
                    any_col = True
        if any_col and not within(
                bad, 2, x.size, xo + c0 + row_lo + min(col_lo * cs, col_hi * cs),
                xo + c0 + row_hi + max(col_lo * cs, col_hi * cs) + used):
            return False
    return True


@compiled(**NOALIAS)
def task(x, dy, acc, r0, r1, sh, ph, pw, dh, band, bad):  # noqa: PLR0913
    """acc (KH*KW, C) <- the sums over output rows r0:r1 (over n and oh). ``bad``:
    checked mode's record of a call outside its buffers, else None."""
    h_, w_, c_ = x.shape[1], x.shape[2], x.shape[3]
    oh_, ow_ = dy.shape[1], dy.shape[2]
    acc[...] = 0
    # columns whose taps all fall inside x: [lo, hi)
    lo = min(ow_, (pw + SW - 1) // SW)
    hi = max(lo, min(ow_, (w_ - 1 + pw - (REACH - 1)) // SW + 1))
    info = np.empty((r1 - r0, 3), dtype=np.intp)
    for r in range(r0, r1):
        n, oh = r // oh_, r % oh_
        ih0 = oh * sh - ph
        bits = 0
        for i in range(KH):
            if 0 <= ih0 + i * dh < h_:
                bits |= 1 << i
        info[r - r0, 0] = (n * h_ + ih0) * w_ * c_
        info[r - r0, 1] = (n * oh_ + oh) * ow_ * c_
        info[r - r0, 2] = bits
    lanes = NVEC * VECTOR_BYTES // x.itemsize
    for b0 in range(0, r1 - r0, band):
        b1 = min(r1 - r0, b0 + band)
        for c0 in range(0, c_, lanes):
            if CHECKED and not inside(bad, acc, x, dy, info, c0, dh * w_ * c_, c_, b0, b1,
                                      ow_, lo, hi, -pw, w_, min(lanes, c_ - c0)):
                continue
            rows(acc, x, dy, info, c0, dh * w_ * c_, c_, b0, b1, ow_, lo, hi, -pw, w_,
                 min(lanes, c_ - c0))


def kernel(x, dy, dw, sh, ph, pw, dh, band, parts):  # noqa: PLR0913
    """``parts`` tasks (:func:`task`) into partial sums, then their sum into dw."""
    c_, taps = dw.shape
    total = dy.shape[0] * dy.shape[1]
    part = np.empty((parts, taps, c_), dtype=dw.dtype)
    if CHECKED:
        bad = violations()
    else:
        bad = None  # (the checks compiled out: nothing to pass)
    for p in prange(parts):
        task(x, dy, part[p], p * total // parts, (p + 1) * total // parts, sh, ph, pw, dh,
             band, bad)
    if CHECKED and bad[0]:  # before dw is written: dw keeps what it held
        fail("depthwise backward-weight kernel", BUFFERS, bad)
    for c in range(c_):
        for t in range(taps):
            s = part[0, t, c]
            for p in range(1, parts):
                s += part[p, t, c]
            dw[c, t] = s


parallel = compiled("parallel", parallel=True, nogil=True)(kernel)
serial = compiled("serial", nogil=True)(kernel)
