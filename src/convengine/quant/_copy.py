"""Short byte copies for the im2col gather: 64-byte vector moves, a masked tail.

``copy_bytes(dst, dpos, src, spos, n)`` copies ``src[spos:spos + n]`` to
``dst[dpos:dpos + n]`` (uint8 arrays, no bounds checks, the ranges must not overlap).
With AVX512BW a copy of 3 to 200 bytes, the kernel row of an input with few
channels, costs a few instructions instead of a byte loop or a call to ``memcpy``:
the tail's masked load and store touch no byte past ``n`` (no fault at the end of
``src``, nothing written that another thread may be writing). Without AVX512BW
there are no byte-masked moves (LLVM splits such a tail into 64 byte-wise branches):
the copy is a plain loop, which LLVM vectorizes (ResNet-50's int8 stem on a Zen 3,
gathered through it rather than tap by tap: 1.8-1.9x as fast).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._host import FEATURES

_I1, _I8, _I32 = ir.IntType(1), ir.IntType(8), ir.IntType(32)
_V64 = ir.VectorType(_I8, 64)
_M64 = ir.VectorType(_I1, 64)


@intrinsic
def _copy_masked(typingctx: Any, dst: Any, dpos: Any, src: Any, spos: Any, n: Any) -> Any:
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        d_arr = context.make_array(signature.args[0])(context, builder, args[0])
        s_arr = context.make_array(signature.args[2])(context, builder, args[2])
        _, dpos_v, _, spos_v, n_v = args
        intp = n_v.type
        d0 = builder.gep(d_arr.data, [dpos_v])
        s0 = builder.gep(s_arr.data, [spos_v])
        full = builder.udiv(n_v, ir.Constant(intp, 64))
        with cgutils.for_range(builder, full) as loop:
            off = builder.mul(loop.index, ir.Constant(intp, 64))
            v = builder.load(builder.bitcast(builder.gep(s0, [off]), _V64.as_pointer()), align=1)
            builder.store(v, builder.bitcast(builder.gep(d0, [off]), _V64.as_pointer()), align=1)
        off = builder.mul(full, ir.Constant(intp, 64))
        rest = builder.sub(n_v, off)  # 0..63 bytes: the low ``rest`` bits of the mask
        one = ir.Constant(intp, 1)  # intp is 64 bits wide on x86-64, the only host here
        mask = builder.bitcast(builder.sub(builder.shl(one, rest), one), _M64)
        load = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V64, [_V64.as_pointer(), _I32, _M64, _V64]),
            "llvm.masked.load.v64i8.p0")
        v = builder.call(load, [builder.bitcast(builder.gep(s0, [off]), _V64.as_pointer()),
                                ir.Constant(_I32, 1), mask, ir.Constant(_V64, None)])
        store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_V64, _V64.as_pointer(), _I32, _M64]),
            "llvm.masked.store.v64i8.p0")
        builder.call(store, [v, builder.bitcast(builder.gep(d0, [off]), _V64.as_pointer()),
                             ir.Constant(_I32, 1), mask])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _copy_loop(dst, dpos, src, spos, n):  # pragma: no cover - compiled
    for k in range(n):
        dst[np.uintp(dpos + k)] = src[np.uintp(spos + k)]


copy_bytes = _copy_masked if FEATURES.get("avx512bw") else _copy_loop
