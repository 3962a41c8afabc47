"""Checked mode: kernels check the range of every tile against the buffers they were given.

``CONVENGINE_CHECKED=1`` (read once at import, as ``CONVENGINE_ISA``: the kernels are
compiled with the checks or without them, and the kernel caches key on it) makes each
kernel that computes addresses check, before every micro-kernel call, that the whole
range the call reads or writes lies inside its buffers. A call that would not is
skipped (nothing outside a buffer is touched) and the kernel raises :class:`BoundsError`
naming itself, the buffer, the range and the buffer's size; kernels that index arrays
(every function compiled through ``convengine._kernel_cache``) are compiled with
numba's ``boundscheck`` (an ``IndexError`` naming the index and the array's length; a
parallel loop holding such a check may run serially). The memory pool then also
surrounds each array with guard bytes, verified when its block comes back, and poisons
freed blocks (see :mod:`convengine.memory`).

Off (the default), :data:`CHECKED` is a constant False in the kernels and numba drops
the checks: the normal build is the same code with nothing inserted. In a kernel::

    bad = violations()                         # before the parallel loop
    for t in prange(tasks):
        if CHECKED and not within(bad, 1, xf.size, x_first, x_stop):
            continue                           # (one site number per buffer)
        ukernel(...)
    if CHECKED and bad[0]:
        fail("blocked gather kernel", ("x", "w", "y"), bad)
"""

from __future__ import annotations

import os

import numpy as np
from numba import njit

CHECKED_ENV = "CONVENGINE_CHECKED"
_BOOLEANS = {"": False, "0": False, "off": False, "false": False,
             "1": True, "on": True, "true": True}


def _parse(value: str) -> bool:
    try:
        return _BOOLEANS[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{CHECKED_ENV}={value!r}: expected 1/on/true or 0/off/false") from None


CHECKED: bool = _parse(os.environ.get(CHECKED_ENV, ""))


class BoundsError(IndexError):
    """A kernel in checked mode found a call reaching outside one of its buffers.

    ``args``: (kernel, buffer, first, stop, size): elements ``[first, stop)`` of a
    buffer of ``size`` elements."""

    def __str__(self) -> str:
        if len(self.args) != 5:
            return super().__str__()
        kernel, buffer, first, stop, size = self.args
        return (f"convengine checked mode: {kernel} would access {buffer}[{first}:{stop}], "
                f"outside its {size} elements")


@njit(inline="always", nogil=True)
def within(bad, site, size, first, stop):  # noqa: ANN001, ANN201
    """Whether elements ``[first, stop)`` lie in a buffer of ``size``; if not, records
    (site, first, stop, size) in ``bad`` (int64[4], from :func:`violations`)."""
    if 0 <= first and stop <= size:
        return True
    bad[0], bad[1], bad[2], bad[3] = site, first, stop, size
    return False


#: the ``bad`` record of a kernel compiled without checks: passed along, never read
NO_CHECKS = np.zeros(4, np.int64)


@njit(nogil=True)
def violations():  # noqa: ANN201
    """The record :func:`within` fills: int64[4], site 0 while nothing was found."""
    return np.zeros(4, np.int64)


@njit(nogil=True)
def fail(kernel, buffers, bad):  # noqa: ANN001, ANN201
    """Raise :class:`BoundsError` for the violation in ``bad``: ``buffers[site - 1]``
    names the buffer."""
    raise BoundsError(kernel, buffers[bad[0] - 1], bad[1], bad[2], bad[3])
