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
The taps reaching each dx row and column are worked out once per call
(:func:`reaching`): the kernel divides nothing (a division per tap and pixel, as the
first version did, took most of its time). Threads share out the dx rows. Serves any
stride, padding and dilation, 1-D and 2-D, groups 1, float32, input channels below
:data:`MAX_CHANNELS`.

Measured 2026-12-07 on an AMD EPYC Zen 4 (2 threads, interleaved with PyTorch 2.13's
oneDNN): ResNet-50's 7x7/2 stem at batch 8 (1.9 GFLOP) 35 GFLOP/s, 0.85x PyTorch,
where ``im2col`` ran 13 (0.33x); MobileNetV2's 3x3/2 stem 24 against 11 (0.72x
against 0.33x); at batch 1 0.82x and 0.55x against 0.39x and 0.34x.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..._kernel_cache import kernel
from ...problem import ConvProblem
from ...threads import get_num_threads

MAX_CHANNELS = 8  # input channels (dx's) this path serves: the stems' 1, 3 or 4


def reason(problem: ConvProblem) -> str | None:
    """Why this path cannot serve a backward-data problem, or None."""
    if problem.groups != 1:
        return f"groups={problem.groups} != 1"
    if problem.in_channels >= MAX_CHANNELS:
        return f"{problem.in_channels} input channels (the narrow path takes < {MAX_CHANNELS})"
    return None


def workspace(problem: ConvProblem) -> int:
    """Bytes: the transposed weights, one accumulator row per thread and channel, and
    the taps reaching each dx row and column (:func:`reaching`)."""
    taps = int(np.prod(problem.kernel))
    rows = problem.out_channels * problem.in_channels * (taps + get_num_threads())
    tables = 3 * sum(n * k for n, k in zip(problem.in_size, problem.kernel))
    return 4 * rows + 8 * tables


def reaching(size: int, out_size: int, taps: int, stride: int, pad: int,
             dilation: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position ``i < size`` of one dx axis, the taps ``a`` reaching it and their
    dy positions ``p = (i + pad - a * dilation) / stride`` (whole, inside dy):
    (count (size,), tap (size, taps), p (size, taps)), worked out once so that the
    kernel divides nothing."""
    i = np.arange(size)[:, None]
    a = np.arange(taps)[None, :]
    top = i + pad - a * dilation
    ok = (top >= 0) & (top % stride == 0) & (top // stride < out_size)
    order = np.argsort(~ok, axis=1, kind="stable")  # the reaching taps first, in order
    tap = np.take_along_axis(np.broadcast_to(a, ok.shape), order, axis=1)
    pos = np.take_along_axis(top // stride, order, axis=1)
    return ok.sum(axis=1).astype(np.intp), tap.astype(np.intp), pos.astype(np.intp)


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
    rows = reaching(dx4.shape[1], dy4.shape[1], kh, sh, ph, dh)
    cols = reaching(dx4.shape[2], dy4.shape[2], kw, sw, pw, dw)
    _rows(dy4, wt, dx4, *rows, *cols)
    return dx


@kernel(parallel=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
def _rows(dy, wt, dx, row_count, row_tap, row_p, col_count, col_tap, col_q):  # noqa: PLR0913
    """dx (N, H, W, C) from dy (N, OH, OW, O) and wt (KH, KW, C, O), one dx row a task;
    the taps reaching each row and column as :func:`reaching` gives them."""
    n_, _, _, o_ = dy.shape
    c_ = wt.shape[2]
    _, h_, w_, _ = dx.shape
    for t in prange(n_ * h_):
        n, i = t // h_, t % h_
        acc = np.empty((c_, o_), np.float32)
        for j in range(w_):
            acc[:] = 0
            for u in range(row_count[i]):
                a, p = row_tap[i, u], row_p[i, u]
                for v in range(col_count[j]):
                    b, q = col_tap[j, v], col_q[j, v]
                    for c in range(c_):
                        for o in range(o_):
                            acc[c, o] += dy[n, p, q, o] * wt[a, b, c, o]
            for c in range(c_):
                total = np.float32(0)
                for o in range(o_):
                    total += acc[c, o]
                dx[n, i, j, c] = total
