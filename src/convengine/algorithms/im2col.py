"""``im2col``: lower the convolution to one GEMM per tile through numpy's BLAS.

The column matrix is never built whole: it is built per tile of (images x output
rows of spatial dim 0), per group, so its size stays within ``WORKSPACE_LIMIT``
bytes whatever the batch (at least one output row: a single row's columns,
``prod(S_out[1:]) * prod(K) * C // g`` values, may exceed it). Serves every
problem, all three passes:

- forward:         y_tile = cols (M, prod(K)*C/g) @ w_g.T
- backward_data:   dcols = dy_tile @ w_g, scattered back one kernel position at a time
- backward_weight: dw_g += dy_tile.T @ cols
"""

from __future__ import annotations

import math

import numpy as np

from ..problem import ConvProblem
from ..registry import register
from ._common import (
    Tile,
    crop_padding,
    input_slab,
    kernel_offsets,
    padded_shape,
    tiles,
    window,
)

WORKSPACE_LIMIT = 32 * 2**20
"""Bytes of column matrix per tile (one output row is the floor)."""


def _supports(problem: ConvProblem) -> None:
    return None


def _column_row_bytes(problem: ConvProblem) -> int:
    """Column bytes for one output row of dim 0 of one image, one group."""
    per_position = math.prod(problem.kernel) * problem.in_per_group
    return math.prod(problem.out_size[1:]) * per_position * problem.compute_dtype.itemsize


def _tiles(problem: ConvProblem) -> list[Tile]:
    return list(tiles(problem, _column_row_bytes(problem), WORKSPACE_LIMIT))


def _workspace(problem: ConvProblem) -> int:
    """Largest tile: its columns, its padded input slab and its GEMM result."""
    if problem.batch == 0:
        return 0
    tile = _tiles(problem)[0]
    item = problem.compute_dtype.itemsize
    rows = tile.positions * math.prod(problem.out_size[1:])
    start, stop = tile.slab_rows(problem)
    padded = padded_shape(problem)
    slab = (tile.n1 - tile.n0) * (stop - start) * math.prod(padded[2:])
    columns = tile.positions * _column_row_bytes(problem)
    extra = problem.batch * math.prod(padded[1:]) if problem.pass_ == "backward_data" else 0
    return columns + item * (slab + rows * problem.out_per_group + extra)


def _columns(slab: np.ndarray, problem: ConvProblem, tile: Tile, group: int) -> np.ndarray:
    """The tile's column matrix for one group: ``(positions, prod(K) * C // g)``."""
    cg = problem.in_per_group
    channels = slice(group * cg, (group + 1) * cg)
    rows = (tile.r0, tile.r1)
    shape = (tile.n1 - tile.n0, tile.r1 - tile.r0, *problem.out_size[1:])
    cols = np.empty((*shape, math.prod(problem.kernel), cg), slab.dtype)
    for i, offset in enumerate(kernel_offsets(problem)):
        cols[..., i, :] = slab[(slice(None), *window(problem, offset, rows), channels)]
    return cols.reshape(math.prod(shape), -1)


def _out_block(tile: Tile, problem: ConvProblem, group: int) -> tuple[slice, ...]:
    """Index of a tile's outputs of one group in y ``(N, *S_out, O)``."""
    og = problem.out_per_group
    rest = (slice(None),) * (problem.ndim - 1)
    return (slice(tile.n0, tile.n1), slice(tile.r0, tile.r1), *rest, slice(group * og, (group + 1) * og))


def _grouped_weight(problem: ConvProblem, w: np.ndarray) -> np.ndarray:
    """(O, *K, C/g) -> (g, O/g, prod(K) * C/g)."""
    return w.reshape(problem.groups, problem.out_per_group, -1)


@register("im2col", "forward", supports=_supports, workspace_bytes=_workspace)
def im2col_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    y = np.empty(problem.y_shape("NHWC"), x.dtype)
    wg = _grouped_weight(problem, w)
    for tile in _tiles(problem):
        slab = input_slab(x, problem, tile)
        for g in range(problem.groups):
            block = _out_block(tile, problem, g)
            y[block] = (_columns(slab, problem, tile, g) @ wg[g].T).reshape(y[block].shape)
    return y


@register("im2col", "backward_data", supports=_supports, workspace_bytes=_workspace)
def im2col_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    dxp = np.zeros(padded_shape(problem), dy.dtype)
    wg = _grouped_weight(problem, w)
    cg, s0 = problem.in_per_group, problem.stride[0]
    for tile in _tiles(problem):
        for g in range(problem.groups):
            dy_tile = dy[_out_block(tile, problem, g)]
            dcols = dy_tile.reshape(-1, problem.out_per_group) @ wg[g]
            dcols = dcols.reshape(*dy_tile.shape[:-1], -1, cg)
            for i, offset in enumerate(kernel_offsets(problem)):
                first, *rest = window(problem, offset, (tile.r0, tile.r1))
                shift = tile.r0 * s0
                rows = slice(first.start + shift, first.stop + shift, first.step)
                target = (slice(tile.n0, tile.n1), rows, *rest, slice(g * cg, (g + 1) * cg))
                dxp[target] += dcols[..., i, :]
    return np.ascontiguousarray(crop_padding(dxp, problem))


@register("im2col", "backward_weight", supports=_supports, workspace_bytes=_workspace)
def im2col_bwd_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    g_count, og = problem.groups, problem.out_per_group
    dw = np.zeros((g_count, og, math.prod(problem.kernel) * problem.in_per_group), x.dtype)
    for tile in _tiles(problem):
        slab = input_slab(x, problem, tile)
        for g in range(g_count):
            dy_rows = dy[_out_block(tile, problem, g)].reshape(-1, og)
            dw[g] += dy_rows.T @ _columns(slab, problem, tile, g)
    return dw.reshape(problem.w_shape("NHWC"))
