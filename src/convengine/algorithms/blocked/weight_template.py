"""Kernel template (see ``convengine._kernel_cache``): the blocked backward-weight for
blocks of ``MR`` broadcast values x ``NR = VEC * NVEC`` vector lanes; made by
:func:`convengine.algorithms.blocked.weight._driver`, whose docstring says what
``run`` computes."""

from numba import prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.blocked.weight import _make_ukernel

(NVEC,) = parameters(__name__, "NVEC")
ukernel = _make_ukernel(NVEC)


@compiled(parallel=True, nogil=True)
def run(b, v, y, tasks, b_step, v_step, ys, n_, oh_, ow_, imgs, rows, workers):  # noqa: PLR0913
    count = tasks.shape[0]
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
                    ukernel(b, b_base + tasks[t, 0], b_step[0], b_step[1], b_step[2],
                            nn, nh, ow_, v, v_base + tasks[t, 1], v_step[0], v_step[1],
                            v_step[2], tasks[t, 3], y, tasks[t, 2], ys, add)
