"""A float Conv node prepared once (:class:`ConvStep`): the conv a
:class:`convengine.prepared.PreparedConv` (weights laid out channels-last and packed
once for the algorithm convengine's heuristic picks per input shape, the kernel called
directly: no per-call validation, weight-cache lookup or NaN scan of constant
weights), then bias + residual + ReLU / ReLU6 / SiLU in one parallel pass over the
output (:mod:`convengine.fused_epilogue`).

Weights holding NaN or infinity, dtypes other than float32 and empty batches take
:func:`convengine.conv` (the NaN rule); activations the fused pass lacks run in numpy
after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import api, fused_epilogue
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
        self.conv = PreparedConv(np.moveaxis(w, 1, -1), **args)
        out_channels = w.shape[0]
        self.bias = (np.zeros(out_channels, w.dtype) if b is None
                     else np.ascontiguousarray(b, dtype=w.dtype))
        self.steps = list(steps)
        adds = [arg for kind, arg in self.steps if kind == "add"]
        self.residual = adds[0] if len(adds) == 1 and self.steps[0][0] == "add" else None
        rest = self.steps[1:] if self.residual is not None else self.steps
        act = fused_activation(rest[0]) if len(rest) == 1 else None
        self.activation = act or "none"
        self.rest = [] if act else rest  # run in numpy after the fused pass

    def __call__(self, x: Array, extra: Sequence[Array]) -> Array:
        xl = to_last(x)
        if not self.conv.serves(xl):
            y = to_first(api.conv(xl, self.conv.weights(), self.bias, layout="NHWC",
                                  **self.conv.args))
            return apply_steps(y, self.steps, extra)
        y = self.conv(xl)
        rows = y.reshape(-1, y.shape[-1])
        residual, rest = None, self.rest
        if self.residual is not None:
            r = to_last(np.asarray(extra[self.residual]))
            if r.shape == y.shape and r.dtype == np.float32:
                residual = np.ascontiguousarray(r).reshape(rows.shape)
        if self.residual is None or residual is not None:
            fused_epilogue.apply(rows, self.bias, residual, self.activation)
        else:  # a broadcasting residual: bias fused, the rest in numpy
            fused_epilogue.apply(rows, self.bias, None, "none")
            rest = self.steps
        return apply_steps(to_first(y), rest, extra) if rest else to_first(y)
