"""int8 convolution kernels, exact in int32, with requantization fused in the store.

Operands arrive canonical: x ``(N, D, H, W, C)`` uint8 (int8 input is shifted by
+128 on the fly through ``flip = 0x80``), w ``(O, KD, KH, KW, C // g)``, 1-D and 2-D
problems padded to 3-D with unit dims, ``geo`` the int64 vector
``[KD, KH, KW, sd, sh, sw, pd, ph, pw, dd, dh, dw, OD, OH, OW]`` and the result
``out (N * OD * OH * OW, O)``. Zero points: ``xzp`` of the shifted activations,
``wzp (O,)`` of the (signed) weights, so ``acc = sum (x - xzp)(w - wzp)``.

- :func:`conv_vnni`: im2col panels of 48 rows gathered into a small buffer, then the
  VNNI micro-kernel on weights prepacked (g, O/64, Kc/4, 64, 4); zero points enter
  through row sums and precomputed column terms, as in fbgemm.
- :func:`conv_portable`: the same gather into int16 differences, int32 dot products.
- :func:`conv_depthwise`: groups == C == O; float32 products and sums of integers
  that stay below 2**24 (``prod(K) * 255 * 255 < 2**24``), hence exact.

``mode`` selects the epilogue: 0 PyTorch float requantization, 1 ONNX int32-bias
requantization, 2 the raw int32 accumulator plus the int32 bias.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._vnni import MR, NR, ukernel_6x64

PANEL_ROWS = 8 * MR
DEPTHWISE_MAX_TAPS = (1 << 24) // (255 * 255)


@njit(inline="always")
def _epilogue(acc, o, mode, mult, bias_f, bias_i, zp, lo, hi):
    """One output value from the exact int32 accumulator (float64 carrier)."""
    if mode == 0:
        v = np.float64(np.rint((np.float32(acc) + bias_f[o]) * mult[o]) + np.float32(zp))
    elif mode == 1:
        t = np.float64(np.int32(acc + bias_i[o])) * np.float64(mult[o]) + np.float64(zp)
        v = np.rint(min(max(t, np.float64(lo)), np.float64(hi)))
    else:
        return np.float64(np.int32(acc + bias_i[o]))
    return min(max(v, np.float64(lo)), np.float64(hi))


@njit(inline="always")
def _decode(m, geo):
    ow = m % geo[14]
    t = m // geo[14]
    oh = t % geo[13]
    t //= geo[13]
    return t // geo[12], t % geo[12], oh, ow


@njit(inline="always")
def _gather_u8(x, m, g, cg, geo, flip, padval, buf, pos):
    """Row m of the im2col matrix of group g, as uint8, into buf[pos:pos + Kc]; its sum."""
    n, od, oh, ow = _decode(m, geo)
    d_in, h_in, w_in = x.shape[1], x.shape[2], x.shape[3]
    total = 0
    for kd in range(geo[0]):
        iz = od * geo[3] - geo[6] + kd * geo[9]
        for kh in range(geo[1]):
            iy = oh * geo[4] - geo[7] + kh * geo[10]
            for kw in range(geo[2]):
                ix = ow * geo[5] - geo[8] + kw * geo[11]
                if 0 <= iz < d_in and 0 <= iy < h_in and 0 <= ix < w_in:
                    for c in range(cg):
                        v = x[n, iz, iy, ix, g * cg + c] ^ flip
                        buf[pos + c] = v
                        total += v
                else:
                    for c in range(cg):
                        buf[pos + c] = padval
                    total += padval * cg
                pos += cg
    return total


@njit(parallel=True, cache=True)
def conv_vnni(x, flip, xzp, wp, wzp, col_term, geo, groups, kc, kc4, nb,
              mode, mult, bias_f, bias_i, zp, lo, hi, out):
    """out[m, o] = epilogue(sum_k (a[m, k] - xzp)(w[o, k] - wzp[o])) via vpdpbusd.

    ``wp`` flat int8 (g, nb, kc4, 64, 4); ``col_term[o] = kc*xzp*wzp[o] - xzp*sum_k w[o, k]``.
    """
    m_total = out.shape[0]
    og = out.shape[1] // groups
    cg = x.shape[4] // groups
    lda = kc4 * 4
    npanel = (m_total + PANEL_ROWS - 1) // PANEL_ROWS
    for p in prange(npanel):
        buf = np.zeros(PANEL_ROWS * lda, np.uint8)
        rows = np.zeros(PANEL_ROWS, np.int64)
        tile = np.empty(MR * NR, np.int32)
        m0 = p * PANEL_ROWS
        m1 = min(m_total, m0 + PANEL_ROWS)
        for g in range(groups):
            for m in range(m0, m1):
                rows[m - m0] = _gather_u8(x, m, g, cg, geo, flip, xzp, buf, (m - m0) * lda)
            for b in range(nb):
                ncol = min(NR, og - b * NR)
                for rb in range(m0, m1, MR):
                    mr = min(MR, m1 - rb)
                    ukernel_6x64(buf, (rb - m0) * lda, lda, wp, (g * nb + b) * kc4 * NR * 4,
                                 kc4, mr, tile)
                    for r in range(mr):
                        rowsum = rows[rb - m0 + r]
                        for j in range(ncol):
                            o = g * og + b * NR + j
                            acc = np.int64(tile[r * NR + j]) - wzp[o] * rowsum + col_term[o]
                            out[rb + r, o] = _epilogue(acc, o, mode, mult, bias_f, bias_i,
                                                       zp, lo, hi)


@njit(parallel=True, cache=True)
def conv_portable(x, flip, xzp, wd, geo, groups, mode, mult, bias_f, bias_i,
                  zp, lo, hi, out):
    """Any grouped conv: int16 differences ``wd (O, Kc) = w - wzp``, int32 dot products."""
    m_total = out.shape[0]
    og = out.shape[1] // groups
    cg = x.shape[4] // groups
    kc = wd.shape[1]
    npanel = (m_total + PANEL_ROWS - 1) // PANEL_ROWS
    for p in prange(npanel):
        buf = np.empty(kc, np.uint8)
        diff = np.empty(kc, np.int16)
        for m in range(p * PANEL_ROWS, min(m_total, (p + 1) * PANEL_ROWS)):
            for g in range(groups):
                _gather_u8(x, m, g, cg, geo, flip, xzp, buf, 0)
                for k in range(kc):
                    diff[k] = np.int16(buf[k]) - np.int16(xzp)
                for j in range(og):
                    o = g * og + j
                    acc = np.int32(0)
                    for k in range(kc):
                        acc += np.int32(diff[k]) * np.int32(wd[o, k])
                    out[m, o] = _epilogue(acc, o, mode, mult, bias_f, bias_i, zp, lo, hi)


@njit(parallel=True, fastmath={"contract"}, cache=True)
def conv_depthwise(xf, wf, geo, mode, mult, bias_f, bias_i, zp, lo, hi, out):
    """Depthwise: xf (N, Dp, Hp, Wp, C) float32 ``x - xzp`` zero-padded, wf (taps, C)
    float32 ``w - wzp``; every partial sum is an integer below 2**24 (exact)."""
    n_img, od_n, oh_n, ow_n = xf.shape[0], geo[12], geo[13], geo[14]
    chans = xf.shape[4]
    for row in prange(n_img * od_n * oh_n):
        n = row // (od_n * oh_n)
        od = (row // oh_n) % od_n
        oh = row % oh_n
        acc = np.empty(chans, np.float32)
        for ow in range(ow_n):
            acc[:] = 0
            tap = 0
            for kd in range(geo[0]):
                iz = od * geo[3] + kd * geo[9]
                for kh in range(geo[1]):
                    iy = oh * geo[4] + kh * geo[10]
                    for kw in range(geo[2]):
                        xr = xf[n, iz, iy, ow * geo[5] + kw * geo[11]]
                        wr = wf[tap]
                        for c in range(chans):
                            acc[c] += xr[c] * wr[c]
                        tap += 1
            m = row * ow_n + ow
            for c in range(chans):
                out[m, c] = _epilogue(np.int64(acc[c]), c, mode, mult, bias_f, bias_i,
                                      zp, lo, hi)
