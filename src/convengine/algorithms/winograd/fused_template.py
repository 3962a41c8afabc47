"""Kernel template (see ``convengine._kernel_cache``): the fused F(M, 3) Winograd
kernel in ``NDIM`` dims for dtype ``DTYPE`` (with scalar tails for channel counts
that are not whole vectors where ``TAILS``): input transform, the batched GEMM of the
transformed tiles by the 6 x NR micro-kernel ``gemm_6xnr``, output transform; made by
:func:`convengine.algorithms.winograd.kernels.kernel`, whose docstring says what
``fused`` computes. The transforms' vector parts are intrinsics built from the
matrices (``make_sandwich``), their scalar tails generated source
(:func:`~convengine.algorithms.winograd.kernels.transform_tails`). In checked mode
(:mod:`convengine.checked`) ``fused`` checks each intrinsic call's ranges first
(:func:`sandwich_inside`, :func:`gemm_inside`), skips a call reaching outside a buffer
and raises BoundsError after its parallel loop."""

import numpy as np
from numba import njit, prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.direct import NOALIAS
from convengine.algorithms.fma import MR, gemm_6xnr, lanes, make_sandwich, nr
from convengine.algorithms.winograd.kernels import CHAIN, _matrices, transform_tails
from convengine.checked import CHECKED, fail, violations, within

NDIM, M, DTYPE, TAILS = parameters(__name__, "NDIM", "M", "DTYPE", "TAILS")
BTH, BTW, _, _, ATH, ATW = _matrices(NDIM, M)
vector_in = make_sandwich(BTH, BTW, check=False)
vector_out = make_sandwich(ATH, ATW, check=True)
# the scalar tails, for channels past the last whole vector, only where asked: half
# of a cold F(4x4) kernel's compile time (4.8 of 10.4 s, Emerald Rapids), for
# channel counts most networks never have. Without them (TAILS 0: the calls below are
# pruned, as CHECKS's are) fused refuses channels that are not whole vectors.
if TAILS:
    tails = transform_tails(NDIM, M, DTYPE)
    tail_in, tail_out = tails.tail_in, tails.tail_out
else:
    tail_in = tail_out = None
AH, AW, MH, MW = BTH.shape[0], BTW.shape[0], ATH.shape[0], ATW.shape[0]
ALPHA2 = AH * AW
WIDTH, VEC = nr(np.dtype(DTYPE).itemsize), lanes(np.dtype(DTYPE).itemsize)
# the buffers of the checks' sites: transform_in's source (x, or the zero-padded tile
# patch), the transformed tiles v, the packed weights up, the products prod, the
# output transform's destination (y, or the edge tile res) and the NaN check
BUFFERS = ("x", "patch", "v", "up", "prod", "y", "res", "check")
X, PATCH, V, UP, PROD, Y, RES, CHECK = 1, 2, 3, 4, 5, 6, 7, 8
# CHECKED as an int in fused: numba 0.68's array analysis put the True of ``if CHECKED``
# in the equivalence class of the literal 1s (True == 1) and rebuilt the shape of
# np.zeros((1, AH, AW, c_)) as (True, ...), which np.empty refused. 0 prunes the checks
# away as False does.
CHECKS = int(CHECKED)


@njit(inline="always")
def reach(off, rows, rs, cols, cs, width):  # noqa: ANN001, ANN201, PLR0913
    """[first, stop) of the elements ``off + k*rs + j*cs + e`` over ``k < rows``, ``j <
    cols``, ``e < width``."""
    return (off + min(0, (rows - 1) * rs) + min(0, (cols - 1) * cs),
            off + max(0, (rows - 1) * rs) + max(0, (cols - 1) * cs) + width)


@njit(inline="always")
def sandwich_inside(bad, src_site, src, dst_site, dst, args, left, right, chk_site,  # noqa: ANN001, ANN201, PLR0913
                    chk):
    """Whether one call of ``make_sandwich(L, R, check)`` (``left``, ``right``: the
    shapes of L and R; ``chk_site``: CHECK if ``check``, else 0) with ``(src,
    *args[:3], dst, *args[3:], chk)`` stays inside its buffers (checked mode). Its
    exact footprint (the intrinsic's code), for ``groups`` vectors of VEC channels at
    ``g * VEC``: src ``s_off + k*s_rs + j*s_cs + [0, groups*VEC)`` over ``k <
    left[1]``, ``j < right[1]`` (every element loaded, zero coefficients too); dst
    ``d_off + i*d_rs + j*d_cs + [0, groups*VEC)`` over ``i < left[0]``, ``j < right[0]``
    (every result stored); with ``check``, chk ``[0, groups*VEC)`` (read and written);
    no access at all when ``groups <= 0``."""
    s_off, s_rs, s_cs, d_off, d_rs, d_cs, groups = args
    if groups <= 0:
        return True
    s_first, s_stop = reach(s_off, left[1], s_rs, right[1], s_cs, groups * VEC)
    d_first, d_stop = reach(d_off, left[0], d_rs, right[0], d_cs, groups * VEC)
    return (within(bad, src_site, src.size, s_first, s_stop)
            and within(bad, dst_site, dst.size, d_first, d_stop)
            and (chk_site == 0 or within(bad, chk_site, chk.size, 0, groups * VEC)))


