"""The AVX512-VNNI int8 micro-kernel: a 6 x 64 int32 tile by ``vpdpbusd``.

``ukernel_6x64(a, a_off, lda, b, b_off, kc4, mr, c, c_off, acc_in)`` computes, for
rows ``r < mr`` of the uint8 matrix at ``a[a_off + r * lda + 4k + i]`` and the int8
weights packed as ``b[b_off + (k * 64 + col) * 4 + i]`` (layout (Kc/4, 64, 4)):

    c[c_off + r * 64 + col] = (c[...] if acc_in else 0)
                              + sum_{k < kc4, i < 4} a[r, 4k + i] * b[k, col, i]   (int32)

Rows ``r >= mr`` repeat row ``mr - 1`` (their results are ignored by the caller).
The 24 accumulators are ``<16 x i32>`` allocas that LLVM keeps in zmm registers.
Narrow variants for narrow column blocks: ``ukernel_8x32`` and ``ukernel_12x16``
(same arguments, 8 rows x 32 columns and 12 rows x 16 columns).
``vpdpbusd`` multiplies unsigned by signed bytes and adds without saturation:
the sum is exact modulo 2**32.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

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
            a_arr = context.make_array(signature.args[0])(context, builder, args[0])
            b_arr = context.make_array(signature.args[3])(context, builder, args[3])
            c_arr = context.make_array(signature.args[7])(context, builder, args[7])
            _, a_off_v, lda_v, _, b_off_v, kc4_v, mr_v, _, c_off_v, acc_in_v = args
            intp = a_off_v.type
            dot = _vpdpbusd(builder)
            a0 = builder.gep(a_arr.data, [a_off_v])
            rows = []
            for r in range(mr_rows):
                rr = ir.Constant(intp, r)
                last = builder.sub(mr_v, ir.Constant(intp, 1))
                use = builder.select(builder.icmp_signed("<", rr, mr_v), rr, last)
                rows.append(builder.gep(a0, [builder.mul(use, lda_v)]))
            b0 = builder.gep(b_arr.data, [b_off_v])
            zero = ir.Constant(_V16, None)
            c0 = builder.gep(c_arr.data, [c_off_v])
            keep = builder.icmp_signed("!=", acc_in_v, ir.Constant(intp, 0))

            def c_ptr(r: int, j: int) -> ir.Value:
                return _vec_ptr(builder, builder.gep(c0, [ir.Constant(intp, r * NR + 16 * j)]))

            accs = [
                [cgutils.alloca_once_value(
                    builder, builder.select(keep, builder.load(c_ptr(r, j), align=4), zero))
                 for j in range(nvec)]
                for r in range(mr_rows)
            ]
            with cgutils.for_range(builder, kc4_v) as loop:
                k = loop.index
                bk = builder.gep(b0, [builder.mul(k, ir.Constant(intp, NR * 4))])
                bvecs = [
                    builder.load(_vec_ptr(builder, builder.gep(bk, [ir.Constant(intp, 64 * j)])),
                                 align=1)
                    for j in range(nvec)
                ]
                k4 = builder.mul(k, ir.Constant(intp, 4))
                for r in range(mr_rows):
                    aptr = builder.bitcast(builder.gep(rows[r], [k4]), _I32.as_pointer())
                    ai = builder.load(aptr, align=1)
                    undef = ir.Constant(_V16, ir.Undefined)
                    splat = builder.insert_element(undef, ai, ir.Constant(_I32, 0))
                    splat = builder.shuffle_vector(splat, undef, ir.Constant(_V16, None))
                    for j in range(nvec):
                        cur = builder.load(accs[r][j])
                        builder.store(builder.call(dot, [cur, splat, bvecs[j]]), accs[r][j])
            for r in range(mr_rows):
                for j in range(nvec):
                    builder.store(builder.load(accs[r][j]), c_ptr(r, j), align=4)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_{mr_rows}x{16 * nvec}"
    return intrinsic(ukernel)


ukernel_6x64 = _make_ukernel(MR, 4)
ukernel_8x32 = _make_ukernel(8, 2)
ukernel_12x16 = _make_ukernel(12, 1)
