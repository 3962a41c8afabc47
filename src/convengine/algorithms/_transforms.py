"""Backward passes as forward convolutions of transformed problems (JAX's transpose rules).

For stride 1, the gradient w.r.t. x is a forward convolution of dy with the
spatially flipped kernel whose in/out channels are swapped, padded by
``extent - 1 - pad`` on each side (extent = dilated kernel size).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..problem import ConvProblem


def backward_data_as_forward_reason(problem: ConvProblem) -> str | None:
    """Why the stride-1 transpose rule cannot express this backward-data problem."""
    if any(s != 1 for s in problem.stride):
        return f"backward-data with stride {problem.stride} != 1"
    if problem.groups != 1:
        return f"groups={problem.groups} != 1"
    for (lo, hi), extent in zip(problem.padding, problem.effective_kernel):
        if max(lo, hi) > extent - 1:
            return f"padding {problem.padding} exceeds the dilated kernel extent - 1"
    return None


def backward_data_as_forward(problem: ConvProblem) -> ConvProblem:
    """The forward problem dx = conv(dy, flipped w) for a stride-1, groups-1 problem."""
    padding = tuple(
        (extent - 1 - lo, extent - 1 - hi)
        for (lo, hi), extent in zip(problem.padding, problem.effective_kernel)
    )
    return dataclasses.replace(
        problem,
        pass_="forward",
        in_channels=problem.out_channels,
        out_channels=problem.in_channels,
        in_size=problem.out_size,
        out_size=problem.in_size,
        padding=padding,
        has_bias=False,
    )


def flipped_weight(w: np.ndarray) -> np.ndarray:
    """w ``(O, *K, C)`` -> ``(C, *K, O)`` flipped in every spatial dim, contiguous."""
    spatial = tuple(range(1, w.ndim - 1))
    return np.ascontiguousarray(np.flip(np.swapaxes(w, 0, -1), axis=spatial))


def flipped_view(w: np.ndarray) -> np.ndarray:
    """:func:`flipped_weight` as a view, no copy (for code that reads any strides)."""
    return np.flip(np.swapaxes(w, 0, -1), axis=tuple(range(1, w.ndim - 1)))
