"""The integer numerics the graph engines call: all of it lives in convengine.quant.

The int8 conv is ``quant.qconv`` returning its raw int32 accumulator (exact).
``requantize`` (cuDNN's graph: a float32 value times a float32 multiplier, rounded
half to even, plus the zero point, saturated) is ``quant.numerics.apply_requant``
with a zero bias.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
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
