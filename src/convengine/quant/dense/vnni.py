"""The AVX512-VNNI int8 micro-kernel: a 6 x 64 int32 tile by ``vpdpbusd``.

The kernels take their arguments as a few records, numba tuples whose members are
named by the ``NamedTuple`` classes below (:mod:`.records`):

- :class:`AOperand` ``(a, a_off, lda, mr)``: rows ``r < mr`` of the uint8 matrix at
  ``a[a_off + r * lda + 4k + i]``;
- :class:`BOperand` ``(b, b_off, kc4)``: the int8 weights packed as
  ``b[b_off + (k * 64 + col) * 4 + i]`` (layout (Kc/4, 64, 4)), ``k < kc4``;
- :class:`Tile` ``(c, c_off, acc_in)``: the int32 tile at ``c[c_off + r * 64 + col]``
  (rows of 64 whatever the kernel's width), added to if ``acc_in`` is non-zero;
- :class:`Dest`, :class:`RowSums`, :class:`Requant`: the requantized 8-bit store
  (:func:`_make_ukernel_requant`); :class:`Taps`: the implicit GEMM's kernel taps
  (:func:`_make_ukernel_taps`).

``ukernel_6x64(a, b, tile)`` computes

    c[c_off + r * 64 + col] = (c[...] if acc_in else 0)
                              + sum_{k < kc4, i < 4} a[r, 4k + i] * b[k, col, i]   (int32)

Rows ``r >= mr`` repeat row ``mr - 1`` (their results are ignored by the caller).
The 24 accumulators are ``<16 x i32>`` allocas that LLVM keeps in zmm registers.
Narrow variants for narrow column blocks: ``ukernel_8x32`` and ``ukernel_12x16``
(same arguments, 8 rows x 32 columns and 12 rows x 16 columns); short ones for a
panel's last rows: ``ukernel_2x64``, ``ukernel_4x64``. ``ukernel_requant_*(a, b,
tile, dest, sums, requant)`` end in the requantized 8-bit store instead;
``ukernel_taps_*(a, b, taps, dest, sums, requant)`` read A's rows in place, tap by
tap. ``vpdpbusd`` multiplies unsigned by signed bytes and adds without saturation:
the sum is exact modulo 2**32.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...algorithms.fma import splat
from ...epilogue_codes import Epilogue
from .._ir import VB, VF, VI, bounds, lane_mask, masked_store, requant
from .records import ARRAY, record_type, unpack_args

MR = 6
NR = 64
_I32 = ir.IntType(32)
_V16 = ir.VectorType(_I32, 16)


class AOperand(NamedTuple):
    """Rows ``r < mr`` of uint8 at ``a[a_off + r * lda:]`` (rows from ``mr`` on repeat
    row ``mr - 1``)."""

    a: Any
    a_off: Any
    lda: Any
    mr: Any


class BOperand(NamedTuple):
    """int8 weights at ``b[b_off:]``, (kc4, 64, 4) (the taps kernels: kc4 quads a
    tap, the taps one after another)."""

    b: Any
    b_off: Any
    kc4: Any


class Tile(NamedTuple):
    """The int32 tile at ``c[c_off + r * 64 + col]``, the sum's start if ``acc_in`` is
    non-zero."""

    c: Any
    c_off: Any
    acc_in: Any


class Dest(NamedTuple):
    """8-bit rows ``r < mr`` at ``out[out_off + r * ldo:]``, columns ``j < ncol``."""

    out: Any
    out_off: Any
    ldo: Any
    ncol: Any


class RowSums(NamedTuple):
    """Row ``r``'s byte sum at ``rows[r_off + r]`` (int32)."""

    rows: Any
    r_off: Any


class Requant(NamedTuple):
    """Column ``j``'s terms at ``o0 + j`` of ``col_term``, ``wzp`` (int32), ``bias``
    (float32, or int32: ONNX) and ``mult`` (float32); the clamp less the zero point,
    ``qmin``, ``qmax`` (float32), and the zero point ``zp``."""

    col_term: Any
    wzp: Any
    bias: Any
    mult: Any
    o0: Any
    qmin: Any
    qmax: Any
    zp: Any


class Taps(NamedTuple):
    """Tap ``t < taps`` of a row at ``tapoff[t]`` bytes past the row's start (int64)."""

    tapoff: Any
    taps: Any


_i, _f = types.intp, types.float32
_PRODUCT = (AOperand(ARRAY, _i, _i, _i), BOperand(ARRAY, _i, _i), Tile(ARRAY, _i, _i))
_STORE = (Dest(ARRAY, _i, _i, _i), RowSums(ARRAY, _i),
          Requant(ARRAY, ARRAY, ARRAY, ARRAY, _i, _f, _f, _i))
