"""Kernel template (see ``convengine._kernel_cache``): the blocked forward over
gathered micro-tiles of ``MR`` output pixels x ``NR = VEC * NVEC`` channels (stored
non-temporally if ``STREAMING``), the reduction in chunks where asked; made by
:func:`convengine.algorithms.blocked.forward._gather_driver`, whose docstring says what
``run`` computes."""

import numpy as np
from numba import njit, prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.blocked.forward import FIRST, LAST, MIDDLE, WHOLE, _make_ukernel
from convengine.algorithms.fma import store_fence
from convengine.checked import CHECKED, fail, violations, within

MR, NVEC, NR, STREAMING = parameters(__name__, "MR", "NVEC", "NR", "STREAMING")
ukernel = _make_ukernel(MR, NVEC, gather=True, streaming=STREAMING)
BUFFERS = ("x", "w", "y", "bias", "res")


@njit(inline="always")
def span(first, count, stride):  # noqa: ANN001, ANN201
    """(lowest, highest) of ``first + i * stride`` for ``i < count`` (count >= 1)."""
    last = first + (count - 1) * stride
    return min(first, last), max(first, last)


@njit(inline="always")
def inside(bad, xf, offsets, x0, m, hs, ws, kh_, taps, run_len, wf, w_at, w_row,  # noqa: PLR0913
           w_col, w_step, yf, y_at, ys, bias, b_at, res, has_res, lanes):  # noqa: ANN001, ANN201
    """Whether one micro-kernel call stays inside its buffers (checked mode): x rows at
    ``x0 + offsets[:m]`` over kh_ x taps x run_len, the weight walk's NR lanes, y (and
    res) rows of ``lanes``, the bias's NR lanes."""
    x_lo, x_hi = offsets[0], offsets[0]
    for r in range(1, m):
        x_lo, x_hi = min(x_lo, offsets[r]), max(x_hi, offsets[r])
    x_hi += (kh_ - 1) * hs + (taps - 1) * ws + run_len
    a_lo, a_hi = span(w_at, kh_, w_row)
    b_lo, b_hi = span(0, taps, w_col)
    k_lo, k_hi = span(0, run_len, w_step)
    y_hi = y_at + (m - 1) * ys + lanes
    return (within(bad, 1, xf.size, x0 + x_lo, x0 + x_hi)
            and within(bad, 2, wf.size, a_lo + b_lo + k_lo, a_hi + b_hi + k_hi + NR)
            and within(bad, 3, yf.size, y_at, y_hi)
            and within(bad, 4, bias.size, b_at, b_at + NR)
            and (not has_res or within(bad, 5, res.size, y_at, y_hi)))


@njit(inline="always")
def part_of(piece, pieces):  # noqa: ANN001, ANN201
    """The ``part`` code of piece ``piece`` of a reduction split in ``pieces``."""
    if pieces == 1:
        return WHOLE
    return FIRST if piece == 0 else (LAST if piece == pieces - 1 else MIDDLE)


@compiled(parallel=True, nogil=True)
def run(xp, wf, y, bias, res, has_res, act, sh, sw, dh, dw, per_task,  # noqa: PLR0913
        blocks_inside, chunk, ahead, kh_, kw_, w_first, w_block, w_row, w_col, w_step,
        fused):
    n_, hp, wpx, c_ = xp.shape
    _, oh_, ow_, o_ = y.shape
    blocks = (o_ + NR - 1) // NR
    xf, yf, rf = xp.reshape(-1), y.reshape(-1), res.reshape(-1)
    image, pixels = oh_ * ow_, n_ * oh_ * ow_
    tiles = (pixels + MR - 1) // MR
    # fused: a kernel row's taps are one contiguous run of kw * c, input and weights
    taps, run_len = (1, kw_ * c_) if fused else (kw_, c_)
    # the run in pieces of ``chunk`` (0: whole), each piece's weights reused across
    # the task's tiles from L1, the partial sums kept in y between pieces
    piece_len = run_len if chunk <= 0 or chunk >= run_len else chunk
    pieces = (run_len + piece_len - 1) // piece_len
    # a task: its tiles times one block, or times every block (each pixel's
    # channels then written at once, the tile's input read from L1)
    task_blocks = 1 if blocks_inside else blocks
    if CHECKED:
        bad = violations()
    for t in prange(((tiles + per_task - 1) // per_task) * task_blocks):
        g, b0 = t // task_blocks, t % task_blocks
        offsets = np.empty(MR, np.intp)
        first = g * per_task
        for piece in range(pieces):
            k0 = piece * piece_len
            k_len, part = min(piece_len, run_len - k0), part_of(piece, pieces)
            # the output pixel (n, i, j) walked along, without a division per pixel
            n, q = (first * MR) // image, (first * MR) % image
            i, j = q // ow_, q % ow_
            for tile in range(first, min(tiles, first + per_task)):
                p0 = tile * MR
                m = min(MR, pixels - p0)
                for r in range(m):
                    offsets[r] = ((n * hp + i * sh) * wpx + j * sw) * c_
                    j += 1
                    if j == ow_:
                        j, i = 0, i + 1
                        if i == oh_:
                            i, n = 0, n + 1
                for ob in range(b0, blocks if blocks_inside else b0 + 1):
                    w_at = w_first + ob * w_block + k0 * w_step
                    if CHECKED and not inside(bad, xf, offsets, k0, m, dh * wpx * c_, dw * c_,
                                              kh_, taps, k_len, wf, w_at, w_row, w_col,
                                              w_step, yf, p0 * o_ + ob * NR, o_, bias,
                                              ob * NR, rf, has_res, min(NR, o_ - ob * NR)):
                        continue
                    ukernel(xf, offsets, k0, dh * wpx * c_, dw * c_, kh_, taps, k_len, wf,
                            w_at, w_row, w_col, w_step, m, yf, p0 * o_ + ob * NR, o_, bias,
                            ob * NR, rf, has_res, act, min(NR, o_ - ob * NR), part, ahead)
        if STREAMING:
            store_fence()
    if CHECKED and bad[0]:
        fail("blocked gather kernel", BUFFERS, bad)
