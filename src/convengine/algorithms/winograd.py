"""``winograd`` (F(2x2,3x3)) and ``winograd4`` (F(4x4,3x3)): fast 3x3 stride-1 convs.

Lavin & Gray's minimal filtering: an ``m x m`` output tile of a 3x3 conv costs
``(m + 2)^2`` multiplies per (input, output) channel pair instead of ``9 m^2``
(16 vs 36 for m = 2, 36 vs 144 for m = 4). 1-D problems use F(2,3) and F(4,3)
(4 vs 6, 6 vs 12). Three stages, run chunk by chunk over the output tiles so the
transformed tiles and the GEMM operands stay in cache:

1. input transform ``V = B^T d B`` per tile (numba code generated from the matrices,
   straight-line, vectorised over channels): V ``(tiles, alpha^2, C)``;
2. one batched GEMM ``M[a] = V[a] @ U[a]`` (BLAS), U ``(alpha^2, C, O)``;
3. output transform ``Y = A^T M A`` (generated likewise), cropped into y.

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
from typing import Any

import numpy as np
from numba import njit

from .. import registry
from ..problem import ConvProblem
from ..registry import register
from ..threads import get_num_threads, run_parallel, single_threaded_blas
from ._finite import nonfinite
from ._transforms import backward_data_as_forward, backward_data_as_forward_reason, flipped_weight
from .direct import NOALIAS

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


def _combination(coefs: np.ndarray, names: list[str]) -> str:
    """``sum coefs[k] * names[k]`` as Python source, zero terms left out; ``F`` is the
    compute dtype's scalar type (a float64 literal would promote float32 code)."""
    terms = []
    for coef, name in zip(coefs, names):
        if coef != 0:
            sign = "-" if coef < 0 else "+"
            mag = abs(float(coef))
            terms.append(f"{sign} {name}" if mag == 1 else f"{sign} F({mag!r}) * {name}")
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else text


def _sandwich_source(name: str, left: np.ndarray, right: np.ndarray) -> str:
    """Source of ``name(src, tmp, dst)``: dst[i * q + j, c] = (left @ S @ right^T)[i, j]
    for S = src[a, b, c] (a 3-D view), coefficients as literals. One short loop over
    channels per column (into tmp) and per row (into dst): LLVM vectorises each, which
    it does not for one loop holding the whole tile."""
    (p, a), (q, b) = left.shape, right.shape
    lines = [f"def {name}(src, tmp, dst):"]
    for j in range(b):  # tmp[:, j] = left @ S[:, j]
        lines.append("    for c in range(src.shape[2]):")
        lines += [f"        s{k} = src[{k}, {j}, c]" for k in range(a)]
        for i in range(p):
            expr = _combination(left[i], [f"s{k}" for k in range(a)])
            lines.append(f"        tmp[{i * b + j}, c] = {expr}")
    for i in range(p):  # dst[i, :] = tmp[i, :] @ right^T
        lines.append("    for c in range(src.shape[2]):")
        lines += [f"        t{k} = tmp[{i * b + k}, c]" for k in range(b)]
        for j in range(q):
            expr = _combination(right[j], [f"t{k}" for k in range(b)])
            lines.append(f"        dst[{i * q + j}, c] = {expr}")
    return "\n".join(lines) + "\n"


_STAGES: dict[tuple[int, int, str], tuple[Any, Any]] = {}


