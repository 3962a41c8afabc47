"""Checks of an ONNX model's content before :class:`~convengine.onnx.Session` builds
anything from it: a model file is input from outside, and a malformed, truncated or
hostile one must end in a :class:`ConvSetupError` naming the node (name and op type) or
the field, never in an internal exception, an out-of-bounds access or an allocation
sized by a declared dimension.

- :func:`load`: the model from a ModelProto, bytes or a path; decode errors name the
  file and the cause;
- :func:`tensor_array`: an initializer or tensor attribute as an array, once its data
  type, dims (non-negative, at most ``max_elements`` (:mod:`convengine.config`) elements) and data size
  agree, and its data is in the model (not an external file);
- :func:`parse_nodes`, :func:`check_graph`: every name valid UTF-8, input counts within the
  operator's schema, each tensor defined once and before it is read (no cycles, no
  missing inputs), the conv and pool attributes sane, quantization parameters
  per-tensor or per-channel of the right length.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import problem
from ..errors import ConvSetupError
from . import proto

if TYPE_CHECKING:  # annotations only: the messages are read through .proto, not onnx
    import onnx

# the com.microsoft operators' (min, max) inputs; .proto has the default domain's
_MICROSOFT_INPUTS = {"QLinearAdd": (7, 8), "QLinearGlobalAveragePool": (5, 5),
                     "QLinearConcat": (5, 1 << 30), "QGemm": (6, 9)}
# ops with conv / pool attributes, and the input index of their weight
_WINDOWED = {"Conv": 1, "ConvTranspose": 1, "ConvInteger": 1, "QLinearConv": 3,
             "MaxPool": None, "AveragePool": None}


def source_name(model: Any) -> str | None:
    """How error messages name a model: its path, or None."""
    return repr(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else None


def load(model: Any) -> onnx.ModelProto:
    """``model`` (a ModelProto, a path or the model's bytes) as a ModelProto, without
    the onnx package (:func:`.proto.load_model`; a path's external data read from its
    directory); a file that cannot be read or decoded is a ConvSetupError naming it and
    the cause."""
    if proto.is_message(model, "ModelProto"):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        what = "ONNX model (bytes)"
    elif isinstance(model, (str, os.PathLike)):
        what = f"ONNX model {os.fspath(model)!r}"
    else:
        raise TypeError(f"model must be an onnx.ModelProto, a path or the model's bytes, "
                        f"got {type(model).__name__}")
    try:
        return proto.load_model(model, problem.max_elements())
    except ConvSetupError:
        raise
    except OSError as error:
        raise ConvSetupError(f"{what} cannot be read: {error}") from error
    except Exception as error:  # protobuf's DecodeError, UnicodeDecodeError
        raise ConvSetupError(f"{what} is not a valid ONNX model (a truncated or damaged "
                             f"file?): {type(error).__name__}: {error}") from error


def check_text(get: Any, what: str) -> str:
    """A string field, read: invalid UTF-8 (protobuf hands it back as bytes, or raises)
    is a ConvSetupError."""
    try:
        value = get()
    except UnicodeDecodeError as error:
        raise ConvSetupError(f"{what} is not valid UTF-8 (a damaged file?): {error}"
                             ) from error
    if not isinstance(value, str):
        raise ConvSetupError(f"{what} {value!r} is not valid UTF-8 (a damaged file?)")
    return value


def tensor_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """The tensor ``t`` as an array, after its declared dims and data agree; ``what``
    names it in errors ("initializer 'w'")."""
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise ConvSetupError(f"{what}: negative dim in its shape {dims}")
    count = math.prod(dims)
    if count > problem.max_elements():
        raise ConvSetupError(f"{what}: its shape {dims} declares {count:,} elements, more "
                             f"than the {problem.max_elements():,} allowed "
                             f"({problem.LIMIT_NAME})")
    try:
        array = proto.to_array(t, what)
    except ConvSetupError:
        raise
    except Exception as error:
        raise ConvSetupError(f"{what}: {type(error).__name__}: {error}") from error
    if array.size != count:
        raise ConvSetupError(f"{what}: shape {dims} declares {count:,} values, its data "
                             f"holds {array.size:,}")
    return array


def _schema_inputs(domain: str, op: str, opsets: Mapping[str, int]) -> tuple[int, int] | None:
    """(min, max) inputs of the operator at the model's opset, if known."""
    domain = "" if domain == "ai.onnx" else domain
    if domain == "com.microsoft":
        return _MICROSOFT_INPUTS.get(op)
    if domain:
        return None
    return proto.schema_inputs(op, opsets.get(domain, 21))


def _ints(attrs: Mapping[str, Any], name: str) -> list[int] | None:
    value = attrs.get(name)
    if value is None:
        return None
    try:
        return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    except (TypeError, ValueError):
        raise ConvSetupError(f"attribute {name} must be ints, got {value!r}") from None


def check_windowed(op: str, attrs: Mapping[str, Any], w: np.ndarray | None) -> None:
    """A conv's or pool's attributes: one value per spatial dim, strides, dilations
    and kernel_shape positive, pads non-negative (2 per dim), ``group`` positive and
    dividing the constant weight's output channels."""
    lengths = {}
    for name in ("kernel_shape", "strides", "dilations", "pads", "output_padding"):
        values = _ints(attrs, name)
        if values is None:
            continue
        least = 0 if name in ("pads", "output_padding") else 1
        if any(v < least for v in values):
            raise ConvSetupError(f"attribute {name}={values}: each value must be >= {least}")
        if any(v > problem.max_elements() for v in values):
            raise ConvSetupError(f"attribute {name}={values}: a value over "
                                 f"{problem.max_elements():,} ({problem.LIMIT_NAME})")
        lengths[name] = len(values) // 2 if name == "pads" else len(values)
        if name == "pads" and len(values) % 2:
            raise ConvSetupError(f"attribute pads={values} needs 2 values per spatial dim")
    if w is not None:
        if w.ndim < 3:
            raise ConvSetupError(f"weight W must have at least 3 dims (O, C/group, kernel), "
                                 f"got shape {list(w.shape)}")
        lengths["the weight's kernel"] = w.ndim - 2
    elif op in ("MaxPool", "AveragePool") and "kernel_shape" not in attrs:
        raise ConvSetupError(f"{op} needs attribute kernel_shape")
    if len(set(lengths.values())) > 1:
        raise ConvSetupError(f"attributes disagree on the number of spatial dims: "
                             f"{', '.join(f'{k}: {v}' for k, v in lengths.items())}")
    group = _ints(attrs, "group")
    if group is not None:
        if len(group) != 1 or group[0] < 1:
            raise ConvSetupError(f"attribute group={attrs['group']!r} must be a positive int")
        if w is not None and op != "ConvTranspose" and w.shape[0] % group[0]:
            raise ConvSetupError(f"attribute group={group[0]} does not divide the weight's "
                                 f"{w.shape[0]} output channels")


def check_quant_params(op: str, inputs: list[str], attrs: Mapping[str, Any],
                       consts: Mapping[str, np.ndarray]) -> None:
    """Constant scales and zero points: QLinearConv's x/y ones per tensor, its w ones
    per tensor or per output channel, its bias one int32 per output channel; a
    QuantizeLinear's / DequantizeLinear's scale and zero point of one shape, per tensor
    or one per index of ``axis`` of a constant x; the com.microsoft ops' per tensor."""
    def get(i: int) -> np.ndarray | None:
        return consts.get(inputs[i]) if len(inputs) > i and inputs[i] else None

    names: dict[int, str] = {}
    if op == "QLinearConv":
        names = {1: "x_scale", 2: "x_zero_point", 6: "y_scale", 7: "y_zero_point"}
        w = get(3)
        for i, name in ((4, "w_scale"), (5, "w_zero_point")):
            v = get(i)
            if v is not None and v.ndim > 1:
                raise ConvSetupError(f"input {name} must be a scalar or 1-D, got shape "
                                     f"{list(v.shape)}")
            if v is not None and w is not None and w.ndim and v.size not in (1, w.shape[0]):
                raise ConvSetupError(f"input {name} has {v.size} values; expected 1 (per "
                                     f"tensor) or {w.shape[0]} (per output channel)")
        b = get(8)
        if b is not None and w is not None and w.ndim and b.shape != (w.shape[0],):
            raise ConvSetupError(f"input B must have shape [{w.shape[0]}] (one int32 per "
                                 f"output channel), got {list(b.shape)}")
    elif op in ("QuantizeLinear", "DequantizeLinear"):
        x, scale, zp = get(0), get(1), get(2)
        if scale is not None and zp is not None and scale.size != zp.size:
            raise ConvSetupError(f"scale (shape {list(scale.shape)}) and zero point (shape "
                                 f"{list(zp.shape)}) must have one size")
        if scale is not None and scale.ndim > 1:
            raise ConvSetupError(f"scale must be a scalar or 1-D, got shape "
                                 f"{list(scale.shape)}")
        if scale is not None and x is not None and scale.size != 1:
            axis = _ints(attrs, "axis") or [1]
            if not -x.ndim <= axis[0] < x.ndim or scale.size != x.shape[axis[0]]:
                raise ConvSetupError(
                    f"scale has {scale.size} values; expected 1 or one per index of axis "
                    f"{axis[0]} of x (shape {list(x.shape)})")
    elif op == "QLinearAdd":
        names = {1: "A_scale", 2: "A_zero_point", 4: "B_scale", 5: "B_zero_point",
                 6: "C_scale", 7: "C_zero_point"}
    elif op == "QLinearGlobalAveragePool":
        names = {1: "x_scale", 2: "x_zero_point", 3: "y_scale", 4: "y_zero_point"}
    for i, name in names.items():
        v = get(i)
        if v is not None and v.size != 1:
            raise ConvSetupError(f"input {name} must be per tensor (1 value), got shape "
                                 f"{list(v.shape)}")


Parsed = tuple[str, str, str, list[str], list[str], dict[str, Any]]


def parse_nodes(model: onnx.ModelProto) -> list[Parsed]:
    """Every node as (name, op_type, domain, inputs, outputs, attributes), its strings
    valid UTF-8 and its attributes readable."""
    from .ops import attributes

    graph = model.graph
    parsed: list[Parsed] = []
    for i, node in enumerate(graph.node):
        op = check_text(lambda n=node: n.op_type, f"node #{i}'s op_type")
        name = check_text(lambda n=node: n.name, f"node #{i} ({op})'s name") or f"{op}_{i}"
        label = f"node {name!r} ({op})"
        domain = check_text(lambda n=node: n.domain, f"{label}'s domain")
        inputs = [check_text(lambda s=s: s, f"{label}'s input name") for s in node.input]
        outputs = [check_text(lambda s=s: s, f"{label}'s output name") for s in node.output]
        try:
            attrs = attributes(node)
        except Exception as error:
            raise ConvSetupError(f"{label}: an attribute cannot be read: "
                                 f"{type(error).__name__}: {error}") from error
        parsed.append((name, op, domain, inputs, outputs, attrs))
    return parsed


def check_graph(model: onnx.ModelProto, parsed: list[Parsed],
                consts: Mapping[str, np.ndarray]) -> None:
    """The nodes' (:func:`parse_nodes`) input counts (the operator's schema),
    definitions before use, attributes and constant quantization parameters;
    ``consts`` the initializers."""
    graph = model.graph
    opsets = {check_text(lambda o=o: o.domain, "an opset_import's domain"): o.version
              for o in model.opset_import}
    opsets[""] = opsets.get("ai.onnx", opsets.get("", 21))
    defined: dict[str, str] = {n: "an initializer" for n in consts}
    for i, v in enumerate(graph.input):
        defined.setdefault(check_text(lambda v=v: v.name, f"graph input #{i}'s name"),
                           "a graph input")
    makers: dict[str, int] = {}
    for i, (*_, outputs, _) in enumerate(parsed):
        for out in outputs:
            if out:
                makers.setdefault(out, i)
    for name, op, domain, inputs, outputs, attrs in parsed:
        label = f"node {name!r} ({op})"
        counts = _schema_inputs(domain, op, opsets)
        used = len(inputs) - next((k for k, s in enumerate(reversed(inputs)) if s),
                                  len(inputs))
        if counts is not None and not counts[0] <= used <= counts[1]:
            raise ConvSetupError(f"{label}: {used} inputs {inputs}; {op} takes "
                                 f"{counts[0]} to {counts[1]}")
        if counts is not None and any(not s for s in inputs[:counts[0]]):
            raise ConvSetupError(f"{label}: inputs {inputs}; the first {counts[0]} are "
                                 f"required")
        for tensor in inputs:
            if not tensor or tensor in defined:
                continue
            later = makers.get(tensor)
            if later is not None:
                raise ConvSetupError(
                    f"{label} reads {tensor!r} before node {parsed[later][0]!r} makes it "
                    f"(a cycle, or nodes out of topological order)")
            raise ConvSetupError(f"{label} reads {tensor!r}, which no node, graph input or "
                                 f"initializer defines")
        if not any(outputs):
            raise ConvSetupError(f"{label} has no outputs")
        for tensor in outputs:
            if tensor and tensor in defined:
                raise ConvSetupError(f"{label}: its output {tensor!r} is already "
                                     f"{defined[tensor]}")
            if tensor:
                defined[tensor] = f"the output of {label}"
        try:
            if op in _WINDOWED:
                index = _WINDOWED[op]
                w = consts.get(inputs[index]) if index is not None and len(inputs) > index \
                    else None
                check_windowed(op, attrs, w)
                b = consts.get(inputs[2]) if op == "Conv" and len(inputs) > 2 else None
                if w is not None and b is not None and b.shape != w.shape[:1]:
                    raise ConvSetupError(f"bias B must have shape [{w.shape[0]}] (one per "
                                         f"output channel), got {list(b.shape)}")
            check_quant_params(op, inputs, attrs, consts)
        except ConvSetupError as error:
            raise ConvSetupError(f"{label}: {error}") from error
    for i, v in enumerate(graph.output):
        out = check_text(lambda v=v: v.name, f"graph output #{i}'s name")
        if out not in defined:
            raise ConvSetupError(f"graph output {out!r}: no node, graph input or "
                                 f"initializer defines it")
