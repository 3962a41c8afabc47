"""Vector kernels for the fused Winograd convolution (numba ``@intrinsic``), in the
host's widest vectors (:mod:`convengine._host`: 512-bit with AVX-512, else 256-bit).

A register-blocked GEMM micro-kernel:

``gemm_6xnr(a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc, add, ahead)`` sets, for rows
``r < mr`` (``mr <= 6``) and columns ``col < NR`` of the operands' dtype
(``NR = NVEC * lanes``: 64 float32 or 32 float64 columns with AVX-512, 16 or 8 with
AVX2):

    c[c_off + r * ldc + col] = (c[...] if add else 0)
                               + sum_{k < kc} a[a_off + r * lda + k] * b[b_off + k * NR + col]

with ``b`` packed as ``kc`` rows of ``NR`` contiguous values. Rows ``r >= mr`` read
row ``mr - 1`` and are not stored. The 6 x NVEC accumulators are vector ``alloca``\\ s
that LLVM keeps in registers, updated by ``llvm.fma`` on ``<16 x float>`` (or
``<8 x double>``; half that with AVX2): LLVM's default for an AVX-512 CPU would use
256-bit vectors; spelling the vectors out gets 512-bit ones. The sum over ``k`` runs
in order, one rounding per fused multiply-add. Each step prefetches b's row ``ahead``
steps on (:data:`WEIGHT_AHEAD`; 0: none).

``add_run(dst, d0, src, s0, count)`` adds a run of values a vector at a time (the last
masked): blocked's narrow backward-data adds its tiles into dx so.

And ``make_sandwich(left, right, check)``: the Winograd tile transforms
``left @ S @ right^T`` over a vector of channels at a time, generated from the
constant matrices with their shared sub-sums factored out (see ``_matvec``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .._host import ACCUMULATORS, VECTOR_BYTES

MR = 6  # rows (Winograd tiles) per register block
# reduction steps ahead at which the micro-kernels here and blocked's prefetch their
# weights (one line per vector of a row each step; the tunable ``ahead`` of both):
# the hardware prefetchers left the weight walks waiting wherever the weights were not
# in L1. Emerald Rapids, 2 threads: blocked's layers with 12 distinct weights in turn,
# batch 1, the 2048 -> 1000 and 1280 -> 1000 classifiers 1.5-1.7x as fast, 2048 -> 512
# at 7x7 1.5x, 256 -> 64 at 56x56 1.15x; Winograd's 3x3 at 512x7x7 1.1-1.3x, 256x14x14
# batch 8 1.1-1.16x (two fresh processes each way); 4, 8 and 16 steps within the noise
WEIGHT_AHEAD = 8
NVEC = ACCUMULATORS // MR  # vectors per row of the register block (4 zmm, 2 ymm)


def row_pointers(builder: ir.IRBuilder, base: ir.Value, count: int, mr: ir.Value,
                 stride: ir.Value) -> list[ir.Value]:
    """``count`` row pointers ``base + r * stride`` of a register block; rows
    ``r >= mr`` repeat row ``mr - 1`` (a partial block computes them, never stores)."""
    last = builder.sub(mr, ir.Constant(mr.type, 1))
    rows = []
    for r in range(count):
        rr = ir.Constant(mr.type, r)
        use = builder.select(builder.icmp_signed("<", rr, mr), rr, last)
        rows.append(builder.gep(base, [builder.mul(use, stride)]))
    return rows


def store_rows(builder: ir.IRBuilder, accs: list, base: ir.Value, mr: ir.Value,
               stride: ir.Value, align: int, add: ir.Value | None = None) -> None:
    """Store rows ``r < mr`` of a register block (``accs[r][j]``: vector allocas) at
    ``base + r * stride + j * lanes``; with ``add`` (an i1), add to what is there."""
    for r, row in enumerate(accs):
        with builder.if_then(builder.icmp_signed("<", ir.Constant(mr.type, r), mr),
                             likely=True):
            at = builder.gep(base, [builder.mul(ir.Constant(mr.type, r), stride)])
            for j, acc_ptr in enumerate(row):
                vec = acc_ptr.type.pointee
                ptr = builder.bitcast(builder.gep(at, [ir.Constant(mr.type, vec.count * j)]),
                                      vec.as_pointer())
                acc = builder.load(acc_ptr)
                if add is None:
                    builder.store(acc, ptr, align=align)
                    continue
                with builder.if_else(add) as (then, otherwise):
                    with then:
                        builder.store(builder.fadd(builder.load(ptr, align=align), acc),
                                      ptr, align=align)
                    with otherwise:
                        builder.store(acc, ptr, align=align)


def splat(builder: ir.IRBuilder, value: ir.Value, vec: ir.VectorType) -> ir.Value:
    """``value`` broadcast to every lane of ``vec`` (any lane count and element type:
    the one splat of the float and int8 LLVM IR kernels)."""
    undef = ir.Constant(vec, ir.Undefined)
    first = builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(first, undef,
                                  ir.Constant(ir.VectorType(ir.IntType(32), vec.count), None))


def nr(itemsize: int) -> int:
    """Columns of the register block for elements of ``itemsize`` bytes."""
    return NVEC * VECTOR_BYTES // itemsize


class VectorOps(NamedTuple):
    """A dtype's vector (:data:`VECTOR_BYTES`) and lane-mask types, element alignment, and the masked
    load ``load(ptr, align, mask, passthru)``, masked store ``store(v, ptr, align,
    mask)`` and ``fma(a, b, c)`` intrinsics declared in the module being built."""

    vec: ir.VectorType
    mask_t: ir.VectorType
    align: ir.Constant
    load: ir.Function
    store: ir.Function
    fma: ir.Function


def vector_ops(context, builder: ir.IRBuilder, dtype) -> VectorOps:
    """VectorOps for numba ``dtype`` (float32: 16 lanes, float64: 8; half with AVX2)."""
    scalar = context.get_value_type(dtype)
    size = context.get_abi_sizeof(scalar)
    lanes = VECTOR_BYTES // size
    vec = ir.VectorType(scalar, lanes)
    mask_t = ir.VectorType(ir.IntType(1), lanes)
    suffix = f"v{lanes}f{8 * size}"
    module = builder.module
    load = cgutils.get_or_insert_function(
        module, ir.FunctionType(vec, [vec.as_pointer(), ir.IntType(32), mask_t, vec]),
        f"llvm.masked.load.{suffix}.p0")
    store = cgutils.get_or_insert_function(
        module, ir.FunctionType(ir.VoidType(), [vec, vec.as_pointer(), ir.IntType(32), mask_t]),
        f"llvm.masked.store.{suffix}.p0")
    fma = cgutils.get_or_insert_function(
        module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.{suffix}")
    return VectorOps(vec, mask_t, ir.Constant(ir.IntType(32), size), load, store, fma)


@intrinsic
def add_run(typingctx, dst, d0, src, s0, count):
    """``dst[d0 + e] += src[s0 + e]`` for ``e < count`` (none for ``count <= 0``), a
    vector at a time, the last one masked: a run of a few dozen values that LLVM's
    own vectoriser leaves to scalar code (its trip count unknown, the arrays maybe
    overlapping). Same dtype, float32 or float64."""
    intp_t = types.intp
    sig = types.void(dst, intp_t, src, intp_t, intp_t)

    def codegen(context, builder, signature, args):
        ops = vector_ops(context, builder, signature.args[0].dtype)
        lanes = ops.vec.count
        dst_arr = context.make_array(signature.args[0])(context, builder, args[0])
        src_arr = context.make_array(signature.args[2])(context, builder, args[2])
        _, d0_v, _, s0_v, count_v = args
        intp = count_v.type
        at_dst = builder.gep(dst_arr.data, [d0_v])
        at_src = builder.gep(src_arr.data, [s0_v])
        steps = builder.sdiv(builder.add(count_v, ir.Constant(intp, lanes - 1)),
                             ir.Constant(intp, lanes))
        ids = ir.Constant(ir.VectorType(intp, lanes), list(range(lanes)))
        zero = ir.Constant(ops.vec, None)
        with cgutils.for_range(builder, steps) as loop:
            first = builder.mul(loop.index, ir.Constant(intp, lanes))
            left = splat(builder, builder.sub(count_v, first), ir.VectorType(intp, lanes))
            mask = builder.icmp_signed("<", ids, left)
            d_ptr = builder.bitcast(builder.gep(at_dst, [first]), ops.vec.as_pointer())
            s_ptr = builder.bitcast(builder.gep(at_src, [first]), ops.vec.as_pointer())
            total = builder.fadd(builder.call(ops.load, [d_ptr, ops.align, mask, zero]),
                                 builder.call(ops.load, [s_ptr, ops.align, mask, zero]))
            builder.call(ops.store, [total, d_ptr, ops.align, mask])
        return context.get_dummy_value()

    return sig, codegen


def prefetch(builder: ir.IRBuilder, ptr: ir.Value, write: bool) -> None:
    """Emit a prefetch of the cache line at ``ptr`` into all cache levels (for a
    write: ``prefetchw``, the line fetched for ownership)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
        "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, int(write)),
                      ir.Constant(i32, 3), ir.Constant(i32, 1)])


