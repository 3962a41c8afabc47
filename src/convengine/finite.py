"""A fast test for NaN or infinity, for algorithms that would smear them."""

from __future__ import annotations

from ._kernel_cache import kernel


@kernel(nogil=True, fastmath={"reassoc", "nsz", "contract"})
def nonfinite(a):
    """Whether a holds a NaN or an infinity (0 * v is NaN exactly for those). The sum
    runs in a's dtype, reassociated, so that LLVM vectorises it."""
    flat = a.reshape(-1)
    if flat.size == 0:
        return False
    total = flat[0] * 0
    for i in range(flat.size):
        total += flat[i] * 0
    return total != 0
