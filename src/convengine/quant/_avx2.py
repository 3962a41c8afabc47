"""The AVX2 int8 micro-kernel (CPUs without VNNI): a 6 x 16 int32 tile by ``vpmaddwd``.

``ukernel_6x16(a, a_off, lda, b, b_off, kc2, mr, c, c_off, ldc)`` computes, for rows
``r < mr`` of the int16 matrix at ``a[a_off + r * lda + 2k + i]`` (the activations'
differences ``x - x_zero_point``) and the int16 weights packed as
``b[b_off + (k * 16 + col) * 2 + i]`` (layout (Kc/2, 16, 2): ``w - w_zero_point``):

    c[c_off + r * ldc + col] = sum_{k < kc2, i < 2} a[r, 2k + i] * b[k, col, i]   (int32)

Rows ``r >= mr`` repeat row ``mr - 1`` and are not stored. ``vpmaddwd`` multiplies
int16 pairs and adds each pair into an int32 lane: exact here (a pair is at most
2 * 255 * 255), unlike the ``vpmaddubsw`` of fbgemm and ONNX Runtime on these CPUs,
which saturates each pair's sum to int16. The 12 accumulators are ``<8 x i32>``
allocas that LLVM keeps in ymm registers.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..algorithms._fma import row_pointers

MR = 6  # rows (output pixels) per tile
NR = 16  # columns (output channels) per tile: two ymm of int32
_I32 = ir.IntType(32)
_V8 = ir.VectorType(_I32, 8)
_W16 = ir.VectorType(ir.IntType(16), 16)


def _make_ukernel() -> Any:
    def ukernel(typingctx, a, a_off, lda, b, b_off, kc2, mr, c, c_off, ldc):
        i = types.intp
        sig = types.void(a, i, i, b, i, i, i, c, i, i)

        def codegen(context, builder, signature, args):
            a_arr, b_arr, c_arr = (context.make_array(signature.args[k])(context, builder,
                                                                         args[k])
                                   for k in (0, 3, 7))
            _, a_off_v, lda_v, _, b_off_v, kc2_v, mr_v, _, c_off_v, ldc_v = args
            intp = a_off_v.type
            pmadd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V8, [_W16, _W16]), "llvm.x86.avx2.pmadd.wd")
            rows = row_pointers(builder, builder.gep(a_arr.data, [a_off_v]), MR, mr_v, lda_v)
            rows = [builder.bitcast(p, _I32.as_pointer()) for p in rows]  # int16 pairs
            b0 = builder.bitcast(builder.gep(b_arr.data, [b_off_v]), _W16.as_pointer())
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_V8, None))
                     for _ in range(2)] for _ in range(MR)]
            undef = ir.Constant(_V8, ir.Undefined)
            lanes = ir.Constant(ir.VectorType(_I32, 8), None)
            with cgutils.for_range(builder, kc2_v) as loop:
                k = loop.index
                wv = [builder.load(builder.gep(b0, [builder.add(builder.mul(
                    k, ir.Constant(intp, 2)), ir.Constant(intp, j))]), align=2)
                    for j in range(2)]
                for r in range(MR):
                    pair = builder.load(builder.gep(rows[r], [k]), align=2)
                    first = builder.insert_element(undef, pair, ir.Constant(_I32, 0))
                    av = builder.bitcast(builder.shuffle_vector(first, undef, lanes), _W16)
                    for j in range(2):
                        acc = accs[r][j]
                        builder.store(builder.add(builder.load(acc),
                                                  builder.call(pmadd, [av, wv[j]])), acc)
            c0 = builder.gep(c_arr.data, [c_off_v])
            for r in range(MR):
                with builder.if_then(builder.icmp_signed("<", ir.Constant(intp, r), mr_v),
                                     likely=True):
                    at = builder.gep(c0, [builder.mul(ir.Constant(intp, r), ldc_v)])
                    for j in range(2):
                        ptr = builder.bitcast(builder.gep(at, [ir.Constant(intp, 8 * j)]),
                                              _V8.as_pointer())
                        builder.store(builder.load(accs[r][j]), ptr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_avx2_{MR}x{NR}"
    return intrinsic(ukernel)


ukernel_6x16 = _make_ukernel()