_TAPS = Taps(ARRAY, _i)


def _int32_bias(requant_ty: types.Tuple) -> bool:
    """Whether the :class:`Requant` record typed ``requant_ty`` requantizes as ONNX."""
    return isinstance(Requant(*requant_ty.types).bias.dtype, types.Integer)


def _vpdpbusd(builder: ir.IRBuilder) -> ir.Function:
    fnty = ir.FunctionType(_V16, [_V16, _V16, _V16])
    return cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")


def _vec_ptr(builder: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    return builder.bitcast(ptr, _V16.as_pointer())


def _make_ukernel(mr_rows: int, nvec: int) -> Any:
    """A micro-kernel of ``mr_rows`` rows x ``16 * nvec`` columns (see the module doc;
    ``c`` keeps rows of 64 int32 whatever the width)."""

    def ukernel(typingctx, a, b, tile):
        sig = types.void(*map(record_type, (a, b, tile), _PRODUCT))

        def codegen(context, builder, signature, args):
            a_op, b_op, c = unpack_args(context, builder, signature, args, AOperand, BOperand,
                                        Tile)
            accs = _tile_codegen(builder, a_op, b_op, c, mr_rows, nvec)
            c_ptr = _c_ptrs(builder, c)
            for r in range(mr_rows):
                for j in range(nvec):
                    builder.store(builder.load(accs[r][j]), c_ptr(r, j), align=4)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_{mr_rows}x{16 * nvec}"
    return intrinsic(ukernel)


def _make_ukernel_requant(mr_rows: int, nvec: int) -> Any:
    """The micro-kernel ending in PyTorch's float requantization (``kernels.epilogue``
    mode 0) instead of int32 stores: ``ukernel_requant(a, b, tile, dest, sums,
    requant)`` stores rows ``r < mr``, columns ``j < ncol`` of the tile to
    ``out[out_off + r * ldo + j]`` (8-bit) as

        q = requant(tile[r, j] + col_term[o] - wzp[o] * rows[r_off + r]),  o = o0 + j

    with ``bias``, ``mult`` (float32) and ``col_term``, ``wzp`` (int32) read at ``o0``
    in whole 16-lane vectors (the caller pads them), ``qmin``/``qmax`` the clamp less
    the zero point ``zp`` (:func:`~convengine.quant._ir.requant`, REQUANT_FLOAT). An
    int32 ``bias`` requantizes as ONNX instead (REQUANT_INT32)."""

    def ukernel(typingctx, a, b, tile, dest, sums, rq):
        sig = types.void(*map(record_type, (a, b, tile, dest, sums, rq), _PRODUCT + _STORE))
        onnx = _int32_bias(rq)

        def codegen(context, builder, signature, args):
            a_op, b_op, c, out, rows, params = unpack_args(
                context, builder, signature, args, AOperand, BOperand, Tile, Dest, RowSums,
                Requant)
            accs = _tile_codegen(builder, a_op, b_op, c, mr_rows, nvec)
            _requant_epilogue(builder, accs, a_op.mr, out, rows, params, onnx)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_requant_{mr_rows}x{16 * nvec}"
    return intrinsic(ukernel)


def _make_ukernel_taps(mr_rows: int) -> Any:
    """``mr_rows`` x 64 with the K loop over kernel taps read in place (implicit GEMM):
    ``ukernel_taps(a, b, taps, dest, sums, requant)`` sums, for tap ``t < taps`` and
    ``k < kc4``, the 4 bytes at ``a[a_off + r * lda + tapoff[t] + 4k]`` against
    ``b[b_off + ((t * kc4 + k) * 64 + col) * 4]``, from zero, then stores as
    :func:`_make_ukernel_requant` (the same ``dest``, ``sums``, ``requant``)."""

    def ukernel(typingctx, a, b, taps, dest, sums, rq):
        sig = types.void(*map(record_type, (a, b, taps, dest, sums, rq),
                              (*_PRODUCT[:2], _TAPS, *_STORE)))
        onnx = _int32_bias(rq)

        def codegen(context, builder, signature, args):
            a_op, b_op, tp, out, rows, params = unpack_args(
                context, builder, signature, args, AOperand, BOperand, Taps, Dest, RowSums,
                Requant)
            intp = b_op.kc4.type
            a_rows, b0 = _operands(builder, a_op, b_op, mr_rows)
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_V16, None))
                     for _ in range(4)] for _ in range(mr_rows)]
            with cgutils.for_range(builder, tp.taps) as tl:
                toff = builder.load(builder.gep(tp.tapoff, [tl.index]))
                rows_t = [builder.gep(p, [toff]) for p in a_rows]
                bt = builder.gep(b0, [builder.mul(builder.mul(tl.index, b_op.kc4),
                                                  ir.Constant(intp, NR * 4))])
                _k_loop(builder, rows_t, bt, b_op.kc4, accs, 4)
            _requant_epilogue(builder, accs, a_op.mr, out, rows, params, onnx)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_taps_{mr_rows}x64"
    return intrinsic(ukernel)


