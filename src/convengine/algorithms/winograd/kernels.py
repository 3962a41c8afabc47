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

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import prange

from ... import _kernel_cache, host_params, memory, registry
from ..._kernel_cache import Source, instantiate, load
from ...finite import nonfinite
from ...params import Params, Space, around
from ...problem import ConvProblem
from ...registry import register
from ...threads import get_num_threads
from .._transforms import (
    backward_data_as_forward,
    backward_data_as_forward_reason,
    flipped_view,
)
from ..direct import NOALIAS
from ..fma import MR, WEIGHT_AHEAD, lanes, nr
from ..weight_cache import WeightCache

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

# bound on the cached weight transforms (and weight copies): a ResNet-50 training step
# needs 450 MB (F(4x4) forward and flipped backward-data transforms of every 3x3
# layer); at 256 MiB the step cycled through the LRU and recomputed every transform
# (measured, batch 8: 520 of its 2,260 ms in Winograd calls)
CACHE_BYTES = 1 << 30
# transformed tiles + products of one block (per thread): half of L2, 512 KiB on a
# 1 MiB L2 (see host_params.winograd_block_bytes)
BLOCK_BYTES = host_params.winograd_block_bytes()
CACHED_U_BYTES = 2**21  # a thread's share of the packed weights above this: streamed ...
REUSE_TILES = 36  # ... once per block, so blocks of at least this many tiles
CHAIN = 128  # input channels summed serially before a partial sum is added (accuracy)
SPLIT_K_TILES = 24  # fewer tiles per thread: threads split the output channels instead


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


def _sandwich_source(name: str, args: str, left: np.ndarray, right: np.ndarray,
                     src: str, dst: str, width: str, check: bool = False) -> str:
    """Source of ``name(args)``: ``dst(i, j)[c] = (left @ S[c] @ right^T)[i, j]`` for
    ``lo <= c < width`` with ``S[c][k, j] = src(k, j)[c]``, coefficients as literals.
    ``src``/``dst`` are index templates over ``{k}``/``{i}`` (tile row), ``{j}``
    (column) and ``{kj}``/``{ij}`` (row-major position). One short loop over channels
    per column (into ``tmp``) and per row (into dst): LLVM vectorises each, which it
    does not for one loop holding the whole tile. ``check``: ``chk[c]`` gains 0 times
    the sum of each result row (NaN once a result is NaN or infinite)."""
    (p, a), (q, b) = left.shape, right.shape
    lines = [f"def {name}({args}):"]
    for j in range(b):  # tmp[:, j] = left @ S[:, j]
        lines.append(f"    for c in range(lo, {width}):")
        lines += [f"        s{k} = " + src.format(k=k, j=j, kj=k * b + j) for k in range(a)]
        for i in range(p):
            expr = _combination(left[i], [f"s{k}" for k in range(a)])
            lines.append(f"        tmp[{i * b + j}, c] = {expr}")
    for i in range(p):  # dst[i, :] = tmp[i, :] @ right^T
        lines.append(f"    for c in range(lo, {width}):")
        lines += [f"        t{k} = tmp[{i * b + k}, c]" for k in range(b)]
        for j in range(q):
            expr = _combination(right[j], [f"t{k}" for k in range(b)])
            lines.append(f"        d{j} = {expr}")
            lines.append("        " + dst.format(i=i, j=j, ij=i * q + j) + f" = d{j}")
        if check:
            lines.append(f"        chk[c] += ({' + '.join(f'd{j}' for j in range(q))}) * F(0)")
    return "\n".join(lines) + "\n"


_KERNELS: dict[tuple[int, int, str, bool], Any] = {}


