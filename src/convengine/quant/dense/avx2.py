"""The AVX2 int8 micro-kernels (CPUs without VNNI): 6 x 16 int32 tiles by ``vpmaddwd``.

The kernels take their arguments as a few records, numba tuples whose members are
named by the ``NamedTuple`` classes below (:mod:`.records`): :class:`AOperand` ``(a,
a_off, lda, mr)``, :class:`BOperand` ``(b, b_off, k_steps)``, :class:`Tile` ``(c,
c_off, ldc)``, :class:`Dest` ``(out, out_off, ldo)`` and :class:`Requant` ``(bias,
mult, o0, lo, hi, zp)``.

``ukernel_6x16(a, b, tile)`` computes, for rows ``r < mr`` of the int16 matrix at
``a[a_off + r * lda + 2k + i]`` (the activations' differences ``x - x_zero_point``)
and the int16 weights packed as ``b[b_off + (k * 16 + col) * 2 + i]`` (layout
(Kc/2, 16, 2): ``w - w_zero_point``, ``k < k_steps``):

    c[c_off + r * ldc + col] = sum_{k < k_steps, i < 2} a[r, 2k + i] * b[k, col, i]   (int32)

Rows ``r >= mr`` repeat row ``mr - 1`` and are not stored. ``ukernel_requant_6x16(a,
b, dest, requant)`` stores the tile requantized to 8 bits instead
(:func:`_make_ukernel_requant`). ``vpmaddwd`` multiplies
int16 pairs and adds each pair into an int32 lane: exact here (a pair is at most
2 * 255 * 255), unlike the ``vpmaddubsw`` of fbgemm and ONNX Runtime on these CPUs,
which saturates each pair's sum to int16. The 12 accumulators are ``<8 x i32>``
allocas that LLVM keeps in ymm registers.

``ukernel_requant_u8s8_6x16(a, b, dest, requant, start)`` takes the raw uint8
activations and int8 weights packed (Kc/4, 16, 4) instead (``k_steps`` quads), and
starts from the int32 tile ``start``: ``vpmaddubsw`` multiplies byte pairs and adds
each pair into an int16 lane, saturating it (as fbgemm and ONNX Runtime do); ``vpmaddwd`` with
ones adds the pairs into int32. Per 32 products it issues two multiplies and one add
where the int16 form issues two of each, and it loads half the bytes of A and B
(measured alone on a Zen 3: 95 against 62 GMAC/s a core). A pair saturates only if
its bytes add up to 257 or more (else it is at most 256 * 128) and its weights are
large (:func:`convengine.quant.prepack.pair_fixes`): ``kernels.conv_avx2_u8s8``
finds those pairs and starts the tile from their exact remainders.
``any_heavy_pair``, ``heavy_pair_mask`` and ``trailing_zeros`` serve that search:
whether a row has pairs adding up to 257 or more, which pairs of 32 bytes do (as the
bits of an int), and the lowest set bit's index.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...algorithms.fma import row_pointers, splat
from ...epilogue_codes import Epilogue
from .._ir import requant
from .records import ARRAY, record_type, unpack_args

MR = 6  # rows (output pixels) per tile
NR = 16  # columns (output channels) per tile: two ymm of int32
_I32 = ir.IntType(32)
_V8 = ir.VectorType(_I32, 8)
_W16 = ir.VectorType(ir.IntType(16), 16)
_B32 = ir.VectorType(ir.IntType(8), 32)


class AOperand(NamedTuple):
    """Rows ``r < mr`` at ``a[a_off + r * lda:]``: int16 pairs (uint8 quads for
    u8s8); rows from ``mr`` on repeat row ``mr - 1``."""

    a: Any
    a_off: Any
    lda: Any
    mr: Any


class BOperand(NamedTuple):
    """Weights at ``b[b_off:]``: int16 (k_steps, 16, 2) (int8 (k_steps, 16, 4) for
    u8s8)."""

    b: Any
    b_off: Any
    k_steps: Any


class Tile(NamedTuple):
    """The int32 tile at ``c[c_off + r * ldc + col]`` (``ldc`` 0: one row for all)."""

    c: Any
    c_off: Any
    ldc: Any


class Dest(NamedTuple):
    """8-bit rows ``r < mr`` at ``out[out_off + r * ldo:]``, 16 columns."""

    out: Any
    out_off: Any
    ldo: Any


class Requant(NamedTuple):
    """Column ``j``'s ``bias`` (float32: PyTorch's requantization; int32: ONNX's) and
    ``mult`` (float32) at ``o0 + j``; the clamp ``lo``, ``hi`` and the zero point
    ``zp`` (float64)."""

    bias: Any
    mult: Any
    o0: Any
    lo: Any
    hi: Any
    zp: Any


_i, _f = types.intp, types.float64
_A, _B, _TILE = AOperand(ARRAY, _i, _i, _i), BOperand(ARRAY, _i, _i), Tile(ARRAY, _i, _i)
_DEST, _REQUANT = Dest(ARRAY, _i, _i), Requant(ARRAY, ARRAY, _i, _f, _f, _f)


def _tile(builder, a: AOperand, b: BOperand, start: Tile | None = None,
          u8s8: bool = False) -> list[list[ir.Value]]:
    """The 6 x 2 accumulator allocas of the tile of ``a`` and ``b`` (see the module
    doc), started from the int32 tile ``start`` if given, else from zero.

    ``u8s8``: A holds uint8 bytes and B int8 weights packed (Kc/4, 16, 4); each step
    multiplies a quad of bytes by ``vpmaddubsw`` (pairs of products, each pair
    saturated to int16) and adds the pairs by ``vpmaddwd`` with ones. Else A holds
    int16 pairs and B (Kc/2, 16, 2) int16, one ``vpmaddwd``."""
    intp = a.a_off.type
    pmadd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V8, [_W16, _W16]), "llvm.x86.avx2.pmadd.wd")
    operand = _B32 if u8s8 else _W16  # one register of B: 16 columns x 2 (or 4) values
    rows = row_pointers(builder, builder.gep(a.a, [a.a_off]), MR, a.mr, a.lda)
    rows = [builder.bitcast(p, _I32.as_pointer()) for p in rows]  # int16 pairs, byte quads
    b0 = builder.bitcast(builder.gep(b.b, [b.b_off]), operand.as_pointer())
    if start is None:
        first = [[ir.Constant(_V8, None)] * 2 for _ in range(MR)]
    else:
        c0 = builder.gep(start.c, [start.c_off])
        first = [[builder.load(builder.bitcast(builder.gep(c0, [builder.add(
            builder.mul(ir.Constant(intp, r), start.ldc), ir.Constant(intp, 8 * j))]),
            _V8.as_pointer()), align=4) for j in range(2)] for r in range(MR)]
    accs = [[cgutils.alloca_once_value(builder, first[r][j]) for j in range(2)]
            for r in range(MR)]
    if u8s8:
        maddubs = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_W16, [_B32, _B32]), "llvm.x86.avx2.pmadd.ub.sw")
        ones = ir.Constant(_W16, [1] * 16)

        def product(av: ir.Value, wv: ir.Value) -> ir.Value:
            return builder.call(pmadd, [builder.call(maddubs, [av, wv]), ones])
    else:
        def product(av: ir.Value, wv: ir.Value) -> ir.Value:
            return builder.call(pmadd, [av, wv])
    with cgutils.for_range(builder, b.k_steps) as loop:
        k = loop.index
        wv = [builder.load(builder.gep(b0, [builder.add(builder.mul(k, ir.Constant(intp, 2)),
                                                        ir.Constant(intp, j))]), align=2)
              for j in range(2)]
        for r in range(MR):
            group = builder.load(builder.gep(rows[r], [k]), align=2)
            av = builder.bitcast(splat(builder, group, _V8), operand)
            for j in range(2):
                acc = accs[r][j]
                builder.store(builder.add(builder.load(acc), product(av, wv[j])), acc)
    return accs


def _for_rows(builder, mr_v, base, ld_v, body) -> None:
    """``body(r, row_ptr)`` for each tile row ``r < mr``, ``row_ptr = base + r * ld``."""
    intp = mr_v.type
    for r in range(MR):
        with builder.if_then(builder.icmp_signed("<", ir.Constant(intp, r), mr_v), likely=True):
            body(r, builder.gep(base, [builder.mul(ir.Constant(intp, r), ld_v)]))


def _make_ukernel() -> Any:
    def ukernel(typingctx, a, b, tile):
        sig = types.void(*map(record_type, (a, b, tile), (_A, _B, _TILE)))

        def codegen(context, builder, signature, args):
            a_op, b_op, c = unpack_args(context, builder, signature, args, AOperand, BOperand,
                                        Tile)
            accs = _tile(builder, a_op, b_op)
            intp = c.c_off.type

            def store(r, at):
                for j in range(2):
                    ptr = builder.bitcast(builder.gep(at, [ir.Constant(intp, 8 * j)]),
                                          _V8.as_pointer())
                    builder.store(builder.load(accs[r][j]), ptr, align=4)

            _for_rows(builder, a_op.mr, builder.gep(c.c, [c.c_off]), c.ldc, store)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_avx2_{MR}x{NR}"
    return intrinsic(ukernel)


def store_bytes(builder, qs: list[ir.Value], ptr: ir.Value, signed: bool) -> None:
    """Store one or two <8 x i32> vectors ``qs`` whose values already lie in the 8-bit
    range (int8 if ``signed``, else uint8) as 8 or 16 consecutive bytes at ``ptr`` (an
    i8 pointer): ``vpackssdw``, then ``vpacksswb`` or ``vpackuswb`` (saturating, so
    exact here) and one dword shuffle; a truncation took two byte shuffles, an extract
    and an unpack per vector (the same speed within noise on ResNet-50's 1x1 and 3x3
    layers, Zen 3: 0.94-1.03x)."""
    i16x8, i32x4 = ir.VectorType(ir.IntType(16), 8), ir.VectorType(_I32, 4)
    i8x16 = ir.VectorType(ir.IntType(8), 16)
    packssdw = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_W16, [_V8, _V8]), "llvm.x86.avx2.packssdw")
    packwb = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(i8x16, [i16x8, i16x8]),
        f"llvm.x86.sse2.pack{'ss' if signed else 'us'}wb.128")
    words = builder.call(packssdw, [qs[0], qs[-1]])  # per 128-bit lane: 4 of q0, 4 of q1
    halves = [builder.shuffle_vector(words, words, ir.Constant(ir.VectorType(_I32, 8),
                                                               list(range(h, h + 8))))
              for h in (0, 8)]
    dwords = builder.bitcast(builder.call(packwb, halves), i32x4)  # q0 0-3, q1 0-3, q0 4-7..
    order = [0, 2, 1, 3] if len(qs) == 2 else [0, 2]
    ordered = builder.shuffle_vector(dwords, dwords, ir.Constant(
        ir.VectorType(_I32, len(order)), order))
    builder.store(ordered, builder.bitcast(ptr, ordered.type.as_pointer()), align=1)


def _make_ukernel_requant(u8s8: bool = False) -> Any:
    """The tile of 16 whole columns requantized into 8-bit ``out``: ``ukernel(a, b,
    dest, requant)`` stores rows ``r < mr`` to ``out[out_off + r * ldo + j]`` as
    :func:`~convengine.quant._ir.requant` of the accumulator, ``bias`` and ``mult``
    read at ``o0`` (float32 ``bias``: PyTorch's requantization; int32: ONNX's).
    ``u8s8``: the :func:`_tile` of raw bytes (K in quads), started from the int32 tile
    ``start`` (a fifth argument, a :class:`Tile`)."""
    layouts = (_A, _B, _DEST, _REQUANT, *((_TILE,) if u8s8 else ()))

    def typed(a, b, dest, rq, *start):
        sig = types.void(*map(record_type, (a, b, dest, rq, *start), layouts))
        onnx = isinstance(Requant(*rq.types).bias.dtype, types.Integer)
        return sig, _requant_codegen(onnx, Dest(*dest.types).out.dtype.signed, u8s8)

    def ukernel(typingctx, a, b, dest, rq):
        return typed(a, b, dest, rq)

    def ukernel_u8s8(typingctx, a, b, dest, rq, start):
        return typed(a, b, dest, rq, start)

    chosen = ukernel_u8s8 if u8s8 else ukernel
    chosen.__name__ = f"ukernel_avx2_requant{'_u8s8' if u8s8 else ''}_{MR}x{NR}"
    return intrinsic(chosen)


def _requant_codegen(onnx: bool, signed: bool, u8s8: bool) -> Any:
    """The code of :func:`_make_ukernel_requant`'s kernels (``signed``: int8 ``out``)."""

    def codegen(context, builder, signature, args):
        a, b, dest, rq, *start = unpack_args(context, builder, signature, args, AOperand,
                                             BOperand, Dest, Requant,
                                             *((Tile,) if u8s8 else ()))
        accs = _tile(builder, a, b, start[0] if u8s8 else None, u8s8)
        intp = rq.o0.type
        lo_v, hi_v, zp_v = (builder.fptrunc(v, ir.FloatType()) for v in (rq.lo, rq.hi, rq.zp))
        mode = Epilogue.REQUANT_INT32 if onnx else Epilogue.REQUANT_FLOAT
        consts = []
        for j in range(2):
            at = builder.add(rq.o0, ir.Constant(intp, 8 * j))
            bias_t = _V8 if onnx else ir.VectorType(ir.FloatType(), 8)
            consts.append([builder.load(builder.bitcast(builder.gep(data, [at]),
                                                        t.as_pointer()), align=4)
                           for data, t in ((rq.bias, bias_t),
                                           (rq.mult, ir.VectorType(ir.FloatType(), 8)))])

        def store(r, at):
            qs = [requant(builder, builder.load(accs[r][j]), *consts[j], lo_v, hi_v, zp_v,
                          mode) for j in range(2)]
            store_bytes(builder, qs, builder.bitcast(at, ir.IntType(8).as_pointer()),
                        signed)

        _for_rows(builder, a.mr, builder.gep(dest.out, [dest.out_off]), dest.ldo, store)
        return context.get_dummy_value()

    return codegen