@njit(inline="always")
def in_args(src, n, h0, w0, v, t):  # noqa: ANN001, ANN201, PLR0913
    """vector_in's (s_off, s_rs, s_cs, d_off, d_rs, d_cs, groups) for the tile at
    src[n, h0:h0 + AH, w0:w0 + AW] -> v[:, t] (its whole vectors of channels)."""
    _, h_, w_, c_ = src.shape
    block = v.shape[1]
    return (((n * h_ + h0) * w_ + w0) * c_, w_ * c_, c_, t * c_, AW * block * c_,
            block * c_, c_ // VEC)


@njit(inline="always")
def out_args(prod, t, y, n, h0, w0, k0, nc):  # noqa: ANN001, ANN201, PLR0913
    """vector_out's (s_off, s_rs, s_cs, d_off, d_rs, d_cs, groups) for prod[:, t, :nc]
    -> y[n, h0:h0 + MH, w0:w0 + MW, k0:k0 + nc] (its whole vectors of channels)."""
    _, oh_, ow_, o_ = y.shape
    block = prod.shape[1]
    return (t * WIDTH, AW * block * WIDTH, block * WIDTH,
            ((n * oh_ + h0) * ow_ + w0) * o_ + k0, ow_ * o_, o_, nc // VEC)


# The checks fused makes: functions of their own (compiled and cached with the kernel,
# in checked mode only), keeping its parallel loop's body small.
@compiled(nogil=True)
def in_inside(bad, site, src, n, h0, w0, v, t, chk):  # noqa: ANN001, ANN201, PLR0913
    """Whether transform_in's vector_in call for the tile at src[n, h0:, w0:] (x, or
    the patch: ``site``) -> v[:, t] stays inside src and v (checked mode)."""
    return sandwich_inside(bad, site, src, V, v, in_args(src, n, h0, w0, v, t), BTH.shape,
                           BTW.shape, 0, chk)


@compiled(nogil=True)
def out_inside(bad, prod, t, site, dst, n, h0, w0, k0, nc, chk):  # noqa: ANN001, ANN201, PLR0913
    """Whether transform_out's vector_out call for prod[:, t, :nc] -> dst[n, h0:, w0:,
    k0:] (y, or the edge tile res: ``site``) stays inside prod, dst and chk (checked
    mode)."""
    return sandwich_inside(bad, PROD, prod, site, dst,
                           out_args(prod, t, dst, n, h0, w0, k0, nc), ATH.shape, ATW.shape,
                           CHECK, chk)


@compiled(nogil=True)
def gemm_inside(bad, a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc, add):  # noqa: ANN001, ANN201, PLR0913, ARG001
    """Whether one ``gemm_6xnr(a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc, add, _)``
    stays inside v (a), up (b) and prod (c) (checked mode). Its exact footprint (see
    :mod:`convengine.algorithms.fma`): a, ``kc`` values of each row it reads, rows
    ``r < MR`` read as row ``min(r, mr - 1)`` (a partial block re-reads its last row;
    with ``mr < 1`` all of them read row ``mr - 1``); b, ``kc`` rows of NR; c, rows
    ``r < min(mr, MR)`` of NR (written; read too with ``add``), stored even with ``kc <=
    0``; no a or b access when ``kc <= 0``."""
    rows = min(mr, MR)
    if kc > 0:
        top = 0 if rows >= 1 else mr - 1  # the lowest and highest row read
        bottom = rows - 1 if rows >= 1 else mr - 1
        a_first = a_off + min(top * lda, bottom * lda)
        if not (within(bad, V, a.size, a_first, a_off + max(top * lda, bottom * lda) + kc)
                and within(bad, UP, b.size, b_off, b_off + kc * WIDTH)):
            return False
    c_first, c_stop = reach(c_off, rows, ldc, 1, 0, WIDTH)
    return rows < 1 or within(bad, PROD, c.size, c_first, c_stop)


@compiled(**NOALIAS)
def transform_in(src, n, h0, w0, tmp, v, t, chk):
    """Tile at src[n, h0:h0 + AH, w0:w0 + AW] -> v[:, t]."""
    c_ = src.shape[3]
    lo = c_ // VEC * VEC
    s_off, s_rs, s_cs, d_off, d_rs, d_cs, groups = in_args(src, n, h0, w0, v, t)
    vector_in(src, s_off, s_rs, s_cs, v, d_off, d_rs, d_cs, groups, chk)
    if TAILS and lo < c_:
        tail_in(src, n, h0, w0, tmp, v, t, lo)


@compiled(**NOALIAS)
def transform_out(prod, t, tmp, y, n, h0, w0, k0, nc, chk):
    """prod[:, t, :nc] -> y[n, h0:h0 + MH, w0:w0 + MW, k0:k0 + nc]."""
    lo = nc // VEC * VEC
    s_off, s_rs, s_cs, d_off, d_rs, d_cs, groups = out_args(prod, t, y, n, h0, w0, k0, nc)
    vector_out(prod, s_off, s_rs, s_cs, y, d_off, d_rs, d_cs, groups, chk)
    if TAILS and lo < nc:
        tail_out(prod, t, tmp, y, n, h0, w0, k0, lo, nc, chk)


@compiled(parallel=True, **NOALIAS)
def fused(x, up, y, pad_h, pad_w, tiles_h, tiles_w, block, parts_k,  # noqa: PLR0913
          v_all, prod_all, check, ahead):
    n_, h_, w_, c_ = x.shape
    _, oh_, ow_, o_ = y.shape
    if not TAILS and (c_ % VEC != 0 or o_ % VEC != 0):
        raise ValueError("this Winograd kernel has no scalar tails: its channel counts "
                         "must be whole vectors")
    total, nkb, parts = n_ * tiles_h * tiles_w, up.shape[0], v_all.shape[0]
    parts_t = parts // parts_k
    # the patch's and res's origin: an int64 variable, as n, h0 and w0 are (literal 0s
    # would type, and compile, a second version of each transform: 2 s apiece)
    zero = np.int64(0)
    if CHECKS:
        bad = violations()
    for p in prange(parts):
        pt, pk = p // parts_k, p % parts_k
        v, prod, chk = v_all[p], prod_all[p], check[p]
        patch = np.zeros((1, AH, AW, c_), dtype=x.dtype)
        tmp_in = np.empty((ALPHA2, c_), dtype=x.dtype)
        tmp_out = np.empty((MH * AW, WIDTH), dtype=x.dtype)
        res = np.empty((1, MH, MW, WIDTH), dtype=x.dtype)
        end = (pt + 1) * total // parts_t
        for t0 in range(pt * total // parts_t, end, block):
            b = min(block, end - t0)
            for t in range(b):
                tile = t0 + t
                n = tile // (tiles_h * tiles_w)
                h0 = (tile // tiles_w) % tiles_h * MH - pad_h
                w0 = tile % tiles_w * MW - pad_w
                if h0 >= 0 and w0 >= 0 and h0 + AH <= h_ and w0 + AW <= w_:
                    if CHECKS and not in_inside(bad, X, x, n, h0, w0, v, t, chk):
                        continue
                    transform_in(x, n, h0, w0, tmp_in, v, t, chk)
                    continue
                for k in range(AH):
                    for j in range(AW):
                        ih, iw = h0 + k, w0 + j
                        inside = 0 <= ih < h_ and 0 <= iw < w_
                        for c in range(c_):
                            patch[0, k, j, c] = x[n, ih, iw, c] if inside else 0
                if CHECKS and not in_inside(bad, PATCH, patch, zero, zero, zero, v, t, chk):
                    continue
                transform_in(patch, zero, zero, zero, tmp_in, v, t, chk)
            for kb in range(pk * nkb // parts_k, (pk + 1) * nkb // parts_k):
                for a in range(ALPHA2):
                    u_off = (kb * ALPHA2 + a) * c_ * WIDTH
                    for c0 in range(0, c_, CHAIN):  # partial sums of CHAIN terms
                        for r0 in range(0, b, MR):  # the weight rows stay in L1
                            a_off, b_off = (a * block + r0) * c_ + c0, u_off + c0 * WIDTH
                            kc, mr = min(CHAIN, c_ - c0), min(MR, b - r0)
                            c_off = (a * block + r0) * WIDTH
                            if CHECKS and not gemm_inside(bad, v, a_off, c_, up, b_off, kc,
                                                           mr, prod, c_off, WIDTH, c0 > 0):
                                continue
                            # the weights come from memory for the first rows only
                            gemm_6xnr(v, a_off, c_, up, b_off, kc, mr, prod, c_off, WIDTH,
                                      c0 > 0, ahead if r0 == 0 else 0)
                k0 = kb * WIDTH
                nc = min(WIDTH, o_ - k0)
                for t in range(b):
                    tile = t0 + t
                    n = tile // (tiles_h * tiles_w)
                    h0 = (tile // tiles_w) % tiles_h * MH
                    w0 = tile % tiles_w * MW
                    if h0 + MH <= oh_ and w0 + MW <= ow_:
                        if CHECKS and not out_inside(bad, prod, t, Y, y, n, h0, w0, k0, nc,
                                                      chk):
                            continue
                        transform_out(prod, t, tmp_out, y, n, h0, w0, k0, nc, chk)
                        continue
                    if CHECKS and not out_inside(bad, prod, t, RES, res, zero, zero, zero, zero, nc,
                                                  chk):
                        continue  # (and res, not written, is not copied)
                    transform_out(prod, t, tmp_out, res, zero, zero, zero, zero, nc, chk)
                    for i in range(min(MH, oh_ - h0)):
                        for j in range(min(MW, ow_ - w0)):
                            for c in range(nc):
                                y[n, h0 + i, w0 + j, k0 + c] = res[0, i, j, c]
    if CHECKS and bad[0]:
        fail("winograd fused kernel", BUFFERS, bad)
