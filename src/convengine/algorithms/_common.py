"""Index helpers shared by the numpy-based algorithms (channels-last arrays)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ..problem import ConvProblem


def pad_spatial(x: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """Zero-pad the spatial dims of a channels-last x ``(N, *S, C)``; no copy if unpadded."""
    if all(p == (0, 0) for p in problem.padding):
        return x
    return np.pad(x, ((0, 0), *problem.padding, (0, 0)))


def padded_shape(problem: ConvProblem) -> tuple[int, ...]:
    """Channels-last shape of x once padded: ``(N, *(S + lo + hi), C)``."""
    sizes = tuple(n + lo + hi for n, (lo, hi) in zip(problem.in_size, problem.padding))
    return (problem.batch, *sizes, problem.in_channels)


def kernel_offsets(problem: ConvProblem) -> Iterator[tuple[int, ...]]:
    """Every kernel position ``(k_0, ..., k_{d-1})`` in C order."""
    return itertools.product(*(range(k) for k in problem.kernel))


def window(problem: ConvProblem, offset: tuple[int, ...]) -> tuple[slice, ...]:
    """Slices of the padded input that kernel position ``offset`` meets, one per
    output position: index with ``xp[(slice(None), *window(...), slice(None))]``."""
    return tuple(
        slice(k * d, k * d + s * (n - 1) + 1, s)
        for k, d, s, n in zip(offset, problem.dilation, problem.stride, problem.out_size)
    )


def crop_padding(xp: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """Inverse of :func:`pad_spatial` for a gradient w.r.t. the padded input."""
    index = tuple(
        slice(lo, lo + n) for n, (lo, _) in zip(problem.in_size, problem.padding)
    )
    return xp[(slice(None), *index, slice(None))]
