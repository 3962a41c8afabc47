"""``implicit_gemm``: the GEMM of im2col without its column matrix.

Each kernel position contributes one GEMM of the shifted input window
``(positions, C)`` with that position's weights ``(C, O)``, accumulated into the
output tile; only one window of one tile is gathered at a time. Dense
convolutions only (groups=1), as Burn's implicit GEMM; backward-data is served
through the stride-1 transpose rule (a forward conv of dy with the flipped
kernel), so stride != 1 is refused there and the fallback serves it.
"""

from __future__ import annotations

import math

import numpy as np

from .. import memory
from ..problem import ConvProblem
from ..registry import register
from ..threads import matmul
from ._common import Tile, input_slab, kernel_offsets, tiles, too_large, window
from ._transforms import (
    backward_data_as_forward,
    backward_data_as_forward_reason,
    flipped_weight,
)

WORKSPACE_LIMIT = 16 * 2**20
"""Bytes of gathered window plus accumulator per tile (one output row is the floor)."""


def _supports_dense(problem: ConvProblem) -> str | None:
    if problem.groups != 1:
        return f"groups={problem.groups} != 1 (implicit GEMM serves dense convolutions)"
    return too_large(problem, _workspace(problem))


def _supports_bwd_data(problem: ConvProblem) -> str | None:
    reason = backward_data_as_forward_reason(problem)
    if reason is not None:
        return f"{reason} (served via the stride-1 transpose rule)"
    return too_large(problem, _workspace(problem))


def _row_bytes(problem: ConvProblem) -> int:
    """Window + accumulator + product bytes for one output row of one image."""
    channels = problem.in_channels + 2 * problem.out_channels
    return math.prod(problem.out_size[1:]) * channels * problem.compute_dtype.itemsize


def _tiles(problem: ConvProblem) -> list[Tile]:
    return list(tiles(problem, _row_bytes(problem), WORKSPACE_LIMIT))


def _workspace(problem: ConvProblem) -> int:
    if problem.pass_ == "backward_data":
        problem = backward_data_as_forward(problem)
    if problem.batch == 0:
        return 0
    tile = next(tiles(problem, _row_bytes(problem), WORKSPACE_LIMIT))
    start, stop = tile.slab_rows(problem)
    padded = [n + lo + hi for n, (lo, hi) in zip(problem.in_size, problem.padding)]
    slab = (tile.n1 - tile.n0) * (stop - start) * math.prod(padded[1:]) * problem.in_channels
    return tile.positions * _row_bytes(problem) + slab * problem.compute_dtype.itemsize


def _windows(problem: ConvProblem, x: np.ndarray, tile: Tile):
    """Yield (kernel position index, gathered window ``(positions, C)``) for a tile."""
    slab = input_slab(x, problem, tile)
    shape = (tile.n1 - tile.n0, tile.r1 - tile.r0, *problem.out_size[1:], problem.in_channels)
    gathered = np.empty(shape, x.dtype)
    for i, offset in enumerate(kernel_offsets(problem)):
        np.copyto(gathered, slab[(slice(None), *window(problem, offset, (tile.r0, tile.r1)))])
        yield i, gathered.reshape(-1, problem.in_channels)


def _forward(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    y = memory.empty(problem.y_shape("NHWC"), x.dtype)
    # (O, *K, C) -> (prod(K), C, O): one (C, O) matrix per kernel position
    wk = w.reshape(problem.out_channels, -1, problem.in_channels).transpose(1, 2, 0).copy()
    for tile in _tiles(problem):
        block = y[tile.n0 : tile.n1, tile.r0 : tile.r1]
        acc = np.zeros((block.size // problem.out_channels, problem.out_channels), x.dtype)
        product = np.empty_like(acc)
        for i, cols in _windows(problem, x, tile):
            matmul(cols, wk[i], out=product)
            acc += product
        block[...] = acc.reshape(block.shape)
    return y


@register("implicit_gemm", "forward", supports=_supports_dense, workspace_bytes=_workspace)
def implicit_gemm_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _forward(problem, x, w)


@register("implicit_gemm", "backward_data", supports=_supports_bwd_data, workspace_bytes=_workspace)
def implicit_gemm_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _forward(backward_data_as_forward(problem), dy, flipped_weight(w))


@register("implicit_gemm", "backward_weight", supports=_supports_dense, workspace_bytes=_workspace)
def implicit_gemm_bwd_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    dw = np.zeros((math.prod(problem.kernel), problem.out_channels, problem.in_channels), x.dtype)
    for tile in _tiles(problem):
        dy_rows = dy[tile.n0 : tile.n1, tile.r0 : tile.r1].reshape(-1, problem.out_channels)
        for i, cols in _windows(problem, x, tile):
            dw[i] += matmul(dy_rows.T, cols)
    return np.ascontiguousarray(dw.transpose(1, 0, 2)).reshape(problem.w_shape("NHWC"))
