"""A register-blocked floating-point GEMM micro-kernel in 512-bit vectors (numba ``@intrinsic``).

``gemm_6xnr(a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc)`` sets, for rows
``r < mr`` (``mr <= 6``) and columns ``col < NR`` of the operands' dtype
(``NR = 4 * lanes``: 64 float32 or 32 float64 columns):

    c[c_off + r * ldc + col] = sum_{k < kc} a[a_off + r * lda + k] * b[b_off + k * NR + col]

with ``b`` packed as ``kc`` rows of ``NR`` contiguous values. Rows ``r >= mr`` read
row ``mr - 1`` and are not stored. The 6 x 4 accumulators are vector ``alloca``\\ s
that LLVM keeps in zmm registers, updated by ``llvm.fma`` on ``<16 x float>`` (or
``<8 x double>``): LLVM's default for this CPU would use 256-bit vectors; spelling
the vectors out gets 512-bit ones. The sum over ``k`` runs in order, one rounding
per fused multiply-add.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

MR = 6  # rows (Winograd tiles) per register block
NVEC = 4  # 512-bit vectors per row of the register block
VECTOR_BYTES = 64


def nr(itemsize: int) -> int:
    """Columns of the register block for elements of ``itemsize`` bytes."""
    return NVEC * VECTOR_BYTES // itemsize


@intrinsic
def gemm_6xnr(typingctx, a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc):
    intp_t = types.intp
    sig = types.void(a, intp_t, intp_t, b, intp_t, intp_t, intp_t, c, intp_t, intp_t)

    def codegen(context, builder, signature, args):
        dtype = signature.args[0].dtype
        scalar = context.get_value_type(dtype)
        lanes = VECTOR_BYTES // context.get_abi_sizeof(scalar)
        vec = ir.VectorType(scalar, lanes)
        align = VECTOR_BYTES // lanes
        width = lanes * NVEC
        a_arr = context.make_array(signature.args[0])(context, builder, args[0])
        b_arr = context.make_array(signature.args[3])(context, builder, args[3])
        c_arr = context.make_array(signature.args[7])(context, builder, args[7])
        _, a_off_v, lda_v, _, b_off_v, kc_v, mr_v, _, c_off_v, ldc_v = args
        intp = a_off_v.type
        suffix = f"v{lanes}f{8 * align}"
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.{suffix}")
        last = builder.sub(mr_v, ir.Constant(intp, 1))
        a0 = builder.gep(a_arr.data, [a_off_v])
        rows = []
        for r in range(MR):
            rr = ir.Constant(intp, r)
            use = builder.select(builder.icmp_signed("<", rr, mr_v), rr, last)
            rows.append(builder.gep(a0, [builder.mul(use, lda_v)]))
        b0 = builder.gep(b_arr.data, [b_off_v])
        zero = ir.Constant(vec, None)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(NVEC)]
                for _ in range(MR)]
        undef = ir.Constant(vec, ir.Undefined)
        lane0 = ir.Constant(ir.IntType(32), 0)
        splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), None)
        with cgutils.for_range(builder, kc_v) as loop:
            k = loop.index
            bk = builder.gep(b0, [builder.mul(k, ir.Constant(intp, width))])
            bvecs = [
                builder.load(builder.bitcast(
                    builder.gep(bk, [ir.Constant(intp, lanes * j)]), vec.as_pointer()),
                    align=align)
                for j in range(NVEC)
            ]
            for r in range(MR):
                ai = builder.load(builder.gep(rows[r], [k]))
                splat = builder.shuffle_vector(
                    builder.insert_element(undef, ai, lane0), undef, splat_mask)
                for j in range(NVEC):
                    cur = builder.load(accs[r][j])
                    builder.store(builder.call(fma, [splat, bvecs[j], cur]), accs[r][j])
        c0 = builder.gep(c_arr.data, [c_off_v])
        for r in range(MR):
            inside = builder.icmp_signed("<", ir.Constant(intp, r), mr_v)
            with builder.if_then(inside, likely=True):
                crow = builder.gep(c0, [builder.mul(ir.Constant(intp, r), ldc_v)])
                for j in range(NVEC):
                    ptr = builder.bitcast(
                        builder.gep(crow, [ir.Constant(intp, lanes * j)]), vec.as_pointer())
                    builder.store(builder.load(accs[r][j]), ptr, align=align)
        return context.get_dummy_value()

    return sig, codegen
