"""LLVM IR helpers shared by the int8 kernels' intrinsics: lane masks, masked
loads and stores of 16-lane vectors, and :func:`requant`, the one requantization of
int32 lanes (16 on AVX-512, 8 on AVX2; PyTorch's float bias or ONNX's int32 bias, as
:func:`convengine.quant.numerics.apply_requant`); :func:`fma32`, float32 fused
multiply-add for numba code (``llvm.fma.f32``: loops of it vectorize)."""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..algorithms.fma import splat
from ..epilogue_codes import Epilogue

LANES = 16
_I1, _I8, _I32 = ir.IntType(1), ir.IntType(8), ir.IntType(32)
VB = ir.VectorType(_I8, LANES)
VI = ir.VectorType(_I32, LANES)
VF = ir.VectorType(ir.FloatType(), LANES)
VM = ir.VectorType(_I1, LANES)


def lane_mask(builder: ir.IRBuilder, n: ir.Value) -> ir.Value:
    """<16 x i1>: lanes i < n (n >= 16: all)."""
    ids = ir.Constant(VI, list(range(LANES)))
    return builder.icmp_signed("<", ids, splat(builder, builder.trunc(n, _I32), VI))


def masked_load(builder: ir.IRBuilder, ptr: ir.Value, mask: ir.Value,
                 passthru: ir.Value) -> ir.Value:
    vty = passthru.type
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vty, [vty.as_pointer(), _I32, mask.type, vty]),
        f"llvm.masked.load.v{vty.count}i{vty.element.width}.p0")
    return builder.call(fn, [builder.bitcast(ptr, vty.as_pointer()), ir.Constant(_I32, 1), mask,
                             passthru])


def masked_store(builder: ir.IRBuilder, value: ir.Value, ptr: ir.Value, mask: ir.Value) -> None:
    vty = value.type
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), _I32, VM]),
        f"llvm.masked.store.v{vty.count}i{vty.element.width}.p0")
    builder.call(fn, [value, builder.bitcast(ptr, vty.as_pointer()), ir.Constant(_I32, 1), mask])


#: the fast float32 requantization's largest distance from a tie that it trusts:
#: its value is within 2**-14.6 of float64's (see :func:`requant`)
TIE_MARGIN = 2.0 ** -13


def bounds(builder: ir.IRBuilder, qmin: ir.Value, qmax: ir.Value, zp: ir.Value
           ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """:func:`requant`'s float32 ``lo``, ``hi``, ``zp`` from the clamp less the zero
    point (float32 ``qmin = lo - zp``, ``qmax = hi - zp``) and the integer ``zp`` (all
    integers of 8 bits: exact)."""
    zp_f = builder.sitofp(zp, ir.FloatType())
    return builder.fadd(qmin, zp_f), builder.fadd(qmax, zp_f), zp_f


def requant(builder: ir.IRBuilder, acc: ir.Value, bias: ir.Value, mult: ir.Value,
            lo: ir.Value, hi: ir.Value, zp: ir.Value, mode: Epilogue) -> ir.Value:
    """The int32 lanes ``acc`` (``<n x i32>``: n = 16 on AVX-512, 8 on AVX2) requantized
    as :func:`convengine.quant.numerics.apply_requant` (``kernels.epilogue``): int32
    lanes inside [lo, hi]. ``mult`` ``<n x float>``; ``lo``, ``hi``, ``zp`` float32
    scalars (integers: the clamp and the output zero point). No multiply and add fuse
    but the one named.

    ``mode`` REQUANT_FLOAT (PyTorch; ``bias`` ``<n x float>``):
    ``clamp(rint((f32(acc) + bias) * mult), lo - zp, hi - zp) + zp``, equal to
    ``clamp(rint(...) + zp, lo, hi)``: rint is monotonic and fixes the integers ``lo -
    zp`` and ``hi - zp``, and inside them ``+ zp`` is exact.

    REQUANT_INT32 (ONNX QLinearConv; ``bias`` ``<n x i32>``, the sum wrapping as int32):
    ``rint(clamp(f64(acc + bias) * f64(mult) + zp, lo, hi))``, computed as ``v =
    fma(f32(acc + bias), mult, zp)`` clamped and rounded to even in float32. Where the
    outcome depends on the rounding, v lies inside the 8-bit clamp range (|v| < 2**8,
    so ``|acc + bias| * mult`` < 2**9 with |zp| < 2**8), and there v is within 2**-15 +
    2**-17 < 2**-14.6 of the float64 value: 2**-24 relative of ``(acc + bias) * mult``
    from float32's accumulator beyond 2**24, half an ulp of v from the fma. Both so
    round to the same integer unless v lies within :data:`TIE_MARGIN` (2**-13) of a
    half-integer; beyond the range both clamp. A vector with such a lane (0.4% of them
    on random values; every exact tie) is computed again in float64 (:func:`_exact`).
    The margin was 2**-10 (3% of vectors, each a likely branch miss): 2**-13 made a
    16 -> 64 1x1 at 112 x 112 1.14x faster (Zen 5, one thread). With the float64 form
    on every vector the AVX2 depthwise kernel's ONNX mode took 1.3-1.6x its float-bias
    mode's time (56x56x144, Zen 3), 1.2x with this one."""
    lanes = acc.type.count
    vf = ir.VectorType(ir.FloatType(), lanes)
    if mode == Epilogue.REQUANT_FLOAT:
        v = builder.fmul(builder.fadd(builder.sitofp(acc, vf), bias), mult)
        _, q = _round(builder, _clamp(builder, v, builder.fsub(lo, zp), builder.fsub(hi, zp)))
        return builder.add(q, splat(builder, builder.fptosi(zp, _I32), acc.type))
    if mode != Epilogue.REQUANT_INT32:
        raise ValueError(f"mode must be REQUANT_FLOAT or REQUANT_INT32, got {mode!r}")
    s = builder.add(acc, bias)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]),
                                         f"llvm.fma.v{lanes}f32")
    v = _clamp(builder, builder.call(fma, [builder.sitofp(s, vf), mult, splat(builder, zp, vf)]),
               lo, hi)
    rounded, q = _round(builder, v)
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf]),
                                          f"llvm.fabs.v{lanes}f32")
    off = builder.call(fabs, [builder.fsub(v, rounded)])
    near = builder.fcmp_ordered(">=", off, ir.Constant(vf, [0.5 - TIE_MARGIN] * lanes))
    result = cgutils.alloca_once_value(builder, q)
    bits = ir.IntType(lanes)
    with builder.if_then(builder.icmp_unsigned("!=", builder.bitcast(near, bits),
                                               ir.Constant(bits, 0)), likely=False):
        builder.store(_exact(builder, s, mult, lo, hi, zp), result)
    return builder.load(result)