def _requant_epilogue(builder: ir.IRBuilder, accs: list[list[ir.Value]], mr: ir.Value,
                      dest: Dest, sums: RowSums, rq: Requant, onnx: bool) -> None:
    """The requantized store of :func:`_make_ukernel_requant` for the accumulators
    ``accs`` of rows ``r < mr`` (``onnx``: ``rq.bias`` is int32)."""
    mr_rows, nvec = len(accs), len(accs[0])
    intp = dest.out_off.type
    out0 = builder.gep(dest.out, [dest.out_off])

    def column(data: ir.Value, j: int, vty: ir.VectorType) -> ir.Value:
        at = builder.add(rq.o0, ir.Constant(intp, 16 * j))
        return builder.load(builder.bitcast(builder.gep(data, [at]), vty.as_pointer()),
                            align=4)

    mode = Epilogue.REQUANT_INT32 if onnx else Epilogue.REQUANT_FLOAT
    lo, hi, zp_f = bounds(builder, rq.qmin, rq.qmax, rq.zp)
    cols = [(column(rq.col_term, j, VI), column(rq.wzp, j, VI),
             column(rq.bias, j, VI if onnx else VF), column(rq.mult, j, VF))
            for j in range(nvec)]
    lanes = [builder.sub(dest.ncol, ir.Constant(intp, 16 * j)) for j in range(nvec)]
    for r in range(mr_rows):
        inside = builder.icmp_signed("<", ir.Constant(intp, r), mr)
        with builder.if_then(inside):
            rsum = builder.load(builder.gep(sums.rows,
                                            [builder.add(sums.r_off, ir.Constant(intp, r))]))
            # the column terms, less wzp * row sum where the row sum is not 0
            # (always 0 with symmetric weights: no multiplies then)
            terms = [cgutils.alloca_once_value(builder, cols[j][0]) for j in range(nvec)]
            with builder.if_then(builder.icmp_signed("!=", rsum, rsum.type(0))):
                rvec = splat(builder, rsum, VI)
                for j in range(nvec):
                    builder.store(builder.sub(cols[j][0], builder.mul(cols[j][1], rvec)),
                                  terms[j])
            row = builder.gep(out0, [builder.mul(dest.ldo, ir.Constant(intp, r))])
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


def _c_ptrs(builder: ir.IRBuilder, c: Tile) -> Any:
    """``c_ptr(r, j)``: the <16 x i32> slot of tile row r, column vector j in ``c``."""
    intp = c.c_off.type
    c0 = builder.gep(c.c, [c.c_off])
    return lambda r, j: _vec_ptr(builder, builder.gep(c0, [ir.Constant(intp, r * NR + 16 * j)]))


def _tile_codegen(builder: ir.IRBuilder, a: AOperand, b: BOperand, c: Tile, mr_rows: int,
                  nvec: int) -> list[list[ir.Value]]:
    """The tile's K loop; returns its accumulators (allocas of <16 x i32>, [row][vector]),
    started from ``c`` when ``acc_in`` is non-zero, else from zero."""
    intp = b.kc4.type
    rows, b0 = _operands(builder, a, b, mr_rows)
    zero = ir.Constant(_V16, None)
    keep = builder.icmp_signed("!=", c.acc_in, ir.Constant(intp, 0))
    c_ptr = _c_ptrs(builder, c)
    accs = [
        [cgutils.alloca_once_value(
            builder, builder.select(keep, builder.load(c_ptr(r, j), align=4), zero))
         for j in range(nvec)]
        for r in range(mr_rows)
    ]
    _k_loop(builder, rows, b0, b.kc4, accs, nvec)
    return accs


def _operands(builder: ir.IRBuilder, a: AOperand, b: BOperand, mr_rows: int
              ) -> tuple[list[ir.Value], ir.Value]:
    """A's row pointers (:func:`_row_ptrs`) and B's start."""
    rows = _row_ptrs(builder, builder.gep(a.a, [a.a_off]), a.lda, a.mr, mr_rows)
    return rows, builder.gep(b.b, [b.b_off])


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
