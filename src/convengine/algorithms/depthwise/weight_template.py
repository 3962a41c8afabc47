"""Kernel template (see ``convengine._kernel_cache``): the depthwise backward-weight
for one (KH, KW) kernel shape, width stride ``SW`` and width dilation ``DW``, over the
generated rows intrinsic of :func:`convengine.algorithms.depthwise.weight._rows_intrinsic`;
made by :func:`~convengine.algorithms.depthwise.weight.weight_kernel`, whose docstring
says what ``parallel`` and ``serial`` compute."""

import numpy as np
from numba import prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.depthwise.forward import NOALIAS, VECTOR_BYTES
from convengine.algorithms.depthwise.weight import NVEC, _rows_intrinsic

KH, KW, SW, DW = parameters(__name__, "KH", "KW", "SW", "DW")
rows = _rows_intrinsic(KH, KW, SW, DW)
REACH = (KW - 1) * DW + 1  # input columns one output pixel reads


@compiled(**NOALIAS)
def task(x, dy, acc, r0, r1, sh, ph, pw, dh, band):  # noqa: PLR0913
    """acc (KH*KW, C) <- the sums over output rows r0:r1 (over n and oh)."""
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
            rows(acc, x, dy, info, c0, dh * w_ * c_, c_, b0, b1, ow_, lo, hi, -pw, w_,
                 min(lanes, c_ - c0))


def kernel(x, dy, dw, sh, ph, pw, dh, band, parts):  # noqa: PLR0913
    """``parts`` tasks (:func:`task`) into partial sums, then their sum into dw."""
    c_, taps = dw.shape
    total = dy.shape[0] * dy.shape[1]
    part = np.empty((parts, taps, c_), dtype=dw.dtype)
    for p in prange(parts):
        task(x, dy, part[p], p * total // parts, (p + 1) * total // parts, sh, ph, pw, dh,
             band)
    for c in range(c_):
        for t in range(taps):
            s = part[0, t, c]
            for p in range(1, parts):
                s += part[p, t, c]
            dw[c, t] = s


parallel = compiled("parallel", parallel=True, nogil=True)(kernel)
serial = compiled("serial", nogil=True)(kernel)
