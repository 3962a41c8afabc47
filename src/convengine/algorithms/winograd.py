"""``winograd`` (F(2x2,3x3)) and ``winograd4`` (F(4x4,3x3)): fast 3x3 stride-1 convs.

Lavin & Gray's minimal filtering: an ``m x m`` output tile of a 3x3 conv costs
``(m + 2)^2`` multiplies per (input, output) channel pair instead of ``9 m^2``
(16 vs 36 for m = 2, 36 vs 144 for m = 4). 1-D problems use F(2,3) and F(4,3)
(4 vs 6, 6 vs 12). Three stages, run chunk by chunk over the output tiles so the
transformed tiles and the GEMM operands stay in cache:

1. input transform ``V = B^T d B`` per tile (numba, parallel over tiles, vectorised
   over channels): V ``(alpha^2, tiles, C)``;
2. one batched GEMM ``M[a] = V[a] @ U[a]`` (BLAS), U ``(alpha^2, C, O)``;
3. output transform ``Y = A^T M A`` (numba), written straight into y.

The weight transform ``U = G g G^T`` is computed in float64 once and cached: keyed by
shape and a sample of the values, and served only after an exact comparison with a
stored copy of the weights, so changed weights are never served stale.

Backward-data with stride 1 is the forward conv of dy with the flipped, channel-swapped
kernel, so both algorithms serve it too. Inputs or weights holding NaN or infinity
are recomputed by ``direct`` (Winograd's transforms would spread them over whole
tiles), so specials propagate as IEEE arithmetic says. Not exact: errors vs float64 are in
docs/performance.md (F(4x4,3x3) about 10x F(2x2,3x3)).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np
from numba import njit

from .. import registry
from ..problem import ConvProblem
from ..registry import register
from ..threads import get_num_threads, run_parallel, single_threaded_blas
from ._finite import nonfinite
from ._transforms import backward_data_as_forward, backward_data_as_forward_reason, flipped_weight

# (B^T, G, A^T) per output tile size m for r = 3
MATRICES = {
    2: (
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]],
    ),
    4: (
        [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
         [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    ),
}
IDENTITY = ([[1.0]], [[1.0]], [[1.0]])  # the height transform of a 1-D problem

CACHE_BYTES = 256 * 2**20  # bound on the cached weight transforms (and weight copies)
CHUNK_BYTES = 2**20  # V + M of one chunk of tiles (one chunk per thread at a time)
MIN_TILES = 32  # fewer tiles per chunk: the GEMM streams U from memory; more: workspace


def multiplies(problem: ConvProblem, m: int) -> int:
    """Multiplies of the GEMM stage (per batch): tiles x alpha^2 x C x O."""
    tiles = math.prod(-(-n // m) for n in problem.out_size)
    return tiles * (m + 2) ** problem.ndim * problem.in_channels * problem.out_channels


def _reason(problem: ConvProblem) -> str | None:
    if problem.ndim not in (1, 2):
        return f"{problem.ndim}-D problems (Winograd here is 1-D or 2-D)"
    if problem.kernel != (3,) * problem.ndim:
        return f"kernel {problem.kernel} is not 3x3 (or 3 in 1-D)"
    if problem.groups != 1:
        return f"groups={problem.groups} != 1"
    if any(s != 1 for s in problem.stride) or any(d != 1 for d in problem.dilation):
        return f"stride {problem.stride} / dilation {problem.dilation} not all 1"
    return None


def _supports(problem: ConvProblem) -> str | None:
    if problem.pass_ == "backward_data":
        return backward_data_as_forward_reason(problem) or _reason(problem)
    return _reason(problem)


# --------------------------------------------------------------------- numba stages


@njit(cache=True, nogil=True)
def _input_tile(x, out, tmp, n, h0, w0, bth, btw):
    """One tile: out (ah*aw, C) = B_h^T d B_w for the patch at (n, h0, w0)."""
    _, h_, w_, c_ = x.shape
    ah, aw = bth.shape[0], btw.shape[0]
    tmp[...] = 0
    for k in range(ah):  # tmp = B_h^T d, skipping rows and columns in the padding
        ih = h0 + k
        if ih < 0 or ih >= h_:
            continue
        for j in range(aw):
            iw = w0 + j
            if iw < 0 or iw >= w_:
                continue
            for i in range(ah):
                coef = bth[i, k]
                if coef != 0:
                    for c in range(c_):
                        tmp[i, j, c] += coef * x[n, ih, iw, c]
    for i in range(ah):  # out = tmp B_w
        for j2 in range(aw):
            row = i * aw + j2
            for c in range(c_):
                out[row, c] = 0
            for j in range(aw):
                coef = btw[j2, j]
                if coef != 0:
                    for c in range(c_):
                        out[row, c] += coef * tmp[i, j, c]


@njit(cache=True, nogil=True)
def _output_tile(src, y, tmp, n, h0, w0, ath, atw):
    """One tile: y[n, h0:h0+mh, w0:w0+mw] = A_h^T src A_w, cropped at the far edges."""
    _, oh_, ow_, o_ = y.shape
    mh, ah = ath.shape
    mw, aw = atw.shape
    tmp[...] = 0
    for a in range(ah):  # tmp = A_h^T src
        for b in range(aw):
            for i in range(mh):
                coef = ath[i, a]
                if coef != 0:
                    for o in range(o_):
                        tmp[i, b, o] += coef * src[a * aw + b, o]
    for i in range(mh):  # y = tmp A_w
        if h0 + i >= oh_:
            continue
        for j in range(mw):
            if w0 + j >= ow_:
                continue
            for o in range(o_):
                y[n, h0 + i, w0 + j, o] = 0
            for b in range(aw):
                coef = atw[j, b]
                if coef != 0:
                    for o in range(o_):
                        y[n, h0 + i, w0 + j, o] += coef * tmp[i, b, o]


@njit(cache=True, nogil=True)
def winograd_input(x, v, t0, tiles_h, tiles_w, pad_h, pad_w, bth, btw):  # noqa: PLR0913
    """x (N,H,W,C) -> v (b, ah*aw, C): the transforms of tiles t0 .. t0+b."""
    ah, aw = bth.shape[0], btw.shape[0]
    mh, mw = max(ah - 2, 1), aw - 2
    tmp = np.empty((ah, aw, x.shape[3]), dtype=v.dtype)
    for t in range(v.shape[0]):
        tile = t0 + t
        n = tile // (tiles_h * tiles_w)
        h0 = (tile // tiles_w) % tiles_h * mh - pad_h
        w0 = tile % tiles_w * mw - pad_w
        _input_tile(x, v[t], tmp, n, h0, w0, bth, btw)


@njit(cache=True, nogil=True)
def winograd_output(m, y, t0, tiles_h, tiles_w, ath, atw):
    """m (b, ah*aw, O) -> y (N,OH,OW,O): Y = A_h^T M A_w for tiles t0 .. t0+b."""
    mh, mw = ath.shape[0], atw.shape[0]
    tmp = np.empty((mh, atw.shape[1], y.shape[3]), dtype=m.dtype)
    for t in range(m.shape[0]):
        tile = t0 + t
        n = tile // (tiles_h * tiles_w)
        h0 = (tile // tiles_w) % tiles_h * mh
        w0 = tile % tiles_w * mw
        _output_tile(m[t], y, tmp, n, h0, w0, ath, atw)


# --------------------------------------------------------------- weight transforms


class _WeightCache:
    """LRU of weight transforms, bounded in bytes; exact match on the weights."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple, list[tuple[np.ndarray, np.ndarray]]] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def _key(w: np.ndarray, m: int) -> tuple:
        sample = w.reshape(-1)[:: max(1, w.size // 64)]
        return (m, w.shape, w.dtype.str, sample.tobytes())

    def _size(self) -> int:
        return sum(a.nbytes + u.nbytes for v in self.entries.values() for a, u in v)

    def get(self, w: np.ndarray, m: int, make) -> np.ndarray:
        key = self._key(w, m)
        with self.lock:
            for stored, u in self.entries.get(key, ()):
                if np.array_equal(stored, w):
                    self.entries.move_to_end(key)
                    self.hits += 1
                    return u
        u = make(w, m)
        with self.lock:
            self.misses += 1
            self.entries.setdefault(key, []).append((w.copy(), u))
            self.entries.move_to_end(key)
            while self._size() > self.max_bytes and len(self.entries) > 1:
                self.entries.popitem(last=False)
        return u

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.hits = self.misses = 0


WEIGHT_CACHE = _WeightCache(CACHE_BYTES)


def _matrices(ndim: int, m: int) -> tuple[np.ndarray, ...]:
    """(B_h^T, B_w^T, G_h, G_w, A_h^T, A_w^T) as float64 arrays."""
    bt, g, at = (np.array(a, dtype=np.float64) for a in MATRICES[m])
    bth, gh, ath = (np.array(a) for a in IDENTITY) if ndim == 1 else (bt, g, at)
    return bth, bt, gh, g, ath, at


def weight_transform(w: np.ndarray, m: int) -> np.ndarray:
    """w (O, [3,] 3, C) -> U (alpha^ndim, C, O) = G g G^T, computed in float64."""
    ndim = w.ndim - 2
    _, _, gh, gw, _, _ = _matrices(ndim, m)
    w4 = w.reshape(w.shape[0], 1, *w.shape[1:]) if ndim == 1 else w
    u = np.einsum("ik,jl,okls->ijso", gh, gw, w4.astype(np.float64), optimize=True)
    return np.ascontiguousarray(u.reshape(-1, w.shape[-1], w.shape[0]), dtype=w.dtype)


# --------------------------------------------------------------------------- driver


def _chunk(problem: ConvProblem, m: int) -> int:
    alpha2 = (m + 2) ** problem.ndim
    per_tile = alpha2 * (problem.in_channels + problem.out_channels) * 4
    return max(MIN_TILES, CHUNK_BYTES // per_tile)


def _tiles(problem: ConvProblem, m: int) -> tuple[int, int]:
    oh = problem.out_size[0] if problem.ndim == 2 else 1
    return -(-oh // m) if problem.ndim == 2 else 1, -(-problem.out_size[-1] // m)


def _workspace(m: int):
    def workspace(problem: ConvProblem) -> int:
        fwd = backward_data_as_forward(problem) if problem.pass_ == "backward_data" else problem
        th, tw = _tiles(fwd, m)
        tiles = max(1, min(_chunk(fwd, m), fwd.batch * th * tw))
        alpha2 = (m + 2) ** fwd.ndim
        chunks = -(-fwd.batch * th * tw // tiles)
        chunk = alpha2 * tiles * (fwd.in_channels + fwd.out_channels)
        if chunks >= get_num_threads():
            chunk *= get_num_threads()  # one pair of buffers per thread
        u = alpha2 * fwd.in_channels * fwd.out_channels
        return (chunk + u) * fwd.compute_dtype.itemsize

    return workspace


def winograd_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray, m: int) -> np.ndarray:
    """Forward conv of channels-last x (N, *S, C) and w (O, *K, C) by F(m, 3)."""
    bth, btw, _, _, ath, atw = (a.astype(x.dtype) for a in _matrices(problem.ndim, m))
    u = WEIGHT_CACHE.get(w, m, weight_transform)
    x4 = x.reshape(x.shape[0], 1, *x.shape[1:]) if problem.ndim == 1 else x
    y = np.empty(problem.y_shape("NHWC"), dtype=x.dtype)
    y4 = y.reshape(y.shape[0], 1, *y.shape[1:]) if problem.ndim == 1 else y
    pad_h = problem.padding[0][0] if problem.ndim == 2 else 0
    pad_w = problem.padding[-1][0]
    tiles_h, tiles_w = _tiles(problem, m)
    total, chunk = problem.batch * tiles_h * tiles_w, _chunk(problem, m)
    chunks = -(-total // chunk)
    shape_v = (min(chunk, total), u.shape[0], problem.in_channels)
    shape_m = (*shape_v[:2], problem.out_channels)

    special = [nonfinite(u)]  # NaN/inf: Winograd would smear them over whole tiles

    def work(part: int, parts: int) -> None:
        # tile-major buffers; the GEMM sees them as (alpha^2, tiles, channels) views
        v, prod = np.empty(shape_v, x.dtype), np.empty(shape_m, x.dtype)
        for i in range(part, chunks, parts):
            t0 = i * chunk
            b = min(chunk, total - t0)
            winograd_input(x4, v[:b], t0, tiles_h, tiles_w, pad_h, pad_w, bth, btw)
            if special[0] or nonfinite(v[:b]):
                special[0] = True
                return
            np.matmul(v[:b].transpose(1, 0, 2), u, out=prod[:b].transpose(1, 0, 2))
            winograd_output(prod[:b], y4, t0, tiles_h, tiles_w, ath, atw)

    if chunks >= get_num_threads():  # threads over chunks, each with serial BLAS
        with single_threaded_blas():
            run_parallel(work, get_num_threads())
    else:  # too few tiles to share out: one chunk at a time, threaded BLAS
        work(0, 1)
    if special[0]:  # the direct loops give NaN/inf exactly where IEEE arithmetic does
        return registry.get("direct", "forward").run(problem, x, w)
    return y


def winograd_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray, m: int) -> np.ndarray:
    """dx as the forward conv of dy with the flipped, channel-swapped kernel."""
    return winograd_fwd(backward_data_as_forward(problem), dy, flipped_weight(w), m)


def _register(name: str, m: int, accuracy: int) -> None:
    def fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return winograd_fwd(problem, x, w, m)

    def bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
        return winograd_bwd_data(problem, dy, w, m)

    for pass_, run in (("forward", fwd), ("backward_data", bwd_data)):
        register(name, pass_, supports=_supports, workspace_bytes=_workspace(m),
                 exact=False, accuracy=accuracy)(run)


_register("winograd", 2, accuracy=1)
_register("winograd4", 4, accuracy=0)
