"""Pointwise op numerics, shared by every engine so that they agree bit for bit.

Each op writes ``out`` (which may be the main operand itself: in place). Values are
carried in float32 or float64; a float16/bfloat16 compute dtype is emulated by
rounding every intermediate to it. The transcendental ops are numba ufuncs so that
they run in one pass without temporaries; ``requantize`` calls the quantization
module's numerics.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
from numba import vectorize

SIGNATURES = ["float32(float32)", "float64(float64)"]


@cache
def _ufuncs() -> dict[str, Any]:
    """Compiled on first use (about a second), then reused."""

    @vectorize(SIGNATURES, nopython=True)
    def sigmoid(v):
        return 1.0 / (1.0 + math.exp(-v))

    @vectorize(SIGNATURES, nopython=True)
    def silu(v):
        return v / (1.0 + math.exp(-v))

    @vectorize(SIGNATURES, nopython=True)
    def gelu(v):
        return 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))

    @vectorize(SIGNATURES, nopython=True)
    def gelu_tanh(v):
        return 0.5 * v * (1.0 + math.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))

    return {"sigmoid": sigmoid, "silu": silu, "gelu": gelu, "gelu_tanh": gelu_tanh}


def carrier_dtype(compute_dtype: str) -> np.dtype:
    """The numpy dtype values are held in: float64 for float64, else float32."""
    return np.dtype(np.float64 if compute_dtype == "float64" else np.float32)


def _round_to(out: np.ndarray, compute_dtype: str) -> None:
    if compute_dtype in ("float16", "bfloat16"):
        if compute_dtype == "float16":
            low: Any = np.float16
        else:
            import ml_dtypes  # ~0.6 s to import: only on the bfloat16 path

            low = ml_dtypes.bfloat16
        out[...] = out.astype(low).astype(out.dtype)


def _operand(b: np.ndarray | None) -> np.ndarray:
    if b is None:
        raise ValueError("a binary pointwise op needs an operand")
    return b


def apply(
    op: str,
    attrs: dict[str, Any],
    a: np.ndarray,
    b: np.ndarray | None,
    out: np.ndarray,
    compute_dtype: str,
) -> np.ndarray:
    """out = op(a, b); ``a`` is float (in ``out.dtype``) or an int32 accumulator,
    ``b`` an operand already broadcastable in the same (channels-last) axes."""
    if op == "requantize":
        from .qnum import requantize_into

        requantize_into(a, attrs["scale"], attrs["zero_point"], out)
        return out
    if a.dtype != out.dtype:  # int32 accumulator: float(acc), exact below 2**24
        np.copyto(out, a, casting="unsafe")
        a = out
    if op in ("add", "bias"):
        np.add(a, _operand(b), out=out)
    elif op == "mul":
        np.multiply(a, _operand(b), out=out)
    elif op == "scale":
        np.multiply(a, out.dtype.type(attrs["factor"]), out=out)
    elif op == "relu":
        np.maximum(a, out.dtype.type(0), out=out)
    elif op == "clamp":
        np.clip(a, out.dtype.type(attrs["lo"]), out.dtype.type(attrs["hi"]), out=out)
    else:
        name = "gelu_tanh" if op == "gelu" and attrs["approximate"] == "tanh" else op
        _ufuncs()[name](a, out=out)
    _round_to(out, compute_dtype)
    return out
