"""``im2col``: lower the convolution to one GEMM per tile through numpy's BLAS.

The column matrix is never built whole: it is built per tile of (images x output
rows of spatial dim 0), per group, by a compiled loop that reads x in place (padding
becomes zeros, never a padded copy), so its size stays within ``WORKSPACE_LIMIT``
bytes whatever the batch (at least one output row: a single row's columns,
``prod(S_out[1:]) * prod(K) * C // g`` values, may exceed it). Serves every
problem, all three passes:

- forward:         y_tile = cols (M, prod(K)*C/g) @ w_g.T
- backward_data:   dcols = dy_tile @ w_g, scattered back one kernel position at a time
- backward_weight: dw_g += dy_tile.T @ cols
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .. import memory
from .._kernel_cache import kernel
from ..problem import ConvProblem
from ..registry import register
from ..threads import matmul
from ._common import Tile, crop_padding, kernel_offsets, padded_shape, tiles, too_large, window

WORKSPACE_LIMIT = 32 * 2**20
"""Bytes of column matrix per tile (one output row is the floor)."""


def _supports(problem: ConvProblem) -> str | None:
    return too_large(problem, _workspace(problem))


def _column_row_bytes(problem: ConvProblem) -> int:
    """Column bytes for one output row of dim 0 of one image, one group."""
    per_position = math.prod(problem.kernel) * problem.in_per_group
    return math.prod(problem.out_size[1:]) * per_position * problem.compute_dtype.itemsize


def _tiles(problem: ConvProblem) -> list[Tile]:
    return list(tiles(problem, _column_row_bytes(problem), WORKSPACE_LIMIT))


def _workspace(problem: ConvProblem) -> int:
    """Largest tile: its columns and its GEMM result (backward-data: plus the padded dx)."""
    if problem.batch == 0:
        return 0
    tile = next(tiles(problem, _column_row_bytes(problem), WORKSPACE_LIMIT))
    item = problem.compute_dtype.itemsize
    rows = tile.positions * math.prod(problem.out_size[1:])
    columns = tile.positions * _column_row_bytes(problem)
    padded = padded_shape(problem)
    extra = problem.batch * math.prod(padded[1:]) if problem.pass_ == "backward_data" else 0
    return columns + item * (rows * problem.out_per_group + extra)


@kernel(nogil=True)
def _fill_columns(x, cols, n0, r0, c0, s0, s1, s2, p0, p1, p2, d0, d1, d2):  # noqa: PLR0913
    """cols[b, r, u, v, i, j, k, c] = x[n0 + b, z, y, w, c0 + c] at the input point that
    kernel tap (i, j, k) of output (r0 + r, u, v) reads, 0 in the padding.

    x ``(N, S0, S1, S2, C)``; cols ``(n, rows, O1, O2, K0, K1, K2, C // g)`` (3-D views,
    see :func:`_as3d`). Both C-contiguous."""
    nt, rt, o1, o2, k0, k1, k2, cg = cols.shape
    size0, size1, size2, channels = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    flat_x, flat_cols = x.ravel(), cols.ravel()
    step_w = channels
    step_y = size2 * step_w
    step_z = size1 * step_y
    whole_rows = d2 == 1 and cg == channels
    q = 0  # position in cols, which is filled in order
    for b in range(nt):
        base_b = (n0 + b) * size0 * step_z + c0
        for r in range(rt):
            for u in range(o1):
                for v in range(o2):
                    for i in range(k0):
                        z = (r0 + r) * s0 + i * d0 - p0
                        for j in range(k1):
                            y = u * s1 + j * d1 - p1
                            inside = 0 <= z < size0 and 0 <= y < size1
                            base = base_b + z * step_z + y * step_y
                            w0 = v * s2 - p2
                            if inside and whole_rows and w0 >= 0 and w0 + k2 <= size2:
                                src = base + w0 * step_w
                                for e in range(k2 * cg):  # one contiguous run of x
                                    flat_cols[q + e] = flat_x[src + e]
                                q += k2 * cg
                                continue
                            for k in range(k2):
                                w = v * s2 + k * d2 - p2
                                if inside and 0 <= w < size2:
                                    src = base + w * step_w
                                    for c in range(cg):
                                        flat_cols[q + c] = flat_x[src + c]
                                else:
                                    for c in range(cg):
                                        flat_cols[q + c] = 0
                                q += cg


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array viewing this thread's column buffer, grown on demand.

    The buffer (at most one tile's columns) outlives the call: a fresh allocation
    of that size costs more in page faults than filling it (measured here: 38 ms
    to fault in 30 MB, 11 ms to fill it)."""
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = getattr(_SCRATCH, "buffer", None)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = _SCRATCH.buffer = np.empty(nbytes, np.uint8)
    return buffer[:nbytes].view(dtype).reshape(shape)


def release_workspace() -> None:
    """Free this thread's column buffer (the next call allocates it again)."""
    _SCRATCH.buffer = None


def _as3d(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    """Spatial values as 3-D: dim 0 stays first (tiles cut it), the last stays last
    (contiguous runs), singleton ``fill`` in between."""
    if len(values) == 1:
        return (values[0], fill, fill)
    if len(values) == 2:
        return (values[0], fill, values[1])
    return values


def _columns(x: np.ndarray, problem: ConvProblem, tile: Tile, group: int) -> np.ndarray:
    """The tile's column matrix for one group: ``(positions, prod(K) * C // g)``."""
    cg = problem.in_per_group
    shape = (tile.n1 - tile.n0, tile.r1 - tile.r0, *_as3d(problem.out_size, 1)[1:])
    cols = _scratch((*shape, *_as3d(problem.kernel, 1), cg), x.dtype)
    x3 = x.reshape(x.shape[0], *_as3d(problem.in_size, 1), x.shape[-1])
    _fill_columns(
        x3, cols, tile.n0, tile.r0, group * cg,
        *_as3d(problem.stride, 1), *_as3d(tuple(lo for lo, _ in problem.padding), 0),
        *_as3d(problem.dilation, 1),
    )
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
    y = memory.empty(problem.y_shape("NHWC"), x.dtype)
    wg = _grouped_weight(problem, w)
    for tile in _tiles(problem):
        for g in range(problem.groups):
            block = _out_block(tile, problem, g)
            if problem.groups == 1:  # the tile's outputs are one contiguous run of y
                matmul(_columns(x, problem, tile, g), wg[g].T, out=y[block].reshape(-1, y.shape[-1]))
            else:
                y[block] = matmul(_columns(x, problem, tile, g), wg[g].T).reshape(y[block].shape)
    return y


@register("im2col", "backward_data", supports=_supports, workspace_bytes=_workspace)
def im2col_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    dxp = np.zeros(padded_shape(problem), dy.dtype)
    wg = _grouped_weight(problem, w)
    cg, s0 = problem.in_per_group, problem.stride[0]
    for tile in _tiles(problem):
        for g in range(problem.groups):
            dy_tile = dy[_out_block(tile, problem, g)]
            dcols = matmul(dy_tile.reshape(-1, problem.out_per_group), wg[g])
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
        for g in range(g_count):
            dy_rows = dy[_out_block(tile, problem, g)].reshape(-1, og)
            dw[g] += matmul(dy_rows.T, _columns(x, problem, tile, g))
    return dw.reshape(problem.w_shape("NHWC"))
