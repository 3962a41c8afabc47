"""LLVM IR helpers shared by the int8 kernels' intrinsics: splats, lane masks, masked
loads and stores of 16-lane vectors, and the requantization of int32 lanes
(:func:`requant_codegen`: float32, ``kernels._epilogue`` mode 0;
:func:`requant_i32_codegen`: int32 bias, float64's rounding, mode 1); :func:`fma32`, float32
fused multiply-add for numba code (``llvm.fma.f32``: loops of it vectorize)."""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16
_I1, _I8, _I16, _I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
VB = ir.VectorType(_I8, LANES)
VI = ir.VectorType(_I32, LANES)
VF = ir.VectorType(ir.FloatType(), LANES)
VM = ir.VectorType(_I1, LANES)
_VD8 = ir.VectorType(ir.DoubleType(), 8)
_VI8 = ir.VectorType(_I32, 8)


def splat(builder: ir.IRBuilder, value: ir.Value, vty: ir.VectorType) -> ir.Value:
    undef = ir.Constant(vty, ir.Undefined)
    v = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, vty.count), None))


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


def requant_codegen(builder: ir.IRBuilder, acc: ir.Value, bias: ir.Value, mult: ir.Value,
                     qmin: ir.Value, qmax: ir.Value, zp: ir.Value) -> ir.Value:
    """``rint(clamp((f32(acc) + bias) * mult, lo - zp, hi - zp)) + zp`` in int32 lanes.

    Equal to ``_epilogue``'s ``clamp(rint((f32(acc) + bias) * mult) + zp, lo, hi)``:
    rint is monotonic and fixes the integers ``lo - zp`` and ``hi - zp``, so clamping
    before or after it agrees, and inside the clamp range ``+ zp`` is exact.
    ``vcvtps2dq`` with {rn-sae} is rint (ties to even) and the conversion in one."""
    v = builder.fmul(builder.fadd(builder.sitofp(acc, VF), bias), mult)
    _, q = _clamp_rint(builder, v, qmin, qmax)
    return builder.add(q, splat(builder, builder.trunc(zp, _I32), VI))


def _clamp_rint(builder: ir.IRBuilder, v: ir.Value, lo: ir.Value, hi: ir.Value
                ) -> tuple[ir.Value, ir.Value]:
    """float32 lanes ``v`` clamped to the scalars [lo, hi] (NaN to lo), and that rounded
    to even into int32 lanes (``vcvtps2dq`` {rn-sae})."""
    lo_v, hi_v = splat(builder, lo, VF), splat(builder, hi, VF)
    v = builder.select(builder.fcmp_ordered(">", v, lo_v), v, lo_v)
    v = builder.select(builder.fcmp_ordered("<", v, hi_v), v, hi_v)
    cvt = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(VI, [VF, VI, _I16, _I32]),
        "llvm.x86.avx512.mask.cvtps2dq.512")
    return v, builder.call(cvt, [v, ir.Constant(VI, None), ir.Constant(_I16, -1),
                                 ir.Constant(_I32, 8)])


#: the fast float32 requantization's largest distance from a tie that it trusts:
#: its value is within 2**-14.6 of float64's (see :func:`requant_i32_codegen`)
TIE_MARGIN = 2.0 ** -13


def requant_i32_codegen(builder: ir.IRBuilder, acc: ir.Value, bias: ir.Value, mult: ir.Value,
                        qmin: ir.Value, qmax: ir.Value, zp: ir.Value) -> ir.Value:
    """ONNX QLinearConv's ``rint(clamp(f64(acc + bias) * f64(mult) + zp, lo, hi))`` in
    int32 lanes (``acc``, ``bias`` <16 x i32>, the sum wrapping as int32; ``mult``
    <16 x float>; ``qmin``/``qmax`` float32 ``lo - zp``/``hi - zp``, so ``lo`` and ``hi``
    are rebuilt exactly), equal to ``_epilogue``'s mode 1.

    Computed as ``v = fma(f32(acc + bias), mult, zp)``, clamped and rounded to even
    in float32. Where the outcome depends on the rounding, v lies inside the 8-bit
    clamp range (|v| < 2**8, so ``|acc + bias| * mult`` < 2**9 with |zp| < 2**8), and
    there v is within 2**-15 + 2**-17 < 2**-14.6 of the float64 value: 2**-24
    relative of ``(acc + bias) * mult`` from float32's accumulator beyond 2**24, half
    an ulp of v from the fma. Both so round to the same integer unless v lies within
    :data:`TIE_MARGIN` (2**-13) of a half-integer; beyond the range both clamp. A
    vector with such a lane (0.4% of them on random values; every exact tie) is
    recomputed in float64 (:func:`_requant_i32_f64`). The margin was 2**-10 (3% of
    vectors, each a likely branch miss): 2**-13 made a 16 -> 64 1x1 at 112 x 112 1.14x
    faster (Zen 5, one thread)."""
    s = builder.add(acc, bias)
    zp_f = builder.sitofp(zp, ir.FloatType())
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF, [VF, VF, VF]),
                                         "llvm.fma.v16f32")
    v = builder.call(fma, [builder.sitofp(s, VF), mult, splat(builder, zp_f, VF)])
    v, q = _clamp_rint(builder, v, builder.fadd(qmin, zp_f), builder.fadd(qmax, zp_f))
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF, [VF]),
                                          "llvm.fabs.v16f32")
    off = builder.call(fabs, [builder.fsub(v, builder.sitofp(q, VF))])
    near = builder.fcmp_ordered(">=", off, ir.Constant(VF, [0.5 - TIE_MARGIN] * LANES))
    result = cgutils.alloca_once_value(builder, q)
    with builder.if_then(builder.icmp_unsigned("!=", builder.bitcast(near, _I16),
                                               ir.Constant(_I16, 0)), likely=False):
        builder.store(_requant_i32_f64(builder, s, mult, qmin, qmax, zp), result)
    return builder.load(result)


def _requant_i32_f64(builder: ir.IRBuilder, s: ir.Value, mult: ir.Value, qmin: ir.Value,
                     qmax: ir.Value, zp: ir.Value) -> ir.Value:
    """:func:`requant_i32_codegen` of ``s = acc + bias`` in two halves of 8 float64
    lanes: clamping before the rounding ``vcvtpd2dq`` {rn-sae} (ties to even), as
    ``_epilogue``'s mode 1."""
    zp_d = builder.sitofp(zp, ir.DoubleType())
    lo = splat(builder, builder.fadd(builder.fpext(qmin, ir.DoubleType()), zp_d), _VD8)
    hi = splat(builder, builder.fadd(builder.fpext(qmax, ir.DoubleType()), zp_d), _VD8)
    zpv = splat(builder, zp_d, _VD8)
    cvt = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_VI8, [_VD8, _VI8, _I8, _I32]),
        "llvm.x86.avx512.mask.cvtpd2dq.512")
    halves = []
    for h in range(2):
        pick = ir.Constant(_VI8, list(range(8 * h, 8 * h + 8)))
        a = builder.sitofp(builder.shuffle_vector(s, s, pick), _VD8)
        m = builder.fpext(builder.shuffle_vector(mult, mult, pick), _VD8)
        v = builder.fadd(builder.fmul(a, m), zpv)
        v = builder.select(builder.fcmp_ordered(">", v, lo), v, lo)
        v = builder.select(builder.fcmp_ordered("<", v, hi), v, hi)
        halves.append(builder.call(cvt, [v, ir.Constant(_VI8, None), ir.Constant(_I8, -1),
                                         ir.Constant(_I32, 8)]))
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(VI, list(range(LANES))))


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