def prefetch_ahead(builder: ir.IRBuilder, at: ir.Value, distance: ir.Value, lanes: int,
                   vectors: int) -> None:
    """Emit prefetches (for reading) of the ``vectors`` runs of ``lanes`` values that
    start ``distance`` values past ``at``: a weight row that many values on. A
    ``distance`` of 0 prefetches nothing (the branch on it is taken the same way every
    step)."""
    intp = distance.type
    with builder.if_then(builder.icmp_signed("!=", distance, ir.Constant(intp, 0))):
        upcoming = builder.gep(at, [distance])
        for j in range(vectors):
            prefetch(builder, builder.gep(upcoming, [ir.Constant(intp, lanes * j)]), False)


@intrinsic
def store_fence(typingctx):
    """``sfence``: this thread's non-temporal stores are visible before what follows."""
    def codegen(context, builder, signature, args):
        fence = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence")
        builder.call(fence, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def gemm_6xnr(typingctx, a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc, add, ahead):
    intp_t = types.intp
    sig = types.void(a, intp_t, intp_t, b, intp_t, intp_t, intp_t, c, intp_t, intp_t,
                     types.boolean, intp_t)

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
        _, a_off_v, lda_v, _, b_off_v, kc_v, mr_v, _, c_off_v, ldc_v, add_v, ahead_v = args
        intp = a_off_v.type
        suffix = f"v{lanes}f{8 * align}"
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.{suffix}")
        rows = row_pointers(builder, builder.gep(a_arr.data, [a_off_v]), MR, mr_v, lda_v)
        b0 = builder.gep(b_arr.data, [b_off_v])
        zero = ir.Constant(vec, None)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(NVEC)]
                for _ in range(MR)]
        ahead_values = builder.mul(ahead_v, ir.Constant(intp, width))
        with cgutils.for_range(builder, kc_v) as loop:
            k = loop.index
            bk = builder.gep(b0, [builder.mul(k, ir.Constant(intp, width))])
            prefetch_ahead(builder, bk, ahead_values, lanes, NVEC)  # b ``ahead`` rows on
            bvecs = [
                builder.load(builder.bitcast(
                    builder.gep(bk, [ir.Constant(intp, lanes * j)]), vec.as_pointer()),
                    align=align)
                for j in range(NVEC)
            ]
            for r in range(MR):
                ai = builder.load(builder.gep(rows[r], [k]))
                ai_v = splat(builder, ai, vec)
                for j in range(NVEC):
                    cur = builder.load(accs[r][j])
                    builder.store(builder.call(fma, [ai_v, bvecs[j], cur]), accs[r][j])
        store_rows(builder, accs, builder.gep(c_arr.data, [c_off_v]), mr_v, ldc_v, align,
                   add=add_v)
        return context.get_dummy_value()

    return sig, codegen


