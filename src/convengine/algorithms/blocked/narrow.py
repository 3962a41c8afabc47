"""``blocked`` backward-data for few input channels (the stems): dot products along O.

A 3-channel stem's dx has too few channels for the forward kernel's panels (a vector
of output channels per multiply-add), and its column matrix (``im2col``'s col2im) is
as large as the whole reduction. Here each dx pixel is the sum, over the taps that
reach it, of dy's row at that tap (O contiguous values, channels-last) times the
weights of the tap, one row of O per input channel::

    dx[n, i, j, c] = sum_{a, b reaching (i, j)} sum_o dy[n, p, q, o] * wt[a, b, c, o]

with ``p = (i + pad_h - a * dil_h) / stride_h`` (a tap reaches the pixel where that
is a whole number inside dy), likewise ``q``. The products are summed along o in an
accumulator row per input channel (vectorised over o), the row summed once per
pixel: no column matrix, and dy read straight from where the forward wrote it.
Threads share out the dx rows. Serves any stride, padding and dilation, 1-D and 2-D,
groups 1, float32, input channels below :data:`MAX_CHANNELS`, where a pixel's taps
are enough to repay clearing and summing its accumulator rows: at least
:data:`MIN_TAPS` taps reach a pixel on average (kernel size over stride).

Measured 2026-12-07 on an AMD EPYC Zen 4 (2 threads, against PyTorch 2.13's oneDNN
in the same process): ResNet-50's 7x7/2 stem at batch 8 (1.9 GFLOP, 12.25 taps a
pixel) 28.9 GFLOP/s, where ``im2col`` ran 11.4 and PyTorch 40; MobileNetV2's 3x3/2
stem (2.25 taps) 8.8, ``im2col`` 10.5: left to ``im2col``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..._kernel_cache import kernel
from ...problem import ConvProblem

MAX_CHANNELS = 8  # input channels (dx's) this path serves: the stems' 1, 3 or 4
MIN_TAPS = 4  # taps reaching a pixel on average, at least


def reason(problem: ConvProblem) -> str | None:
    """Why this path cannot serve a backward-data problem, or None."""
    if problem.groups != 1:
        return f"groups={problem.groups} != 1"
    if problem.in_channels >= MAX_CHANNELS:
        return f"{problem.in_channels} input channels (the narrow path takes < {MAX_CHANNELS})"
    if math.prod(problem.kernel) < MIN_TAPS * math.prod(problem.stride):
        return (f"kernel {problem.kernel} at stride {problem.stride}: under {MIN_TAPS} taps "
                f"reach a pixel (the narrow path's accumulators cost more)")
    return None


def workspace(problem: ConvProblem) -> int:
    """Bytes: the transposed weights, and one accumulator row per thread and channel."""
    taps = int(np.prod(problem.kernel))
    return 4 * problem.out_channels * problem.in_channels * (taps + 64)


def backward_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """dy ``(N, *S_out, O)``, w ``(O, *K, C)`` float32 -> dx ``(N, *S, C)``."""
    lead = 2 - problem.ndim
    two = (1,) * lead
    kh, kw = two + problem.kernel
    wt = np.ascontiguousarray(np.moveaxis(w.reshape(w.shape[0], kh, kw, -1), 0, -1))
    dy4 = np.ascontiguousarray(dy).reshape(dy.shape[0], *two, *dy.shape[1:])
    dx = np.empty(problem.x_shape("NHWC"), np.float32)
    dx4 = dx.reshape(dx.shape[0], *two, *dx.shape[1:])
    sh, sw = two + problem.stride
    dh, dw = two + problem.dilation
    ph, pw = (0,) * lead + tuple(lo for lo, _ in problem.padding)
    _rows(dy4, wt, dx4, sh, sw, ph, pw, dh, dw)
    return dx


@kernel(parallel=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
def _rows(dy, wt, dx, sh, sw, ph, pw, dh, dw):  # noqa: PLR0913
    """dx (N, H, W, C) from dy (N, OH, OW, O) and wt (KH, KW, C, O), one dx row a task."""
    n_, oh_, ow_, o_ = dy.shape
    kh_, kw_, c_, _ = wt.shape
    _, h_, w_, _ = dx.shape
    for t in prange(n_ * h_):
        n, i = t // h_, t % h_
        acc = np.empty((c_, o_), np.float32)
        for j in range(w_):
            acc[:] = 0
            for a in range(kh_):
                top = i + ph - a * dh
                if top < 0 or top % sh != 0 or top // sh >= oh_:
                    continue
                p = top // sh
                for b in range(kw_):
                    left = j + pw - b * dw
                    if left < 0 or left % sw != 0 or left // sw >= ow_:
                        continue
                    q = left // sw
                    for c in range(c_):
                        for o in range(o_):
                            acc[c, o] += dy[n, p, q, o] * wt[a, b, c, o]
            for c in range(c_):
                total = np.float32(0)
                for o in range(o_):
                    total += acc[c, o]
                dx[n, i, j, c] = total
