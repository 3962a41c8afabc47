"""A fast test for NaN or infinity, for algorithms that would smear them."""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def nonfinite(a):
    """Whether a holds a NaN or an infinity (0 * v is NaN exactly for those)."""
    total = 0.0
    for v in a.reshape(-1):
        total += v * 0
    return total != 0