ukernel_6x16 = _make_ukernel()
ukernel_requant_6x16 = _make_ukernel_requant()
ukernel_requant_u8s8_6x16 = _make_ukernel_requant(u8s8=True)


def _pair_sums(builder, ptr) -> ir.Value:
    """The 16 sums ``low byte + high byte`` of the 16-bit words at ``ptr`` (32 bytes)."""
    v = builder.load(builder.bitcast(ptr, _W16.as_pointer()), align=1)
    low = builder.and_(v, ir.Constant(_W16, [0xFF] * 16))
    return builder.add(low, builder.lshr(v, ir.Constant(_W16, [8] * 16)))


@intrinsic
def heavy_pair_mask(typingctx: Any, a: Any, at: Any) -> Any:
    """Bit i of the result: whether the pair of bytes ``a[at + 2i]``, ``a[at + 2i + 1]``
    (a uint8 array) adds up to 257 or more, for i < 16 (32 bytes read, no bounds
    check). Only such a pair can saturate ``vpmaddubsw`` against int8 weights: its
    products then add up to at most ``128 * 256``."""
    sig = types.uint32(a, types.intp)

    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        total = _pair_sums(builder, builder.gep(arr.data, [args[1]]))
        heavy = builder.icmp_unsigned(">", total, ir.Constant(_W16, [256] * 16))
        return builder.zext(builder.bitcast(heavy, ir.IntType(16)), _I32)

    return sig, codegen


