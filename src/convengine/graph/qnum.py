"""The integer numerics the graph engines call: all of it lives in convengine.quant.

The int8 conv is ``quant.qconv`` returning its raw int32 accumulator (exact), or,
for the ``kernel_fused`` engine, the quant kernels with the epilogue in their store.
``requantize`` (cuDNN's graph: a float32 value times a float32 multiplier, rounded
half to even, plus the zero point, saturated) is ``quant.numerics.apply_requant``
with a zero bias.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..problem import ConvProblem
from ..quant import plan as qplan
from ..quant import qconv
from ..quant.numerics import Requant, apply_requant, dtype_range


def requantize_into(a: np.ndarray, scale: float, zero_point: int, out: np.ndarray) -> None:
    """out = saturate(rint(float32(a) * float32(scale)) + zero_point), out's int dtype."""
    lo, hi = dtype_range(out.dtype)
    rq = Requant("float", np.array([scale], np.float32), np.zeros(1, np.float32),
                 zero_point, lo, hi)
    out[...] = apply_requant(a, rq, out.dtype)


def int8_conv(problem: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The exact int32 accumulator ``sum x * w`` of a forward conv (zero points 0),
    channels-last in and out: ``quant.qconv(..., out_dtype=int32)``."""
    return qconv(x, 1.0, 0, w, 1.0, 0, out_dtype=np.int32, stride=problem.stride,
                 padding=problem.padding, dilation=problem.dilation, groups=problem.groups,
                 layout="NHWC")


def int8_conv_refusal(problem: ConvProblem) -> str | None:
    if problem.pass_ != "forward":
        return "the int8 conv is forward only"
    return None


def int8_conv_requant(problem: ConvProblem, x: np.ndarray, w: np.ndarray,
                      bias: np.ndarray | None, multiplier: float, zero_point: int,
                      relu: bool, out: np.ndarray) -> None:
    """The int8 conv with cuDNN's epilogue applied in the kernel's store, into ``out``
    (channels-last, C-contiguous, int8/uint8):
    ``saturate(rint((f32(acc) + bias) * multiplier) + zp)``, ReLU as a clamp at zp
    (equal to ReLU before the positive multiplier). Calls the quant kernels with a
    :class:`Requant` built here, since ``qconv`` derives its own constants."""
    cl = dataclasses.replace(problem, layout="NHWC")
    o = problem.out_channels
    lo, hi = dtype_range(out.dtype)
    rq = Requant("float", np.full(o, multiplier, np.float32),
                 np.zeros(o, np.float32) if bias is None else np.ascontiguousarray(bias),
                 zero_point, max(lo, zero_point) if relu else lo, hi)
    plan = qplan.QuantPlan(cl, qplan.choose_algo(cl, "auto"), qplan.geometry(cl), 0,
                    np.zeros(o, np.int64), rq, 0, out.dtype)
    if out.size:
        qplan.run(plan, qplan.canonical(x, cl), qplan.canonical(w, cl), out.reshape(-1, o))
