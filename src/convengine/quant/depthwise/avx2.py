"""int8 depthwise convolution on AVX2 (CPUs without VNNI), register-blocked.

:func:`conv_depthwise_avx2` computes what :func:`.depthwise.conv_depthwise` does (x
``(N, D, H, W, C)`` uint8, ``wf (taps, C)`` float32 ``w - wzp``, ``out (M, C)``
8-bit, requantized as ``kernels._epilogue`` modes 0 and 1), but keeps a block of
``width`` output pixels times 16 channels in registers across all taps
(:func:`_block`): each tap's 8 bytes a vector are widened to float32 and multiplied
into the sums (``vpmovzxbd``, ``vcvtdq2ps``, ``vfmadd``), where the portable loop
read and wrote a row of sums in memory per tap (Zen 3, MobileNetV2's layers at batch
8: 2-4 GMAC/s a thread, ONNX Runtime 4-7). For 3-wide kernel rows at stride 1 or 2
the block widens each input column of a row once and multiplies it into every pixel
that reads it (alternated in one process against one widening per pixel and tap,
Zen 3: MobileNetV2's layers 1.07-1.29x, at batch 1 and 8).

The sums start at ``wterm = -xzp * sum_t wf[t]`` and add ``x * wf`` over every tap: a
tap outside the input reads the zero point instead (a row of ``xzp`` for tap rows
outside; for the first and last pixels of a row, a copy of their window with ``xzp``
past the edges), so each pixel's sum is ``sum_t (x_t - xzp) * wf[t]``. Every partial
sum is an integer of magnitude below ``2 * 255 * 255 * taps``; with ``taps <=
MAX_TAPS`` that is below 2**24, so float32 holds each exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._kernel_cache import kernel
from ...checked import CHECKED, fail, violations, within
from ...epilogue_codes import Epilogue
from .._ir import requant
from ..cpu import HAS_AVX2
from ..dense.avx2 import store_bytes
from ..dense.kernels import NO_CHECKS, extent
from .kernels import _row_source

MAX_TAPS = (1 << 24) // (2 * 255 * 255)  # 129: the float32 sums' exactness bound
LANES = 8  # float32 lanes of a ymm register
BLOCK = 4  # output pixels per register block
# Below this many multiply-adds a layer runs on the calling thread. This kernel does
# about a fifth of the VNNI one's work a microsecond, so a second thread pays off far
# sooner (Zen 3, 2 threads, back to back: 0.08M MACs 15 us serial, 9 in parallel;
# 0.42M 77 against 33)
SERIAL_MAX_MACS = 50_000
#: AVX2 with FMA (the ``avx2`` level of ``_host`` includes FMA)
AVAILABLE = HAS_AVX2
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, LANES)
_VI = ir.VectorType(ir.IntType(32), LANES)
_VB = ir.VectorType(ir.IntType(8), LANES)
# Checked mode (convengine.checked): the register blocks' buffers by site number
# (``bad`` is NO_CHECKS when off)
BUFFERS = ("src", "zero", "wf", "wterm", "bias", "mult", "out")


def _block(width: int, nvec: int, stride: int = 0) -> Any:
    """An ``@intrinsic`` for ``width`` output pixels times ``nvec`` vectors of 8 channels:

        out[oo + b * ldo + l] = requant(wterm[c0 + l] + sum_{r, j} row_r[col + b * pix
                                        + j * tap + l] * wf[(r * kw + j) * C + c0 + l])

    for ``b < width``, ``l < 8 * nvec``, ``r < len(offsets)``, ``j < kw``, where tap row
    ``r`` is ``src[offsets[r]:]``, or ``zero`` where ``offsets[r] < 0`` (uint8 arrays);
    ``out`` an 8-bit array, ``ldo`` its row stride. ``stride`` (1 or 2; 0: any): the
    form for 3-wide kernel rows at column dilation 1 and that stride (``pix == stride *
    tap``, ``kw == 3``), which widens each input column of a row once for every pixel
    that reads it (half the conversions at stride 1) where the general form widens
    one per pixel and tap. ``requant``: :func:`~convengine.quant._ir.requant` of
    the (exact) sum with ``bias`` and ``mult`` at ``c0`` (float32 ``bias``: mode 0;
    int32: mode 1), ``lo``, ``hi``, ``zp``. Arrays only, no raw addresses: with the
    rows' addresses taken by numba's ``.ctypes.data`` in the kernel, a PyTorch benchmark
    process died twice in a row in a later ``free`` ("double free or corruption"),
    and never since."""

    def block(typingctx, out, oo, ldo, src, zero, offsets, col, pix, tap, kw, wf, c_n, c0,
              wterm, bias, mult, lo, hi, zp):
        i, f = types.intp, types.float64
        sig = types.void(out, i, i, src, zero, offsets, i, i, i, i, wf, i, i, wterm, bias,
                         mult, f, f, f)
        onnx = isinstance(bias.dtype, types.Integer)

        def codegen(context, builder, signature, args):
            (_, oo_v, ldo_v, _, _, offsets_a, col_v, pix_v, tap_v, kw_v, _, cn_v, c0_v,
             _, _, _, lo_v, hi_v, zp_v) = args
            intp = oo_v.type
            arrays = {k: context.make_array(signature.args[k])(context, builder, args[k]).data
                      for k in (0, 3, 4, 5, 10, 13, 14, 15)}
            byte_ptr = ir.IntType(8).as_pointer()
            src_p, zero_p = (builder.bitcast(arrays[k], byte_ptr) for k in (3, 4))

            def const(v: int) -> ir.Value:
                return ir.Constant(intp, v)

            def vector_at(base, index, vty):
                return builder.bitcast(builder.gep(base, [index]), vty.as_pointer())

            def channel(v: int) -> ir.Value:
                return builder.add(c0_v, const(LANES * v))

            start = [builder.load(vector_at(arrays[13], channel(v), _VF), align=4)
                     for v in range(nvec)]
            accs = [[cgutils.alloca_once_value(builder, start[v]) for v in range(nvec)]
                    for _ in range(width)]
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v8f32")
            nrows = context.make_array(signature.args[5])(context, builder, offsets_a).nitems

            def weight(t, v):
                """Tap t's weights for vector v of the block's channels."""
                return builder.load(vector_at(arrays[10], builder.add(
                    builder.mul(t, cn_v), channel(v)), _VF), align=4)

            def add_product(b, v, xv, w):
                acc = accs[b][v]
                builder.store(builder.call(fma, [xv, w, builder.load(acc)]), acc)

            def widened(at, index, v):
                """8 bytes at ``at + index`` (vector v) as float32."""
                ptr = vector_at(at, builder.add(index, const(LANES * v)), _VB)
                return builder.sitofp(builder.zext(builder.load(ptr, align=1), _VI), _VF)

            def every_tap(r, row):
                with cgutils.for_range(builder, kw_v) as tap_loop:
                    j = tap_loop.index
                    at = builder.gep(row, [builder.mul(j, tap_v)])
                    for v in range(nvec):
                        w = weight(builder.add(builder.mul(r, kw_v), j), v)
                        for b in range(width):
                            add_product(b, v, widened(at, builder.mul(const(b), pix_v), v), w)

            def shared_columns(r, row):
                # pixel b's tap j reads column b * stride + j: each column widened once
                for v in range(nvec):
                    ws = [weight(builder.add(builder.mul(r, const(3)), const(j)), v)
                          for j in range(3)]
                    for k in range((width - 1) * stride + 3):
                        xv = widened(row, builder.mul(const(k), tap_v), v)
                        for b in range(width):
                            if 0 <= k - b * stride < 3:
                                add_product(b, v, xv, ws[k - b * stride])

            with cgutils.for_range(builder, nrows) as row_loop:
                r = row_loop.index
                offset = builder.load(builder.gep(arrays[5], [r]))
                inside = builder.icmp_signed(">=", offset, const(0))
                base = builder.select(inside, builder.gep(src_p, [offset]), zero_p)
                row = builder.gep(base, [col_v])
                (shared_columns if stride else every_tap)(r, row)
            lo_q, hi_q, zp_q = (builder.fptrunc(v, _F32) for v in (lo_v, hi_v, zp_v))
            mode = Epilogue.REQUANT_INT32 if onnx else Epilogue.REQUANT_FLOAT
            out_base = builder.bitcast(arrays[0], byte_ptr)
            consts = [(builder.load(vector_at(arrays[14], channel(v), _VI if onnx else _VF),
                                    align=4),
                       builder.load(vector_at(arrays[15], channel(v), _VF), align=4))
                      for v in range(nvec)]
            for b in range(width):
                qs = [requant(builder, builder.fptosi(builder.load(accs[b][v]), _VI),
                              *consts[v], lo_q, hi_q, zp_q, mode) for v in range(nvec)]
                at = builder.add(oo_v, builder.mul(const(b), ldo_v))
                store_bytes(builder, qs, builder.gep(out_base, [at]),
                            signature.args[0].dtype.signed)
            return context.get_dummy_value()

        return sig, codegen

    block.__name__ = f"depthwise_avx2_block_{width}x{LANES * nvec}"
    return intrinsic(block)


_block4_16, _block4_8 = _block(4, 2), _block(4, 1)
_block1_16, _block1_8 = _block(1, 2), _block(1, 1)
_block4_16_s1, _block4_8_s1 = _block(4, 2, 1), _block(4, 1, 1)
_block4_16_s2, _block4_8_s2 = _block(4, 2, 2), _block(4, 1, 2)


@njit(inline="always")
def _block_inside(bad, out, oo, ldo, src, zero, offsets, col, pix, tap, kw, wf, c_n, c0,
                  wterm, bias, mult, width, nvec):
    """Whether a :func:`_block` call stays inside its buffers: each tap row ``r`` reads
    ``8 * nvec`` bytes at ``col + b * pix + j * tap`` (``b < width``, ``j < kw``; the
    shared-column forms read the same columns, ``pix == stride * tap``) past
    ``offsets[r]`` in ``src``, or past 0 in ``zero`` where ``offsets[r] < 0``; ``wf``
    ``8 * nvec`` lanes from ``t * c_n + c0`` for every tap ``t``; ``wterm``, ``bias``,
    ``mult`` ``8 * nvec`` lanes from ``c0``; ``out`` ``8 * nvec`` bytes at ``oo + b * ldo``
    (:func:`~convengine.quant.dense.kernels.extent`: its rows may be a view's)."""
    lanes = LANES * nvec
    span = (width - 1) * pix + (kw - 1) * tap + lanes
    for r in range(offsets.size):
        if offsets[r] >= 0:
            if not within(bad, 1, src.size, offsets[r] + col, offsets[r] + col + span):
                return False
        elif not within(bad, 2, zero.size, col, col + span):
            return False
    return (within(bad, 3, wf.size, c0, (offsets.size * kw - 1) * c_n + c0 + lanes)
            and within(bad, 4, wterm.size, c0, c0 + lanes)
            and within(bad, 5, bias.size, c0, c0 + lanes)
            and within(bad, 6, mult.size, c0, c0 + lanes)
            and within(bad, 7, extent(out), oo, oo + (width - 1) * ldo + lanes))


@njit(inline="always")
def _pixels(bad, out, oo, ldo, src, zero, offsets, col, pix, tap, kw, wf, chans, wterm, bias,
            mult, lo, hi, zp, width, shared):
    """``width`` (1 or 4) adjacent pixels of one output row over all channels;
    ``shared`` 1 or 2: 3-wide kernel rows at that stride, column dilation 1 (the
    blocks of 4 then widen each input column once), else 0. Checked mode: blocks
    outside their buffers are skipped and recorded in ``bad``."""
    for c0 in range(0, chans, 2 * LANES):
        at, start = oo + c0, col + c0
        # 16 channels a block, 8 for a last odd vector
        if CHECKED and not _block_inside(bad, out, at, ldo, src, zero, offsets, start, pix,
                                         tap, kw, wf, chans, c0, wterm, bias, mult, width,
                                         2 if chans - c0 >= 2 * LANES else 1):
            continue
        if width == BLOCK and shared == 1:
            if chans - c0 >= 2 * LANES:
                _block4_16_s1(out, at, ldo, src, zero, offsets, start, pix, tap, kw, wf,
                              chans, c0, wterm, bias, mult, lo, hi, zp)
            else:
                _block4_8_s1(out, at, ldo, src, zero, offsets, start, pix, tap, kw, wf,
                             chans, c0, wterm, bias, mult, lo, hi, zp)
        elif width == BLOCK and shared == 2:
            if chans - c0 >= 2 * LANES:
                _block4_16_s2(out, at, ldo, src, zero, offsets, start, pix, tap, kw, wf,
                              chans, c0, wterm, bias, mult, lo, hi, zp)
            else:
                _block4_8_s2(out, at, ldo, src, zero, offsets, start, pix, tap, kw, wf,
                             chans, c0, wterm, bias, mult, lo, hi, zp)
        elif chans - c0 >= 2 * LANES:
            if width == BLOCK:
                _block4_16(out, at, ldo, src, zero, offsets, start, pix, tap, kw, wf, chans,
                           c0, wterm, bias, mult, lo, hi, zp)
            else:
                _block1_16(out, at, ldo, src, zero, offsets, start, pix, tap, kw, wf, chans,
                           c0, wterm, bias, mult, lo, hi, zp)
        elif width == BLOCK:
            _block4_8(out, at, ldo, src, zero, offsets, start, pix, tap, kw, wf, chans, c0,
                      wterm, bias, mult, lo, hi, zp)
        else:
            _block1_8(out, at, ldo, src, zero, offsets, start, pix, tap, kw, wf, chans, c0,
                      wterm, bias, mult, lo, hi, zp)


def serves(chans: int, taps: int, mode: int) -> bool:
    """Whether :func:`conv_depthwise_avx2` serves a layer (given an 8-bit output whose
    channels are contiguous): an AVX2 host, whole vectors of channels, few enough taps
    to stay exact, a requantized output."""
    return AVAILABLE and chans % LANES == 0 and taps <= MAX_TAPS and mode in (0, 1)


def zero_point_term(wf: np.ndarray, xzp: int) -> np.ndarray:
    """``wterm (C,)`` of :func:`conv_depthwise_avx2`: ``-xzp * sum_t wf[t]`` (exact)."""
    return (-float(xzp) * wf.astype(np.float64).sum(axis=0)).astype(np.float32)


@njit(inline="always")
def _rows(bad, x, xzp, wf, wterm, geo, mode, mult, bias_f, bias_i, zp, lo, hi, out, zero_row,
          first, last):
    """Output rows ``first:last`` (over n, od, oh) of :func:`conv_depthwise_avx2`."""
    w_in, chans = x.shape[3], x.shape[4]
    kd_n, kh_n, kw_n = geo[0], geo[1], geo[2]
    sw, pw, dw = geo[5], geo[8], geo[11]
    od_n, oh_n, ow_n = geo[12], geo[13], geo[14]
    nrows = kd_n * kh_n
    wflat = wf.reshape(-1)
    xflat = x.reshape(-1)
    ldo = out.strides[0]
    reach = (kw_n - 1) * dw
    lo_ow = min(ow_n, (pw + sw - 1) // sw)  # pixels [lo_ow, hi_ow) read x in place
    hi_ow = max(lo_ow, min(ow_n, (w_in - 1 + pw - reach) // sw + 1))
    flo, fhi, fzp = np.float64(lo), np.float64(hi), np.float64(zp)
    shared = sw if kw_n == 3 and dw == 1 and sw <= 2 else 0
    offsets = np.empty(nrows, np.int64)  # the tap rows' offsets in x, or -1 outside x
    window = np.empty(nrows * kw_n * chans, np.uint8)
    win_rows = np.arange(nrows) * (kw_n * chans)  # the window's rows
    for item in range(first, last):
        n, od, oh = item // (od_n * oh_n), (item // oh_n) % od_n, item % oh_n
        for r in range(nrows):
            offset, inside, _ = _row_source(r, nrows, n, od, oh, geo, x.shape, xzp)
            offsets[r] = offset if inside else -1
        m0 = item * ow_n
        ow = lo_ow
        while ow < hi_ow:
            width = BLOCK if hi_ow - ow >= BLOCK else 1
            col = (ow * sw - pw) * chans
            if mode == 0:
                _pixels(bad, out, (m0 + ow) * ldo, ldo, xflat, zero_row, offsets, col, sw * chans,
                        dw * chans, kw_n, wflat, chans, wterm, bias_f, mult, flo, fhi, fzp,
                        width, shared)
            else:
                _pixels(bad, out, (m0 + ow) * ldo, ldo, xflat, zero_row, offsets, col, sw * chans,
                        dw * chans, kw_n, wflat, chans, wterm, bias_i, mult, flo, fhi, fzp,
                        width, shared)
            ow += width
        for ow in range(ow_n):
            if lo_ow <= ow < hi_ow:
                continue
            for r in range(nrows):
                for j in range(kw_n):
                    ix = ow * sw - pw + j * dw
                    at = (r * kw_n + j) * chans
                    if offsets[r] >= 0 and 0 <= ix < w_in:
                        src = offsets[r] + ix * chans
                        window[at:at + chans] = xflat[src:src + chans]
                    else:
                        window[at:at + chans] = xzp
            if mode == 0:
                _pixels(bad, out, (m0 + ow) * ldo, ldo, window, window, win_rows, 0, 0, chans,
                        kw_n, wflat, chans, wterm, bias_f, mult, flo, fhi, fzp, 1, 0)
            else:
                _pixels(bad, out, (m0 + ow) * ldo, ldo, window, window, win_rows, 0, 0, chans,
                        kw_n, wflat, chans, wterm, bias_i, mult, flo, fhi, fzp, 1, 0)


@kernel(parallel=True)
def conv_depthwise_avx2(x, xzp, wf, wterm, geo, mode, mult, bias_f, bias_i, zp, lo, hi,
                        out, parts):
    """Depthwise (groups == C == O) on uint8 x ``(N, D, H, W, C)``: ``wf (taps, C)``
    float32 ``w - wzp``, ``wterm (C,)`` float32 ``-xzp * sum_t wf[t]``; ``out (M, C)``
    8-bit, channels contiguous (see :func:`serves`). The output rows are split into
    ``parts`` work items. In a row, the pixels whose taps all lie inside the input
    read x in place, four at a time; the others read a copy of their window padded
    with ``xzp``."""
    zero_row = np.full(x.shape[3] * x.shape[4], np.uint8(xzp))  # read for rows outside x
    total = out.shape[0] // geo[14]
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    for part in prange(parts):
        _rows(bad, x, xzp, wf, wterm, geo, mode, mult, bias_f, bias_i, zp, lo, hi, out,
              zero_row, part * total // parts, (part + 1) * total // parts)
    if CHECKED and bad[0]:
        fail("int8 AVX2 depthwise kernel", BUFFERS, bad)


@kernel()
def conv_depthwise_avx2_serial(x, xzp, wf, wterm, geo, mode, mult, bias_f, bias_i, zp, lo,
                               hi, out):
    """:func:`conv_depthwise_avx2` on the calling thread (no parallel region: for small
    layers). In a parallel function the same rows outside its ``prange`` ran 5-10x
    slower."""
    zero_row = np.full(x.shape[3] * x.shape[4], np.uint8(xzp))
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    _rows(bad, x, xzp, wf, wterm, geo, mode, mult, bias_f, bias_i, zp, lo, hi, out, zero_row,
          0, out.shape[0] // geo[14])
    if CHECKED and bad[0]:
        fail("int8 AVX2 depthwise kernel", BUFFERS, bad)
