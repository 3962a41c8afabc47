"""int8 convolution kernels, exact in int32, with requantization fused in the store.

Operands arrive canonical: x ``(N, D, H, W, C)`` uint8 (int8 input is shifted by
+128 on the fly through ``flip = 0x80``), w ``(O, KD, KH, KW, C // g)``, 1-D and 2-D
problems padded to 3-D with unit dims, ``geo`` the int64 vector
``[KD, KH, KW, sd, sh, sw, pd, ph, pw, dd, dh, dw, OD, OH, OW]`` and the result
``out (N * OD * OH * OW, O)``. Zero points: ``xzp`` of the shifted activations,
``wzp (O,)`` of the (signed) weights, so ``acc = sum (x - xzp)(w - wzp)``.

- :func:`conv_vnni`: im2col panels (L2-sized) gathered into a buffer, then the
  VNNI micro-kernel on weights prepacked (g, O/64, Kc/4, 64, 4); zero points enter
  through row sums and precomputed column terms, as in fbgemm.
- :func:`conv_amx`: the same panels, 32 x 32 blocks on AMX tiles (``tdpbusd``).
- :func:`conv_avx2`: the same panels as int16 differences, 6 x 16 tiles by
  ``vpmaddwd`` (:mod:`._avx2`) on weights prepacked (g, O/16, Kc/2, 16, 2), for CPUs
  with AVX2 but no VNNI.
- :func:`conv_avx2_u8s8`: for uint8 activations and int8 weights of zero point 0:
  ``vpmaddubsw`` on the raw bytes (:mod:`._avx2`), twice the products of ``vpmaddwd``
  an instruction; the few pairs of products that saturate its int16 sums are found and
  added back exactly.
- :func:`conv_portable`: the same gather into int16 differences, int32 dot products.

Depthwise convolutions (groups == C == O) have their own kernels in :mod:`.depthwise`.

``mode`` selects the epilogue: 0 PyTorch float requantization, 1 ONNX int32-bias
requantization, 2 the raw int32 accumulator plus the int32 bias.

:func:`conv_vnni`, :func:`conv_vnni_taps`, :func:`conv_avx2` and :func:`conv_avx2_u8s8`
can end in a residual add (``res_kind`` 1 or 2, :func:`residual_rows`): ONNX Runtime's
QLinearAdd of the 8-bit result just stored and an equally shaped ``res``, while those
rows are still in cache.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from ... import host_params
from ..._kernel_cache import kernel
from ...checked import CHECKED, NO_CHECKS, fail, violations, within
from .._copy import copy_bytes
from .._ir import fma32
from .amx import amx_32x32, amx_begin, amx_end
from .avx2 import MR as AVX2_MR
from .avx2 import NR as AVX2_NR
from .avx2 import (
    any_heavy_pair,
    heavy_pair_mask,
    trailing_zeros,
    ukernel_6x16,
    ukernel_requant_6x16,
    ukernel_requant_u8s8_6x16,
)
from .vnni import (
    MR,
    NR,
    ukernel_2x64,
    ukernel_4x64,
    ukernel_6x64,
    ukernel_8x32,
    ukernel_12x16,
    ukernel_requant_2x64,
    ukernel_requant_4x64,
    ukernel_requant_6x64,
    ukernel_requant_8x32,
    ukernel_requant_12x16,
    ukernel_taps_2x64,
    ukernel_taps_4x64,
    ukernel_taps_6x64,
)

PANEL_ROWS = 2 * MR  # portable kernel
# VNNI im2col panel: three eighths of a core's L2, 384 KiB of 1 MiB (see
# host_params.vnni_panel_bytes)
PANEL_BYTES = host_params.vnni_panel_bytes()
# K chunk in groups of 4 bytes: a 64-column weight block of half of L1d stays in L1
# (64 groups, 16 KiB of a 32 KiB L1d; see host_params.vnni_k_block)
KC4_BLOCK = host_params.vnni_k_block()


# Checked mode (:mod:`convengine.checked`): before each micro-kernel call (raw
# pointers: numba's boundscheck does not see them) the drivers check the exact range
# the call reads or writes in each buffer, in elements of that buffer; a call
# reaching outside is skipped and the driver raises BoundsError afterwards. Site
# numbers (``within``'s ``site``) index DENSE_BUFFERS. Off, every check sits under
# ``if CHECKED`` (a constant False: compiled out) and ``bad`` is NO_CHECKS, never read.
DENSE_BUFFERS = ("a", "wp", "tile", "out", "row sums", "col_term", "wzp", "bias", "mult",
                 "tapoff", "gather dest", "x")


@njit(inline="always")
def extent(out):
    """Elements of the 2-D ``out`` a store may reach: ``(M - 1) * ldo + O`` (its rows
    may be a view's, ``ldo`` apart); 0 if empty."""
    if out.size == 0:
        return 0
    return ((out.shape[0] - 1) * out.strides[0] + (out.shape[1] - 1) * out.strides[1]) \
        // out.itemsize + 1


@njit(inline="always")
def _copy_inside(bad, dst, dpos, src, spos, n):
    """Whether :func:`copy_bytes` of ``n`` bytes stays inside ``dst`` and ``src``: it
    touches ``[dpos, dpos + n)`` and ``[spos, spos + n)`` exactly (the tail by masked
    moves); an empty copy touches nothing (its ``spos`` may then be anywhere)."""
    return n <= 0 or (within(bad, 11, dst.size, dpos, dpos + n)
                      and within(bad, 12, src.size, spos, spos + n))


@njit(inline="always")
def _vnni_inside(bad, a, a_off, lda, mr, kc4, b, b_off, nvec):
    """A VNNI micro-kernel's A and B (vnni.py): A rows ``r < mr`` (rows past mr re-read
    row mr - 1) of ``4 * kc4`` bytes, ``lda`` apart; B per K step ``k`` the first
    ``nvec`` 64-byte vectors of its 256 at ``b_off + 256 k`` (a narrow kernel reads
    16 * nvec of the 64 columns)."""
    return (within(bad, 1, a.size, a_off, a_off + (mr - 1) * lda + 4 * kc4)
            and within(bad, 2, b.size, b_off, b_off + (kc4 - 1) * 4 * NR + 64 * nvec))


@njit(inline="always")
def _tile_inside(bad, c, c_off, c_rows, nvec):
    """A VNNI micro-kernel's int32 tile: all ``c_rows`` rows of the kernel (its stores,
    and its loads under ``acc_in``, do not stop at mr), 16 * nvec lanes each, 64 apart."""
    return within(bad, 3, c.size, c_off, c_off + (c_rows - 1) * NR + 16 * nvec)


@njit(inline="always")
def _requant_inside(bad, out_n, out_off, ldo, mr, ncol, nvec, rows, r_off, col_term, wzp,
                    bias, mult, o0):
    """The VNNI requantizing store (vnni._requant_epilogue): 8-bit rows ``r < mr`` of
    ``min(ncol, 16 * nvec)`` bytes at ``out_off + r * ldo`` (whole vectors, then a
    masked one) in ``out_n`` (:func:`extent`), row sums ``r_off + r``, and the four
    column vectors read whole, 16 * nvec lanes from ``o0``, whatever ``ncol``."""
    width = 16 * nvec
    return (within(bad, 4, out_n, out_off, out_off + (mr - 1) * ldo + min(ncol, width))
            and within(bad, 5, rows.size, r_off, r_off + mr)
            and within(bad, 6, col_term.size, o0, o0 + width)
            and within(bad, 7, wzp.size, o0, o0 + width)
            and within(bad, 8, bias.size, o0, o0 + width)
            and within(bad, 9, mult.size, o0, o0 + width))


@njit(inline="always")
def _avx2_inside(bad, a, a_off, lda, mr, step, b, b_off, k_steps, b_step):
    """An AVX2 micro-kernel's A and B (avx2.py): A rows ``r < mr`` (rows past mr re-read
    row mr - 1) of ``step * k_steps`` elements, ``lda`` apart (``step`` 2: int16 pairs;
    4: u8s8's byte quads); B ``b_step`` elements a K step (two 32-byte vectors: 32
    int16, or 64 int8)."""
    return (within(bad, 1, a.size, a_off, a_off + (mr - 1) * lda + step * k_steps)
            and within(bad, 2, b.size, b_off, b_off + k_steps * b_step))


@njit(inline="always")
def _avx2_store_inside(bad, out_n, out_off, ldo, mr, bias, mult, o0):
    """AVX2's requantizing store: 16 bytes a row ``r < mr`` at ``out_off + r * ldo`` in
    ``out_n`` (:func:`extent`); ``bias`` and ``mult``: two 8-lane vectors from ``o0``."""
    return (within(bad, 4, out_n, out_off, out_off + (mr - 1) * ldo + AVX2_NR)
            and within(bad, 8, bias.size, o0, o0 + AVX2_NR)
            and within(bad, 9, mult.size, o0, o0 + AVX2_NR))


@njit(inline="always")
def epilogue(acc, o, mode, mult, bias_f, bias_i, zp, lo, hi):
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
def qadd_value(a, b, ra, rb, fixed, lo, hi):
    """com.microsoft QLinearAdd of two 8-bit values as ONNX Runtime's x86 kernel
    (MLAS, ``vfmadd`` on float32 lanes): ``rint(fma(a, ra, fma(b, rb, fixed)))``
    clamped to [lo, hi], all float32 (:func:`fma32`; 3.4x the speed of carrying each
    fma in float64, which double-rounds where the exact sum needs over 53 bits)."""
    v = np.rint(fma32(np.float32(a), ra, fma32(np.float32(b), rb, fixed)))
    v = v if v > lo else lo
    return v if v < hi else hi


@njit(inline="always")
def residual_rows(out, m0, m1, c0, c1, res, kind, params):
    """QLinearAdd in place over ``out[m0:m1, c0:c1]`` and ``res`` (both ``(M, O)``
    8-bit): :func:`qadd_value` with ``a`` the conv's result and ``b = res`` (kind 1) or
    the other way round (kind 2); ``params`` float32 ``[ra, rb, fixed, lo, hi]``.
    Indexes are unsigned (no wraparound test: the loops vectorize)."""
    ra, rb, fixed, lo, hi = params[0], params[1], params[2], params[3], params[4]
    for m in range(m0, m1):
        i = np.uintp(m)
        if kind == 1:
            for c in range(c0, c1):
                j = np.uintp(c)
                out[i, j] = qadd_value(out[i, j], res[i, j], ra, rb, fixed, lo, hi)
        else:
            for c in range(c0, c1):
                j = np.uintp(c)
                out[i, j] = qadd_value(res[i, j], out[i, j], ra, rb, fixed, lo, hi)


@kernel(parallel=True)
def add_residual(out, res, kind, params):
    """:func:`residual_rows` over all of ``out``, for kernels without the fused pass."""
    m_total = out.shape[0]
    step = 64
    for t in prange((m_total + step - 1) // step):
        residual_rows(out, t * step, min(m_total, (t + 1) * step), 0, out.shape[1], res, kind,
                      params)


@njit(inline="always")
def _decode(m, geo):
    ow = m % geo[14]
    t = m // geo[14]
    oh = t % geo[13]
    t //= geo[13]
    return t // geo[12], t % geo[12], oh, ow


@njit(inline="always")
def _gather_u8(x, m, g, cg, geo, padval, buf, pos):
    """Row m of the im2col matrix of group g into buf[pos:pos + Kc], raw bytes of x
    (``padval`` where the window leaves the input)."""
    n, od, oh, ow = _decode(m, geo)
    d_in, h_in, w_in, chans = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    xflat = x.reshape(-1)
    for kd in range(geo[0]):
        iz = od * geo[3] - geo[6] + kd * geo[9]
        for kh in range(geo[1]):
            iy = oh * geo[4] - geo[7] + kh * geo[10]
            for kw in range(geo[2]):
                ix = ow * geo[5] - geo[8] + kw * geo[11]
                if 0 <= iz < d_in and 0 <= iy < h_in and 0 <= ix < w_in:
                    src = (((n * d_in + iz) * h_in + iy) * w_in + ix) * chans + g * cg
                    for c in range(cg):  # unsigned indices: no wraparound checks
                        buf[np.uintp(pos + c)] = xflat[np.uintp(src + c)]
                else:
                    for c in range(cg):
                        buf[np.uintp(pos + c)] = padval
                pos += cg


@njit(inline="always")
def _gather_panel(bad, x, m0, m1, g, cg, geo, padval, flip, need_sum, kc, lda, buf, rows):
    """Rows m0..m1 of group g's im2col matrix into ``buf`` (``lda`` bytes a row, zeros
    past ``kc``, XORed with ``flip``), their byte sums into ``rows`` if ``need_sum``.

    :func:`_gather_u8`'s bytes, by output rows: the input rows each kernel row reads
    are found once per output row, and where a pixel's window lies inside the input
    (ungrouped, width dilation 1) each kernel row's ``KW * C`` bytes move in one
    :func:`copy_bytes`; otherwise each tap's ``cg`` bytes do. Checked mode: a copy
    outside ``buf`` or x is skipped and recorded in ``bad`` (:func:`_copy_inside`)."""
    xflat = x.reshape(-1)
    d_in, h_in, w_in, chans = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    kh_n, kw_n, sw, pw, dw, ow_n = geo[1], geo[2], geo[5], geo[8], geo[11], geo[14]
    run = kw_n * cg
    taps = geo[0] * kh_n
    base = np.empty(taps, np.int64)  # the flat offset of each kernel row's input row, or -1
    n, od, oh, ow = _decode(m0, geo)
    m = m0
    while m < m1:
        for t in range(taps):
            iz = od * geo[3] - geo[6] + (t // kh_n) * geo[9]
            iy = oh * geo[4] - geo[7] + (t % kh_n) * geo[10]
            inside = 0 <= iz < d_in and 0 <= iy < h_in
            base[t] = ((n * d_in + iz) * h_in + iy) * w_in * chans if inside else -1
        seg = min(m1 - m, ow_n - ow)
        for i in range(seg):
            pos = (m + i - m0) * lda
            ix0 = (ow + i) * sw - pw
            whole = cg == chans and dw == 1 and ix0 >= 0 and ix0 + kw_n <= w_in
            for t in range(taps):
                at = pos + t * run
                if base[t] < 0:
                    for k in range(run):
                        buf[np.uintp(at + k)] = padval
                elif whole:
                    if CHECKED and not _copy_inside(bad, buf, at, xflat, base[t] + ix0 * chans,
                                                    run):
                        continue
                    copy_bytes(buf, at, xflat, base[t] + ix0 * chans, run)
                else:
                    for kw in range(kw_n):
                        ix = ix0 + kw * dw
                        if 0 <= ix < w_in:
                            if CHECKED and not _copy_inside(bad, buf, at, xflat,
                                                            base[t] + ix * chans + g * cg, cg):
                                pass  # skipped (recorded)
                            else:
                                copy_bytes(buf, at, xflat, base[t] + ix * chans + g * cg, cg)
                        else:
                            for k in range(cg):
                                buf[np.uintp(at + k)] = padval
                        at += cg
            for k in range(kc, lda):
                buf[np.uintp(pos + k)] = 0
            rows[m + i - m0] = _flip_and_sum(buf, pos, kc, flip, need_sum)
        m += seg
        ow = 0
        oh += 1
        if oh == geo[13]:
            oh = 0
            od += 1
            if od == geo[12]:
                od = 0
                n += 1


@njit(inline="always")
def _flip_and_sum(buf, pos, kc, flip, need_sum):
    """XOR a gathered row with ``flip`` (int8 -> uint8 shift); its byte sum if asked."""
    if flip != 0:
        for k in range(kc):
            buf[np.uintp(pos + k)] ^= flip
    total = np.int32(0)
    if need_sum:
        for k in range(kc):
            total += np.int32(buf[np.uintp(pos + k)])
    return total


@njit(inline="always")
def _store_tile(tile, mr, ncol, m0, o0, rows, r0, wzp, col_term, mode, mult, bias_f, bias_i,
                zp, lo, hi, out):
    """Requantize an int32 tile (rows m0.., channels o0..) straight into ``out``."""
    flo, fhi, fzp = np.float32(lo), np.float32(hi), np.float32(zp)
    for r in range(mr):
        rowsum = rows[np.uintp(r0 + r)]
        t = r * NR
        m = np.uintp(m0 + r)
        if mode == 0:
            for j in range(ncol):
                o = np.uintp(o0 + j)
                acc = np.int32(tile[t + j] - wzp[o] * rowsum + col_term[o])
                v = np.rint((np.float32(acc) + bias_f[o]) * mult[o]) + fzp
                out[m, o] = np.int32(min(max(v, flo), fhi))
        else:
            for j in range(ncol):
                o = np.uintp(o0 + j)
                acc = tile[t + j] - wzp[o] * rowsum + col_term[o]
                out[m, o] = epilogue(acc, o, mode, mult, bias_f, bias_i, zp, lo, hi)


@functools.cache  # called on every launch with the few shapes of a model
def panel_rows(m_total: int, lda: int, threads: int, multiple: int = MR) -> int:
    """Rows per im2col panel, a multiple of ``multiple``: the panel (rows x lda bytes)
    stays in L2 while every 64-column weight block streams past it; panels come in
    multiples of ``threads``."""
    npanel = max(1, -(-m_total * lda // PANEL_BYTES))
    npanel = -(-npanel // threads) * threads
    rows = -(-m_total // npanel)
    return max(multiple, -(-rows // multiple) * multiple)


@functools.cache  # (as panel_rows)
def work_split(m_total: int, lda: int, og: int, threads: int) -> tuple[int, int]:
    """How :func:`conv_vnni` shares ``m_total`` rows x ``og`` columns (per group) among
    ``threads``: ``(rows per panel, column parts)``. Either the threads take row panels
    (:func:`panel_rows`) or, where that leaves them unevenly loaded (few rows: the
    6-row blocks do not divide evenly), each takes a part of the 64-column blocks of
    every L2-sized panel; columns only where they give the busiest thread at least a
    twentieth fewer 6 x 64 tiles: each thread then reads all of x, half of it written
    by the other core's previous kernel (ResNet-50's 56 x 56 1x1 64 -> 256 at batch 1,
    2 threads: 0.31-0.39 ms split by columns at one tile less, 0.18 by rows, in the
    network; its 7 x 7 3x3 at batch 4, 8% fewer tiles by columns: 1440 against 1390
    GOPS alone)."""
    nb = -(-og // NR)
    multiple = 12 if og <= 16 else 8 if og <= 32 else MR
    by_rows = panel_rows(m_total, lda, threads, multiple)
    if threads == 1 or nb < threads:
        return by_rows, 1
    npanel = -(-m_total // by_rows)
    blocks = [-(-min(by_rows, m_total - p * by_rows) // MR) for p in range(npanel)]
    per_thread = -(-npanel // threads)
    rows_cost = max(sum(blocks[t:t + per_thread]) for t in range(0, npanel, per_thread)) * nb
    by_cols = panel_rows(m_total, lda, 1, MR)
    cols_cost = -(-m_total // MR) * -(-nb // threads)
    return (by_cols, threads) if cols_cost <= 0.95 * rows_cost else (by_rows, 1)


@kernel(parallel=True)
def conv_vnni(x, flip, xzp, wp, wzp, col_term, geo, groups, kc, kc4, nb, direct, prows,
              parts, kblock, mode, mult, bias_f, bias_i, zp, lo, hi, out, res, res_kind, res_params):
    """out[m, o] = epilogue(sum_k (a[m, k] - xzp)(w[o, k] - wzp[o])) via vpdpbusd.

    ``wp`` flat int8 (g, nb, kc4, 64, 4); ``wzp``, ``col_term`` (O,) int32 with
    ``col_term[o] = kc*xzp*wzp[o] - xzp*sum_k w[o, k]`` (wrapping like the int32 sum).
    ``direct``: a 1x1, stride-1, unpadded, ungrouped conv on uint8 with C % 4 == 0 reads
    x in place (no im2col). ``prows`` rows per panel and ``parts`` column parts from
    :func:`work_split`: work item ``i`` is panel ``i % npanel`` with the ``i // npanel``-th
    part of the column blocks (numba hands each thread a contiguous run of items).
    Column blocks of at most 16 or 32 channels use the narrow
    micro-kernels. For each
    64-column block the K dimension runs in chunks of ``kblock * 4`` bytes
    (:data:`KC4_BLOCK`, an argument so that the machine code does not depend on the
    host's cache sizes) whose weights stay in L1 across the panel's row blocks; int32 partial tiles of
    the panel accumulate in ``ctile``. In modes 0 and 1 with unit column stride the last
    chunk's micro-kernels requantize and store themselves (``wzp``, ``col_term``,
    ``mult`` and the mode's bias then hold 64 values of padding past O); else
    :func:`_store_tile` does. ``res_kind`` 1 or 2: each work item ends with
    :func:`residual_rows` over its rows and columns (0: none; ``res`` unread).
    """
    m_total = out.shape[0]
    fuse = mode != 2 and out.strides[1] == 1
    ldo = out.strides[0]
    qmin, qmax = np.float32(lo - zp), np.float32(hi - zp)
    og = out.shape[1] // groups
    cg = x.shape[4] // groups
    lda = kc if direct else kc4 * 4
    xflat = x.reshape(-1)
    need_sum = np.any(wzp != 0)
    npanel = (m_total + prows - 1) // prows
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    for item in prange(npanel * parts):
        p, part = item % npanel, item // npanel
        buf = np.empty(1 if direct else prows * lda, np.uint8)
        rows = np.zeros(prows, np.int32)
        ctile = np.empty((prows + 12) * NR, np.int32)  # + the tallest kernel's spill
        m0 = p * prows
        m1 = min(m_total, m0 + prows)
        a = xflat if direct else buf
        a0 = m0 * kc if direct else 0
        for g in range(groups):
            if direct:
                for m in range(m0, m1):
                    rows[m - m0] = _flip_and_sum(xflat, m * kc, kc, 0, need_sum)
            else:
                _gather_panel(bad, x, m0, m1, g, cg, geo, xzp ^ flip, flip, need_sum, kc, lda,
                              buf, rows)
            for b in range(part * nb // parts, (part + 1) * nb // parts):
                ncol = min(NR, og - b * NR)
                b_base = (g * nb + b) * kc4 * NR * 4
                o0 = g * og + b * NR
                for k0 in range(0, kc4, kblock):
                    kn = min(kblock, kc4 - k0)
                    keep = 1 if k0 > 0 else 0
                    b_off = b_base + k0 * NR * 4
                    if fuse and k0 + kblock >= kc4:  # the last chunk: requantize, store
                        if mode == 0:
                            _tiles_requant(bad, a, a0 + k0 * 4, lda, wp, b_off, kn, m0, m1,
                                           ncol, ctile, keep, out, ldo, o0, rows, col_term,
                                           wzp, bias_f, mult, qmin, qmax, zp)
                        else:
                            _tiles_requant(bad, a, a0 + k0 * 4, lda, wp, b_off, kn, m0, m1,
                                           ncol, ctile, keep, out, ldo, o0, rows, col_term,
                                           wzp, bias_i, mult, qmin, qmax, zp)
                    else:
                        _tiles(bad, a, a0 + k0 * 4, lda, wp, b_off, kn, m0, m1, ncol, ctile,
                               keep)
                if not fuse:
                    for rb in range(m0, m1, MR):
                        _store_tile(ctile[(rb - m0) * NR:], min(MR, m1 - rb), ncol, rb, o0,
                                    rows, rb - m0, wzp, col_term, mode, mult, bias_f, bias_i,
                                    zp, lo, hi, out)
            if res_kind != 0:
                b0, b1 = part * nb // parts, (part + 1) * nb // parts
                residual_rows(out, m0, m1, g * og + b0 * NR, g * og + min(og, b1 * NR), res,
                              res_kind, res_params)
    if CHECKED and bad[0]:
        fail("int8 VNNI dense kernel", DENSE_BUFFERS, bad)


@njit(inline="always")
def _tiles(bad, a, a0, lda, wp, b_off, kn, m0, m1, ncol, ctile, keep):
    """The panel's row blocks (rows m0..m1 at ``a[a0 + (m - m0) * lda]``) against one
    K chunk of one column block, int32 into ``ctile``: the micro-kernel that fits
    ``ncol``. (The micro-kernels' records are built where they are called: tuples
    holding arrays live across no loop, so their reference counts cancel.) Checked
    mode: calls outside their buffers are skipped and recorded in ``bad``."""
    if ncol <= 16:
        for rb in range(m0, m1, 12):
            if CHECKED and not (
                    _vnni_inside(bad, a, a0 + (rb - m0) * lda, lda, min(12, m1 - rb), kn, wp,
                                 b_off, 1)
                    and _tile_inside(bad, ctile, (rb - m0) * NR, 12, 1)):
                continue
            ukernel_12x16((a, a0 + (rb - m0) * lda, lda, min(12, m1 - rb)), (wp, b_off, kn),
                          (ctile, (rb - m0) * NR, keep))
    elif ncol <= 32:
        for rb in range(m0, m1, 8):
            if CHECKED and not (
                    _vnni_inside(bad, a, a0 + (rb - m0) * lda, lda, min(8, m1 - rb), kn, wp,
                                 b_off, 2)
                    and _tile_inside(bad, ctile, (rb - m0) * NR, 8, 2)):
                continue
            ukernel_8x32((a, a0 + (rb - m0) * lda, lda, min(8, m1 - rb)), (wp, b_off, kn),
                         (ctile, (rb - m0) * NR, keep))
    else:
        for rb in range(m0, m1, MR):
            mr = min(MR, m1 - rb)
            # the kernel's rows: 2, 4 or 6 (see below), each a row of the tile
            if CHECKED and not (
                    _vnni_inside(bad, a, a0 + (rb - m0) * lda, lda, mr, kn, wp, b_off, 4)
                    and _tile_inside(bad, ctile, (rb - m0) * NR, 2 if mr <= 2 else
                                     4 if mr <= 4 else MR, 4)):
                continue
            a_rows, weights = (a, a0 + (rb - m0) * lda, lda, mr), (wp, b_off, kn)
            tile = (ctile, (rb - m0) * NR, keep)
            if mr <= 2:  # a short last block: a shorter kernel, not 6 rows' work
                ukernel_2x64(a_rows, weights, tile)
            elif mr <= 4:
                ukernel_4x64(a_rows, weights, tile)
            else:
                ukernel_6x64(a_rows, weights, tile)


@njit(inline="always")
def _tiles_requant(bad, a, a0, lda, wp, b_off, kn, m0, m1, ncol, ctile, keep, out, ldo, o0,
                   rows, col_term, wzp, bias_f, mult, qmin, qmax, zp):
    """:func:`_tiles` for the last K chunk, requantized into ``out`` (row stride ``ldo``
    bytes, columns from ``o0``) by the micro-kernels' own epilogue."""
    if ncol <= 16:
        for rb in range(m0, m1, 12):
            if CHECKED and not (
                    _vnni_inside(bad, a, a0 + (rb - m0) * lda, lda, min(12, m1 - rb), kn, wp,
                                 b_off, 1)
                    and _tile_inside(bad, ctile, (rb - m0) * NR, 12, 1)
                    and _requant_inside(bad, extent(out), rb * ldo + o0, ldo,
                                        min(12, m1 - rb), ncol, 1, rows, rb - m0, col_term,
                                        wzp, bias_f, mult, o0)):
                continue
            a_rows, weights = (a, a0 + (rb - m0) * lda, lda, min(12, m1 - rb)), (wp, b_off, kn)
            tile, sums = (ctile, (rb - m0) * NR, keep), (rows, rb - m0)
            dest = (out, rb * ldo + o0, ldo, ncol)
            rq = (col_term, wzp, bias_f, mult, o0, qmin, qmax, zp)
            ukernel_requant_12x16(a_rows, weights, tile, dest, sums, rq)
    elif ncol <= 32:
        for rb in range(m0, m1, 8):
            if CHECKED and not (
                    _vnni_inside(bad, a, a0 + (rb - m0) * lda, lda, min(8, m1 - rb), kn, wp,
                                 b_off, 2)
                    and _tile_inside(bad, ctile, (rb - m0) * NR, 8, 2)
                    and _requant_inside(bad, extent(out), rb * ldo + o0, ldo,
                                        min(8, m1 - rb), ncol, 2, rows, rb - m0, col_term,
                                        wzp, bias_f, mult, o0)):
                continue
            a_rows, weights = (a, a0 + (rb - m0) * lda, lda, min(8, m1 - rb)), (wp, b_off, kn)
            tile, sums = (ctile, (rb - m0) * NR, keep), (rows, rb - m0)
            dest = (out, rb * ldo + o0, ldo, ncol)
            rq = (col_term, wzp, bias_f, mult, o0, qmin, qmax, zp)
            ukernel_requant_8x32(a_rows, weights, tile, dest, sums, rq)
    else:
        for rb in range(m0, m1, MR):
            mr = min(MR, m1 - rb)
            if CHECKED and not (
                    _vnni_inside(bad, a, a0 + (rb - m0) * lda, lda, mr, kn, wp, b_off, 4)
                    and _tile_inside(bad, ctile, (rb - m0) * NR, 2 if mr <= 2 else
                                     4 if mr <= 4 else MR, 4)
                    and _requant_inside(bad, extent(out), rb * ldo + o0, ldo, mr, ncol, 4,
                                        rows, rb - m0, col_term, wzp, bias_f, mult, o0)):
                continue
            a_rows, weights = (a, a0 + (rb - m0) * lda, lda, mr), (wp, b_off, kn)
            tile, sums = (ctile, (rb - m0) * NR, keep), (rows, rb - m0)
            dest = (out, rb * ldo + o0, ldo, ncol)
            rq = (col_term, wzp, bias_f, mult, o0, qmin, qmax, zp)
            if mr <= 2:
                ukernel_requant_2x64(a_rows, weights, tile, dest, sums, rq)
            elif mr <= 4:
                ukernel_requant_4x64(a_rows, weights, tile, dest, sums, rq)
            else:
                ukernel_requant_6x64(a_rows, weights, tile, dest, sums, rq)


@njit(inline="always")
def _taps_inside(bad, a, a_off, lda, mr, kc4, tapoff, taps, b, b_off, out_n, out_off, ldo,
                 ncol, rows, col_term, bias, mult, o0):
    """A taps micro-kernel (vnni._make_ukernel_taps): rows ``r < mr`` (rows past mr
    re-read row mr - 1) of ``4 * kc4`` bytes at each of ``tapoff[:taps]`` past
    ``a_off + r * lda``; B ``taps * kc4`` K steps of 256 bytes (all 64 columns), tap
    after tap; then the requantizing store of :func:`_requant_inside` (``col_term``
    also as ``wzp``, ``rows`` the zero row sums from 0)."""
    if not within(bad, 10, tapoff.size, 0, taps):
        return False
    lo_t, hi_t = tapoff[0], tapoff[0]
    for t in range(1, taps):
        lo_t, hi_t = min(lo_t, tapoff[t]), max(hi_t, tapoff[t])
    return (within(bad, 1, a.size, a_off + lo_t, a_off + (mr - 1) * lda + hi_t + 4 * kc4)
            and within(bad, 2, b.size, b_off, b_off + taps * kc4 * 4 * NR)
            and _requant_inside(bad, out_n, out_off, ldo, mr, ncol, 4, rows, 0, col_term,
                                col_term, bias, mult, o0))


@kernel(parallel=True)
def conv_vnni_taps(x, xzp, wp, col_term, geo, kc4, nb, parts, mult, bias, zp, lo, hi, out,
                   res, res_kind, res_params):
    """:func:`conv_vnni` without im2col (implicit GEMM) for ungrouped dilation-1 2-D
    convs on uint8 x and weights of zero point 0, requantized as mode 0 (float32
    ``bias``) or mode 1 (int32 ``bias``) (``wp``, ``col_term``, ``mult``, ``bias`` as
    there, padded, the weights' channels padded with zeros to ``Cp``, C
    rounded up to a multiple of 4: ``kc4 = KH * KW * Cp / 4``).

    x is copied once into a buffer padded with ``xzp`` (so every window lies inside
    it; channels to ``Cp``); then each 6-pixel run of an output row is a tile whose K
    loop walks the kernel taps in place (:func:`ukernel_taps_6x64`: rows ``sw * Cp``
    bytes apart, tap ``(kh, kw)`` at ``(kh * Wp + kw) * Cp``), the weights' (kh, kw, c)
    order being the im2col order. Work items: output rows, times ``parts`` column parts (as
    :func:`conv_vnni`), each ending in the residual add if ``res_kind`` asks (as there)."""
    n_img, h_in, w_in, chans = x.shape[0], x.shape[2], x.shape[3], x.shape[4]
    kh_n, kw_n, ph, pw, oh_n, ow_n = geo[1], geo[2], geo[7], geo[8], geo[13], geo[14]
    sh, sw = geo[4], geo[5]
    hp, wpd = (oh_n - 1) * sh + kh_n, (ow_n - 1) * sw + kw_n
    taps = kh_n * kw_n
    cp = kc4 * 4 // taps
    xflat = x.reshape(-1)
    xp = np.empty(n_img * hp * wpd * cp, np.uint8)
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    for r in prange(n_img * hp):
        n, iy = r // hp, r % hp - ph
        base = r * wpd * cp
        lo_x, hi_x = min(pw, wpd), min(wpd, pw + w_in)
        if not 0 <= iy < h_in:
            lo_x = hi_x = wpd
        for k in range(lo_x * cp):
            xp[np.uintp(base + k)] = xzp
        src = ((n * h_in + iy) * w_in + lo_x - pw) * chans
        if cp == chans:
            if CHECKED and not _copy_inside(bad, xp, base + lo_x * cp, xflat, src,
                                            (hi_x - lo_x) * cp):
                pass  # skipped (recorded)
            else:
                copy_bytes(xp, base + lo_x * cp, xflat, src, (hi_x - lo_x) * cp)
        else:
            for ix in range(lo_x, hi_x):
                if CHECKED and not _copy_inside(bad, xp, base + ix * cp, xflat,
                                                src + (ix - lo_x) * chans, chans):
                    continue
                copy_bytes(xp, base + ix * cp, xflat, src + (ix - lo_x) * chans, chans)
                for k in range(chans, cp):  # (against zero weights)
                    xp[np.uintp(base + ix * cp + k)] = xzp
        for k in range(hi_x * cp, wpd * cp):
            xp[np.uintp(base + k)] = xzp
    tapoff = np.empty(taps, np.int64)
    for t in range(taps):
        tapoff[t] = ((t // kw_n) * wpd + t % kw_n) * cp
    c4n = cp // 4
    og = out.shape[1]
    ldo = out.strides[0]
    qmin, qmax = np.float32(lo - zp), np.float32(hi - zp)
    zeros = np.zeros(MR, np.int32)  # row sums: none needed (weight zero points are 0)
    nrows = n_img * oh_n
    for item in prange(nrows * parts):
        orow, part = item % nrows, item // nrows
        n, oh = orow // oh_n, orow % oh_n
        a_row = (n * hp + oh * sh) * wpd * cp
        for b in range(part * nb // parts, (part + 1) * nb // parts):
            ncol = min(NR, og - b * NR)
            b_off = b * kc4 * NR * 4
            o0 = b * NR
            for ow0 in range(0, ow_n, MR):
                mr = min(MR, ow_n - ow0)
                if CHECKED and not _taps_inside(bad, xp, a_row + ow0 * sw * cp, sw * cp, mr,
                                                c4n, tapoff, taps, wp, b_off, extent(out),
                                                (orow * ow_n + ow0) * ldo + o0, ldo, ncol,
                                                zeros, col_term, bias, mult, o0):
                    continue
                a_rows, weights = (xp, a_row + ow0 * sw * cp, sw * cp, mr), (wp, b_off, c4n)
                dest = (out, (orow * ow_n + ow0) * ldo + o0, ldo, ncol)
                sums, rq = (zeros, 0), (col_term, col_term, bias, mult, o0, qmin, qmax, zp)
                if mr <= 2:
                    ukernel_taps_2x64(a_rows, weights, (tapoff, taps), dest, sums, rq)
                elif mr <= 4:
                    ukernel_taps_4x64(a_rows, weights, (tapoff, taps), dest, sums, rq)
                else:
                    ukernel_taps_6x64(a_rows, weights, (tapoff, taps), dest, sums, rq)
        if res_kind != 0:
            b0, b1 = part * nb // parts, (part + 1) * nb // parts
            residual_rows(out, orow * ow_n, (orow + 1) * ow_n, b0 * NR, min(og, b1 * NR), res,
                          res_kind, res_params)
    if CHECKED and bad[0]:
        fail("int8 VNNI implicit-GEMM kernel", DENSE_BUFFERS, bad)


@njit(inline="always")
def _amx_inside(bad, a, a_off, lda, b, b_off, ksteps, c, c_off):
    """:func:`~.amx.amx_32x32`'s tiles: A 32 rows (all: rows past a panel's end are
    read too) of ``64 * ksteps`` bytes, ``lda`` apart; B per K step ``k`` two tiles of
    16 rows of 64 bytes, 256 apart, at ``b_off + 4096 k`` and 64 bytes further (the
    last byte read: ``4096 (ksteps - 1) + 64 + 15 * 256 + 63``); the int32 block: 32
    rows of 32 lanes, 64 apart."""
    return (within(bad, 1, a.size, a_off, a_off + 31 * lda + 64 * ksteps)
            and within(bad, 2, b.size, b_off, b_off + (ksteps - 1) * 4096 + 15 * 256 + 128)
            and within(bad, 3, c.size, c_off, c_off + 31 * NR + 32))


@kernel(parallel=True)
def conv_amx(x, flip, xzp, wp, wzp, col_term, geo, groups, kc, kc4, nb, direct, prows, cfg,
             mode, mult, bias_f, bias_i, zp, lo, hi, out):
    """As :func:`conv_vnni` with AMX tiles: 32 x 32 blocks by ``tdpbusd``.

    ``kc4`` is a multiple of 16 (K padded to 64 bytes), ``prows`` a multiple of 32; rows
    past the panel's end hold stale bytes whose results are never stored. ``direct``
    (1x1, stride 1, unpadded, ungrouped, uint8, C % 64 == 0) reads x in place, the
    last partial block of 32 rows through a zero-padded copy.
    """
    m_total = out.shape[0]
    og = out.shape[1] // groups
    cg = x.shape[4] // groups
    lda = kc4 * 4
    xflat = x.reshape(-1)
    need_sum = np.any(wzp != 0)
    npanel = (m_total + prows - 1) // prows
    full_end = m_total - m_total % 32  # row blocks from here on are partial
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    for p in prange(npanel):
        amx_begin(cfg)
        buf = np.empty(32 * lda if direct else prows * lda, np.uint8)
        rows = np.zeros(prows, np.int32)
        ctile = np.empty(prows * NR, np.int32)
        m0 = p * prows
        m1 = min(m_total, m0 + prows)
        for g in range(groups):
            if direct:
                for m in range(m0, m1):
                    rows[m - m0] = _flip_and_sum(xflat, m * kc, kc, 0, need_sum)
                if m1 > full_end:
                    buf[:] = 0
                    buf[:(m1 - full_end) * kc] = xflat[full_end * kc:m1 * kc]
            else:
                _gather_panel(bad, x, m0, m1, g, cg, geo, xzp ^ flip, flip, need_sum, kc, lda,
                              buf, rows)
            for b in range(nb):
                ncol = min(NR, og - b * NR)
                b_base = (g * nb + b) * kc4 * NR * 4
                for half in range(2 if ncol > 32 else 1):
                    for rb in range(m0, m1, 32):
                        if CHECKED and not _amx_inside(
                                bad, xflat if direct and rb < full_end else buf,
                                (rb - m0) * lda if not direct else rb * kc if rb < full_end
                                else 0, kc if direct else lda, wp, b_base + half * 128,
                                kc4 // 16, ctile, (rb - m0) * NR + half * 32):
                            continue
                        if not direct:
                            amx_32x32(buf, (rb - m0) * lda, lda, wp, b_base + half * 128,
                                      kc4 // 16, ctile, (rb - m0) * NR + half * 32)
                        elif rb < full_end:
                            amx_32x32(xflat, rb * kc, kc, wp, b_base + half * 128,
                                      kc4 // 16, ctile, (rb - m0) * NR + half * 32)
                        else:
                            amx_32x32(buf, 0, kc, wp, b_base + half * 128,
                                      kc4 // 16, ctile, (rb - m0) * NR + half * 32)
                for rb in range(m0, m1, MR):
                    _store_tile(ctile[(rb - m0) * NR:], min(MR, m1 - rb), ncol, rb,
                                g * og + b * NR, rows, rb - m0, wzp, col_term, mode, mult,
                                bias_f, bias_i, zp, lo, hi, out)
        amx_end()
    if CHECKED and bad[0]:
        fail("int8 AMX dense kernel", DENSE_BUFFERS, bad)


@kernel(parallel=True)
def conv_avx2(x, flip, xzp, wp, geo, groups, kc, kc2, nb, prows, direct, zeros, mode,
              mult, bias_f, bias_i, zp, lo, hi, out, res, res_kind, res_params):
    """Any grouped conv on AVX2: panels of ``prows`` rows gathered
    (:func:`_gather_panel`), then widened to int16 differences ``x - xzp`` (K
    zero-padded to ``2 * kc2``; ``direct``: a pointwise conv whose row m is x's pixel m,
    widened in place), times ``wp (g, nb, kc2, 16, 2)`` int16 ``w - wzp`` in 6 x 16
    tiles, requantized in the micro-kernel's registers (whole tiles to 8 bits), else
    from the tile in memory (``zeros``: int32 zeros, one per row of a tile and per
    output channel: no zero-point terms remain). Each work item (a panel of one group)
    ends with the residual add ``res_kind`` (:func:`residual_rows`) over its part."""
    m_total = out.shape[0]
    og = out.shape[1] // groups
    cg = x.shape[4] // groups
    lda = 2 * kc2
    npanel = (m_total + prows - 1) // prows
    xflat = x.reshape(-1)
    xz16, flip8 = np.int16(xzp), np.uint8(flip)
    # whole 16-channel tiles of 8-bit rows requantize in the micro-kernel's registers
    vector_store = mode != 2 and out.itemsize == 1 and out.strides[1] == 1
    ldo = out.strides[0]
    flo, fhi, fzp = np.float64(lo), np.float64(hi), np.float64(zp)
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    for t in prange(npanel * groups):
        p, g = t // groups, t % groups
        buf = np.empty(1 if direct else prows * kc, np.uint8)
        sums = np.empty(prows, np.int32)  # (row sums: not needed)
        a = np.zeros(prows * lda, np.int16)
        tile = np.empty(AVX2_MR * NR, np.int32)
        m0 = p * prows
        rows = min(prows, m_total - m0)
        if not direct:  # the panel's raw bytes, flipped and widened below
            _gather_panel(bad, x, m0, m0 + rows, g, cg, geo, xzp ^ flip, 0, False, kc, kc, buf,
                          sums)
        for r in range(rows):
            at = r * lda
            src = (m0 + r) * kc if direct else r * kc
            row = xflat if direct else buf
            for k in range(kc):
                a[np.uintp(at + k)] = np.int16(row[np.uintp(src + k)] ^ flip8) - xz16
        for b in range(nb):
            o0 = g * og + b * AVX2_NR
            ncol = min(AVX2_NR, og - b * AVX2_NR)
            b_off = ((g * nb + b) * kc2) * 2 * AVX2_NR
            if vector_store and ncol == AVX2_NR:  # one loop per mode: see _panel_u8s8
                if mode == 0:
                    for r0 in range(0, rows, AVX2_MR):
                        if CHECKED and not (
                                _avx2_inside(bad, a, r0 * lda, lda, min(AVX2_MR, rows - r0), 2,
                                             wp, b_off, kc2, 2 * AVX2_NR)
                                and _avx2_store_inside(bad, extent(out), (m0 + r0) * ldo + o0,
                                                       ldo, min(AVX2_MR, rows - r0), bias_f,
                                                       mult, o0)):
                            continue
                        ukernel_requant_6x16((a, r0 * lda, lda, min(AVX2_MR, rows - r0)),
                                             (wp, b_off, kc2), (out, (m0 + r0) * ldo + o0, ldo),
                                             (bias_f, mult, o0, flo, fhi, fzp))
                else:
                    for r0 in range(0, rows, AVX2_MR):
                        if CHECKED and not (
                                _avx2_inside(bad, a, r0 * lda, lda, min(AVX2_MR, rows - r0), 2,
                                             wp, b_off, kc2, 2 * AVX2_NR)
                                and _avx2_store_inside(bad, extent(out), (m0 + r0) * ldo + o0,
                                                       ldo, min(AVX2_MR, rows - r0), bias_i,
                                                       mult, o0)):
                            continue
                        ukernel_requant_6x16((a, r0 * lda, lda, min(AVX2_MR, rows - r0)),
                                             (wp, b_off, kc2), (out, (m0 + r0) * ldo + o0, ldo),
                                             (bias_i, mult, o0, flo, fhi, fzp))
                continue
            for r0 in range(0, rows, AVX2_MR):
                mr = min(AVX2_MR, rows - r0)
                # the tile: rows r < mr stored, 16 int32 each, NR (64) apart
                if CHECKED and not (
                        _avx2_inside(bad, a, r0 * lda, lda, mr, 2, wp, b_off, kc2, 2 * AVX2_NR)
                        and within(bad, 3, tile.size, 0, (mr - 1) * NR + AVX2_NR)):
                    continue
                ukernel_6x16((a, r0 * lda, lda, mr), (wp, b_off, kc2), (tile, 0, NR))
                _store_tile(tile, mr, ncol, m0 + r0, o0, zeros, 0, zeros, zeros, mode, mult,
                            bias_f, bias_i, zp, lo, hi, out)
        if res_kind != 0:
            residual_rows(out, m0, m0 + rows, g * og, (g + 1) * og, res, res_kind, res_params)
    if CHECKED and bad[0]:
        fail("int8 AVX2 dense kernel", DENSE_BUFFERS, bad)


_LOW_BYTES = np.uint64(0x00FF00FF00FF00FF)
_LANE_ONES = np.uint64(0x0001000100010001)


#: :func:`few_heavy_pairs` reads at most this many bytes of x: windows of
#: ``SAMPLE_WINDOW`` bytes spread evenly over it (a full pass over a batch-8 tensor,
#: made before the parallel kernel starts, took up to 60 us on one thread)
SAMPLE_BYTES = 1 << 18
SAMPLE_WINDOW = 4096


@kernel()
def few_heavy_pairs(x, share):
    """Whether at most one in ``share`` of the byte pairs ``x[2i], x[2i + 1]`` of the
    contiguous uint8 array ``x`` adds up to 257 or more (the pairs that can saturate
    ``vpmaddubsw``), counted in windows of ``SAMPLE_WINDOW`` bytes spread evenly over x,
    ``SAMPLE_BYTES`` at most (x under two windows: all of it; the answer only picks
    the faster of two exact kernels). Four pairs a 64-bit
    word: each 16-bit lane's sum plus 255 has bit 9 set exactly then; the flags are
    summed in those lanes a window at a time and folded."""
    flat = x.reshape(-1)
    n = flat.shape[0] - flat.shape[0] % 8
    words = flat[:n].view(np.uint64)
    window = SAMPLE_WINDOW // 8
    count = min(words.shape[0] // window, SAMPLE_BYTES // SAMPLE_WINDOW)
    if count < 2:  # small x: all of it, as one window
        count, window = 1, words.shape[0]
    gap = words.shape[0] // count
    total = 0
    for i in range(count):
        lanes = np.uint64(0)
        for j in range(i * gap, i * gap + window):
            w = words[j]
            sums = (w & _LOW_BYTES) + ((w >> np.uint64(8)) & _LOW_BYTES) + _LOW_BYTES
            lanes += (sums >> np.uint64(9)) & _LANE_ONES
        total += np.int64((lanes * _LANE_ONES) >> np.uint64(48))
    return total <= count * window * 4 // share


def u8s8_share(out_channels: int, fixes_per_pair: float) -> int:
    """The ``share`` of :func:`few_heavy_pairs` under which :func:`conv_avx2_u8s8`
    pays: a heavy pair of x costs about the time of 100 instructions (its loops' and
    branches' outcomes are rarely predicted) plus 6 for each of its risky columns
    (``fixes_per_pair`` on average), a pair about ``0.23 * O`` instructions in the
    tiles; the fixes may take a tenth of that. Calibrated on MobileNetV2's ONNX int8
    layers (Zen 3, in-process A/B against the int16 tiles): 32 channels with 3% heavy
    pairs ran 0.82-0.92x, 96-320 channels with 0.2-1.5% 1.10-1.24x. Without risky
    weights nothing is looked up (share 1: any x)."""
    if fixes_per_pair == 0:
        return 1
    allowed = 0.1 * 0.23 * out_channels / (100 + 6 * fixes_per_pair)
    return max(1, int(np.ceil(1 / allowed)))


@kernel(parallel=True)
def conv_avx2_u8s8(x, xzp, wp, col_term, fix_ptr, fix_col, fix_w, geo, kc, kc4, nb, prows,
                   in_place, mode, mult, bias_f, bias_i, zp, lo, hi, out, res, res_kind,
                   res_params):
    """:func:`conv_avx2` for uint8 x, int8 weights of zero point 0, ungrouped, every
    16-channel tile whole and 8-bit ``out`` with unit column stride.

    The tiles multiply x's bytes by ``wp (nb, kc4, 16, 4)`` int8 with ``vpmaddubsw``,
    whose pairs of products saturate at int16; each tile starts from ``col_term[o] =
    -xzp * sum_k w[o, k]`` plus, for every pair of its rows that saturates, the part the
    pair loses: ``p - clamp(p, -32768, 32767)``. Such a pair has bytes adding up to 257
    or more and weights from the :func:`~convengine.quant.prepack.pair_fixes` table (``fix_ptr``,
    ``fix_col``, ``fix_w``), so only those pairs are looked at. ``in_place``: a 1x1
    stride-1 conv whose rows are x's pixels, C a multiple of 4 (no gather). One panel
    of ``prows`` rows a work item (:func:`_panel_u8s8`), ending with the residual add
    ``res_kind`` (:func:`residual_rows`) over its rows."""
    npanel = (out.shape[0] + prows - 1) // prows
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    for p in prange(npanel):
        m0 = p * prows
        if mode == 0:
            _panel_u8s8(bad, x, xzp, wp, col_term, fix_ptr, fix_col, fix_w, geo, kc, kc4, nb,
                        m0, prows, in_place, mult, bias_f, zp, lo, hi, out)
        else:
            _panel_u8s8(bad, x, xzp, wp, col_term, fix_ptr, fix_col, fix_w, geo, kc, kc4, nb,
                        m0, prows, in_place, mult, bias_i, zp, lo, hi, out)
        if res_kind != 0:
            residual_rows(out, m0, min(m0 + prows, out.shape[0]), 0, out.shape[1], res,
                          res_kind, res_params)
    if CHECKED and bad[0]:
        fail("int8 AVX2 u8s8 dense kernel", DENSE_BUFFERS, bad)


@kernel()
def _panel_u8s8(bad, x, xzp, wp, col_term, fix_ptr, fix_col, fix_w, geo, kc, kc4, nb, m0,
                prows, in_place, mult, bias, zp, lo, hi, out):
    """Rows ``m0:m0 + prows`` of :func:`conv_avx2_u8s8`, requantized as mode 0 (float32
    ``bias``) or 1 (int32). A function of its own, called from the parallel loop: its
    buffers are its own, and its code does not depend on how numba transforms that loop
    (inlined there, a kernel of this shape ran at half speed on two threads after some
    compilation orders); one compilation per mode, so that no branch on the mode picks
    between two micro-kernel calls whose records hold different arrays (their reference
    counts would then not cancel). Checked mode: calls outside their buffers are
    skipped and recorded in ``bad``."""
    rows = min(prows, out.shape[0] - m0)
    lda = kc4 * 4
    ldo = out.strides[0]
    flo, fhi, fzp = np.float64(lo), np.float64(hi), np.float64(zp)
    if in_place:
        a, a0 = x.reshape(-1), m0 * lda
    else:
        a, a0 = np.empty(rows * lda, np.uint8), 0
        sums = np.empty(rows, np.int32)  # (row sums: not needed)
        _gather_panel(bad, x, m0, m0 + rows, 0, x.shape[4], geo, xzp, 0, False, kc, lda, a,
                      sums)
    # the search for saturating pairs reads the panel's rows whole, 32 bytes at a
    # time (any_heavy_pair, heavy_pair_mask): [a0, a0 + rows * lda) at most
    if CHECKED and not within(bad, 1, a.size, a0, a0 + rows * lda):
        return
    first, fix_o, fix_d = _saturated_pairs(a, a0, lda, kc, rows, fix_ptr, fix_col, fix_w)
    start = np.empty(AVX2_MR * AVX2_NR, np.int32)
    for b in range(nb):
        o0 = b * AVX2_NR
        b_off = b * kc4 * AVX2_NR * 4
        for r0 in range(0, rows, AVX2_MR):
            mr = min(AVX2_MR, rows - r0)
            fixed = first[r0 + mr] > first[r0] and _start_tile(start, col_term, o0, r0, mr,
                                                               first, fix_o, fix_d)
            # the tile starts at ``start``, else every row at col_term (one tuple a path)
            init = (start, 0, AVX2_NR) if fixed else (col_term, o0, 0)
            # the start tile is read for all 6 rows: 16 lanes each, 16 apart in
            # ``start``, one row for all (ldc 0) in col_term
            if CHECKED and not (
                    _avx2_inside(bad, a, a0 + r0 * lda, lda, mr, 4, wp, b_off, kc4,
                                 4 * AVX2_NR)
                    and _avx2_store_inside(bad, extent(out), (m0 + r0) * ldo + o0, ldo, mr,
                                           bias, mult, o0)
                    and (within(bad, 3, start.size, 0, AVX2_MR * AVX2_NR) if fixed
                         else within(bad, 6, col_term.size, o0, o0 + AVX2_NR))):
                continue
            ukernel_requant_u8s8_6x16((a, a0 + r0 * lda, lda, mr), (wp, b_off, kc4),
                                      (out, (m0 + r0) * ldo + o0, ldo),
                                      (bias, mult, o0, flo, fhi, fzp), init)


@kernel()
def _saturated_pairs(a, a0, lda, kc, rows, fix_ptr, fix_col, fix_w):
    """The pairs of ``rows`` rows of bytes ``a[a0 + r * lda:][:kc]`` that saturate
    ``vpmaddubsw`` against the weights of ``fix_ptr``/``fix_col``/``fix_w``: row r's
    are ``fix_o[first[r]:first[r + 1]]`` (output channels, int32) with what each loses,
    ``fix_d`` (int32). Weights without a risky pair (an empty table) need no search."""
    first = np.zeros(rows + 1, np.int64)
    if fix_col.size == 0 or not _panel_has_heavy_pair(a, a0, rows * lda):
        return first, np.empty(0, np.int32), np.empty(0, np.int32)
    room = 4 * rows + 64
    while True:
        fix_o = np.empty(room, np.int32)
        fix_d = np.empty(room, np.int32)
        found = _find_saturated(a, a0, lda, kc, rows, fix_ptr, fix_col, fix_w, first, fix_o,
                                fix_d)
        if found <= room:
            return first, fix_o, fix_d
        room = found


@njit(inline="always")
def _panel_has_heavy_pair(a, a0, n):
    """Whether a pair of the ``n`` bytes ``a[a0:a0 + n]`` (``a0`` and ``n`` even) adds
    up to 257 or more: one branch-free pass before any row is looked at (MobileNetV2's
    first 1x1 layers at batch 8, 32 bytes a row, had none, and row by row the search
    cost a fifth of the tiles' time)."""
    whole = n // 32
    if any_heavy_pair(a, a0, whole):
        return True
    for k in range(a0 + 32 * whole, a0 + n, 2):
        if np.int32(a[k]) + np.int32(a[k + 1]) >= 257:
            return True
    return False


@kernel()
def _find_saturated(a, a0, lda, kc, rows, fix_ptr, fix_col, fix_w, first, fix_o, fix_d):
    """:func:`_saturated_pairs` into ``first``, ``fix_o``, ``fix_d``; returns how many
    it found (those past the arrays' room counted, not stored). Only pairs whose bytes
    add up to 257 or more are looked up (16 pairs at a time by ``heavy_pair_mask``, in
    rows where :func:`any_heavy_pair` finds one: in ResNet-50's ONNX int8 layers 0.12%
    of pairs are, and most rows have none)."""
    n = 0
    room = fix_o.shape[0]
    whole = kc // 32
    for r in range(rows):
        row = a0 + r * lda
        skip = 0 if any_heavy_pair(a, row, whole) else whole * 32  # to the tail, if any
        for k in range(skip, kc, 32):
            if k + 32 <= kc:
                bits = heavy_pair_mask(a, row + k)
            else:  # the row's last pairs (past kc: the panel's zero padding)
                bits = np.uint32(0)
                for i in range((kc - k + 1) // 2):
                    total = np.int32(a[row + k + 2 * i]) + np.int32(a[row + k + 2 * i + 1])
                    bits = np.uint32(bits | (np.uint32(total >= 257) << np.uint32(i)))
            while bits:
                pair = k // 2 + np.int64(trailing_zeros(bits))
                bits = np.uint32(bits & (bits - np.uint32(1)))
                x0 = np.int32(a[row + 2 * pair])
                x1 = np.int32(a[row + 2 * pair + 1])
                for i in range(fix_ptr[pair], fix_ptr[pair + 1]):
                    v = x0 * fix_w[i, 0] + x1 * fix_w[i, 1]
                    lost = v - min(max(v, -32768), 32767)
                    if lost != 0:
                        if n < room:
                            fix_o[n] = fix_col[i]
                            fix_d[n] = lost
                        n += 1
        first[r + 1] = n
    return n


@njit(inline="always")
def _start_tile(start, col_term, o0, r0, mr, first, fix_o, fix_d):
    """Fill ``start (6 * 16,)`` with ``col_term[o0:o0 + 16]`` per row plus the fixes of
    rows ``r0:r0 + mr`` in those columns; False (``start`` untouched) if there are none."""
    found = False
    for r in range(mr):
        for e in range(first[r0 + r], first[r0 + r + 1]):
            j = fix_o[e] - o0
            if 0 <= j < AVX2_NR:
                if not found:
                    for i in range(AVX2_MR * AVX2_NR):
                        start[i] = col_term[o0 + i % AVX2_NR]
                    found = True
                start[r * AVX2_NR + j] += fix_d[e]
    return found


@kernel(parallel=True)
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
                _gather_u8(x, m, g, cg, geo, xzp ^ flip, buf, 0)
                for k in range(kc):
                    diff[k] = np.int16(buf[k] ^ flip) - np.int16(xzp)
                for j in range(og):
                    o = g * og + j
                    acc = np.int32(0)
                    for k in range(kc):
                        acc += np.int32(diff[k]) * np.int32(wd[o, k])
                    out[m, o] = epilogue(acc, o, mode, mult, bias_f, bias_i, zp, lo, hi)
