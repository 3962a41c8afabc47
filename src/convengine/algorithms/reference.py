"""``reference``: exact, slow, any problem; the tests' float64 oracle.

Accumulates in float64 whatever the input dtype, one kernel position at a time
(a sum of ``prod(K)`` small einsums over the output positions whose tap lands
inside x), for all three passes. Padding is never materialised: the temporaries are
x, the output and dy in float64, whatever the padding.

It defines the NaN rule (:mod:`convengine.nan_rule`): forward and backward-weight
sum over the zero-padded input, so a padded tap adds ``0 * w`` (forward) or
``0 * dy`` (backward-weight), NaN where that operand is NaN or infinite;
backward-data sums over the (dy, w) pairs that land inside x only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..problem import ConvProblem
from ..registry import register
from ._common import kernel_offsets


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


def _inside(
    problem: ConvProblem, offset: tuple[int, ...]
) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """(output slices, x slices) of the output positions whose tap ``offset`` lands
    inside x (not in the padding), one slice per spatial dim; empty slices if none does."""
    outs, ins = [], []
    for k, n, o, s, d, (lo, _) in zip(offset, problem.in_size, problem.out_size,
                                      problem.stride, problem.dilation, problem.padding):
        start = k * d - lo  # x index read by output position 0
        p0, p1 = max(0, -(start // s)), min(o, (n - 1 - start) // s + 1)
        if p1 <= p0:
            none = (slice(0, 0),) * len(offset)
            return none, none
        outs.append(slice(p0, p1))
        ins.append(slice(start + p0 * s, start + (p1 - 1) * s + 1, s))
    return tuple(outs), tuple(ins)


def _padded_taps(problem: ConvProblem, inside: tuple[slice, ...]) -> np.ndarray:
    """Boolean mask over the output positions whose tap lands in the padding."""
    mask = np.ones(problem.out_size, dtype=bool)
    mask[inside] = False
    return mask


def _tap_sums(problem: ConvProblem, a: np.ndarray, w: np.ndarray, forward: bool) -> np.ndarray:
    """The sum over the kernel positions of a's pixels times w there, between the
    pixels each tap links inside x: forward, a is x, to y ``(N, *S_out, g, O // g)``;
    else (backward-data) a is dy, to dx ``(N, *S, g, C // g)``; float64."""
    g, every = problem.groups, slice(None)
    size, per = ((problem.out_size, problem.out_per_group) if forward
                 else (problem.in_size, problem.in_per_group))
    spec = "...gc,goc->...go" if forward else "...go,goc->...gc"
    ag = _grouped(a, g)
    out = np.zeros((problem.batch, *size, g, per))
    for offset in kernel_offsets(problem):
        outs, ins = _inside(problem, offset)
        src, dst = (ins, outs) if forward else (outs, ins)
        out[(every, *dst)] += np.einsum(spec, ag[(every, *src)], _weight_at(problem, w, offset))
    return out


@register("reference", "forward", supports=_supports, accuracy=3)
def reference_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    y = _tap_sums(problem, x, w, forward=True)
    for offset in kernel_offsets(problem):
        wk = _weight_at(problem, w, offset)
        if not np.isfinite(wk).all():  # padded taps add 0 * w: NaN where w is not finite
            y[:, _padded_taps(problem, _inside(problem, offset)[0])] += (0 * wk).sum(axis=-1)
    return y.reshape(problem.y_shape("NHWC")).astype(problem.compute_dtype)


@register("reference", "backward_data", supports=_supports, accuracy=3)
def reference_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    dx = _tap_sums(problem, dy, w, forward=False)
    return dx.reshape(problem.x_shape("NHWC")).astype(problem.compute_dtype)


@register("reference", "backward_weight", supports=_supports, accuracy=3)
def reference_bwd_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    g, every = problem.groups, slice(None)
    xg, dyg = _grouped(x, g), _grouped(dy, g)
    dy_finite = bool(np.isfinite(dyg).all())
    dw = np.zeros(problem.w_shape("NHWC"))
    for offset in kernel_offsets(problem):
        outs, ins = _inside(problem, offset)
        patch = xg[(every, *ins)].reshape(-1, g, problem.in_per_group)
        rows = dyg[(every, *outs)].reshape(-1, g, problem.out_per_group)
        dwk = np.einsum("mgc,mgo->goc", patch, rows)
        dw[_position(offset)] = dwk.reshape(problem.out_channels, -1)
        if not dy_finite:  # padded taps add 0 * dy: NaN where dy is not finite
            mask = _padded_taps(problem, outs)
            zero = (0 * dyg[:, mask]).sum(axis=(0, 1)).reshape(problem.out_channels, 1)
            dw[_position(offset)] += zero
    return dw.astype(problem.compute_dtype)
