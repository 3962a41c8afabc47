"""Index helpers shared by the numpy-based algorithms (channels-last arrays)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..problem import LIMIT_NAME, ConvProblem, max_elements


def too_large(problem: ConvProblem, workspace_bytes: int, what: str = "workspace") -> str | None:
    """The reason to refuse a problem whose workspace (bytes) would hold more than
    :func:`convengine.problem.max_elements` values of its compute dtype, else None."""
    values = workspace_bytes // problem.compute_dtype.itemsize
    limit = max_elements()
    if values > limit:
        return f"{what} of {values:,} values exceeds {LIMIT_NAME} ({limit:,})"
    return None


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


def window(
    problem: ConvProblem, offset: tuple[int, ...], rows: tuple[int, int] | None = None
) -> tuple[slice, ...]:
    """Slices of the padded input that kernel position ``offset`` meets, one per
    output position: index with ``xp[(slice(None), *window(...), slice(None))]``.

    ``rows=(r0, r1)`` restricts spatial dim 0 to output rows r0..r1-1, in the
    coordinates of a slab that starts at padded row ``r0 * stride[0]``.
    """
    out = list(problem.out_size)
    if rows is not None:
        out[0] = rows[1] - rows[0]
    return tuple(
        slice(k * d, k * d + s * (n - 1) + 1, s)
        for k, d, s, n in zip(offset, problem.dilation, problem.stride, out)
    )


@dataclass(frozen=True)
class Tile:
    """Images ``n0:n1`` and output rows ``r0:r1`` (spatial dim 0) of one problem."""

    n0: int
    n1: int
    r0: int
    r1: int

    @property
    def positions(self) -> int:
        return (self.n1 - self.n0) * (self.r1 - self.r0)

    def slab_rows(self, problem: ConvProblem) -> tuple[int, int]:
        """Padded input rows of dim 0 that these output rows read: [start, stop)."""
        start = self.r0 * problem.stride[0]
        return start, (self.r1 - 1) * problem.stride[0] + problem.effective_kernel[0]


def tiles(problem: ConvProblem, bytes_per_position: int, limit: int) -> Iterator[Tile]:
    """Cover (batch x output rows) with tiles whose ``positions * bytes_per_position``
    stays within ``limit``: whole images while they fit, else blocks of rows
    (never less than one output row). ``bytes_per_position`` counts one output
    row of dim 0 of one image."""
    rows = problem.out_size[0]
    per_row = max(bytes_per_position, 1)
    if per_row * rows <= limit:
        images = max(1, limit // (per_row * rows))
        for n0 in range(0, problem.batch, images):
            yield Tile(n0, min(n0 + images, problem.batch), 0, rows)
    else:
        step = max(1, limit // per_row)
        for n0 in range(problem.batch):
            for r0 in range(0, rows, step):
                yield Tile(n0, n0 + 1, r0, min(r0 + step, rows))


def input_slab(x: np.ndarray, problem: ConvProblem, tile: Tile) -> np.ndarray:
    """The zero-padded part of x ``(N, *S, C)`` that a tile reads:
    ``(n1 - n0, slab rows, *padded S[1:], C)``, a fresh array (or a view if unpadded)."""
    start, stop = tile.slab_rows(problem)
    lo0 = problem.padding[0][0]
    src0, src1 = max(start - lo0, 0), min(stop - lo0, problem.in_size[0])
    if all(p == (0, 0) for p in problem.padding):
        return x[tile.n0 : tile.n1, start:stop]
    rest = [n + lo + hi for n, (lo, hi) in zip(problem.in_size[1:], problem.padding[1:])]
    slab = np.zeros((tile.n1 - tile.n0, stop - start, *rest, x.shape[-1]), x.dtype)
    inner = tuple(slice(lo, lo + n) for n, (lo, _) in zip(problem.in_size[1:], problem.padding[1:]))
    dst0 = src0 + lo0 - start
    if src1 > src0:
        target = (slice(None), slice(dst0, dst0 + src1 - src0), *inner)
        slab[target] = x[tile.n0 : tile.n1, src0:src1]
    return slab


def crop_padding(xp: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """Inverse of :func:`pad_spatial` for a gradient w.r.t. the padded input."""
    index = tuple(
        slice(lo, lo + n) for n, (lo, _) in zip(problem.in_size, problem.padding)
    )
    return xp[(slice(None), *index, slice(None))]