def kernel(ndim: int, m: int, dtype: np.dtype, tails: bool = True) -> Any:
    """The compiled fused F(m, 3) kernel in ``ndim`` dims, generated once (without
    ``tails``: for channel counts C and O that are whole vectors only, a ValueError
    otherwise, and about half the compile time; see :func:`needs_tails`):

    ``fused(x (N,H,W,C), up (K/NR, alpha^2, C, NR), y (N,OH,OW,O), pad_h, pad_w,
    tiles_h, tiles_w, block, parts_k, v (P, alpha^2, block, C), prod (P, alpha^2,
    block, NR), check (P, NR), ahead)`` (``ahead``: the GEMM's weight prefetch distance,
    :data:`convengine.algorithms.fma.WEIGHT_AHEAD`).

    Part ``p < P`` (one per thread) takes an equal share of the tiles (of ``P //
    parts_k`` shares) and of the ``NR``-wide output-channel blocks (of ``parts_k``).
    Per ``block`` tiles: the input transform into ``v[p]``, for each channel block the
    alpha^2 GEMMs ``prod[p][a] = v[p][a] @ up[kb, a]`` by the register-blocked
    micro-kernel, then the output transform cropped into y. Interior tiles are read
    straight from x, tiles meeting the padding or far edges from a zero-padded copy.
    ``check[p]`` gains 0 times sums of outputs: NaN if one was not finite."""
    key = (ndim, m, np.dtype(dtype).name, bool(tails))
    if key not in _KERNELS:
        tag = f"winograd_{ndim}d_f{m}_{key[2]}{'' if tails else '_whole'}"
        _KERNELS[key] = instantiate(__name__, "fused_template.py", tag, NDIM=ndim, M=m,
                                    DTYPE=key[2], TAILS=int(tails)).fused
    return _KERNELS[key]


def needs_tails(problem: ConvProblem) -> bool:
    """Whether the problem's forward channel counts (in and out) leave a part vector:
    the fused kernel then needs its scalar tails."""
    vec = lanes(problem.compute_dtype.itemsize)
    return problem.in_channels % vec != 0 or problem.out_channels % vec != 0


@functools.cache
def transform_tails(ndim: int, m: int, dtype: str) -> Any:
    """The transforms' scalar tails for the channels past the last whole vector (a
    module of :class:`Source`, generated from the matrices, cached on disk):
    ``tail_in(src, n, h0, w0, tmp, dst, t, lo)`` writes ``dst[:, t, lo:]`` from the
    tile of ``src`` (N,H,W,C) at (n, h0, w0); ``tail_out(src, t, tmp, dst, n, h0, w0,
    k0, lo, nc, chk)`` writes ``dst[n, h0:, w0:, k0 + lo:k0 + nc]`` from ``src[:, t]``."""
    bth, btw, _, _, ath, atw = _matrices(ndim, m)
    src = Source(__name__, f"winograd_tails_{ndim}d_f{m}_{dtype}")
    src.expr("F", f"np.{dtype}")
    src.code(_sandwich_source(
        "tail_in", "src, n, h0, w0, tmp, dst, t, lo", bth, btw,
        "src[n, h0 + {k}, w0 + {j}, c]", "dst[{ij}, t, c]", "src.shape[3]"), "tail_in")
    src.code(_sandwich_source(
        "tail_out", "src, t, tmp, dst, n, h0, w0, k0, lo, nc, chk", ath, atw,
        "src[{kj}, t, c]", "dst[n, h0 + {i}, w0 + {j}, k0 + c]", "nc", check=True), "tail_out")
    src.jit("tail_in", **NOALIAS)
    src.jit("tail_out", **NOALIAS)
    return load(src)


# --------------------------------------------------------------- weight transforms


WEIGHT_CACHE = WeightCache(CACHE_BYTES)


def _matrices(ndim: int, m: int) -> tuple[np.ndarray, ...]:
    """(B_h^T, B_w^T, G_h, G_w, A_h^T, A_w^T) as float64 arrays."""
    bt, g, at = (np.array(a, dtype=np.float64) for a in MATRICES[m])
    bth, gh, ath = (np.array(a) for a in IDENTITY) if ndim == 1 else (bt, g, at)
    return bth, bt, gh, g, ath, at


