"""A 16-channel depthwise 3x3 step in 512-bit vectors (numba ``@intrinsic``).

``dw3x3_16(x, x0, cs, rs, w, c, chans, wsum, xzp, acc)`` sets, for the 16 channels
``c + i`` (i < 16) of one output pixel whose top-left input tap starts at ``x[x0]``:

    acc[c + i] = sum_{kh, kw < 3} f32(x[x0 + kh * rs + kw * cs + c + i])
                                  * w[(3 kh + kw) * chans + c + i]  -  xzp * wsum[c + i]

in ``<16 x float>`` fused multiply-adds. Every term and partial sum is an integer
below 2**24, so the result is exact. LLVM's default for this CPU would use 256-bit
vectors; spelling the vectors out gets 512-bit ones.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, 16)
_VB = ir.VectorType(ir.IntType(8), 16)
_VI = ir.VectorType(ir.IntType(32), 16)


@intrinsic
def dw3x3_16(typingctx, x, x0, cs, rs, w, c, chans, wsum, xzp, acc):
    intp_t = types.intp
    sig = types.void(x, intp_t, intp_t, intp_t, w, intp_t, intp_t, wsum, types.float32, acc)

    def codegen(context, builder, signature, args):
        x_arr = context.make_array(signature.args[0])(context, builder, args[0])
        w_arr = context.make_array(signature.args[4])(context, builder, args[4])
        s_arr = context.make_array(signature.args[7])(context, builder, args[7])
        a_arr = context.make_array(signature.args[9])(context, builder, args[9])
        _, x0, cs_v, rs_v, _, c_v, chans_v, _, xzp_v, _ = args
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), "llvm.fma.v16f32")
        total = ir.Constant(_VF, None)
        base = builder.add(x0, c_v)
        for kh in range(3):
            for kw in range(3):
                off = builder.add(base, builder.add(
                    builder.mul(rs_v, ir.Constant(rs_v.type, kh)),
                    builder.mul(cs_v, ir.Constant(cs_v.type, kw))))
                xp = builder.bitcast(builder.gep(x_arr.data, [off]), _VB.as_pointer())
                xv = builder.uitofp(builder.zext(builder.load(xp, align=1), _VI), _VF)
                woff = builder.add(builder.mul(chans_v, ir.Constant(chans_v.type, 3 * kh + kw)),
                                   c_v)
                wp = builder.bitcast(builder.gep(w_arr.data, [woff]), _VF.as_pointer())
                total = builder.call(fma, [xv, builder.load(wp, align=4), total])
        sp = builder.bitcast(builder.gep(s_arr.data, [c_v]), _VF.as_pointer())
        undef = ir.Constant(_VF, ir.Undefined)
        zp = builder.insert_element(undef, xzp_v, ir.Constant(ir.IntType(32), 0))
        zp = builder.shuffle_vector(zp, undef, ir.Constant(_VI, None))
        total = builder.fsub(total, builder.fmul(zp, builder.load(sp, align=4)))
        builder.store(total, builder.bitcast(builder.gep(a_arr.data, [c_v]), _VF.as_pointer()),
                      align=4)
        return context.get_dummy_value()

    return sig, codegen