@intrinsic
def any_heavy_pair(typingctx: Any, a: Any, at: Any, chunks: Any) -> Any:
    """Whether any pair of bytes in ``a[at:at + 32 * chunks]`` adds up to 257 or more
    (:func:`heavy_pair_mask` of each 32, as a running maximum: no branch a chunk)."""
    sig = types.boolean(a, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        base = builder.gep(arr.data, [args[1]])
        peak = cgutils.alloca_once_value(builder, ir.Constant(_W16, [0] * 16))
        umax = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_W16, [_W16, _W16]), "llvm.umax.v16i16")
        with cgutils.for_range(builder, args[2]) as loop:
            at = builder.mul(loop.index, ir.Constant(loop.index.type, 32))
            builder.store(builder.call(umax, [builder.load(peak),
                                              _pair_sums(builder, builder.gep(base, [at]))]),
                          peak)
        heavy = builder.icmp_unsigned(">", builder.load(peak), ir.Constant(_W16, [256] * 16))
        return builder.icmp_unsigned("!=", builder.bitcast(heavy, ir.IntType(16)),
                                     ir.Constant(ir.IntType(16), 0))

    return sig, codegen


@intrinsic
def trailing_zeros(typingctx: Any, bits: Any) -> Any:
    """The index of the lowest set bit of the nonzero uint32 ``bits`` (``tzcnt``)."""
    sig = types.uint32(types.uint32)

    def codegen(context, builder, signature, args):
        cttz = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [_I32, ir.IntType(1)]), "llvm.cttz.i32")
        return builder.call(cttz, [args[0], ir.Constant(ir.IntType(1), 1)])

    return sig, codegen