def packed_transform(w: np.ndarray, m: int) -> np.ndarray:
    """The transformed weights ``U = G g G^T`` packed as the micro-kernel's panels, in one
    compiled pass: w (O, [3,] 3, C), any strides (a flipped view too) -> (ceil(O / NR),
    alpha^ndim, C, NR), one contiguous run per output-channel block, each ``G g G^T``
    summed in float64 and rounded once, the panels' padding zero. A
    training step changes the weights on every call: the numpy form (float64 copies,
    two tensordots, a transpose and the packing) took 12 ms a layer there."""
    ndim = w.ndim - 2
    _, _, gh, gw, _, _ = _matrices(ndim, m)
    w4 = w.reshape(w.shape[0], 1, *w.shape[1:]) if ndim == 1 else w
    o, _, _, c = w4.shape
    width = nr(w.itemsize)
    up = np.empty((-(-o // width), gh.shape[0] * gw.shape[0], c, width), dtype=w.dtype)
    _transform_into(w4, gh, gw, up)
    return up


@_kernel_cache.kernel(parallel=True, nogil=True)
def _transform_into(w, gh, gw, up):
    """up[o // NR, i * aw + j, c, o % NR] = sum_kh gh[i, kh] sum_kw gw[j, kw]
    w[o, kh, kw, c] in float64 (zero for o >= O), parallel over (panel, channel), the
    panel's NR output channels innermost (vector lanes)."""
    o_, kh_, kw_, c_ = w.shape
    ah, aw = gh.shape[0], gw.shape[0]
    panels, _, _, width = up.shape
    for t in prange(panels * c_):
        ob, c = t // c_, t % c_
        taps = np.zeros((kh_, kw_, width))
        for lane in range(min(width, o_ - ob * width)):
            for kh in range(kh_):
                for kw in range(kw_):
                    taps[kh, kw, lane] = w[ob * width + lane, kh, kw, c]
        rows = np.zeros((kh_, aw, width))
        for kh in range(kh_):
            for j in range(aw):
                for kw in range(kw_):
                    g = gw[j, kw]
                    for lane in range(width):
                        rows[kh, j, lane] += g * taps[kh, kw, lane]
        for i in range(ah):
            for j in range(aw):
                total = np.zeros(width)
                for kh in range(kh_):
                    g = gh[i, kh]
                    for lane in range(width):
                        total[lane] += g * rows[kh, j, lane]
                for lane in range(width):
                    up[ob, i * aw + j, c, lane] = total[lane]


# --------------------------------------------------------------------------- driver


def _tiles(problem: ConvProblem, m: int) -> tuple[int, int]:
    oh = problem.out_size[0] if problem.ndim == 2 else 1
    return -(-oh // m) if problem.ndim == 2 else 1, -(-problem.out_size[-1] // m)


def _split_k(problem: ConvProblem, m: int) -> int | None:
    """Whether the threads split the output channels (1) or the tiles (0) by default:
    channels when the tiles are too few to share out (each thread then reads only its
    share of the transformed weights); None where there is no choice (one thread, or
    fewer channel blocks than threads)."""
    parts = get_num_threads()
    th, tw = _tiles(problem, m)
    nkb = -(-problem.out_channels // nr(problem.compute_dtype.itemsize))
    if parts == 1 or nkb < parts:
        return None
    return int(problem.batch * th * tw < parts * SPLIT_K_TILES)


def tunables(m: int) -> Callable[[ConvProblem], Space]:
    """The parameters of F(m, 3), the cost-model default first: ``block_kib``, the
    KiB of transformed tiles and products per block (``BLOCK_BYTES``, half of L2) or
    a quarter, half or twice it; ``ahead``, the GEMM steps ahead at which the weights
    are prefetched (``WEIGHT_AHEAD``, none, twice); ``split_k`` (:func:`_split_k`)
    where it is a choice."""
    def space(problem: ConvProblem) -> Space:
        fwd = backward_data_as_forward(problem) if problem.pass_ == "backward_data" else problem
        chosen: Space = {"block_kib": around(BLOCK_BYTES >> 10),
                         "ahead": (WEIGHT_AHEAD, 0, 2 * WEIGHT_AHEAD)}
        split = _split_k(fwd, m)
        if split is not None:
            chosen["split_k"] = (split, 1 - split)
        return chosen
    return space


def _plan(problem: ConvProblem, m: int, params: Params | None = None) -> tuple[int, int, int]:
    """(parts, parts_k, block): one part per thread; the output channels are split
    over the threads (parts_k = parts) as :func:`_split_k` says (or ``params``);
    tiles go through the GEMMs ``block`` at a time, a multiple of the micro-kernel's
    rows with about BLOCK_BYTES (or ``params["block_kib"]``) of transformed tiles and
    products, or REUSE_TILES when the thread's share of the packed weights does not
    stay in its cache."""
    chosen = params or {}
    parts = get_num_threads()
    th, tw = _tiles(problem, m)
    total = problem.batch * th * tw
    width = nr(problem.compute_dtype.itemsize)
    nkb = -(-problem.out_channels // width)
    split_k = bool(chosen.get("split_k", _split_k(problem, m) or 0))
    parts_k = parts if split_k and parts > 1 and nkb >= parts else 1
    share = max(1, -(-total // (parts // parts_k)))  # batch 0: the plan of one tile
    alpha2, itemsize = (m + 2) ** problem.ndim, problem.compute_dtype.itemsize
    block_bytes = chosen.get("block_kib", BLOCK_BYTES >> 10) << 10
    most = block_bytes // (alpha2 * (problem.in_channels + width) * itemsize)
    if alpha2 * problem.in_channels * nkb * width * itemsize > CACHED_U_BYTES * parts_k:
        most = max(most, REUSE_TILES)
    most = max(MR, most // MR * MR)
    per_block = -(-share // -(-share // most))  # equal blocks of at most ``most``
    return parts, parts_k, -(-per_block // MR) * MR


def _workspace(m: int):
    def workspace(problem: ConvProblem) -> int:
        fwd = backward_data_as_forward(problem) if problem.pass_ == "backward_data" else problem
        parts, _, block = _plan(fwd, m)
        alpha2 = (m + 2) ** fwd.ndim
        width = nr(fwd.compute_dtype.itemsize)
        padded = -(-fwd.out_channels // width) * width
        per_part = alpha2 * block * (fwd.in_channels + width) + width
        u = alpha2 * fwd.in_channels * padded
        return (parts * per_part + u) * fwd.compute_dtype.itemsize

    return workspace


def winograd_fwd(problem: ConvProblem, x: np.ndarray, up: np.ndarray,
                 m: int, params: Params | None = None) -> np.ndarray | None:
    """Forward conv of channels-last x (N, *S, C) by F(m, 3) with packed transformed
    weights up (:func:`packed_transform`), ``params`` as :func:`tunables` names them;
    None if an output is NaN or infinite (x held one, or the transforms overflowed)."""
    fused = kernel(problem.ndim, m, x.dtype, needs_tails(problem))
    x4 = x.reshape(x.shape[0], 1, *x.shape[1:]) if problem.ndim == 1 else x
    y = memory.empty(problem.y_shape("NHWC"), dtype=x.dtype)
    y4 = y.reshape(y.shape[0], 1, *y.shape[1:]) if problem.ndim == 1 else y
    pad_h = problem.padding[0][0] if problem.ndim == 2 else 0
    pad_w = problem.padding[-1][0]
    tiles_h, tiles_w = _tiles(problem, m)
    parts, parts_k, block = _plan(problem, m, params)
    width = up.shape[-1]
    v = np.empty((parts, up.shape[1], block, problem.in_channels), x.dtype)
    prod = np.empty((parts, up.shape[1], block, width), x.dtype)
    check = np.zeros((parts, width), x.dtype)
    fused(x4, up, y4, pad_h, pad_w, tiles_h, tiles_w, block, parts_k, v, prod, check,
          (params or {}).get("ahead", WEIGHT_AHEAD))
    return None if nonfinite(check) else y


def _run(problem: ConvProblem, a: np.ndarray, w: np.ndarray, m: int,
         params: Params | None = None) -> np.ndarray:
    """Forward, or backward-data as the forward conv of dy with the flipped,
    channel-swapped kernel (whose transform is cached against the unflipped w).
    NaN/inf anywhere: the direct loops, which put them where IEEE arithmetic does."""
    if problem.pass_ == "backward_data":
        u, special = WEIGHT_CACHE.get(
            w, (m, "flipped"), lambda w: packed_transform(flipped_view(w), m))
        out = None if special else winograd_fwd(backward_data_as_forward(problem), a, u, m,
                                                params)
    else:
        u, special = WEIGHT_CACHE.get(w, (m, "forward"), lambda w: packed_transform(w, m))
        out = None if special else winograd_fwd(problem, a, u, m, params)
    return registry.get("direct", problem.pass_).run(problem, a, w) if out is None else out


def _register(name: str, m: int, accuracy: int) -> None:
    def run(problem: ConvProblem, a: np.ndarray, w: np.ndarray,
            params: Params | None = None) -> np.ndarray:
        return _run(problem, a, w, m, params)

    for pass_ in ("forward", "backward_data"):
        register(name, pass_, supports=_supports, workspace_bytes=_workspace(m),
                 exact=False, accuracy=accuracy, tunables=tunables(m))(run)


_register("winograd", 2, accuracy=1)
_register("winograd4", 4, accuracy=0)
