"""The AVX512-VNNI int8 micro-kernel: a 6 x 64 int32 tile by ``vpdpbusd``.

``ukernel_6x64(a, a_off, lda, b, b_off, kc4, mr, c, c_off, acc_in)`` computes, for
rows ``r < mr`` of the uint8 matrix at ``a[a_off + r * lda + 4k + i]`` and the int8
weights packed as ``b[b_off + (k * 64 + col) * 4 + i]`` (layout (Kc/4, 64, 4)):

    c[c_off + r * 64 + col] = (c[...] if acc_in else 0)
                              + sum_{k < kc4, i < 4} a[r, 4k + i] * b[k, col, i]   (int32)

Rows ``r >= mr`` repeat row ``mr - 1`` (their results are ignored by the caller).
The 24 accumulators are ``<16 x i32>`` allocas that LLVM keeps in zmm registers.
Narrow variants for narrow column blocks: ``ukernel_8x32`` and ``ukernel_12x16``
(same arguments, 8 rows x 32 columns and 12 rows x 16 columns); short ones for a
panel's last rows: ``ukernel_2x64``, ``ukernel_4x64``. ``ukernel_requant_*``
end in the requantized 8-bit store instead (:func:`_make_ukernel_requant`).
``vpdpbusd`` multiplies unsigned by signed bytes and adds without saturation:
the sum is exact modulo 2**32.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...algorithms.fma import splat
from ...epilogue_codes import Epilogue
from .._ir import VB, VF, VI, bounds, lane_mask, masked_store, requant

MR = 6
NR = 64
_I8, _I32 = ir.IntType(8), ir.IntType(32)
_V16 = ir.VectorType(_I32, 16)


def _vpdpbusd(builder: ir.IRBuilder) -> ir.Function:
    fnty = ir.FunctionType(_V16, [_V16, _V16, _V16])
    return cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")


def _vec_ptr(builder: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    return builder.bitcast(ptr, _V16.as_pointer())


def _make_ukernel(mr_rows: int, nvec: int) -> Any:
    """A micro-kernel of ``mr_rows`` rows x ``16 * nvec`` columns (see the module doc;
    ``c`` keeps rows of 64 int32 whatever the width)."""

    def ukernel(typingctx, a, a_off, lda, b, b_off, kc4, mr, c, c_off, acc_in):
        intp_t = types.intp
        sig = types.void(a, intp_t, intp_t, b, intp_t, intp_t, intp_t, c, intp_t, intp_t)

        def codegen(context, builder, signature, args):
            accs = _tile_codegen(context, builder, signature, args, mr_rows, nvec)
            c_ptr = _c_ptrs(context, builder, signature, args)
            for r in range(mr_rows):
                for j in range(nvec):
                    builder.store(builder.load(accs[r][j]), c_ptr(r, j), align=4)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_{mr_rows}x{16 * nvec}"
    return intrinsic(ukernel)


def _make_ukernel_requant(mr_rows: int, nvec: int) -> Any:
    """The micro-kernel ending in PyTorch's float requantization (``kernels.epilogue``
    mode 0) instead of int32 stores: rows ``r < mr``, columns ``j < ncol`` of the tile
    go to ``out[out_off + r * ldo + j]`` (8-bit) as

        q = requant(tile[r, j] + col_term[o] - wzp[o] * rows[r_off + r]),  o = o0 + j

    with ``bias``, ``mult`` (float32) and ``col_term``, ``wzp`` (int32) read at ``o0``
    in whole 16-lane vectors (the caller pads them), ``qmin``/``qmax`` the clamp less
    the zero point ``zp`` (:func:`~convengine.quant._ir.requant`, REQUANT_FLOAT). An
    int32 ``bias`` requantizes as ONNX instead (REQUANT_INT32)."""

    def ukernel(typingctx, a, a_off, lda, b, b_off, kc4, mr, c, c_off, acc_in, out, out_off,
                ldo, ncol, rows, r_off, col_term, wzp, bias, mult, o0, qmin, qmax, zp):
        i = types.intp
        sig = types.void(a, i, i, b, i, i, i, c, i, i, out, i, i, i, rows, i, col_term, wzp,
                         bias, mult, i, types.float32, types.float32, i)

        def codegen(context, builder, signature, args):
            accs = _tile_codegen(context, builder, signature, args, mr_rows, nvec)
            _requant_epilogue(context, builder, signature, args, accs, 6, 10)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_requant_{mr_rows}x{16 * nvec}"
    return intrinsic(ukernel)


def _make_ukernel_taps(mr_rows: int) -> Any:
    """``mr_rows`` x 64 with the K loop over kernel taps read in place (implicit GEMM):
    ``ukernel_taps(a, a_off, lda, b, b_off, c4n, taps, tapoff, mr, out, ...)`` sums, for
    tap ``t < taps`` and ``k < c4n``, the 4 bytes at ``a[a_off + r * lda + tapoff[t] +
    4k]`` against ``b[b_off + ((t * c4n + k) * 64 + col) * 4]``, from zero, then stores
    as :func:`_make_ukernel_requant` (the arguments after ``mr`` are the same)."""

    def ukernel(typingctx, a, a_off, lda, b, b_off, c4n, taps, tapoff, mr, out, out_off, ldo,
                ncol, rows, r_off, col_term, wzp, bias, mult, o0, qmin, qmax, zp):
        i = types.intp
        sig = types.void(a, i, i, b, i, i, i, tapoff, i, out, i, i, i, rows, i, col_term, wzp,
                         bias, mult, i, types.float32, types.float32, i)

        def codegen(context, builder, signature, args):
            t_arr = context.make_array(signature.args[7])(context, builder, args[7])
            c4n_v, taps_v = args[5], args[6]
            intp = c4n_v.type
            a_rows, b0 = _operands(context, builder, signature, args, 8, mr_rows)
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_V16, None))
                     for _ in range(4)] for _ in range(mr_rows)]
            with cgutils.for_range(builder, taps_v) as tl:
                toff = builder.load(builder.gep(t_arr.data, [tl.index]))
                rows_t = [builder.gep(p, [toff]) for p in a_rows]
                bt = builder.gep(b0, [builder.mul(builder.mul(tl.index, c4n_v),
                                                  ir.Constant(intp, NR * 4))])
                _k_loop(builder, rows_t, bt, c4n_v, accs, 4)
            _requant_epilogue(context, builder, signature, args, accs, 8, 9)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_taps_{mr_rows}x64"
    return intrinsic(ukernel)


def _requant_epilogue(context: Any, builder: ir.IRBuilder, signature: Any, args: Any,
                      accs: list[list[ir.Value]], mr_at: int, out_at: int) -> None:
    """The requantized store of :func:`_make_ukernel_requant` for the accumulators
    ``accs``; ``mr`` is argument ``mr_at``, ``out`` and the 13 after it start at
    ``out_at`` (out, out_off, ldo, ncol, rows, r_off, col_term, wzp, bias, mult, o0,
    qmin, qmax, zp)."""
    mr_rows, nvec = len(accs), len(accs[0])
    k = out_at
    arr = {j: context.make_array(signature.args[k + j])(context, builder, args[k + j])
           for j in (0, 4, 6, 7, 8, 9)}
    out_off, ldo, ncol, r_off, o0, qmin, qmax, zp = (args[k + j] for j in (
        1, 2, 3, 5, 10, 11, 12, 13))
    intp = out_off.type
    out0 = builder.gep(arr[0].data, [out_off])

    def column(a: int, j: int, vty: ir.VectorType) -> ir.Value:
        at = builder.add(o0, ir.Constant(intp, 16 * j))
        return builder.load(builder.bitcast(builder.gep(arr[a].data, [at]), vty.as_pointer()),
                            align=4)

    onnx = isinstance(signature.args[k + 8].dtype, types.Integer)  # int32 bias: ONNX's
    mode = Epilogue.REQUANT_INT32 if onnx else Epilogue.REQUANT_FLOAT
    lo, hi, zp_f = bounds(builder, qmin, qmax, zp)
    cols = [(column(6, j, VI), column(7, j, VI), column(8, j, VI if onnx else VF),
             column(9, j, VF)) for j in range(nvec)]
    lanes = [builder.sub(ncol, ir.Constant(intp, 16 * j)) for j in range(nvec)]
    for r in range(mr_rows):
        inside = builder.icmp_signed("<", ir.Constant(intp, r), args[mr_at])
        with builder.if_then(inside):
            rsum = builder.load(builder.gep(arr[4].data, [builder.add(r_off, ir.Constant(intp, r))]))
            # the column terms, less wzp * row sum where the row sum is not 0
            # (always 0 with symmetric weights: no multiplies then)
            terms = [cgutils.alloca_once_value(builder, cols[j][0]) for j in range(nvec)]
            with builder.if_then(builder.icmp_signed("!=", rsum, rsum.type(0))):
                rvec = splat(builder, rsum, VI)
                for j in range(nvec):
                    builder.store(builder.sub(cols[j][0], builder.mul(cols[j][1], rvec)),
                                  terms[j])
            row = builder.gep(out0, [builder.mul(ldo, ir.Constant(intp, r))])
            for j in range(nvec):
                _, _, bias, mult = cols[j]
                acc = builder.add(builder.load(accs[r][j]), builder.load(terms[j]))
                q = builder.trunc(requant(builder, acc, bias, mult, lo, hi, zp_f, mode), VB)
                ptr = builder.bitcast(builder.gep(row, [ir.Constant(intp, 16 * j)]),
                                      VB.as_pointer())
                full = builder.icmp_signed(">=", lanes[j], ir.Constant(intp, 16))
                with builder.if_else(full) as (whole, part):
                    with whole:
                        builder.store(q, ptr, align=1)
                    with part, builder.if_then(builder.icmp_signed(
                            ">", lanes[j], ir.Constant(intp, 0))):
                        masked_store(builder, q, ptr, lane_mask(builder, lanes[j]))


def _c_ptrs(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
    """``c_ptr(r, j)``: the <16 x i32> slot of tile row r, column vector j in ``c``."""
    c_arr = context.make_array(signature.args[7])(context, builder, args[7])
    intp = args[8].type
    c0 = builder.gep(c_arr.data, [args[8]])
    return lambda r, j: _vec_ptr(builder, builder.gep(c0, [ir.Constant(intp, r * NR + 16 * j)]))


def _tile_codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any,
                  mr_rows: int, nvec: int) -> list[list[ir.Value]]:
    """The tile's K loop; returns its accumulators (allocas of <16 x i32>, [row][vector]),
    started from ``c`` when ``acc_in`` is non-zero, else from zero."""
    kc4_v, acc_in_v = args[5], args[9]
    intp = kc4_v.type
    rows, b0 = _operands(context, builder, signature, args, 6, mr_rows)
    zero = ir.Constant(_V16, None)
    keep = builder.icmp_signed("!=", acc_in_v, ir.Constant(intp, 0))
    c_ptr = _c_ptrs(context, builder, signature, args)
    accs = [
        [cgutils.alloca_once_value(
            builder, builder.select(keep, builder.load(c_ptr(r, j), align=4), zero))
         for j in range(nvec)]
        for r in range(mr_rows)
    ]
    _k_loop(builder, rows, b0, kc4_v, accs, nvec)
    return accs


def _operands(context: Any, builder: ir.IRBuilder, signature: Any, args: Any, mr_at: int,
              mr_rows: int) -> tuple[list[ir.Value], ir.Value]:
    """The micro-kernels' operands from their first five arguments (a, a_off, lda, b,
    b_off) and ``mr`` (argument ``mr_at``): A's row pointers (:func:`_row_ptrs`) and B's
    start."""
    a_arr = context.make_array(signature.args[0])(context, builder, args[0])
    b_arr = context.make_array(signature.args[3])(context, builder, args[3])
    rows = _row_ptrs(builder, builder.gep(a_arr.data, [args[1]]), args[2], args[mr_at],
                     mr_rows)
    return rows, builder.gep(b_arr.data, [args[4]])


def _row_ptrs(builder: ir.IRBuilder, a0: ir.Value, lda: ir.Value, mr: ir.Value,
              mr_rows: int) -> list[ir.Value]:
    """Pointers to rows ``r`` of A at ``a0 + r * lda`` (rows from ``mr`` on repeat the
    last one)."""
    intp = lda.type
    last = builder.sub(mr, ir.Constant(intp, 1))
    ptrs = []
    for r in range(mr_rows):
        rr = ir.Constant(intp, r)
        use = builder.select(builder.icmp_signed("<", rr, mr), rr, last)
        ptrs.append(builder.gep(a0, [builder.mul(use, lda)]))
    return ptrs


def _k_loop(builder: ir.IRBuilder, rows: list[ir.Value], b0: ir.Value, kc4: ir.Value,
            accs: list[list[ir.Value]], nvec: int) -> None:
    """``accs[r][j] += dot4(rows[r][4k:], b0[(k * 64 + 16 j) * 4:])`` for ``k < kc4``."""
    intp = kc4.type
    dot = _vpdpbusd(builder)
    with cgutils.for_range(builder, kc4) as loop:
        k = loop.index
        bk = builder.gep(b0, [builder.mul(k, ir.Constant(intp, NR * 4))])
        bvecs = [
            builder.load(_vec_ptr(builder, builder.gep(bk, [ir.Constant(intp, 64 * j)])),
                         align=1)
            for j in range(nvec)
        ]
        k4 = builder.mul(k, ir.Constant(intp, 4))
        for r, row in enumerate(rows):
            aptr = builder.bitcast(builder.gep(row, [k4]), _I32.as_pointer())
            splat_a = splat(builder, builder.load(aptr, align=1), _V16)
            for j in range(nvec):
                cur = builder.load(accs[r][j])
                builder.store(builder.call(dot, [cur, splat_a, bvecs[j]]), accs[r][j])


ukernel_2x64 = _make_ukernel(2, 4)
ukernel_4x64 = _make_ukernel(4, 4)
ukernel_6x64 = _make_ukernel(MR, 4)
ukernel_8x32 = _make_ukernel(8, 2)
ukernel_12x16 = _make_ukernel(12, 1)
ukernel_requant_2x64 = _make_ukernel_requant(2, 4)
ukernel_requant_4x64 = _make_ukernel_requant(4, 4)
ukernel_requant_6x64 = _make_ukernel_requant(MR, 4)
ukernel_requant_8x32 = _make_ukernel_requant(8, 2)
ukernel_requant_12x16 = _make_ukernel_requant(12, 1)
ukernel_taps_2x64 = _make_ukernel_taps(2)
ukernel_taps_4x64 = _make_ukernel_taps(4)
ukernel_taps_6x64 = _make_ukernel_taps(MR)
