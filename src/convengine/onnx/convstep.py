"""A float Conv node prepared once (:class:`ConvStep`): the conv a
:class:`convengine.prepared.PreparedConv` (weights laid out channels-last and packed
once for the algorithm convengine's heuristic picks per input shape, the kernel called
directly: no per-call validation, weight-cache lookup or NaN scan of constant
weights), with bias + residual + ReLU / ReLU6 / SiLU as its epilogue (in the
kernel's store or one parallel pass over the output).

Weights holding NaN or infinity, dtypes other than float32 and empty batches take
:func:`convengine.conv` (the NaN rule); activations the fused pass lacks run in numpy
after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import api
from ..errors import ConvSetupError
from ..prepared import PreparedConv
from .ops import Array, hard_sigmoid, sigmoid, to_first, to_last


def fused_activation(step: tuple[str, Any]) -> str | None:
    """The fused pass's name for an epilogue step ("relu", "relu6", "silu"), or None."""
    kind, arg = step
    if kind in ("relu", "silu"):
        return kind
    if kind == "clip":
        lo, hi = (None if v is None else float(np.asarray(v)) for v in arg)
        if lo == 0 and hi is None:
            return "relu"
        if lo == 0 and hi == 6:
            return "relu6"
    return None


def apply_steps(y: Array, steps: Sequence[tuple[str, Any]], extra: Sequence[Array]) -> Array:
    """The epilogue ``steps`` on the conv output ``y`` in numpy (in place where shapes
    allow): ``("add", i)`` adds ``extra[i]``, then relu, clip (lo, hi), leaky (alpha),
    sigmoid, silu, hardswish, hardsigmoid (alpha, beta)."""
    for kind, arg in steps:
        if kind == "add":
            r = extra[arg]
            if np.broadcast_shapes(y.shape, r.shape) == y.shape and r.dtype == y.dtype:
                np.add(y, r, out=y)
            else:
                y = y + r
        elif kind == "relu":
            np.maximum(y, 0, out=y)
        elif kind == "clip":
            lo, hi = arg
            if lo is not None:
                np.maximum(y, y.dtype.type(lo), out=y)
            if hi is not None:
                np.minimum(y, y.dtype.type(hi), out=y)
        elif kind == "leaky":
            np.multiply(y, y.dtype.type(arg), out=y, where=y < 0)
        elif kind == "sigmoid":
            y[...] = sigmoid(y)
        elif kind == "silu":
            y *= sigmoid(y)
        elif kind == "hardswish":
            y *= hard_sigmoid(y, 1 / 6, 0.5)
        elif kind == "hardsigmoid":
            y[...] = hard_sigmoid(y, *arg)
    return y


class ConvStep:
    """``step(x, extra) -> y``: the conv of NCHW-shaped ``x`` (a view of channels-last
    memory, as every step returns) with w ``(O, C/g, *K)``, bias ``(O,)`` or None,
    then ``steps`` (``("add", i)`` adds ``extra[i]``, then activations); y an NCHW view
    of channels-last memory."""

    def __init__(self, w: Array, b: Array | None, args: Mapping[str, Any],
                 steps: Sequence[tuple[str, Any]]) -> None:
        self.bias = None if b is None else np.ascontiguousarray(b, dtype=w.dtype)
        self.steps = list(steps)
        adds = [arg for kind, arg in self.steps if kind == "add"]
        self.residual = adds[0] if len(adds) == 1 and self.steps[0][0] == "add" else None
        rest = self.steps[1:] if self.residual is not None else self.steps
        act = fused_activation(rest[0]) if len(rest) == 1 else None
        self.rest = [] if act else rest  # run in numpy after the fused epilogue
        self.conv = PreparedConv(np.moveaxis(w, 1, -1), bias=self.bias,
                                 activation=act or "none", layout="NHWC", **args)

    def __call__(self, x: Array, extra: Sequence[Array]) -> Array:
        xl = to_last(x)
        if not self.conv.serves(xl):
            y = to_first(api.conv(xl, self.conv.weights(), self.bias, layout="NHWC",
                                  **self.conv.args))
            return apply_steps(y, self.steps, extra)
        if self.residual is None:
            y = self.conv(xl)
        else:
            r = to_last(np.asarray(extra[self.residual]))
            if r.shape != self.conv.out_shape(xl) or r.dtype != np.float32:
                # a broadcasting residual: the bias fused, the rest in numpy
                y = to_first(self.conv(xl, activation="none"))
                return apply_steps(y, self.steps, extra)
            y = self.conv(xl, np.ascontiguousarray(r))
        return apply_steps(to_first(y), self.rest, extra) if self.rest else to_first(y)


class GemmStep:
    """``step(a (M, K)) -> (M, N)``: ONNX Gemm with a constant B and C, ``alpha`` 1 and
    ``transA`` 0, as a 1x1 conv of M pixels (:class:`PreparedConv`: B packed once and
    kept only so, ``beta * C`` added in the kernel's store, the rows on convengine's
    threads) instead of a single-threaded BLAS call. :func:`gemm_step` says whether it
    serves a node; a float32 ``a`` of K columns is what a float graph feeds it."""

    def __init__(self, b: Array, c: Array | None, attrs: Mapping[str, Any]) -> None:
        w = b if attrs.get("transB", 0) else b.T  # (N, K)
        n = w.shape[0]
        bias = None if c is None else \
            np.broadcast_to((c * c.dtype.type(attrs.get("beta", 1.0))).reshape(-1), (n,))
        self.conv = PreparedConv(np.ascontiguousarray(w).reshape(n, 1, 1, -1), bias=bias,
                                 layout="NHWC")

    def __call__(self, a: Array) -> Array:
        k = self.conv.w_shape[-1]
        if a.dtype != np.float32 or a.ndim != 2 or a.shape[1] != k:
            raise ConvSetupError(f"Gemm: A must be a float32 (M, {k}) matrix, got "
                                 f"{a.dtype} of shape {a.shape}")
        y = self.conv(a.reshape(a.shape[0], 1, 1, k))
        return y.reshape(a.shape[0], -1)


def gemm_step(b: Array, c: Array | None, attrs: Mapping[str, Any]) -> bool:
    """Whether :class:`GemmStep` serves a Gemm node with constant B (2-D float32) and
    C (None, or float32 broadcasting along one row of the output)."""
    if b.ndim != 2:
        return False
    n = b.shape[0] if attrs.get("transB", 0) else b.shape[-1]
    return (b.dtype == np.float32 and not attrs.get("transA", 0)
            and float(attrs.get("alpha", 1.0)) == 1.0
            and (c is None or c.dtype == np.float32 and c.size in (1, n)
                 and c.ndim <= 2 and (c.ndim < 2 or c.shape[0] == 1)))
