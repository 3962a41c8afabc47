"""Compile the Triton kernels for a CUDA architecture without a GPU (``triton.compile``
down to a cubin with Triton's bundled LLVM and ptxas): the checks the interpreter does
not make (dot shapes and dtypes, constexpr rules, shared memory, tensor-core lowering).

Run with ``TRITON_INTERPRET`` unset, e.g. ``python -m convengine.gpu.aot 90``.
"""

from __future__ import annotations

import sys
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ..epilogue_codes import Activation, Epilogue
from . import kernels

FLOATS = ("out_zp", "lo", "hi")  # float scalar arguments; every other scalar is i32
# what the JIT assumes of pointers and of channel counts that are multiples of 16
# (ResNet's): loads vectorise and the GEMM's main loop is pipelined through cp.async
DIVISIBLE = ("a_ptr", "b_ptr", "y_ptr", "x_ptr", "dy_ptr", "dw_ptr", "R", "Q", "C", "NO",
             "sb_q", "sb_tap")
TENSOR_CORE_OPS = ("mma.sync", "wgmma")


def compile_kernel(fn: Any, pointers: dict[str, str], constexprs: dict[str, Any],
                   arch: int = 90, num_warps: int = 4, num_stages: int = 3) -> Any:
    """The compiled kernel of ``fn`` for ``sm_<arch>``: ``pointers`` name -> "*fp16" etc."""
    names = fn.arg_names
    signature = {n: "constexpr" if n in constexprs else pointers.get(n) or
                 ("fp32" if n in FLOATS else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in DIVISIBLE if n in names}
    src = ASTSource(fn=fn, signature=signature, attrs=attrs,
                    constexprs={(names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages,
                                   "enable_fp_fusion": False})


def representative(arch: int = 90) -> dict[str, tuple[int, bool]]:
    """Compile one variant of each kernel (bf16 GEMM, strided backward-data and wgrad,
    int8 GEMM with the float32 requantization, int8 grouped direct, fp16 grouped
    wgrad); name -> (shared memory bytes,
    whether its PTX has tensor-core instructions)."""
    gemm = dict(HAS_BIAS=True, ACT=int(Activation.SILU), TF32=False, DOT_F32=False,
                BLOCK_M=128, BLOCK_N=128, GROUP_M=8)
    plan = {
        "igemm_bf16": (kernels.igemm_kernel,
                       dict(a_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", bias_ptr="*fp32",
                            mult_ptr="*fp32", rsum_ptr="*i32"),
                       {**gemm, "EPI": int(Epilogue.FLOAT), "BLOCK_K": 32}),
        "igemm_int8": (kernels.igemm_kernel,
                       dict(a_ptr="*i8", b_ptr="*i8", y_ptr="*u8", bias_ptr="*fp32",
                            mult_ptr="*fp32", rsum_ptr="*i32"),
                       {**gemm, "ACT": 0, "EPI": int(Epilogue.REQUANT_FLOAT),
                        "BLOCK_K": 64}),
        "direct_int8": (kernels.direct_kernel,
                        dict(a_ptr="*u8", b_ptr="*i8", y_ptr="*i8", bias_ptr="*i32",
                             mult_ptr="*fp32", bzp_ptr="*i32"),
                        dict(HAS_BIAS=True, ACT=0, EPI=int(Epilogue.REQUANT_INT32),
                             BLOCK_M=64, BLOCK_N=64)),
        "dgrad_phased_bf16": (kernels.dgrad_phased_kernel,
                              dict(a_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16",
                                   bias_ptr="*fp32", tab_ptr="*i32"),
                              dict(HAS_BIAS=True, ACT=1, TF32=False, DOT_F32=False,
                                   BLOCK_M=128, BLOCK_N=128, BLOCK_K=32)),
        "wgrad_direct_fp16": (kernels.wgrad_direct_kernel,
                              dict(x_ptr="*fp16", dy_ptr="*fp16", dw_ptr="*fp16"),
                              dict(BLOCK_P=64, BLOCK_N=64)),
        "wgrad_bf16": (kernels.wgrad_kernel,
                       dict(x_ptr="*bf16", dy_ptr="*bf16", dw_ptr="*bf16"),
                       dict(TF32=False, DOT_F32=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)),
    }
    result = {}
    for name, (fn, ptrs, consts) in plan.items():
        k = compile_kernel(fn, ptrs, consts, arch)
        result[name] = (int(k.metadata.shared), any(op in k.asm["ptx"] for op in TENSOR_CORE_OPS))
    return result


if __name__ == "__main__":
    print(representative(int(sys.argv[1]) if len(sys.argv) > 1 else 90))
