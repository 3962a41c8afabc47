"""``reference``: exact, slow, any problem; the tests' float64 oracle.

Accumulates in float64 whatever the input dtype, one kernel position at a time
(a sum of ``prod(K)`` small einsums), for all three passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..problem import ConvProblem
from ..registry import register
from ._common import crop_padding, kernel_offsets, pad_spatial, padded_shape, window


def _supports(problem: ConvProblem) -> None:
    return None


def _grouped(a: np.ndarray, groups: int) -> np.ndarray:
    """(..., C) -> (..., g, C // g) as float64."""
    return a.astype(np.float64, copy=False).reshape(*a.shape[:-1], groups, -1)


def _position(offset: tuple[int, ...]) -> tuple[Any, ...]:
    """Index of one kernel position in a weight ``(O, *K, C // g)``."""
    return (slice(None), *offset, slice(None))


def _weight_at(problem: ConvProblem, w: np.ndarray, offset: tuple[int, ...]) -> np.ndarray:
    """w[:, offset, :] as (g, O // g, C // g) float64."""
    wk = w[_position(offset)].astype(np.float64)
    return wk.reshape(problem.groups, problem.out_per_group, problem.in_per_group)


@register("reference", "forward", supports=_supports, accuracy=3)
def reference_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    xp = pad_spatial(x, problem)
    g = problem.groups
    y = np.zeros((problem.batch, *problem.out_size, g, problem.out_per_group))
    for offset in kernel_offsets(problem):
        patch = _grouped(xp[(slice(None), *window(problem, offset), slice(None))], g)
        y += np.einsum("...gc,goc->...go", patch, _weight_at(problem, w, offset))
    return y.reshape(problem.y_shape("NHWC")).astype(problem.compute_dtype)


@register("reference", "backward_data", supports=_supports, accuracy=3)
def reference_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    g = problem.groups
    dxp = np.zeros(padded_shape(problem))
    dyg = _grouped(dy, g)
    for offset in kernel_offsets(problem):
        contribution = np.einsum("...go,goc->...gc", dyg, _weight_at(problem, w, offset))
        target = (slice(None), *window(problem, offset), slice(None))
        dxp[target] += contribution.reshape(*contribution.shape[:-2], -1)
    return crop_padding(dxp, problem).astype(problem.compute_dtype)


@register("reference", "backward_weight", supports=_supports, accuracy=3)
def reference_bwd_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    xp = pad_spatial(x, problem)
    g = problem.groups
    dyg_rows = _grouped(dy, g).reshape(-1, g, problem.out_per_group)
    dw = np.zeros(problem.w_shape("NHWC"))
    for offset in kernel_offsets(problem):
        patch = _grouped(xp[(slice(None), *window(problem, offset), slice(None))], g)
        dwk = np.einsum("mgc,mgo->goc", patch.reshape(-1, *patch.shape[-2:]), dyg_rows)
        dw[_position(offset)] = dwk.reshape(problem.out_channels, -1)
    return dw.astype(problem.compute_dtype)
