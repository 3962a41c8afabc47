"""Ready-made graphs: PyTorch's quantized cuDNN conv, and conv + bias + activation.

``quantized_conv_cudnn`` builds the graph PyTorch's cuDNN backend builds for
``quantized::conv2d(_relu)`` (aten/src/ATen/native/quantized/cudnn/Conv.cpp)::

    acc   = conv(x_q, w_q)                      int8 x int8 -> exact int32
    b     = bias * f32(1 / (sx * sw))           bias multiplier, double -> float32
    v     = f32(acc) + b                        float32
    v     = relu(v)                             (optional)
    y_q   = saturate(rint(v * f32(sx * sw / sy)) + y_zp)

Symmetric int8 (zero points 0 on x and w), as that path requires.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..problem import make_problem
from .builder import Graph
from .ir import Tensor

ACTIVATIONS = ("none", "relu", "sigmoid", "silu", "gelu", "gelu_tanh")


def _f32(value: float) -> float:
    """A double rounded to float32 (as PyTorch's fill_ of a float tensor), as a float."""
    return float(np.float32(value))


def quantized_conv_cudnn(
    x_shape: Any, w_shape: Any, *, x_scale: float, w_scale: float, y_scale: float,
    y_zero_point: int = 0, bias: bool = True, relu: bool = True, stride: Any = 1,
    padding: Any = 0, dilation: Any = 1, groups: int = 1, layout: str = "NCHW",
    x_dtype: str = "int8",
) -> tuple[Graph, dict[str, Tensor]]:
    """The graph and its tensors ``{"x", "w", "bias" (if any), "y"}``; y is int8."""
    g = Graph(io_dtype="int8", compute_dtype="float32", layout=layout)
    t = {"x": g.tensor("x", x_shape, x_dtype), "w": g.tensor("w", w_shape, "int8")}
    v = g.conv_fprop(t["x"], t["w"], stride=stride, padding=padding, dilation=dilation,
                     groups=groups, name="conv")
    if bias:
        t["bias"] = g.tensor("bias", (tuple(w_shape)[0],), "float32")
        scaled = g.scale(t["bias"], _f32(1.0 / (x_scale * w_scale)), name="bias_mult")
        v = g.bias(v, scaled, name="add_bias")
    if relu:
        v = g.relu(v, name="relu")
    t["y"] = g.requantize(v, _f32(x_scale * w_scale / y_scale), y_zero_point, "int8",
                          name="requant").set_output()
    return g, t


def qconv_cudnn(x_q: Any, w_q: Any, bias: Any = None, *, x_scale: float, w_scale: float,
                y_scale: float, y_zero_point: int = 0, relu: bool = True,
                **conv_args: Any) -> np.ndarray:
    """Run :func:`quantized_conv_cudnn` on arrays through the (cached) plan."""
    x, w = np.asarray(x_q), np.asarray(w_q)
    g, t = quantized_conv_cudnn(
        x.shape, w.shape, x_scale=x_scale, w_scale=w_scale, y_scale=y_scale,
        y_zero_point=y_zero_point, bias=bias is not None, relu=relu,
        x_dtype=x.dtype.name, **conv_args)
    bindings = {t["x"]: x, t["w"]: w}
    if bias is not None:
        bindings[t["bias"]] = np.asarray(bias, np.float32)
    return g.build().execute(bindings)[t["y"]]


def conv_bias_act(
    x_shape: Any, w_shape: Any, *, activation: str = "relu", residual: bool = False,
    dtype: str = "float32", stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1, layout: str = "NCHW",
) -> tuple[Graph, dict[str, Tensor]]:
    """y = act(conv(x, w) + bias [+ r]); tensors ``{"x", "w", "bias", "r"?, "y"}``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    g = Graph(io_dtype=dtype, compute_dtype="float64" if dtype == "float64" else "float32",
              layout=layout)
    t = {"x": g.tensor("x", x_shape), "w": g.tensor("w", w_shape),
         "bias": g.tensor("bias", (tuple(w_shape)[0],))}
    v = g.conv_fprop(t["x"], t["w"], stride=stride, padding=padding, dilation=dilation,
                     groups=groups, name="conv")
    v = g.bias(v, t["bias"], name="add_bias")
    if residual:  # the residual has the conv output's shape
        y_shape = make_problem("forward", x_shape, w_shape, dtype=dtype, stride=stride,
                               padding=padding, dilation=dilation, groups=groups,
                               layout=layout).y_shape()
        t["r"] = g.tensor("r", y_shape)
        v = g.add(v, t["r"], name="add_residual")
    if activation == "gelu_tanh":
        v = g.gelu(v, approximate="tanh", name="act")
    elif activation != "none":
        v = getattr(g, activation)(v, name="act")
    t["y"] = v.set_output()
    return g, t
