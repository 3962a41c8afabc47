"""ONNX interop: run ONNX conv operators, and small conv models, on convengine.

    import convengine.onnx as ceo
    (y,) = ceo.run_node(node, [x, w, b])          # Conv, ConvTranspose, ConvInteger, QLinearConv
    outputs = ceo.run_model("model.onnx", [x])    # conv nodes plus the ops around them

Attribute semantics follow the current opset and the ONNX reference implementation
(``onnx.reference``), whose outputs the ONNX backend tests store. Needs the ``onnx``
extra. Tensors are NCHW, as ONNX defines them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx  # absolute import: the onnx package, not this module
from onnx import numpy_helper

from . import api
from .errors import ConvSetupError

__all__ = ["SUPPORTED_OPS", "run_model", "run_node"]

Array = np.ndarray


# ------------------------------------------------------------------ attributes


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes as Python values (strings decoded, tensors as arrays)."""
    attrs: dict[str, Any] = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        attrs[a.name] = value
    return attrs


def _ints(attrs: Mapping[str, Any], name: str, ndim: int, default: int) -> tuple[int, ...]:
    values = tuple(int(v) for v in attrs.get(name, [default] * ndim))
    if len(values) != ndim:
        raise ConvSetupError(f"attribute {name} needs {ndim} values (one per spatial dim), "
                             f"got {list(values)}")
    return values


def _pads(attrs: Mapping[str, Any], ndim: int) -> tuple[tuple[int, int], ...]:
    """ONNX ``pads`` [x1_begin, x2_begin, ..., x1_end, x2_end, ...] -> (lo, hi) pairs."""
    pads = [int(p) for p in attrs.get("pads", [0] * 2 * ndim)]
    if len(pads) != 2 * ndim:
        raise ConvSetupError(f"attribute pads needs {2 * ndim} values (begin and end per "
                             f"spatial dim), got {pads}")
    return tuple((pads[i], pads[i + ndim]) for i in range(ndim))


AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _auto_pad(attrs: Mapping[str, Any]) -> str:
    mode = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if mode not in AUTO_PADS:
        raise ConvSetupError(f"attribute auto_pad={mode!r}; expected one of {AUTO_PADS}")
    return str(mode)


def _conv_padding(attrs: Mapping[str, Any], ndim: int) -> Any:
    """Conv/pool padding for convengine: explicit pairs or a mode string."""
    mode = _auto_pad(attrs)
    if mode == "SAME_UPPER":
        return "same"
    if mode == "SAME_LOWER":
        return "same_lower"
    if mode == "VALID":
        return "valid"
    return _pads(attrs, ndim)


def _check_kernel_shape(attrs: Mapping[str, Any], kernel: tuple[int, ...]) -> None:
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != kernel:
        raise ConvSetupError(
            f"attribute kernel_shape={list(attrs['kernel_shape'])} does not match the "
            f"weight's spatial shape {list(kernel)}"
        )