def _combine(builder: ir.IRBuilder, fma: ir.Function, coefs, values: list) -> ir.Value:
    """``sum coefs[k] * values[k]`` over the nonzero coefficients: adds and subtracts
    for +-1, fused multiply-adds by splat constants otherwise."""
    vec = values[0].type
    total = None
    for coef, value in zip(coefs, values):
        coef = float(coef)
        if coef == 0:
            continue
        if total is None:
            total = (value if coef == 1 else builder.fneg(value) if coef == -1
                     else builder.fmul(ir.Constant(vec, [coef] * vec.count), value))
        elif abs(coef) == 1:
            total = builder.fadd(total, value) if coef > 0 else builder.fsub(total, value)
        else:
            total = builder.call(fma, [ir.Constant(vec, [coef] * vec.count), value, total])
    return total if total is not None else ir.Constant(vec, None)


def _matvec(builder: ir.IRBuilder, fma: ir.Function, mat: np.ndarray, values: list) -> list:
    """``mat @ values`` with the shared sub-sums of the Winograd matrices factored out:
    two inputs whose columns are equal up to sign in every row enter as their sum and
    difference; two rows equal up to sign in every column share the sums over the
    columns where their signs agree and where they differ (``e + o``, ``e - o``)."""
    mat = np.array(mat, dtype=np.float64)
    cols, vals = [], []
    used: set[int] = set()
    for k in range(mat.shape[1]):
        if k in used:
            continue
        pair = next((k2 for k2 in range(k + 1, mat.shape[1]) if k2 not in used
                     and np.any(mat[:, k]) and np.array_equal(np.abs(mat[:, k]),
                                                              np.abs(mat[:, k2]))), None)
        if pair is None:
            cols.append(mat[:, k])
            vals.append(values[k])
            continue
        used.add(pair)
        same = mat[:, k] == mat[:, pair]
        cols += [np.where(same, mat[:, k], 0.0), np.where(same, 0.0, mat[:, k])]
        vals += [builder.fadd(values[k], values[pair]), builder.fsub(values[k], values[pair])]
    rows = np.stack(cols, axis=1)
    out: list = [None] * rows.shape[0]
    for i in range(rows.shape[0]):
        if out[i] is not None:
            continue
        twin = next((i2 for i2 in range(i + 1, rows.shape[0]) if out[i2] is None
                     and np.array_equal(np.abs(rows[i]), np.abs(rows[i2]))
                     and not np.array_equal(rows[i], rows[i2])), None)
        if twin is None:
            out[i] = _combine(builder, fma, rows[i], vals)
            continue
        agree = rows[i] == rows[twin]
        e = _combine(builder, fma, np.where(agree, rows[i], 0.0), vals)
        o = _combine(builder, fma, np.where(agree, 0.0, rows[i]), vals)
        out[i], out[twin] = builder.fadd(e, o), builder.fsub(e, o)
    return out