def stages(ndim: int, m: int, dtype: np.dtype) -> tuple[Any, Any]:
    """The compiled (input, output) stages of F(m, 3) in ``ndim`` dims, generated once:

    - ``input(x (N,H,W,C), v (b, ah*aw, C), t0, tiles_h, tiles_w, pad_h, pad_w)``;
    - ``output(m (b, ah*aw, O), y (N,OH,OW,O), t0, tiles_h, tiles_w)``.

    Interior tiles are transformed straight from x; tiles meeting the padding or the
    far edges from a zero-padded copy, and their outputs are cropped."""
    key = (ndim, m, np.dtype(dtype).name)
    if key in _STAGES:
        return _STAGES[key]
    bth, btw, _, _, ath, atw = _matrices(ndim, m)
    scope: dict[str, Any] = {"F": np.dtype(dtype).type}
    exec(_sandwich_source("transform_in", bth, btw), scope)  # noqa: S102
    exec(_sandwich_source("transform_out", ath, atw), scope)  # noqa: S102
    transform_in = njit(**NOALIAS)(scope["transform_in"])
    transform_out = njit(**NOALIAS)(scope["transform_out"])
    ah, aw, mh, mw = bth.shape[0], btw.shape[0], ath.shape[0], atw.shape[0]

    @njit(nogil=True)
    def winograd_input(x, v, t0, tiles_h, tiles_w, pad_h, pad_w):  # noqa: PLR0913
        _, h_, w_, c_ = x.shape
        patch = np.empty((ah, aw, c_), dtype=v.dtype)
        tmp = np.empty((ah * aw, c_), dtype=v.dtype)
        for t in range(v.shape[0]):
            tile = t0 + t
            n = tile // (tiles_h * tiles_w)
            h0 = (tile // tiles_w) % tiles_h * mh - pad_h
            w0 = tile % tiles_w * mw - pad_w
            if h0 >= 0 and w0 >= 0 and h0 + ah <= h_ and w0 + aw <= w_:
                transform_in(x[n, h0:h0 + ah, w0:w0 + aw], tmp, v[t])
                continue
            for k in range(ah):
                for j in range(aw):
                    ih, iw = h0 + k, w0 + j
                    inside = 0 <= ih < h_ and 0 <= iw < w_
                    for c in range(c_):
                        patch[k, j, c] = x[n, ih, iw, c] if inside else 0
            transform_in(patch, tmp, v[t])

    @njit(nogil=True)
    def winograd_output(prod, y, t0, tiles_h, tiles_w):
        _, oh_, ow_, o_ = y.shape
        res = np.empty((mh * mw, o_), dtype=y.dtype)
        tmp = np.empty((mh * aw, o_), dtype=y.dtype)
        for t in range(prod.shape[0]):
            tile = t0 + t
            n = tile // (tiles_h * tiles_w)
            h0 = (tile // tiles_w) % tiles_h * mh
            w0 = tile % tiles_w * mw
            transform_out(prod[t].reshape(ah, aw, o_), tmp, res)
            for i in range(min(mh, oh_ - h0)):
                for j in range(min(mw, ow_ - w0)):
                    for c in range(o_):
                        y[n, h0 + i, w0 + j, c] = res[i * mw + j, c]

    _STAGES[key] = (winograd_input, winograd_output)
    return _STAGES[key]


# --------------------------------------------------------------- weight transforms


@njit(cache=True, nogil=True)
def _same_bits(a, b):
    """Whether two equally shaped unsigned-integer views hold the same bits."""
    a, b = a.reshape(-1), b.reshape(-1)
    for i in range(0, a.size, 4096):  # blocks: vectorised compare, early exit
        if not np.array_equal(a[i:i + 4096], b[i:i + 4096]):
            return False
    return True


class _WeightCache:
    """LRU of weight transforms, bounded in bytes, matched bit-exactly on the weights.

    ``get(w, kind, make)`` returns ``(u, special)``: ``u = make(w)`` (computed once per
    distinct weights and ``kind``) and whether u holds NaN or infinity."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple, list[tuple[np.ndarray, np.ndarray, bool]]] = (
            OrderedDict())
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def _key(w: np.ndarray, kind: tuple) -> tuple:
        sample = w.reshape(-1)[:: max(1, w.size // 64)]
        return (kind, w.shape, w.dtype.str, sample.tobytes())

    def _size(self) -> int:
        return sum(a.nbytes + u.nbytes for v in self.entries.values() for a, u, _ in v)

    def get(self, w: np.ndarray, kind: tuple, make) -> tuple[np.ndarray, bool]:
        key = self._key(w, kind)
        bits = w.view(f"u{w.itemsize}")
        with self.lock:
            for stored, u, special in self.entries.get(key, ()):
                if _same_bits(stored.view(bits.dtype), bits):
                    self.entries.move_to_end(key)
                    self.hits += 1
                    return u, special
        u = make(w)
        special = bool(nonfinite(u))
        with self.lock:
            self.misses += 1
            self.entries.setdefault(key, []).append((w.copy(), u, special))
            self.entries.move_to_end(key)
            while self._size() > self.max_bytes and len(self.entries) > 1:
                self.entries.popitem(last=False)
        return u, special

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
    """Tiles per chunk: about CHUNK_BYTES of V and M, at least MIN_TILES, but small
    enough that every thread gets a chunk (threaded BLAS on one chunk collapsed to
    2 GFLOP/s next to a busy neighbour: its threads wait on each other)."""
    alpha2 = (m + 2) ** problem.ndim
    per_tile = alpha2 * (problem.in_channels + problem.out_channels) * 4
    th, tw = _tiles(problem, m)
    share = -(-problem.batch * th * tw // get_num_threads())
    return max(1, min(max(MIN_TILES, CHUNK_BYTES // per_tile), share))


def _tiles(problem: ConvProblem, m: int) -> tuple[int, int]:
    oh = problem.out_size[0] if problem.ndim == 2 else 1
    return -(-oh // m) if problem.ndim == 2 else 1, -(-problem.out_size[-1] // m)


def _workspace(m: int):
    def workspace(problem: ConvProblem) -> int:
        fwd = backward_data_as_forward(problem) if problem.pass_ == "backward_data" else problem
        th, tw = _tiles(fwd, m)
        tiles, total = _chunk(fwd, m), fwd.batch * th * tw
        alpha2 = (m + 2) ** fwd.ndim
        chunk = alpha2 * min(tiles, total) * (fwd.in_channels + fwd.out_channels)
        chunk *= min(get_num_threads(), -(-total // tiles))  # a pair of buffers per thread
        u = alpha2 * fwd.in_channels * fwd.out_channels
        return (chunk + u) * fwd.compute_dtype.itemsize

    return workspace


def winograd_fwd(problem: ConvProblem, x: np.ndarray, u: np.ndarray, m: int) -> np.ndarray | None:
    """Forward conv of channels-last x (N, *S, C) by F(m, 3) with transformed weights u
    (alpha^ndim, C, O); None if x holds NaN or infinity."""
    winograd_input, winograd_output = stages(problem.ndim, m, x.dtype)
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
    special = [False]  # NaN/inf met: Winograd would smear them over whole tiles

    def work(part: int, parts: int) -> None:
        # tile-major buffers; the GEMM sees them as (alpha^2, tiles, channels) views
        v, prod = np.empty(shape_v, x.dtype), np.empty(shape_m, x.dtype)
        for i in range(part, chunks, parts):
            t0 = i * chunk
            b = min(chunk, total - t0)
            winograd_input(x4, v[:b], t0, tiles_h, tiles_w, pad_h, pad_w)
            if special[0] or nonfinite(v[:b]):
                special[0] = True
                return
            np.matmul(v[:b].transpose(1, 0, 2), u, out=prod[:b].transpose(1, 0, 2))
            winograd_output(prod[:b], y4, t0, tiles_h, tiles_w)

    with single_threaded_blas():  # threads over chunks, each with serial BLAS
        run_parallel(work, min(get_num_threads(), chunks))
    return None if special[0] else y


def _run(problem: ConvProblem, a: np.ndarray, w: np.ndarray, m: int) -> np.ndarray:
    """Forward, or backward-data as the forward conv of dy with the flipped,
    channel-swapped kernel (whose transform is cached against the unflipped w).
    NaN/inf anywhere: the direct loops, which put them where IEEE arithmetic does."""
    if problem.pass_ == "backward_data":
        u, special = WEIGHT_CACHE.get(
            w, (m, "flipped"), lambda w: weight_transform(flipped_weight(w), m))
        out = None if special else winograd_fwd(backward_data_as_forward(problem), a, u, m)
    else:
        u, special = WEIGHT_CACHE.get(w, (m, "forward"), lambda w: weight_transform(w, m))
        out = None if special else winograd_fwd(problem, a, u, m)
    return registry.get("direct", problem.pass_).run(problem, a, w) if out is None else out


def _register(name: str, m: int, accuracy: int) -> None:
    def run(problem: ConvProblem, a: np.ndarray, w: np.ndarray) -> np.ndarray:
        return _run(problem, a, w, m)

    for pass_ in ("forward", "backward_data"):
        register(name, pass_, supports=_supports, workspace_bytes=_workspace(m),
                 exact=False, accuracy=accuracy)(run)


_register("winograd", 2, accuracy=1)
_register("winograd4", 4, accuracy=0)