def _conv_args(x: Array, w: Array, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """stride/padding/dilation/groups for a forward conv node (Conv, ConvInteger, ...)."""
    if x.ndim < 3:
        raise ConvSetupError(f"input X must have at least 3 dims (N, C, spatial), got "
                             f"shape {x.shape}")
    ndim = x.ndim - 2
    _check_kernel_shape(attrs, tuple(w.shape[2:]))
    return {
        "stride": _ints(attrs, "strides", ndim, 1),
        "padding": _conv_padding(attrs, ndim),
        "dilation": _ints(attrs, "dilations", ndim, 1),
        "groups": int(attrs.get("group", 1)),
    }


# ------------------------------------------------------------------ conv operators


def _conv(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, w, b = _operands(inputs, "Conv", 2, 3)
    return [api.conv(x, w, b, **_conv_args(x, w, attrs))]


def _conv_transpose(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """ConvTranspose. Pads, ``output_shape`` and ``output_padding`` select a window
    ``out[j] = full[j + begin]`` of the full transposed output (zero outside it); the
    engine computes the part of the window that overlaps ``full``."""
    x, w, b = _operands(inputs, "ConvTranspose", 2, 3)
    ndim = x.ndim - 2
    kernel = tuple(w.shape[2:])
    _check_kernel_shape(attrs, kernel)
    stride = _ints(attrs, "strides", ndim, 1)
    dilation = _ints(attrs, "dilations", ndim, 1)
    out_pad = _ints(attrs, "output_padding", ndim, 0)
    groups = int(attrs.get("group", 1))
    full = [(n - 1) * s + d * (k - 1) + 1
            for n, s, d, k in zip(x.shape[2:], stride, dilation, kernel, strict=True)]
    shape = attrs.get("output_shape")
    if shape is not None:
        shape = [int(v) for v in shape][-ndim:]  # some exporters include N and C
    mode = _auto_pad(attrs)
    if "pads" not in attrs and mode in ("SAME_UPPER", "SAME_LOWER"):
        target = shape or [n * s for n, s in zip(x.shape[2:], stride, strict=True)]
        total = [f + op - t for f, op, t in zip(full, out_pad, target, strict=True)]
        begin = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in total]
        length = list(target)
    else:
        pairs = _pads(attrs, ndim) if mode == "NOTSET" else ((0, 0),) * ndim
        begin = [lo for lo, _ in pairs]
        length = shape or [f + op - lo - hi
                           for f, op, (lo, hi) in zip(full, out_pad, pairs, strict=True)]
    if min(length) < 1:
        raise ConvSetupError(f"ConvTranspose output would be empty: spatial shape {length}")
    lo_core = [max(bg, 0) for bg in begin]
    hi_core = [max(f - bg - n, 0) for f, bg, n in zip(full, begin, length, strict=True)]
    core = [f - lo - hi for f, lo, hi in zip(full, lo_core, hi_core, strict=True)]
    c_out = w.shape[1] * groups
    if min(core) >= 1:
        pairs = list(zip(lo_core, hi_core, strict=True))
        y = api.conv_transpose(x, w, None, stride=stride, padding=pairs, dilation=dilation,
                               groups=groups)
        before = [lo - bg for lo, bg in zip(lo_core, begin, strict=True)]
        after = [n - a - c for n, a, c in zip(length, before, core, strict=True)]
        y = np.pad(y, ((0, 0), (0, 0), *zip(before, after, strict=True)))
    else:  # the window misses every output the kernel reaches
        y = np.zeros((x.shape[0], c_out, *length), dtype=x.dtype)
    if b is not None:
        y = y + b.astype(y.dtype).reshape(-1, *(1,) * ndim)
    return [y]


def _qconv() -> Callable[..., Array]:
    """convengine's quantized conv, imported when a quantized node runs."""
    from .quant import qconv

    return qconv


def _conv_integer(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, w, x_zp, w_zp = _operands(inputs, "ConvInteger", 2, 4)
    x_zp = np.zeros((), x.dtype) if x_zp is None else x_zp
    w_zp = np.zeros((), w.dtype) if w_zp is None else w_zp
    y = _qconv()(x, 1.0, x_zp, w, 1.0, w_zp, out_dtype=np.int32, **_conv_args(x, w, attrs))
    return [y]


def _qlinear_conv(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, xs, xzp, w, ws, wzp, ys, yzp, b = _operands(inputs, "QLinearConv", 8, 9)
    y = _qconv()(x, xs, xzp, w, ws, wzp, b, out_scale=ys, out_zero_point=yzp,
                 out_dtype=yzp.dtype, bias_mode="int32", **_conv_args(x, w, attrs))
    return [y]


# ------------------------------------------------------------------ ops around convs


def _relu(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = _operands(inputs, "Relu", 1, 1)
    return [np.maximum(x, np.zeros((), x.dtype))]


def _add(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    a, b = _operands(inputs, "Add", 2, 2)
    return [np.add(a, b)]


def _mul(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    a, b = _operands(inputs, "Mul", 2, 2)
    return [np.multiply(a, b)]


def _identity(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = _operands(inputs, "Identity", 1, 1)
    return [x]


def _constant(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    if "value" not in attrs:
        raise NotImplementedError(f"Constant supports the 'value' attribute only, got "
                                  f"{sorted(attrs)}")
    return [np.asarray(attrs["value"])]


def _batch_norm(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, scale, bias, mean, var = _operands(inputs, "BatchNormalization", 5, 5)
    if attrs.get("training_mode", 0):
        raise NotImplementedError("BatchNormalization with training_mode=1 is not supported "
                                  "(inference only)")
    shape = (-1, *(1,) * (x.ndim - 2))
    eps = np.float32(attrs.get("epsilon", 1e-5))
    inv = (scale / np.sqrt(var + eps)).reshape(shape)
    return [((x - mean.reshape(shape)) * inv + bias.reshape(shape)).astype(x.dtype)]


def _global_average_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any]
                         ) -> list[Array]:
    (x,) = _operands(inputs, "GlobalAveragePool", 1, 1)
    return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=x.dtype)]


def _flatten(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = _operands(inputs, "Flatten", 1, 1)
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


def _gemm(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    a, b, c = _operands(inputs, "Gemm", 2, 3)
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = np.float32(attrs.get("alpha", 1.0)) * (a @ b)
    if c is not None:
        y = y + np.float32(attrs.get("beta", 1.0)) * c
    return [y.astype(a.dtype)]


def _max_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """MaxPool (auto_pad, pads, strides, dilations, ceil_mode); no Indices output."""
    (x,) = _operands(inputs, "MaxPool", 1, 1)
    ndim = x.ndim - 2
    kernel = _ints(attrs, "kernel_shape", ndim, 0)
    stride = _ints(attrs, "strides", ndim, 1)
    dilation = _ints(attrs, "dilations", ndim, 1)
    mode = _auto_pad(attrs)
    sizes = x.shape[2:]
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        from .problem import same_padding

        pads = same_padding(sizes, kernel, stride, dilation, lower=mode == "SAME_LOWER")
    else:
        pads = _pads(attrs, ndim) if mode == "NOTSET" else ((0, 0),) * ndim
    ceil = bool(attrs.get("ceil_mode", 0)) and mode == "NOTSET"
    out, hi_extra = [], []
    for n, k, s, d, (lo, hi) in zip(sizes, kernel, stride, dilation, pads, strict=True):
        span = n + lo + hi - (d * (k - 1) + 1)
        size = (-(-span // s) if ceil else span // s) + 1
        if ceil and (size - 1) * s >= n + lo:  # the last window must start inside
            size -= 1
        out.append(size)
        hi_extra.append(max((size - 1) * s + d * (k - 1) + 1 - (n + lo + hi), 0))
    lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    widths = [(lo, hi + e) for (lo, hi), e in zip(pads, hi_extra, strict=True)]
    xp = np.pad(x, ((0, 0), (0, 0), *widths), constant_values=lowest)
    y = np.full((*x.shape[:2], *out), lowest, dtype=x.dtype)
    for offset in np.ndindex(*kernel):
        window = tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                       for o, d, s, m in zip(offset, dilation, stride, out, strict=True))
        np.maximum(y, xp[(slice(None), slice(None), *window)], out=y)
    return [y]


Op = Callable[[Sequence["Array | None"], Mapping[str, Any]], list[Array]]

OPS: dict[str, Op] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "ConvInteger": _conv_integer,
    "QLinearConv": _qlinear_conv,
    "Relu": _relu,
    "Add": _add,
    "Mul": _mul,
    "BatchNormalization": _batch_norm,
    "MaxPool": _max_pool,
    "GlobalAveragePool": _global_average_pool,
    "Flatten": _flatten,
    "Gemm": _gemm,
    "Identity": _identity,
    "Constant": _constant,
}
SUPPORTED_OPS = tuple(OPS)
# outputs that exist in the operator but that this runner does not produce
_SINGLE_OUTPUT = {"BatchNormalization", "MaxPool"}


def _operands(inputs: Sequence[Array | None], op: str, required: int, total: int
              ) -> list[Any]:
    """Pad optional inputs with None; check the required ones are there."""
    items = list(inputs) + [None] * (total - len(inputs))
    if len(items) > total:
        raise ConvSetupError(f"{op} takes at most {total} inputs, got {len(inputs)}")
    missing = [i for i in range(required) if items[i] is None]
    if missing:
        raise ConvSetupError(f"{op} needs inputs {list(range(required))}; missing {missing}")
    return [None if a is None else np.asarray(a) for a in items]


# ------------------------------------------------------------------ public


def run_node(node: onnx.NodeProto, inputs: Sequence[Any]) -> list[Array]:
    """Execute one ONNX node; ``inputs`` follow ``node.input`` (None for an omitted
    optional input). Returns the outputs in ``node.output`` order."""
    if not isinstance(node, onnx.NodeProto):
        raise TypeError(f"node must be an onnx.NodeProto, got {type(node).__name__}")
    if node.domain not in ("", "ai.onnx"):
        raise NotImplementedError(
            f"ONNX operator {node.domain}::{node.op_type} is not supported by convengine.onnx "
            f"(only the default domain); supported: {', '.join(SUPPORTED_OPS)}"
        )
    if node.op_type not in OPS:
        raise NotImplementedError(
            f"ONNX operator {node.op_type!r} (node {node.name!r}) is not supported by "
            f"convengine.onnx; supported: {', '.join(SUPPORTED_OPS)}"
        )
    if node.op_type in _SINGLE_OUTPUT and len([o for o in node.output if o]) > 1:
        raise NotImplementedError(
            f"{node.op_type} node {node.name!r} asks for {len(node.output)} outputs; "
            f"convengine.onnx produces only the first (Y)"
        )
    return OPS[node.op_type](list(inputs), attributes(node))


def run_model(
    model: str | os.PathLike[str] | onnx.ModelProto,
    inputs: Mapping[str, Any] | Sequence[Any],
) -> list[Array]:
    """Run a model of conv-family nodes and the ops around them (``SUPPORTED_OPS``).

    ``model`` is a path or a ModelProto; ``inputs`` maps graph input names to arrays,
    or lists them in the order of the graph inputs that are not initializers.
    Returns the graph outputs in order. Other operators raise NotImplementedError.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model))
    graph = model.graph
    env: dict[str, Any] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    feeds = [i.name for i in graph.input if i.name not in env]
    if isinstance(inputs, Mapping):
        unknown = set(inputs) - {i.name for i in graph.input}
        if unknown:
            raise ConvSetupError(f"unknown model inputs {sorted(unknown)}; the graph takes "
                                 f"{feeds}")
        env.update(inputs)
    else:
        if len(inputs) != len(feeds):
            raise ConvSetupError(f"the model takes {len(feeds)} inputs {feeds}, got "
                                 f"{len(inputs)}")
        env.update(zip(feeds, inputs, strict=True))
    missing = [name for name in feeds if name not in env]
    if missing:
        raise ConvSetupError(f"missing model inputs {missing}")
    for node in graph.node:
        unknown_inputs = [n for n in node.input if n and n not in env]
        if unknown_inputs:
            raise ConvSetupError(f"node {node.name!r} ({node.op_type}) reads undefined "
                                 f"tensors {unknown_inputs}; is the graph sorted?")
        outputs = run_node(node, [env[n] if n else None for n in node.input])
        env.update((name, value) for name, value in zip(node.output, outputs, strict=False)
                   if name)
    return [env[o.name] for o in graph.output]
