"""Kernel template (see ``convengine._kernel_cache``): the blocked forward over output
rows for one tile shape, ``MR`` pixels x ``NR = VEC * NVEC`` output channels; made by
:func:`convengine.algorithms.blocked.forward._driver`, whose docstring says what
``run`` computes."""

from numba import njit, prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.blocked.forward import _make_ukernel
from convengine.checked import CHECKED, fail, violations, within

MR, NVEC, NR = parameters(__name__, "MR", "NVEC", "NR")
ukernel = _make_ukernel(MR, NVEC)
BUFFERS = ("x", "w", "y")


@njit(inline="always")
def inside(bad, xf, x_off, ps, hs, ws, kh_, taps, run_len, wf, w_off, m, yf, y_off,  # noqa: PLR0913
           ys):  # noqa: ANN001, ANN201
    """Whether one micro-kernel call stays inside its buffers (checked mode): m pixels
    ``ps`` apart over kh_ x taps x run_len inputs, the packed weights' block, m rows of
    NR outputs ``ys`` apart."""
    return (within(bad, 1, xf.size, x_off,
                   x_off + (m - 1) * ps + (kh_ - 1) * hs + (taps - 1) * ws + run_len)
            and within(bad, 2, wf.size, w_off, w_off + kh_ * taps * run_len * NR)
            and within(bad, 3, yf.size, y_off, y_off + (m - 1) * ys + NR))


@compiled(parallel=True, nogil=True)
def run(xp, h0, w0, wp, yf, y0, yn, yh, yw, oh_, ow_, sh, sw, dh, dw,  # noqa: PLR0913
        per_task):
    n_, hp, wpx, c_ = xp.shape
    blocks, kh_, kw_ = wp.shape[0], wp.shape[1], wp.shape[2]
    xf, wf = xp.reshape(-1), wp.reshape(-1)
    segments = (ow_ + MR - 1) // MR
    groups = (segments + per_task - 1) // per_task  # of segments, per output row
    wblock = kh_ * kw_ * c_ * NR
    # unit column dilation: a kernel row's taps are one contiguous run of kw * c
    taps, run_len = (1, kw_ * c_) if dw == 1 else (kw_, c_)
    if CHECKED:
        bad = violations()
    for t in prange(n_ * oh_ * groups * blocks):
        row, g, ob = t // (groups * blocks), (t // blocks) % groups, t % blocks
        n, oh = row // oh_, row % oh_
        for s in range(g * per_task, min(segments, (g + 1) * per_task)):
            ow0 = s * MR
            x_off = ((n * hp + h0 + oh * sh) * wpx + w0 + ow0 * sw) * c_
            y_off = y0 + n * yn + oh * yh + ow0 * yw + ob * NR
            if CHECKED and not inside(bad, xf, x_off, sw * c_, dh * wpx * c_, dw * c_, kh_,
                                      taps, run_len, wf, ob * wblock, min(MR, ow_ - ow0),
                                      yf, y_off, yw):
                continue
            ukernel(xf, x_off, sw * c_, dh * wpx * c_, dw * c_, kh_, taps, run_len,
                    wf, ob * wblock, min(MR, ow_ - ow0), yf, y_off, yw)
    if CHECKED and bad[0]:
        fail("blocked rows kernel", BUFFERS, bad)
