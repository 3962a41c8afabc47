"""int8 depthwise convolution (groups == C == O), exact in int32, requantization fused.

Operands as in :mod:`.kernels`: x ``(N, D, H, W, C)`` uint8 (int8 input XORed with
``flip = 0x80`` on the fly), ``geo`` the int64 geometry vector, ``out (M, C)``.

:func:`conv_depthwise_vnni` (AVX512-VNNI). The ``R = KD * KH`` kernel rows form
``G = ceil(R / 4)`` groups of four. For each output row, each thread interleaves the
input rows of every group into a buffer ``buf[g, bx, c, 4]`` (byte ``i`` of the
int32 lane of channel ``c`` is input row ``4g + i`` at buffer column ``bx``, i.e.
input column ``bx - pw``), so one ``vpdpbusd`` adds four taps of 16 channels:

    acc[c] = xzp * wterm[c] + sum_{g, kw} dot4(buf[g, ow * sw + kw * dw, c], wq[g, kw, c])

Columns and rows outside the input hold the zero point ``xzp`` (they then add ``(xzp -
xzp) * w = 0`` to the exact sum), rows past ``R`` hold 0 (the fourth of a group of
three: anything) against zero weights. Weights are packed (:func:`pack_weights`) as
``d = w - wzp`` when every ``d`` fits int8, else as ``w`` with ``- wzp[c] * sum_t
x_t`` added through a second ``vpdpbusd`` on ones; ``wterm = T * wzp - sum_t w_t``
(int32 arithmetic wraps, and the true sum fits, so the result is exact). Modes 0 and 1
requantize 16 channels at a time exactly as ``kernels.epilogue`` (see
:func:`convengine.quant._ir.requant`); the raw accumulator (mode 2)
goes through ``epilogue`` per value. Each row kernel call covers several output rows
(about 32 pixels); workers take rows from an atomic counter;
:func:`conv_depthwise_vnni_serial` is the same without threads, for layers below
``SERIAL_MAX_MACS``.

:func:`conv_depthwise` (any CPU): float32 products and sums of integers below 2**24,
hence exact; used where VNNI is missing or the portable int8 path is forced.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._host import FEATURES
from ..._kernel_cache import kernel
from ...algorithms.fma import splat
from ...checked import CHECKED, fail, violations, within
from ...epilogue_codes import Epilogue
from .._ir import (
    LANES,
    VB,
    VF,
    VI,
    bounds,
    lane_mask,
    masked_load,
    masked_store,
    requant,
)
from ..dense.kernels import NO_CHECKS, epilogue

MAX_TAPS = (1 << 24) // (255 * 255)  # the float kernel's exactness bound
# Below this many multiply-adds the VNNI kernel runs on the calling thread, where
# starting the parallel region costs more than the second thread saves. 2M when that
# start took ~17 us (2026-11-29, before convengine's threading layer); re-measured
# 2026-12-04 (Zen 5, 2 threads, MobileNetV2's batch-1 layers, ONNX mode): parallel
# 1.2-1.3x faster at 0.25-0.42M, 1.6-1.8x at 0.68-1.35M. 0.5M, as the float kernel's
# threshold (algorithms/depthwise.py, Zen 4: serial faster at 0.25-0.42M there).
SERIAL_MAX_MACS = 500_000
HAS_VBMI = bool(FEATURES.get("avx512vbmi"))  # vpermt2b: 64-byte two-source permutes
_I8, _I32 = ir.IntType(8), ir.IntType(32)
# Checked mode (convengine.checked): the buffers of the VNNI kernels' raw-pointer calls
# (interleave_rows, dw_row_*), by site number; ``bad`` is NO_CHECKS when off
DW_BUFFERS = ("x", "buf", "wq", "wterm", "wzp", "bias", "mult", "out", "scratch")


@njit(inline="always")
def _interleave_inside(bad, x, offs, three, chans, ncols, buf, boff):
    """Whether :func:`interleave_rows` stays inside x and ``buf``: it reads
    ``ncols * chans`` bytes from each ``offs[r]`` of the rows it loads (3 when the
    fourth row is absent, else 4: rows outside the input are read too, then replaced)
    and writes ``ncols`` buffer columns of ``4 * C16`` bytes from ``boff`` (whole
    16-channel blocks: the padding channels too)."""
    run = ncols * chans
    if run <= 0:
        return True
    for r in range(3 if three else 4):
        if not within(bad, 1, x.size, offs[r], offs[r] + run):
            return False
    return within(bad, 2, buf.size, boff, boff + ncols * 4 * ((chans + LANES - 1) // LANES
                                                             * LANES))


@njit(inline="always")
def _row_kernel_inside(bad, buf, boff, tap, plane, ngroups, kw_n, step, ow_n, wq, woff,
                       wtap, wterm, wzp, c, bias, mult, requantize, lanes, dst, dst_site,
                       doff, dstride, nrows, rowbuf):
    """Whether a :func:`dw_row_requant` / :func:`dw_row_acc` call stays inside its
    buffers: 64-byte loads of ``buf`` at ``boff + r * rowbuf + ow * step + g * plane +
    kw * tap`` and of ``wq`` at ``woff + (g * kw_n + kw) * wtap``; 16 int32 lanes from
    ``c`` of ``wterm`` and ``wzp`` (and, requantizing, of ``bias`` and ``mult``); each of
    the ``nrows * ow_n`` pixels' ``lanes`` elements (the masked bytes, or 16 int32) at
    ``doff + pixel * dstride`` of ``dst``."""
    b_hi = (boff + (nrows - 1) * rowbuf + (ow_n - 1) * step + (ngroups - 1) * plane
            + (kw_n - 1) * tap + 4 * LANES)
    return (within(bad, 2, buf.size, boff, b_hi)
            and within(bad, 3, wq.size, woff, woff + (ngroups * kw_n - 1) * wtap + 4 * LANES)
            and within(bad, 4, wterm.size, c, c + LANES)
            and within(bad, 5, wzp.size, c, c + LANES)
            and (not requantize or (within(bad, 6, bias.size, c, c + LANES)
                                    and within(bad, 7, mult.size, c, c + LANES)))
            and within(bad, dst_site, dst.size, doff,
                       doff + (nrows * ow_n - 1) * dstride + lanes))


def pack_weights(taps: np.ndarray, wzp: np.ndarray) -> dict[str, Any]:
    """Depthwise weights for :func:`conv_depthwise_vnni`.

    ``taps (C, R, KW)`` int8 (signed weights, ``R = KD * KH`` kernel rows), ``wzp (C,)``
    int64 signed zero points. Returns ``wq`` int8 flat ``(G, KW, C16, 4)`` (C16 = C
    rounded up to 16, zeros past R and C), ``wterm`` and ``wzp`` int32 ``(C16,)``,
    ``has_wzp`` (weights packed raw, zero point applied through the input sums)."""
    chans, rows, kw_n = taps.shape
    c16 = -(-chans // LANES) * LANES
    groups4 = -(-rows // 4)
    t64 = taps.astype(np.int64)
    diff = t64 - wzp[:, None, None]
    fits = bool(np.all((diff >= -128) & (diff <= 127)))
    packed = diff if fits else t64
    arr = np.zeros((groups4 * 4, kw_n, c16), np.int8)
    arr[:rows, :, :chans] = packed.transpose(1, 2, 0)
    wq = np.ascontiguousarray(arr.reshape(groups4, 4, kw_n, c16).transpose(0, 2, 3, 1)).ravel()
    wterm = np.zeros(c16, np.int32)
    wterm[:chans] = (rows * kw_n * wzp - t64.sum(axis=(1, 2))).astype(np.int32)
    wzp16 = np.zeros(c16, np.int32)
    wzp16[:chans] = wzp
    return dict(wq=wq, wterm=wterm, wzp=wzp16, has_wzp=not fits)


def _interleave4(builder: ir.IRBuilder, rows: list[ir.Value], width: int) -> ir.Value:
    """<4 width x i8>: byte 4 i + r = rows[r][i] (bytes of pairs, then of 16-bit words)."""
    pairs = [i + width * h for i in range(width) for h in (0, 1)]
    p01 = builder.shuffle_vector(rows[0], rows[1], ir.Constant(ir.VectorType(_I32, 2 * width),
                                                               pairs))
    p23 = builder.shuffle_vector(rows[2], rows[3], ir.Constant(ir.VectorType(_I32, 2 * width),
                                                               pairs))
    quads = [k for i in range(width) for k in (2 * i, 2 * i + 1, 2 * width + 2 * i,
                                                  2 * width + 2 * i + 1)]
    return builder.shuffle_vector(p01, p23, ir.Constant(ir.VectorType(_I32, 4 * width), quads))


def _interleave3_vbmi(builder: ir.IRBuilder, rows: list[ir.Value], nblocks: ir.Value,
                      store: Any) -> None:
    """Three <64 x i8> rows -> ``nblocks`` (1-4) <64 x i8> blocks of 16 channels, block
    k holding ``[r0, r1, r2, ?]`` lanes of channels 16 k + i (as :func:`_interleave4`,
    byte 3 left as it comes: its weights are 0 and the row kernels leave it out of the
    input sums), each passed to ``store(k, block)``. Six ``vpermt2b`` for four blocks:
    two pair up rows 0 and 1, one per block adds row 2."""
    v64 = ir.VectorType(_I8, 64)
    perm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v64, [v64] * 3),
                                          "llvm.x86.avx512.vpermi2var.qi.512")

    def pair(h: int) -> ir.Value:
        idx = [32 * h + i + 64 * b for i in range(32) for b in (0, 1)]
        return builder.call(perm, [rows[0], ir.Constant(v64, idx), rows[1]])

    def block(k: int, pairs: ir.Value) -> None:
        idx = [v for i in range(LANES) for v in (2 * (16 * (k % 2) + i),
                                                   2 * (16 * (k % 2) + i) + 1,
                                                   64 + 16 * k + i, 0)]
        store(k, builder.call(perm, [pairs, ir.Constant(v64, idx), rows[2]]))

    def more(k: int) -> Any:
        return builder.if_then(builder.icmp_signed(">", nblocks, ir.Constant(nblocks.type, k)))

    low = pair(0)
    block(0, low)
    with more(1):
        block(1, low)
    with more(2):
        high = pair(1)
        block(2, high)
        with more(3):
            block(3, high)


@intrinsic
def interleave_rows(typingctx, x, off, valid, fill, flip, chans, ncols, buf, boff):
    """For ``bx < ncols`` buffer columns and channels ``c < chans`` (padded to 16):
    ``buf[boff + bx * 4 * C16 + 4 c + r] = x[off[r] + bx * chans + c] ^ flip`` if
    ``valid[r]``, else ``fill[r]`` (also for the padding channels c >= chans); when
    ``valid[3] == fill[3] == 0`` (a group of three kernel rows) byte 3 is undefined.
    ``off``, ``valid``, ``fill``: 4-tuples of ints, one per kernel row r of the group;
    every ``off[r]`` must address a row of x, valid or not (invalid rows are read and
    replaced). With ``chans % 16 == 0`` buffer columns are exactly 4x the input's, and
    the ``ncols * chans`` bytes of each row go as one run; otherwise column by column.
    Runs go in blocks of 64, 32 and 16 bytes, then a masked tail."""
    intp_t = types.intp
    tup = types.UniTuple(intp_t, 4)
    sig = types.void(x, tup, tup, tup, intp_t, intp_t, intp_t, buf, intp_t)

    def codegen(context, builder, signature, args):
        x_arr = context.make_array(signature.args[0])(context, builder, args[0])
        b_arr = context.make_array(signature.args[7])(context, builder, args[7])
        _, off_t, valid_t, fill_t, flip_v, chans_v, ncols_v, _, boff_v = args
        intp = chans_v.type

        def const(v: int) -> ir.Value:
            return ir.Constant(intp, v)

        nvec = builder.sdiv(builder.add(chans_v, const(LANES - 1)), const(LANES))
        col = builder.mul(nvec, const(4 * LANES))
        flip8 = builder.trunc(flip_v, _I8)
        oks = [builder.icmp_signed("!=", builder.extract_value(valid_t, r), const(0))
               for r in range(4)]
        fills = [builder.xor(builder.trunc(builder.extract_value(fill_t, r), _I8), flip8)
                 for r in range(4)]  # XORed once more with the loaded rows
        offs = [builder.extract_value(off_t, r) for r in range(4)]

        def load_rows(xcol: ir.Value, c: ir.Value, width: int, nrows: int, flipped: bool,
                      lanes: ir.Value | None) -> list[ir.Value]:
            """Rows r < nrows at channels c.. (``width`` bytes; masked loads if ``lanes``),
            the fill where a row is outside the input, XORed with flip."""
            vty = ir.VectorType(_I8, width)
            rows = []
            for r in range(nrows):
                ptr = builder.gep(x_arr.data, [builder.add(offs[r], builder.add(xcol, c))])
                fill = splat(builder, fills[r], vty)
                if lanes is not None:
                    row = masked_load(builder, ptr, builder.select(
                        oks[r], lanes, ir.Constant(lanes.type, None)), fill)
                else:
                    got = builder.load(builder.bitcast(ptr, vty.as_pointer()), align=1)
                    row = builder.select(oks[r], got, fill)
                rows.append(builder.xor(row, splat(builder, flip8, vty)) if flipped else row)
            return rows

        def block(xcol: ir.Value, bcol: ir.Value, c: ir.Value, width: int, masked: bool,
                  flipped: bool, three: bool, run: ir.Value) -> None:
            lanes = lane_mask(builder, builder.sub(run, c)) if masked else None
            rows = load_rows(xcol, c, width, 3 if three else 4, flipped, lanes)
            if three:
                rows.append(ir.Constant(ir.VectorType(_I8, width), None))
            out = _interleave4(builder, rows, width)
            dst = builder.gep(b_arr.data, [builder.add(bcol, builder.mul(c, const(4)))])
            builder.store(out, builder.bitcast(dst, out.type.as_pointer()), align=1)

        def block64_vbmi(xcol: ir.Value, bcol: ir.Value, c: ir.Value, flipped: bool,
                         rest: ir.Value | None) -> None:
            """64 channels from c (``rest`` < 64 of them by masked loads) in 16-channel
            blocks, three rows."""
            lanes = None
            if rest is not None:
                ids = ir.Constant(ir.VectorType(_I32, 64), list(range(64)))
                lanes = builder.icmp_signed("<", ids, splat(builder, builder.trunc(
                    rest, _I32), ir.VectorType(_I32, 64)))
            rows = load_rows(xcol, c, 64, 3, flipped, lanes)
            dst = builder.gep(b_arr.data, [builder.add(bcol, builder.mul(c, const(4)))])

            def store(k: int, part: ir.Value) -> None:
                at = builder.gep(dst, [const(64 * k)])
                builder.store(part, builder.bitcast(at, part.type.as_pointer()), align=1)

            nblocks = const(4) if rest is None else builder.sdiv(
                builder.add(rest, const(LANES - 1)), const(LANES))
            _interleave3_vbmi(builder, rows, nblocks, store)

        def columns(flipped: bool, three: bool, ncols: ir.Value, run: ir.Value) -> None:
            """``ncols`` runs of ``run`` input bytes each (x stride ``run``, buffer
            stride ``col``)."""
            n64 = builder.sdiv(run, const(64))
            rest = builder.srem(run, const(64))
            has32 = builder.icmp_signed(">=", rest, const(32))
            n16 = builder.sdiv(builder.srem(rest, const(32)), const(LANES))
            tail = builder.srem(run, const(LANES))
            with cgutils.for_range(builder, ncols) as cl:
                xcol = builder.mul(cl.index, run)
                bcol = builder.add(boff_v, builder.mul(cl.index, col))
                if three and HAS_VBMI:
                    with cgutils.for_range(builder, n64) as bl:
                        block64_vbmi(xcol, bcol, builder.mul(bl.index, const(64)), flipped,
                                     None)
                    with builder.if_then(builder.icmp_signed("!=", rest, const(0))):
                        block64_vbmi(xcol, bcol, builder.mul(n64, const(64)), flipped, rest)
                    return
                with cgutils.for_range(builder, n64) as bl:
                    block(xcol, bcol, builder.mul(bl.index, const(64)), 64, False, flipped,
                          three, run)
                c32 = builder.mul(n64, const(64))
                with builder.if_then(has32):
                    block(xcol, bcol, c32, 32, False, flipped, three, run)
                c16 = builder.add(c32, builder.select(has32, const(32), const(0)))
                with cgutils.for_range(builder, n16) as vl:
                    block(xcol, bcol, builder.add(c16, builder.mul(vl.index, const(LANES))),
                          LANES, False, flipped, three, run)
                with builder.if_then(builder.icmp_signed("!=", tail, const(0))):
                    block(xcol, bcol, builder.sub(run, tail), LANES, True, flipped, three,
                          run)

        def runs(flipped: bool, three: bool) -> None:
            dense = builder.icmp_signed("==", builder.srem(chans_v, const(LANES)), const(0))
            with builder.if_else(dense) as (one_run, per_column):
                with one_run:
                    columns(flipped, three, const(1), builder.mul(ncols_v, chans_v))
                with per_column:
                    columns(flipped, three, ncols_v, chans_v)

        # a fourth row that is past the kernel (invalid, fill 0) is a constant zero
        absent3 = builder.and_(builder.not_(oks[3]), builder.icmp_signed(
            "==", builder.extract_value(fill_t, 3), const(0)))
        flipped = builder.icmp_signed("!=", flip_v, const(0))
        with builder.if_else(absent3) as (three_rows, four_rows):
            for block_ctx, three in ((three_rows, True), (four_rows, False)):
                with block_ctx, builder.if_else(flipped) as (yes, no):
                    with yes:
                        runs(True, three)
                    with no:
                        runs(False, three)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fetch_add(typingctx, arr, value):
    """Atomically ``old = arr[0]; arr[0] += value``; returns ``old`` (int64 arrays)."""
    sig = types.int64(arr, types.int64)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", a.data, args[1], "monotonic")

    return sig, codegen


def _load_vec(builder: ir.IRBuilder, base: ir.Value, idx: ir.Value, vty: ir.Type) -> ir.Value:
    return builder.load(builder.bitcast(builder.gep(base, [idx]), vty.as_pointer()), align=4)


def _make_row_kernel(requantize: bool) -> Any:
    """An intrinsic that runs 16 channels (``c .. c + 15``) of ``nrows`` output rows:
    for ``r < nrows``, ``ow < ow_n`` the int32 lanes

        acc = xzp * wterm[c:] + sum_{g < ngroups, kw < kw_n} dot4(
                  buf[b + g * plane + kw * tap], wq[woff + (g * kw_n + kw) * wtap])
              (- wzp[c:] * sum of the same input bytes, if has_wzp)

    with ``b = boff + r * rowbuf + ow * step``, go to
    ``dst[doff + (r * ow_n + ow) * dstride:][:16]``: requantized (lanes < n, 8-bit:
    :func:`~convengine.quant._ir.requant`, ONNX's for an int32 ``bias``) or
    as int32. The 3 x 3 case
    (ngroups 1, kw_n 3) keeps its three weight vectors in registers."""

    def row_kernel(typingctx, buf, boff, tap, plane, ngroups, kw_n, step, ow_n, wq, woff, wtap,
                   wterm, wzp, has_wzp, c, bias, mult, qmin, qmax, zp, n, dst, doff, dstride,
                   xzp, rows, nrows, rowbuf):
        i = types.intp
        sig = types.void(buf, i, i, i, i, i, i, i, wq, i, i, wterm, wzp, i, i, bias, mult,
                         types.float32, types.float32, i, i, dst, i, i, i, i, i, i)

        def codegen(context, builder, signature, args):
            arr = [context.make_array(signature.args[k])(context, builder, args[k])
                   if isinstance(signature.args[k], types.Array) else None
                   for k in range(len(args))]
            (_, boff_v, tap_v, plane_v, ngroups_v, kw_v, step_v, ow_v, _, woff_v, wtap_v,
             _, _, has_wzp_v, c_v, _, _, qmin_v, qmax_v, zp_v, n_v, _, doff_v, dstride_v,
             xzp_v, rows_v, nrows_v, rowbuf_v) = args
            intp = boff_v.type
            dot = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(VI, [VI] * 3), "llvm.x86.avx512.vpdpbusd.512")

            def ones(group: ir.Value) -> ir.Value:
                """Byte weights 1 for the kernel rows of ``group``: the fourth lane of
                a group of three may hold anything (see :func:`interleave_rows`)."""
                three = builder.icmp_signed(">=", builder.add(builder.mul(
                    group, ir.Constant(intp, 4)), ir.Constant(intp, 3)), rows_v)
                return builder.select(three, ir.Constant(VI, [0x00010101] * LANES),
                                      ir.Constant(VI, [0x01010101] * LANES))
            buf_p, wq_p, dst_p = arr[0].data, arr[8].data, arr[21].data
            init = builder.mul(_load_vec(builder, arr[11].data, c_v, VI),
                               splat(builder, builder.trunc(xzp_v, _I32), VI))
            wzp_vec = _load_vec(builder, arr[12].data, c_v, VI)
            onnx = isinstance(signature.args[15].dtype, types.Integer)  # int32 bias: ONNX's
            mode = Epilogue.REQUANT_INT32 if onnx else Epilogue.REQUANT_FLOAT
            if requantize:
                lo, hi, zp_f = bounds(builder, qmin_v, qmax_v, zp_v)
                bias_vec = _load_vec(builder, arr[15].data, c_v, VI if onnx else VF)
                mult_vec = _load_vec(builder, arr[16].data, c_v, VF)
                mask = lane_mask(builder, n_v)

            def emit(fast: bool, use_wzp: bool) -> None:
                if fast:
                    wv = [_load_vec(builder, wq_p, builder.add(
                        woff_v, builder.mul(wtap_v, ir.Constant(intp, k))), VI) for k in range(3)]
                    ones0 = ones(ir.Constant(intp, 0))
                with cgutils.for_range(builder, nrows_v) as rl, \
                        cgutils.for_range(builder, ow_v) as ol:
                    base = builder.add(builder.add(boff_v, builder.mul(rl.index, rowbuf_v)),
                                       builder.mul(ol.index, step_v))
                    pixel = builder.add(builder.mul(rl.index, ow_v), ol.index)
                    if fast:
                        acc, xs = init, ir.Constant(VI, None)
                        for k in range(3):
                            xv = _load_vec(builder, buf_p, builder.add(
                                base, builder.mul(tap_v, ir.Constant(intp, k))), VI)
                            acc = builder.call(dot, [acc, xv, wv[k]])
                            if use_wzp:
                                xs = builder.call(dot, [xs, xv, ones0])
                    else:
                        acc_p = cgutils.alloca_once_value(builder, init)
                        xs_p = cgutils.alloca_once_value(builder, ir.Constant(VI, None))
                        with cgutils.for_range(builder, ngroups_v) as gl:
                            gb = builder.add(base, builder.mul(gl.index, plane_v))
                            gw = builder.add(woff_v, builder.mul(
                                builder.mul(gl.index, kw_v), wtap_v))
                            with cgutils.for_range(builder, kw_v) as kl:
                                xv = _load_vec(builder, buf_p, builder.add(
                                    gb, builder.mul(kl.index, tap_v)), VI)
                                wk = _load_vec(builder, wq_p, builder.add(
                                    gw, builder.mul(kl.index, wtap_v)), VI)
                                builder.store(builder.call(dot, [builder.load(acc_p), xv, wk]),
                                              acc_p)
                                if use_wzp:
                                    builder.store(builder.call(
                                        dot, [builder.load(xs_p), xv, ones(gl.index)]), xs_p)
                        acc, xs = builder.load(acc_p), builder.load(xs_p)
                    if use_wzp:
                        acc = builder.sub(acc, builder.mul(wzp_vec, xs))
                    at = builder.gep(dst_p, [builder.add(doff_v, builder.mul(pixel, dstride_v))])
                    if requantize:
                        q = requant(builder, acc, bias_vec, mult_vec, lo, hi, zp_f, mode)
                        masked_store(builder, builder.trunc(q, VB), at, mask)
                    else:
                        builder.store(acc, builder.bitcast(at, VI.as_pointer()), align=4)

            fast = builder.and_(builder.icmp_signed("==", ngroups_v, ir.Constant(intp, 1)),
                                builder.icmp_signed("==", kw_v, ir.Constant(intp, 3)))
            with_wzp = builder.icmp_signed("!=", has_wzp_v, ir.Constant(intp, 0))
            with builder.if_else(fast) as (is_fast, is_generic):
                for block, fast_flag in ((is_fast, True), (is_generic, False)):
                    with block, builder.if_else(with_wzp) as (yes, no):
                        with yes:
                            emit(fast_flag, True)
                        with no:
                            emit(fast_flag, False)
            return context.get_dummy_value()

        return sig, codegen

    row_kernel.__name__ = "dw_row_requant" if requantize else "dw_row_acc"
    return intrinsic(row_kernel)


dw_row_requant = _make_row_kernel(True)
dw_row_acc = _make_row_kernel(False)


@kernel()
def _padded16(values, c16):
    """``values`` zero-padded to length c16 (plain loop: no parallel region)."""
    res = np.zeros(c16, values.dtype)
    for c in range(min(c16, values.shape[0])):
        res[c] = values[c]
    return res


@njit(inline="always")
def _row_source(k, rows, n, od, oh, geo, x_shape, xzp):
    """Kernel row k (of ``rows`` = KD * KH) for output row (n, od, oh): the flat offset
    of its input row, whether that row is inside the input, and the fill byte (the
    zero point for rows in the padding, 0 for rows past the kernel)."""
    if k >= rows:
        return 0, 0, 0
    d_in, h_in, w_in, chans = x_shape[1], x_shape[2], x_shape[3], x_shape[4]
    iz = od * geo[3] - geo[6] + (k // geo[1]) * geo[9]
    iy = oh * geo[4] - geo[7] + (k % geo[1]) * geo[10]
    if 0 <= iz < d_in and 0 <= iy < h_in:
        return ((n * d_in + iz) * h_in + iy) * w_in * chans, 1, xzp
    return 0, 0, xzp  # row 0 of x: read, then replaced by the fill


@njit(inline="always")
def _worker(bad, x, flip, xzp, wq, wterm, wzp, has_wzp, geo, mode, mult, bias_f, bias_i, zp,
            lo, hi, out, mult16, bias16, biasi16, next_row, grab, batch):
    """One worker of :func:`conv_depthwise_vnni`: its buffers, then runs of ``grab`` output
    rows from the counter ``next_row`` until none are left, ``batch`` rows a call."""
    kh_n, kw_n = geo[1], geo[2]
    od_n, oh_n, ow_n = geo[12], geo[13], geo[14]
    sw, pw, dw = geo[5], geo[8], geo[11]
    rows = geo[0] * kh_n
    ngroups = (rows + 3) // 4
    c16 = wterm.shape[0]
    col = c16 * 4  # bytes per buffer column
    wb = (ow_n - 1) * sw + (kw_n - 1) * dw + 1  # buffer columns
    plane = wb * col
    region = ngroups * plane  # one output row's buffer
    bx_lo, bx_hi = min(pw, wb), max(min(pw, wb), min(wb, pw + x.shape[3]))
    total = x.shape[0] * od_n * oh_n
    qmin, qmax = np.float32(lo - zp), np.float32(hi - zp)
    buf = np.empty(batch * region, np.uint8)
    scratch = np.empty(batch * ow_n * c16 if mode == 2 else 16, np.int32)
    buf32 = buf.view(np.int32)
    for k in range(batch):
        for g in range(ngroups):  # columns outside the input: the zero point
            lanes = 0  # the int32 lane of 4 bytes: xzp in kernel rows, 0 past them
            for r in range(4):
                if 4 * g + r < rows:
                    lanes |= xzp << (8 * r)
            fill = np.int32(np.uint32(lanes))
            for bx in range(wb):
                if bx < bx_lo or bx >= bx_hi:
                    base = (k * region + g * plane + bx * col) // 4
                    for c in range(c16):
                        buf32[base + c] = fill
    xflat = x.reshape(-1)
    oflat = out.reshape(-1)
    while True:
        first = fetch_add(next_row, grab)
        if first >= total:
            break
        for row0 in range(first, min(total, first + grab), batch):
            _depthwise_rows(bad, row0, min(batch, total - row0), xflat, x.shape, flip, xzp, wq,
                            wterm, wzp, has_wzp, geo, buf, region, scratch, mode, mult,
                            bias_f, bias_i, zp, lo, hi, mult16, bias16, biasi16, qmin, qmax,
                            oflat, out)


@njit(inline="always")
def _schedule(x, wterm, geo, mult, bias_f, bias_i, mode, nchunks):
    """Per call: padded constants, the row counter, rows per kernel call (``batch``:
    about 32 pixels, spreading each call's set-up of weights and constants, in at most
    256 KiB of buffer) and rows a worker takes at a time (``grab``, a multiple)."""
    c16 = wterm.shape[0]
    ragged = c16 != x.shape[4]
    mult16 = _padded16(mult, c16) if ragged else mult
    bias16 = _padded16(bias_f, c16) if ragged and mode == 0 else bias_f
    biasi16 = _padded16(bias_i, c16) if ragged and mode == 1 else bias_i
    ow_n = geo[14]
    region = ((geo[0] * geo[1] + 3) // 4) * ((ow_n - 1) * geo[5] + (geo[2] - 1) * geo[11] + 1) \
        * c16 * 4
    total = x.shape[0] * geo[12] * geo[13]
    batch = max(1, min(8, -(-32 // ow_n), (1 << 18) // region))
    grab = batch * max(1, total // (8 * nchunks * batch))
    next_row = np.empty(1, np.int64)
    next_row[0] = 0
    return mult16, bias16, biasi16, next_row, grab, batch


@kernel(parallel=True)
def conv_depthwise_vnni(x, flip, xzp, wq, wterm, wzp, has_wzp, geo, nchunks, mode, mult,
                        bias_f, bias_i, zp, lo, hi, out):
    """Depthwise conv by ``vpdpbusd`` (module doc): ``wq``, ``wterm``, ``wzp`` and
    ``has_wzp`` from :func:`pack_weights`. ``nchunks`` workers (one per thread) take
    output rows in runs from a shared atomic counter, so a worker slowed down by
    another process on its core does not hold the others up."""
    mult16, bias16, biasi16, next_row, grab, batch = _schedule(x, wterm, geo, mult, bias_f,
                                                               bias_i, mode, nchunks)
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    for _worker_id in prange(nchunks):
        _worker(bad, x, flip, xzp, wq, wterm, wzp, has_wzp, geo, mode, mult, bias_f, bias_i,
                zp, lo, hi, out, mult16, bias16, biasi16, next_row, grab, batch)
    if CHECKED and bad[0]:
        fail("int8 VNNI depthwise kernel", DW_BUFFERS, bad)


@kernel()
def conv_depthwise_vnni_serial(x, flip, xzp, wq, wterm, wzp, has_wzp, geo, mode, mult,
                               bias_f, bias_i, zp, lo, hi, out):
    """:func:`conv_depthwise_vnni` on the calling thread, without a parallel region
    (whose start costs more than a second thread saves on small layers)."""
    mult16, bias16, biasi16, next_row, grab, batch = _schedule(x, wterm, geo, mult, bias_f,
                                                               bias_i, mode, 1)
    if CHECKED:
        bad = violations()
    else:
        bad = NO_CHECKS
    _worker(bad, x, flip, xzp, wq, wterm, wzp, has_wzp, geo, mode, mult, bias_f, bias_i, zp,
            lo, hi, out, mult16, bias16, biasi16, next_row, grab, batch)
    if CHECKED and bad[0]:
        fail("int8 VNNI depthwise kernel", DW_BUFFERS, bad)


@njit(inline="always")
def _depthwise_rows(bad, row0, nrows, xflat, x_shape, flip, xzp, wq, wterm, wzp, has_wzp, geo, buf,
                    region, scratch, mode, mult, bias_f, bias_i, zp, lo, hi, mult16, bias16,
                    biasi16, qmin, qmax, oflat, out):
    """Output rows row0 .. row0 + nrows - 1 (each an (n, od, oh)): interleave the input
    rows of each into its ``region`` of ``buf``, then every 16-channel block of all their
    pixels (see :func:`conv_depthwise_vnni`). Checked mode: calls outside their
    buffers are skipped and recorded in ``bad``."""
    chans = x_shape[4]
    kh_n, kw_n = geo[1], geo[2]
    od_n, oh_n, ow_n = geo[12], geo[13], geo[14]
    sw, pw, dw = geo[5], geo[8], geo[11]
    rows = geo[0] * kh_n
    ngroups = (rows + 3) // 4
    c16 = wterm.shape[0]
    col = c16 * 4
    wb = (ow_n - 1) * sw + (kw_n - 1) * dw + 1
    plane = wb * col
    bx_lo, bx_hi = min(pw, wb), max(min(pw, wb), min(wb, pw + x_shape[3]))
    nvec = c16 // 16
    for k in range(nrows):
        row = row0 + k
        n = row // (od_n * oh_n)
        od = (row // oh_n) % od_n
        oh = row % oh_n
        for g in range(ngroups):
            o0, v0, f0 = _row_source(4 * g, rows, n, od, oh, geo, x_shape, xzp)
            o1, v1, f1 = _row_source(4 * g + 1, rows, n, od, oh, geo, x_shape, xzp)
            o2, v2, f2 = _row_source(4 * g + 2, rows, n, od, oh, geo, x_shape, xzp)
            o3, v3, f3 = _row_source(4 * g + 3, rows, n, od, oh, geo, x_shape, xzp)
            xb = (bx_lo - pw) * chans
            # (the fourth row is absent, and not read, when past the kernel: f3 == 0)
            if CHECKED and not _interleave_inside(
                    bad, xflat, (o0 + xb, o1 + xb, o2 + xb, o3 + xb), v3 == 0 and f3 == 0,
                    chans, bx_hi - bx_lo, buf, k * region + g * plane + bx_lo * col):
                continue
            interleave_rows(xflat, (o0 + xb, o1 + xb, o2 + xb, o3 + xb), (v0, v1, v2, v3),
                            (f0, f1, f2, f3), flip, chans, bx_hi - bx_lo, buf,
                            k * region + g * plane + bx_lo * col)
    m0 = row0 * ow_n
    for j in range(nvec):
        # requantized: min(16, chans - 16 j) bytes a pixel (masked) into out (site 8);
        # raw: 16 int32 a pixel into scratch (site 9), bias and mult unread
        if mode == 0:
            if CHECKED and not _row_kernel_inside(
                    bad, buf, 64 * j, dw * col, plane, ngroups, kw_n, sw * col, ow_n, wq,
                    64 * j, col, wterm, wzp, 16 * j, bias16, mult16, True,
                    min(16, chans - 16 * j), oflat, 8, m0 * chans + 16 * j, chans, nrows,
                    region):
                continue
            dw_row_requant(buf, 64 * j, dw * col, plane, ngroups, kw_n, sw * col, ow_n,
                           wq, 64 * j, col, wterm, wzp, has_wzp, 16 * j, bias16, mult16,
                           qmin, qmax, zp, chans - 16 * j, oflat, m0 * chans + 16 * j,
                           chans, xzp, rows, nrows, region)
        elif mode == 1:
            if CHECKED and not _row_kernel_inside(
                    bad, buf, 64 * j, dw * col, plane, ngroups, kw_n, sw * col, ow_n, wq,
                    64 * j, col, wterm, wzp, 16 * j, biasi16, mult16, True,
                    min(16, chans - 16 * j), oflat, 8, m0 * chans + 16 * j, chans, nrows,
                    region):
                continue
            dw_row_requant(buf, 64 * j, dw * col, plane, ngroups, kw_n, sw * col, ow_n,
                           wq, 64 * j, col, wterm, wzp, has_wzp, 16 * j, biasi16, mult16,
                           qmin, qmax, zp, chans - 16 * j, oflat, m0 * chans + 16 * j,
                           chans, xzp, rows, nrows, region)
        else:
            if CHECKED and not _row_kernel_inside(
                    bad, buf, 64 * j, dw * col, plane, ngroups, kw_n, sw * col, ow_n, wq,
                    64 * j, col, wterm, wzp, 16 * j, bias16, mult16, False, 16, scratch, 9,
                    16 * j, c16, nrows, region):
                continue
            dw_row_acc(buf, 64 * j, dw * col, plane, ngroups, kw_n, sw * col, ow_n,
                       wq, 64 * j, col, wterm, wzp, has_wzp, 16 * j, bias16, mult16,
                       qmin, qmax, zp, 16, scratch, 16 * j, c16, xzp, rows, nrows, region)
    if mode == 2:
        for p in range(nrows * ow_n):
            for c in range(chans):
                out[m0 + p, c] = epilogue(scratch[p * c16 + c], c, mode, mult, bias_f,
                                           bias_i, zp, lo, hi)


@kernel(parallel=True, fastmath={"contract"})
def conv_depthwise(x, xzp, wf, geo, mode, mult, bias_f, bias_i, zp, lo, hi, out):
    """Depthwise (groups == C == O) on uint8 x (int8 shifted by the caller):
    wf (taps, C) float32 ``w - wzp``. One output row
    (all OW x C) accumulates in float32 tap by tap; taps that fall in the padding
    add nothing and are skipped. Every partial sum is an integer below 2**24: exact."""
    n_img, d_in, h_in, w_in, chans = x.shape
    od_n, oh_n, ow_n = geo[12], geo[13], geo[14]
    sw, pw, dw = geo[5], geo[8], geo[11]
    xflat = x.reshape(-1)
    wflat = wf.reshape(-1)
    fzp = np.float32(xzp)
    for row in prange(n_img * od_n * oh_n):
        n = row // (od_n * oh_n)
        od = (row // oh_n) % od_n
        oh = row % oh_n
        acc = np.zeros(ow_n * chans, np.float32)
        for kd in range(geo[0]):
            iz = od * geo[3] - geo[6] + kd * geo[9]
            for kh in range(geo[1]):
                iy = oh * geo[4] - geo[7] + kh * geo[10]
                if iz < 0 or iz >= d_in or iy < 0 or iy >= h_in:
                    continue
                base = ((n * d_in + iz) * h_in + iy) * w_in
                for kw in range(geo[2]):
                    wb = ((kd * geo[1] + kh) * geo[2] + kw) * chans
                    shift = kw * dw - pw
                    ow_lo = max(0, (-shift + sw - 1) // sw)
                    ow_hi = min(ow_n, (w_in - 1 - shift) // sw + 1)
                    for ow in range(ow_lo, ow_hi):
                        xb = (base + ow * sw + shift) * chans
                        ab = ow * chans
                        for c in range(chans):  # unsigned indices: no wraparound checks
                            xv = np.float32(xflat[np.uintp(xb + c)]) - fzp
                            acc[np.uintp(ab + c)] += xv * wflat[np.uintp(wb + c)]
        m0 = row * ow_n
        flo, fhi, fz = np.float32(lo), np.float32(hi), np.float32(zp)
        for ow in range(ow_n):
            ab = ow * chans
            m = np.uintp(m0 + ow)
            if mode == 0:
                for c in range(chans):
                    v = np.rint((acc[ab + c] + bias_f[c]) * mult[c]) + fz
                    out[m, c] = np.int32(min(max(v, flo), fhi))
            else:
                for c in range(chans):
                    out[m, c] = epilogue(np.int64(acc[ab + c]), c, mode, mult, bias_f,
                                          bias_i, zp, lo, hi)