def _exact(builder: ir.IRBuilder, s: ir.Value, mult: ir.Value, lo: ir.Value, hi: ir.Value,
           zp: ir.Value) -> ir.Value:
    """REQUANT_INT32 of ``s = acc + bias`` in float64, 8 lanes at a time:
    ``rint(clamp(f64(s) * f64(mult) + zp, lo, hi))`` (clamped before the rounding)."""
    lanes, d = s.type.count, ir.DoubleType()
    vd = ir.VectorType(d, 8)
    lo_d, hi_d, zp_d = (builder.fpext(v, d) for v in (lo, hi, zp))
    parts = []
    for h in range(lanes // 8):
        pick = ir.Constant(ir.VectorType(_I32, 8), list(range(8 * h, 8 * h + 8)))
        a = builder.sitofp(s if lanes == 8 else builder.shuffle_vector(s, s, pick), vd)
        m = builder.fpext(mult if lanes == 8 else builder.shuffle_vector(mult, mult, pick), vd)
        v = builder.fadd(builder.fmul(a, m), splat(builder, zp_d, vd))
        parts.append(_round(builder, _clamp(builder, v, lo_d, hi_d), avx512=lanes == 16)[1])
    if len(parts) == 1:
        return parts[0]
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(s.type, list(range(lanes))))


def _clamp(builder: ir.IRBuilder, v: ir.Value, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """Float lanes ``v`` clamped to the scalars [lo, hi] (ordered compares: NaN to lo)."""
    low, high = splat(builder, lo, v.type), splat(builder, hi, v.type)
    v = builder.select(builder.fcmp_ordered(">", v, low), v, low)
    return builder.select(builder.fcmp_ordered("<", v, high), v, high)


def _round(builder: ir.IRBuilder, v: ir.Value, avx512: bool | None = None
           ) -> tuple[ir.Value, ir.Value]:
    """Float lanes ``v`` rounded to even, as floats and as ``<n x i32>``. 512-bit
    vectors on AVX-512 (``avx512``; default: 16 float32 lanes) convert with
    ``vcvtps2dq``/``vcvtpd2dq`` {rn-sae}, the rounding and the conversion in one; else
    ``vroundps``/``vroundpd`` and a truncating conversion (exact on integers)."""
    lanes, double = v.type.count, isinstance(v.type.element, ir.DoubleType)
    vi = ir.VectorType(_I32, lanes)
    if avx512 is None:
        avx512 = lanes == 16 and not double
    if not avx512:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type, [v.type]),
                                            f"llvm.rint.v{lanes}f{64 if double else 32}")
        rounded = builder.call(fn, [v])
        return rounded, builder.fptosi(rounded, vi)
    mask = ir.IntType(lanes)
    cvt = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vi, [v.type, vi, mask, _I32]),
        f"llvm.x86.avx512.mask.cvt{'pd' if double else 'ps'}2dq.512")
    q = builder.call(cvt, [v, ir.Constant(vi, None), ir.Constant(mask, -1), ir.Constant(_I32, 8)])
    return builder.sitofp(q, v.type), q


@intrinsic
def fma32(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """``a * b + c`` in float32 with one rounding (the float32 arguments' FMA)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        f = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f, [f, f, f]),
                                            "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen
