"""Kernel template (see ``convengine._kernel_cache``): the blocked backward-weight for
blocks of ``MR`` broadcast values x ``NR = VEC * NVEC`` vector lanes; made by
:func:`convengine.algorithms.blocked.weight._driver`, whose docstring says what
``run`` computes."""

from numba import njit, prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.blocked.weight import VEC, _make_ukernel
from convengine.checked import CHECKED, fail, violations, within

(NVEC,) = parameters(__name__, "NVEC")
ukernel = _make_ukernel(NVEC)
NR = VEC * NVEC
BUFFERS = ("dy or x (broadcast)", "x or dy (vector)", "dw")


@njit(inline="always")
def reach(first, nn, nh, nw, step):  # noqa: ANN001, ANN201
    """(lowest, highest) of ``first + n*step[0] + h*step[1] + w*step[2]`` over the
    chunk's nn x nh x nw pixels."""
    lo = hi = first
    for count, stride in ((nn, step[0]), (nh, step[1]), (nw, step[2])):
        lo += min(0, (count - 1) * stride)
        hi += max(0, (count - 1) * stride)
    return lo, hi


@njit(inline="always")
def inside(bad, b, b_at, b_step, v, v_at, v_step, nn, nh, nw, m, y, y_at, ys):  # noqa: ANN001, ANN201, PLR0913
    """Whether one micro-kernel call stays inside its buffers (checked mode): m
    broadcast values and NR vector lanes per pixel, m rows of NR sums ``ys`` apart."""
    b_lo, b_hi = reach(b_at, nn, nh, nw, b_step)
    v_lo, v_hi = reach(v_at, nn, nh, nw, v_step)
    return (within(bad, 1, b.size, b_lo, b_hi + m)
            and within(bad, 2, v.size, v_lo, v_hi + NR)
            and within(bad, 3, y.size, y_at, y_at + (m - 1) * ys + NR))


@compiled(parallel=True, nogil=True)
def run(b, v, y, tasks, b_step, v_step, ys, n_, oh_, ow_, imgs, rows, workers):  # noqa: PLR0913
    count = tasks.shape[0]
    if CHECKED:
        bad = violations()
    for worker in prange(workers):
        first, stop = worker * count // workers, (worker + 1) * count // workers
        for n0 in range(0, n_, imgs):
            nn = min(imgs, n_ - n0)
            for h0 in range(0, oh_, rows):
                nh = min(rows, oh_ - h0)
                add = 0 if n0 == 0 and h0 == 0 else 1
                b_base = n0 * b_step[0] + h0 * b_step[1]
                v_base = n0 * v_step[0] + h0 * v_step[1]
                for t in range(first, stop):
                    if CHECKED and not inside(bad, b, b_base + tasks[t, 0], b_step, v,
                                              v_base + tasks[t, 1], v_step, nn, nh, ow_,
                                              tasks[t, 3], y, tasks[t, 2], ys):
                        continue
                    ukernel(b, b_base + tasks[t, 0], b_step[0], b_step[1], b_step[2],
                            nn, nh, ow_, v, v_base + tasks[t, 1], v_step[0], v_step[1],
                            v_step[2], tasks[t, 3], y, tasks[t, 2], ys, add)
    if CHECKED and bad[0]:
        fail("blocked backward-weight kernel", BUFFERS, bad)
