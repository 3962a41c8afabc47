"""``blocked`` backward-data at stride > 1: one stride-1 forward conv per phase.

For stride ``s`` (dilation 1), the input positions ``t = r + s*u`` of one phase
``r < s`` receive gradient only from the taps ``a = a0 + s*k`` with
``a0 = (r + pad_lo) mod s``:

    dx[r + s*u] = sum_k dy[u + q0 - k] * w[a0 + s*k],   q0 = (r + pad_lo - a0) / s

a stride-1 correlation of dy with the flipped, channel-swapped sub-kernel
``w[a0::s]``, over the window of dy from ``q0 - (K_r - 1)`` on. dy is zero-padded
once, as far as the phases' windows reach; each of the ``prod(s)`` phases (per
spatial dim, combined) then runs ``blocked``'s forward kernel on its window and writes
its strided slice of dx; a phase no tap reaches is zero. The same multiply-adds as
the direct sum, none on inserted zeros (the zero-dilated dy of the textbook rule would
do ``prod(s)`` times as many).

Two ways to run a phase (``blocked``'s ``gather`` parameter, :func:`gathers` the
default): along its output rows, writing dx in place (micro-tiles never cross a row,
so a short row ends in a partly filled tile that loads a whole weight panel for a few
pixels), or with micro-tiles gathered across rows into a contiguous buffer then copied
into dx (full tiles, plus the copies of the phase's dy window and output).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ...problem import ConvProblem
from .._transforms import backward_data_as_forward, flipped_view


class Phase(NamedTuple):
    """One phase along one spatial dim: first input position ``r``, first tap ``a0``,
    ``taps`` taps, ``size`` outputs, its window of dy starting at ``start`` (may be
    negative: in the zero padding)."""

    r: int
    a0: int
    taps: int
    size: int
    start: int


def phases_1d(length: int, kernel: int, stride: int, pad_lo: int) -> list[Phase]:
    """The phases of one spatial dim of a conv with input ``length``."""
    result = []
    for r in range(stride):
        a0 = (r + pad_lo) % stride
        taps = max(0, -(-(kernel - a0) // stride))
        q0 = (r + pad_lo - a0) // stride
        result.append(Phase(r, a0, taps, -(-(length - r) // stride), q0 - (taps - 1)))
    return result


class Step(NamedTuple):
    """One phase to run: its per-dim phases, its stride-1 forward problem, and where it
    reads and writes as 2-D (row, column) pairs (a 1-D problem is one row): the
    (first, step) of its outputs in dx, the origin of its window in the padded dy."""

    phase: tuple[Phase, ...]
    problem: ConvProblem
    first: tuple[int, ...]
    step: tuple[int, ...]
    origin: tuple[int, ...]


@lru_cache(maxsize=256)
def plan(problem: ConvProblem) -> tuple[tuple[Step, ...], tuple[tuple[int, int], ...]]:
    """(the phases some tap reaches that have outputs, the (lo, hi) zero padding of dy
    that all their windows lie in), worked out once per problem."""
    per_dim = [[p for p in phases_1d(n, k, s, lo) if p.taps > 0 and p.size > 0]
               for n, k, s, (lo, _) in zip(problem.in_size, problem.kernel, problem.stride,
                                           problem.padding)]
    pads = tuple((max([0] + [-p.start for p in dim]),
                  max([0] + [p.start + p.size + p.taps - 1 - out for p in dim]))
                 for out, dim in zip(problem.out_size, per_dim))
    lead = 2 - problem.ndim
    steps = tuple(
        Step(phase, sub_problem(problem, phase),
             (0,) * lead + tuple(p.r for p in phase),
             (1,) * lead + problem.stride,
             (0,) * lead + tuple(p.start + lo for p, (lo, _) in zip(phase, pads)))
        for phase in itertools.product(*per_dim))
    return steps, pads


# gathered tiles pay off below this share of filled micro-tile rows (the copies they
# add cost 5-20% of the phase's GEMM on ResNet-50's strided layers; searched by the tuner)
GATHER_BELOW_FILL = 0.8


def row_fill(problem: ConvProblem, rows: int) -> float:
    """The share of micro-tile rows that hold pixels when the phases' output rows are
    cut into tiles of ``rows`` pixels (each row's last tile partly empty)."""
    widths = [s.problem.out_size[-1] for s in plan(problem)[0]]
    return sum(widths) / max(1, sum(-(-w // rows) * rows for w in widths))


def gathers(problem: ConvProblem, rows: int) -> bool:
    """The default way to run the phases (tiles of ``rows`` pixels): gathered across
    rows where rows alone fill under ``GATHER_BELOW_FILL`` of the tiles. With 6-pixel
    tiles (AVX-512, 64-channel panels; Zen 4, batch 8, 2 threads) ResNet-50's 7x7
    phases (fill 0.58) ran 1.6x faster gathered, its 14x14 ones (0.78) 1.15x, its
    28x28 ones (0.93) 1.15x slower."""
    return row_fill(problem, rows) < GATHER_BELOW_FILL


def window(step: Step) -> tuple[slice, ...]:
    """The phase's window of the padded dy as (N, H, W, O) (a 1-D problem's H is 1)."""
    size = (1,) * (len(step.origin) - step.problem.ndim) + step.problem.in_size
    return (slice(None), *(slice(o, o + n) for o, n in zip(step.origin, size)))


def outputs(step: Step) -> tuple[slice, ...]:
    """Where the phase's outputs lie in dx as (N, H, W, C)."""
    return (slice(None), *(slice(f, None, s) for f, s in zip(step.first, step.step)))


def reason(problem: ConvProblem) -> str | None:
    """Why the phases cannot serve this backward-data problem."""
    if problem.groups != 1:
        return f"groups={problem.groups} != 1"
    if any(d != 1 for d in problem.dilation):
        return f"strided backward-data with dilation {problem.dilation} != 1"
    return None


def sub_problem(problem: ConvProblem, phase: tuple[Phase, ...]) -> ConvProblem:
    """The stride-1, unpadded forward problem of one phase (channels swapped)."""
    forward = backward_data_as_forward(problem)
    return dataclasses.replace(
        forward,
        in_size=tuple(p.size + p.taps - 1 for p in phase),
        out_size=tuple(p.size for p in phase),
        kernel=tuple(p.taps for p in phase),
        stride=(1,) * problem.ndim,
        padding=((0, 0),) * problem.ndim,
    )


def sub_kernel(w: np.ndarray, problem: ConvProblem, phase: tuple[Phase, ...]) -> np.ndarray:
    """w ``(O, *K, C)`` -> the phase's flipped, channel-swapped ``(C, *K_r, O)`` (a view)."""
    every_sth = tuple(slice(p.a0, None, s) for p, s in zip(phase, problem.stride))
    return flipped_view(w[(slice(None), *every_sth, slice(None))])


def workspace(problem: ConvProblem) -> int:
    """Bytes: the padded dy and the packed sub-kernels (as many weights as w)."""
    padded = math.prod(o + lo + hi for o, (lo, hi) in zip(problem.out_size, plan(problem)[1]))
    weights = problem.out_channels * math.prod(problem.kernel) * problem.in_channels
    return 4 * (problem.batch * padded * problem.out_channels + weights)
