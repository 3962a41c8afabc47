"""Kernel template (see ``convengine._kernel_cache``): the fused F(M, 3) Winograd
kernel in ``NDIM`` dims for dtype ``DTYPE``: input transform, the batched GEMM of the
transformed tiles by the 6 x NR micro-kernel ``gemm_6xnr``, output transform; made by
:func:`convengine.algorithms.winograd.kernels.kernel`, whose docstring says what
``fused`` computes. The transforms' vector parts are intrinsics built from the
matrices (``make_sandwich``), their scalar tails generated source
(:func:`~convengine.algorithms.winograd.kernels.transform_tails`)."""

import numpy as np
from numba import prange

from convengine._kernel_cache import compiled, parameters
from convengine.algorithms.direct import NOALIAS
from convengine.algorithms.fma import MR, gemm_6xnr, lanes, make_sandwich, nr
from convengine.algorithms.winograd.kernels import CHAIN, _matrices, transform_tails

NDIM, M, DTYPE = parameters(__name__, "NDIM", "M", "DTYPE")
BTH, BTW, _, _, ATH, ATW = _matrices(NDIM, M)
vector_in = make_sandwich(BTH, BTW, check=False)
vector_out = make_sandwich(ATH, ATW, check=True)
tails = transform_tails(NDIM, M, DTYPE)
tail_in, tail_out = tails.tail_in, tails.tail_out
AH, AW, MH, MW = BTH.shape[0], BTW.shape[0], ATH.shape[0], ATW.shape[0]
ALPHA2 = AH * AW
WIDTH, VEC = nr(np.dtype(DTYPE).itemsize), lanes(np.dtype(DTYPE).itemsize)


@compiled(**NOALIAS)
def transform_in(src, n, h0, w0, tmp, v, t, chk):
    """Tile at src[n, h0:h0 + AH, w0:w0 + AW] -> v[:, t]."""
    _, h_, w_, c_ = src.shape
    block = v.shape[1]
    lo = c_ // VEC * VEC
    vector_in(src, ((n * h_ + h0) * w_ + w0) * c_, w_ * c_, c_, v, t * c_,
              AW * block * c_, block * c_, c_ // VEC, chk)
    if lo < c_:
        tail_in(src, n, h0, w0, tmp, v, t, lo)


@compiled(**NOALIAS)
def transform_out(prod, t, tmp, y, n, h0, w0, k0, nc, chk):
    """prod[:, t, :nc] -> y[n, h0:h0 + MH, w0:w0 + MW, k0:k0 + nc]."""
    _, oh_, ow_, o_ = y.shape
    block = prod.shape[1]
    lo = nc // VEC * VEC
    vector_out(prod, t * WIDTH, AW * block * WIDTH, block * WIDTH, y,
               ((n * oh_ + h0) * ow_ + w0) * o_ + k0, ow_ * o_, o_, nc // VEC, chk)
    if lo < nc:
        tail_out(prod, t, tmp, y, n, h0, w0, k0, lo, nc, chk)


@compiled(parallel=True, **NOALIAS)
def fused(x, up, y, pad_h, pad_w, tiles_h, tiles_w, block, parts_k,  # noqa: PLR0913
          v_all, prod_all, check):
    n_, h_, w_, c_ = x.shape
    _, oh_, ow_, o_ = y.shape
    total, nkb, parts = n_ * tiles_h * tiles_w, up.shape[0], v_all.shape[0]
    parts_t = parts // parts_k
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
                    transform_in(x, n, h0, w0, tmp_in, v, t, chk)
                    continue
                for k in range(AH):
                    for j in range(AW):
                        ih, iw = h0 + k, w0 + j
                        inside = 0 <= ih < h_ and 0 <= iw < w_
                        for c in range(c_):
                            patch[0, k, j, c] = x[n, ih, iw, c] if inside else 0
                transform_in(patch, 0, 0, 0, tmp_in, v, t, chk)
            for kb in range(pk * nkb // parts_k, (pk + 1) * nkb // parts_k):
                for a in range(ALPHA2):
                    u_off = (kb * ALPHA2 + a) * c_ * WIDTH
                    for c0 in range(0, c_, CHAIN):  # partial sums of CHAIN terms
                        for r0 in range(0, b, MR):  # the weight rows stay in L1
                            gemm_6xnr(v, (a * block + r0) * c_ + c0, c_, up,
                                      u_off + c0 * WIDTH, min(CHAIN, c_ - c0),
                                      min(MR, b - r0), prod, (a * block + r0) * WIDTH,
                                      WIDTH, c0 > 0)
                k0 = kb * WIDTH
                nc = min(WIDTH, o_ - k0)
                for t in range(b):
                    tile = t0 + t
                    n = tile // (tiles_h * tiles_w)
                    h0 = (tile // tiles_w) % tiles_h * MH
                    w0 = tile % tiles_w * MW
                    if h0 + MH <= oh_ and w0 + MW <= ow_:
                        transform_out(prod, t, tmp_out, y, n, h0, w0, k0, nc, chk)
                        continue
                    transform_out(prod, t, tmp_out, res, 0, 0, 0, 0, nc, chk)
                    for i in range(min(MH, oh_ - h0)):
                        for j in range(min(MW, ow_ - w0)):
                            for c in range(nc):
                                y[n, h0 + i, w0 + j, k0 + c] = res[0, i, j, c]
