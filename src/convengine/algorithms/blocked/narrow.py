"""``blocked`` backward-data for few input channels (the stems): a GEMM and its col2im in cache.

A 3-channel stem's dx has too few channels for the forward kernel's panels (a vector
of dx channels per multiply-add), and ``im2col``'s column matrix is as large as the
whole reduction. The columns are the products of dy's rows with the weights::

    cols[n, p, q, (a, b, c)] = sum_o dy[n, p, q, o] * w[o, a, b, c]
    dx[n, p * sh - ph + a * dh, q * sw - pw + b * dw, c] += cols[n, p, q, (a, b, c)]

Here the columns of 6 neighbouring dy pixels are made by the register-blocked
micro-kernel (:func:`~convengine.algorithms.fma.gemm_6xnr`, a tile of 6 x NR) on the
weights packed in blocks of NR columns, and added into dx at once, while the tile is
in L1: no column matrix. A kernel row's taps land side by side in dx (dilation 1
along W), so each run of them (:func:`pack`) is added as one contiguous stretch of
dx. Output rows in bands (:func:`band_rows`) tall enough that bands two apart
never write the same dx row: the threads take the even bands, then the odd ones, so
no two threads add into the same dx values and the sums' order does not depend on
the thread count. Serves any stride, padding and dilation, 1-D and 2-D, groups 1,
float32, input channels below :data:`MAX_CHANNELS`.

The first version (2026-12-07) summed each dx pixel's taps with accumulator rows in
memory (dot products along O, vectorised by LLVM), about a tenth of the host's peak:
on Emerald Rapids (2 threads, against PyTorch 2.13's oneDNN in the same process)
ResNet-50's 7x7/2 stem 35 GFLOP/s at batch 8, 0.64x, MobileNetV2's 3x3/2 stem 19,
0.46x.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..._kernel_cache import kernel
from ...checked import CHECKED, NO_CHECKS, fail, violations, within
from ...problem import ConvProblem
from ...threads import get_num_threads
from ..fma import MR, add_run, gemm_6xnr, nr

MAX_CHANNELS = 8  # input channels (dx's) this path serves: the stems' 1, 3 or 4
NR = nr(4)  # float32 columns of the micro-kernel's tile (64 with AVX-512, 16 with AVX2)
BUFFERS = ("dy", "packed weights", "tile", "dx")  # checked mode: the raw-pointer buffers


def reason(problem: ConvProblem) -> str | None:
    """Why this path cannot serve a backward-data problem, or None."""
    if problem.groups != 1:
        return f"groups={problem.groups} != 1"
    if problem.in_channels >= MAX_CHANNELS:
        return f"{problem.in_channels} input channels (the narrow path takes < {MAX_CHANNELS})"
    return None


def workspace(problem: ConvProblem) -> int:
    """Bytes: the packed weights (whole blocks of NR columns, at most a block per kernel
    row more than their columns), a tile per thread, the runs' table."""
    kh, kw = ((1,) * (2 - problem.ndim) + problem.kernel)[-2:]
    columns = kh * kw * problem.in_channels
    blocks = -(-columns // NR) + kh
    return 4 * (blocks * NR * problem.out_channels + get_num_threads() * MR * NR) \
        + 8 * 4 * kh * kw


def pack(w: np.ndarray, dilation_w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w ``(O, KH, KW, C)`` -> (the weights in blocks ``(blocks, O, NR)``, zero past the
    columns; ``runs (R, 4)``: a run's first column in its block, kernel row ``a``, first
    tap ``b`` and taps; ``starts (blocks + 1,)``: block ``k``'s runs are ``runs[starts[k]:
    starts[k + 1]]``). A run is taps of one kernel row whose ``(b, c)`` values are
    adjacent in dx (several only at dilation 1 along W), at most NR values, never split
    across blocks."""
    o, kh, kw, c = w.shape
    per_run = max(1, NR // c) if dilation_w == 1 else 1
    runs: list[tuple[int, int, int, int]] = []
    starts, used = [0], 0
    for a in range(kh):
        for b in range(0, kw, per_run):
            taps = min(per_run, kw - b)
            if used + taps * c > NR:
                starts.append(len(runs))
                used = 0
            runs.append((used, a, b, taps))
            used += taps * c
    starts.append(len(runs))
    blocks = len(starts) - 1
    packed = np.zeros((blocks, o, NR), np.float32)
    for k in range(blocks):
        for col, a, b, taps in runs[starts[k]:starts[k + 1]]:
            packed[k, :, col:col + taps * c] = w[:, a, b:b + taps].reshape(o, -1)
    return packed, np.array(runs, np.int64).reshape(-1, 4), np.array(starts, np.int64)


def band_rows(kernel_h: int, stride_h: int, dilation_h: int) -> int:
    """dy rows per band: the fewest such that the dx rows of bands two apart never meet
    (a band of ``B`` rows writes dx rows ``[B k sh - ph, (B (k + 1) - 1) sh - ph + (KH - 1)
    dh]``: ``(KH - 1) dh - sh < B sh``)."""
    return max(1, ((kernel_h - 1) * dilation_h - stride_h) // stride_h + 1)


def backward_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """dy ``(N, *S_out, O)``, w ``(O, *K, C)`` float32 -> dx ``(N, *S, C)``."""
    lead = 2 - problem.ndim
    two = (1,) * lead
    kh, kw = two + problem.kernel
    sh, sw = two + problem.stride
    dh, dw = two + problem.dilation
    ph, pw = (0,) * lead + tuple(lo for lo, _ in problem.padding)
    packed, runs, starts = pack(w.reshape(w.shape[0], kh, kw, -1), dw)
    dy4 = np.ascontiguousarray(dy).reshape(dy.shape[0], *two, *dy.shape[1:])
    dx = np.zeros(problem.x_shape("NHWC"), np.float32)
    geometry = np.array([sh, sw, ph, pw, dh, dw], np.int64)
    scatter(dy4, packed, runs, starts, dx.reshape(dx.shape[0], *two, *dx.shape[1:]),
            geometry, band_rows(kh, sh, dh))
    return dx


@njit(inline="always")
def _gemm_inside(bad, dyf, a_off, o_, packed, b_off, mr, tile):  # noqa: ANN001, ANN201
    """Checked mode: whether ``gemm_6xnr`` reads ``mr`` rows of ``o_`` values of dy from
    ``a_off`` and ``o_`` rows of NR weights from ``b_off``, and writes ``mr`` rows of NR
    of the tile, inside their buffers."""
    return (within(bad, 1, dyf.size, a_off, a_off + (mr - 1) * o_ + o_)
            and within(bad, 2, packed.size, b_off, b_off + o_ * NR)
            and within(bad, 3, tile.size, 0, mr * NR))


@njit(inline="always")
def _run_inside(bad, dxf, d0, tile, s0, count):  # noqa: ANN001, ANN201
    """Checked mode: whether ``add_run`` of ``count`` values stays inside dx and the tile."""
    return count <= 0 or (within(bad, 4, dxf.size, d0, d0 + count)
                          and within(bad, 3, tile.size, s0, s0 + count))


@kernel(parallel=True, nogil=True)
def scatter(dy, packed, runs, starts, dx, geometry, band):  # noqa: PLR0913
    """dx (N, H, W, C), zero on entry, += the columns of dy (N, OH, OW, O) by the
    packed weights (:func:`pack`) at their dx positions; ``geometry`` [sh, sw, ph, pw,
    dh, dw]; ``band`` dy rows a task (:func:`band_rows`), even bands first."""
    n_, oh_, ow_, o_ = dy.shape
    _, h_, w_, c_ = dx.shape
    sh, sw, ph, pw, dh, dw = (geometry[0], geometry[1], geometry[2], geometry[3],
                              geometry[4], geometry[5])
    dyf, pf, dxf = dy.reshape(-1), packed.reshape(-1), dx.reshape(-1)
    bands = (oh_ + band - 1) // band
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    for parity in range(2):
        per_image = (bands - parity + 1) // 2
        for t in prange(n_ * per_image):
            n, k = t // per_image, 2 * (t % per_image) + parity
            tile = np.empty(MR * NR, np.float32)
            for p in range(k * band, min(oh_, (k + 1) * band)):
                for q0 in range(0, ow_, MR):
                    mr = min(MR, ow_ - q0)
                    a_off = ((n * oh_ + p) * ow_ + q0) * o_
                    for blk in range(starts.size - 1):
                        b_off = blk * o_ * NR
                        if CHECKED and not _gemm_inside(bad, dyf, a_off, o_, pf, b_off, mr,
                                                        tile):
                            continue
                        gemm_6xnr(dyf, a_off, o_, pf, b_off, o_, mr, tile, 0, NR, False, 0)
                        for r in range(mr):
                            for u in range(starts[blk], starts[blk + 1]):
                                col, a, b0, taps = runs[u, 0], runs[u, 1], runs[u, 2], runs[u, 3]
                                i = p * sh - ph + a * dh
                                if i < 0 or i >= h_:
                                    continue
                                row = (n * h_ + i) * w_
                                j0 = (q0 + r) * sw - pw + b0 * dw  # tap b0's dx column
                                lo = 0 if j0 >= 0 else (dw - 1 - j0) // dw
                                last = j0 + (taps - 1) * dw
                                hi = taps if last < w_ else (w_ - 1 - j0) // dw + 1
                                if dw == 1:  # the run's values side by side in dx
                                    d0, s0 = (row + j0 + lo) * c_, r * NR + col + lo * c_
                                    if CHECKED and not _run_inside(bad, dxf, d0, tile, s0,
                                                                   (hi - lo) * c_):
                                        continue
                                    add_run(dxf, d0, tile, s0, (hi - lo) * c_)
                                else:
                                    for tb in range(lo, hi):
                                        d0 = (row + j0 + tb * dw) * c_
                                        s0 = r * NR + col + tb * c_
                                        for e in range(c_):
                                            dxf[d0 + e] += tile[s0 + e]
    if CHECKED and bad[0]:
        fail("blocked narrow backward-data kernel", BUFFERS, bad)
