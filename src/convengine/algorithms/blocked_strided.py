"""``blocked`` backward-data at stride > 1: one stride-1 forward conv per phase.

For stride ``s`` (dilation 1), the input positions ``t = r + s*u`` of one phase
``r < s`` receive gradient only from the taps ``a = a0 + s*k`` with
``a0 = (r + pad_lo) mod s``:

    dx[r + s*u] = sum_k dy[u + q0 - k] * w[a0 + s*k],   q0 = (r + pad_lo - a0) / s

a stride-1 correlation of dy with the flipped, channel-swapped sub-kernel
``w[a0::s]`` whose padding ``K_r - 1 - q0`` (and the matching high side) may be
negative, where dy is cropped instead. Each of the ``prod(s)`` phases (per spatial
dim, combined) runs on ``blocked``'s forward kernel and is written into its strided
slice of dx; a phase no tap reaches is zero. The same multiply-adds as the direct
sum, none on inserted zeros (the zero-dilated dy of the textbook rule would do
``prod(s)`` times as many).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import NamedTuple

import numpy as np

from ..problem import ConvProblem
from ._transforms import backward_data_as_forward


class Phase(NamedTuple):
    """One phase along one spatial dim: first input position ``r``, first tap ``a0``,
    ``taps`` taps, outputs ``size``, dy cropped to ``[crop_lo, n - crop_hi)`` and
    padded by ``pad`` (lo, hi) for the stride-1 correlation."""

    r: int
    a0: int
    taps: int
    size: int
    crop_lo: int
    crop_hi: int
    pad: tuple[int, int]


def phases_1d(length: int, out: int, kernel: int, stride: int, pad_lo: int) -> list[Phase]:
    """The phases of one spatial dim of a conv of input ``length`` -> output ``out``."""
    result = []
    for r in range(stride):
        size = -(-(length - r) // stride)
        a0 = (r + pad_lo) % stride
        count = max(0, -(-(kernel - a0) // stride))
        q0 = (r + pad_lo - a0) // stride
        lo = count - 1 - q0
        hi = size - out - lo + count - 1
        result.append(Phase(r, a0, count, size, max(0, -lo), max(0, -hi),
                            (max(0, lo), max(0, hi))))
    return result


def phases(problem: ConvProblem) -> list[tuple[Phase, ...]]:
    """Every combination of per-dim phases of a backward-data problem."""
    per_dim = [phases_1d(n, o, k, s, lo) for n, o, k, s, (lo, _) in zip(
        problem.in_size, problem.out_size, problem.kernel, problem.stride, problem.padding)]
    return list(itertools.product(*per_dim))


def reason(problem: ConvProblem) -> str | None:
    """Why the phases cannot serve this backward-data problem."""
    if problem.groups != 1:
        return f"groups={problem.groups} != 1"
    if any(d != 1 for d in problem.dilation):
        return f"strided backward-data with dilation {problem.dilation} != 1"
    return None


def sub_problem(problem: ConvProblem, phase: tuple[Phase, ...]) -> ConvProblem:
    """The stride-1 forward problem of one phase (channels swapped: dy -> dx)."""
    forward = backward_data_as_forward(problem)
    return dataclasses.replace(
        forward,
        in_size=tuple(o - p.crop_lo - p.crop_hi for o, p in zip(problem.out_size, phase)),
        out_size=tuple(p.size for p in phase),
        kernel=tuple(p.taps for p in phase),
        stride=(1,) * problem.ndim,
        padding=tuple(p.pad for p in phase),
    )


def sub_kernel(w: np.ndarray, problem: ConvProblem, phase: tuple[Phase, ...]) -> np.ndarray:
    """w ``(O, *K, C)`` -> the phase's flipped, channel-swapped ``(C, *K_r, O)``."""
    every_sth = tuple(slice(p.a0, None, s) for p, s in zip(phase, problem.stride))
    sub = w[(slice(None), *every_sth, slice(None))]
    spatial = tuple(range(1, w.ndim - 1))
    return np.ascontiguousarray(np.flip(np.swapaxes(sub, 0, -1), axis=spatial))


def cropped(dy: np.ndarray, phase: tuple[Phase, ...]) -> np.ndarray:
    """dy ``(N, *S_out, O)`` cropped as the phase says, C-contiguous."""
    index = tuple(slice(p.crop_lo, dy.shape[1 + i] - p.crop_hi) for i, p in enumerate(phase))
    return np.ascontiguousarray(dy[(slice(None), *index, slice(None))])


def scatter_index(problem: ConvProblem, phase: tuple[Phase, ...]) -> tuple[slice, ...]:
    """The slice of dx ``(N, *S_in, C)`` that a phase's output fills."""
    return (slice(None), *(slice(p.r, None, s) for p, s in zip(phase, problem.stride)),
            slice(None))


def workspace(problem: ConvProblem) -> int:
    """Bytes: a phase's padded dy and its output (one phase at a time), and the packed
    sub-kernels (as many weights as w)."""
    widest = max(math.prod(o + sum(p.pad) for o, p in zip(problem.out_size, ph))
                 for ph in phases(problem))
    largest = max(math.prod(p.size for p in ph) for ph in phases(problem))
    per_image = (widest * problem.out_channels + largest * problem.in_channels)
    weights = problem.out_channels * math.prod(problem.kernel) * problem.in_channels
    return 4 * (problem.batch * per_image + weights)