def make_sandwich(left, right, check: bool):
    """An intrinsic ``sandwich(src, s_off, s_rs, s_cs, dst, d_off, d_rs, d_cs, groups,
    chk)`` computing, in vectors, for each channel group ``g < groups``
    (``lanes`` channels at offset ``g * lanes``; 16 float32 or 8 float64):

        dst[d_off + i * d_rs + j * d_cs + ...] = (left @ S @ right^T)[i, j],
        S[k, j] = src[s_off + k * s_rs + j * s_cs + ...]

    ``left`` (p, a) and ``right`` (q, b) are constant matrices (the Winograd
    transforms). ``check``: ``chk[g * lanes + ...]`` gains 0 times the sum of each
    result row, NaN once a result is NaN or infinite; else chk is untouched."""
    p, a = left.shape
    b = right.shape[1]

    def sandwich(typingctx, src, s_off, s_rs, s_cs, dst, d_off, d_rs, d_cs, groups, chk):
        intp_t = types.intp
        sig = types.void(src, intp_t, intp_t, intp_t, dst, intp_t, intp_t, intp_t, intp_t, chk)

        def codegen(context, builder, signature, args):
            scalar = context.get_value_type(signature.args[0].dtype)
            lanes = VECTOR_BYTES // context.get_abi_sizeof(scalar)
            vec = ir.VectorType(scalar, lanes)
            align = VECTOR_BYTES // lanes
            src_a = context.make_array(signature.args[0])(context, builder, args[0])
            dst_a = context.make_array(signature.args[4])(context, builder, args[4])
            chk_a = context.make_array(signature.args[9])(context, builder, args[9])
            _, s_off_v, s_rs_v, s_cs_v, _, d_off_v, d_rs_v, d_cs_v, groups_v, _ = args
            intp = s_off_v.type
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec, vec, vec]),
                f"llvm.fma.v{lanes}f{8 * align}")

            def ptr(base, off, i, rs, j, cs, g):
                idx = builder.add(off, builder.add(
                    builder.add(builder.mul(rs, ir.Constant(intp, i)),
                                builder.mul(cs, ir.Constant(intp, j))), g))
                return builder.bitcast(builder.gep(base, [idx]), vec.as_pointer())

            with cgutils.for_range(builder, groups_v) as loop:
                g = builder.mul(loop.index, ir.Constant(intp, lanes))
                cols = []
                for j in range(b):  # tmp[:, j] = left @ S[:, j]
                    s = [builder.load(ptr(src_a.data, s_off_v, k, s_rs_v, j, s_cs_v, g),
                                      align=align) for k in range(a)]
                    cols.append(_matvec(builder, fma, left, s))
                for i in range(p):  # dst[i, :] = tmp[i, :] @ right^T
                    row = [cols[k][i] for k in range(b)]
                    outs = _matvec(builder, fma, right, row)
                    for j, value in enumerate(outs):
                        builder.store(value, ptr(dst_a.data, d_off_v, i, d_rs_v, j, d_cs_v, g),
                                      align=align)
                    if check:
                        total = outs[0]
                        for value in outs[1:]:
                            total = builder.fadd(total, value)
                        cp = builder.bitcast(builder.gep(chk_a.data, [g]), vec.as_pointer())
                        zero = ir.Constant(vec, None)
                        builder.store(builder.fadd(builder.load(cp, align=align),
                                                   builder.fmul(total, zero)), cp, align=align)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(sandwich)


def lanes(itemsize: int) -> int:
    """Elements of ``itemsize`` bytes per vector (:data:`VECTOR_BYTES`)."""
    return VECTOR_BYTES // itemsize
