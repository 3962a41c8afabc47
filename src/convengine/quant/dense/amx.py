"""AMX int8 tiles (``tdpbusd``): a 32 x 32 int32 block per call, 4 accumulator tiles.

``amx_32x32(a, a_off, lda, b, b_off, ksteps, c, c_off)`` computes

    c[c_off + r * 64 + col] = sum_{k < 64 * ksteps} a[a_off + r * lda + k] * B[k, col]

for r, col < 32, with B packed as in the VNNI path (rows of 4-byte groups, 256 bytes
per row of 64 columns; ``b_off`` points at the first of the 32 columns): tile rows
of A are 64 bytes of K, tile rows of B one 4-byte group of K for 16 columns.
Tiles: tmm0-3 accumulate, tmm4-5 hold A, tmm6-7 hold B; all 16 rows x 64 bytes.
``amx_begin(cfg)`` loads that configuration (per thread), ``amx_end()`` releases it.
Linux grants tile state only on request: :func:`convengine._host.request_amx`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I8 = ir.IntType(8)
_I64 = ir.IntType(64)
_VOID = ir.VoidType()
_PTR = _I8.as_pointer()


def tile_config() -> np.ndarray:
    """The 64-byte ldtilecfg block: palette 1, tiles 0-7 of 16 rows x 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    for t in range(8):
        cfg[16 + 2 * t] = 64  # bytes per row (little-endian u16)
        cfg[48 + t] = 16  # rows
    return cfg


def _fn(builder: ir.IRBuilder, name: str, args: list[ir.Type]) -> ir.Function:
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VOID, args), name)


def _t(i: int) -> ir.Constant:
    return ir.Constant(_I8, i)


@intrinsic
def amx_begin(typingctx, cfg):
    sig = types.void(cfg)

    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        builder.call(_fn(builder, "llvm.x86.ldtilecfg", [_PTR]), [builder.bitcast(arr.data, _PTR)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def amx_end(typingctx):
    sig = types.void()

    def codegen(context, builder, signature, args):
        builder.call(_fn(builder, "llvm.x86.tilerelease", []), [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def amx_32x32(typingctx, a, a_off, lda, b, b_off, ksteps, c, c_off):
    intp_t = types.intp
    sig = types.void(a, intp_t, intp_t, b, intp_t, intp_t, c, intp_t)

    def codegen(context, builder, signature, args):
        a_arr = context.make_array(signature.args[0])(context, builder, args[0])
        b_arr = context.make_array(signature.args[3])(context, builder, args[3])
        c_arr = context.make_array(signature.args[6])(context, builder, args[6])
        _, a_off_v, lda_v, _, b_off_v, ksteps_v, _, c_off_v = args
        intp = a_off_v.type
        load = _fn(builder, "llvm.x86.tileloadd64", [_I8, _PTR, _I64])
        store = _fn(builder, "llvm.x86.tilestored64", [_I8, _PTR, _I64])
        zero = _fn(builder, "llvm.x86.tilezero", [_I8])
        dot = _fn(builder, "llvm.x86.tdpbusd", [_I8, _I8, _I8])

        def at(base: ir.Value, offset: ir.Value) -> ir.Value:
            return builder.bitcast(builder.gep(base, [offset]), _PTR)

        def const(v: int) -> ir.Constant:
            return ir.Constant(intp, v)

        for t in range(4):
            builder.call(zero, [_t(t)])
        a0 = builder.gep(a_arr.data, [a_off_v])
        a1 = builder.gep(a0, [builder.mul(lda_v, const(16))])
        b0 = builder.gep(b_arr.data, [b_off_v])
        with cgutils.for_range(builder, ksteps_v) as loop:
            k = loop.index
            ka = builder.mul(k, const(64))
            kb = builder.mul(k, const(16 * 256))
            builder.call(load, [_t(4), at(a0, ka), lda_v])
            builder.call(load, [_t(5), at(a1, ka), lda_v])
            builder.call(load, [_t(6), at(b0, kb), const(256)])
            builder.call(load, [_t(7), at(b0, builder.add(kb, const(64))), const(256)])
            builder.call(dot, [_t(0), _t(4), _t(6)])
            builder.call(dot, [_t(1), _t(4), _t(7)])
            builder.call(dot, [_t(2), _t(5), _t(6)])
            builder.call(dot, [_t(3), _t(5), _t(7)])
        c0 = builder.gep(c_arr.data, [c_off_v])  # int32 elements, rows of 64
        for t, (r, col) in enumerate(((0, 0), (0, 16), (16, 0), (16, 16))):
            builder.call(store, [_t(t), at(c0, const(r * 64 + col)), const(256)])
        return context.get_dummy_value()

    return sig, codegen
