"""The operation graph: tensors, nodes, validation and the canonical description.

A :class:`GraphDefinition` is built op by op (``g.conv_fprop``, ``g.bias``, ``g.relu``, ...);
op outputs are *virtual* tensors whose shapes are inferred by :meth:`GraphDefinition.validate`.
The canonical description (:class:`GraphKey`) is a JSON text of every tensor
(name, shape, strides, dtype, layout, alignment, role), every node (op, inputs,
output, normalised attributes) and the build flags; its SHA-256 is the stable hash
the plan cache keys on.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConvSetupError
from ..problem import FLOAT_DTYPES, LAYOUTS, ConvProblem, make_problem

INT_DTYPES = ("int8", "uint8", "int32")
QUANT_DTYPES = ("int8", "uint8")
DTYPES = (*FLOAT_DTYPES, *INT_DTYPES)
COMPUTE_DTYPES = FLOAT_DTYPES
REDUCED_DTYPES = ("float16", "bfloat16")
CONV_OPS = ("conv_fprop", "conv_dgrad", "conv_wgrad")
BINARY_OPS = ("add", "mul", "bias")
UNARY_OPS = ("scale", "relu", "clamp", "sigmoid", "silu", "gelu", "requantize")
POINTWISE_OPS = (*BINARY_OPS, *UNARY_OPS)
GELU_MODES = ("none", "tanh")
FORMAT_VERSION = 1


class Tensor:
    """A graph tensor: a user input (shape given) or an op output (shape inferred).

    Activations and weights (rank 3-5) are in ``layout``; lower ranks have none.
    """

    def __init__(
        self,
        graph: GraphDefinition,
        name: str,
        shape: tuple[int, ...] | None,
        dtype: str,
        layout: str | None,
        alignment: int,
        producer: str | None,
    ) -> None:
        self.graph = graph
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.layout = layout
        self.alignment = alignment
        self.producer = producer
        self.is_output = False

    @property
    def is_virtual(self) -> bool:
        """True for op outputs (no user buffer unless marked as an output)."""
        return self.producer is not None

    def set_output(self, flag: bool = True) -> Tensor:
        """Mark (or unmark) this op output as a result of the graph."""
        if not self.is_virtual:
            raise ConvSetupError(
                f"tensor {self.name!r} is a graph input; only op outputs can be outputs"
            )
        self.is_output = bool(flag)
        return self

    def __repr__(self) -> str:
        shape = "?" if self.shape is None else self.shape
        return f"Tensor({self.name!r}, shape={shape}, dtype={self.dtype})"


@dataclass
class Node:
    """One op: ``output = op(*inputs, **attrs)`` (inputs and output by tensor name)."""

    op: str
    name: str
    inputs: tuple[str, ...]
    output: str
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GraphKey:
    """The canonical description as JSON text; ``digest`` is its SHA-256 (stable
    across processes and machines, unlike ``hash()``)."""

    canonical: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()


def _dtype_name(dtype: Any) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in DTYPES:
        raise ConvSetupError(f"unsupported dtype {dtype!r}; expected one of {DTYPES}")
    if name == "bfloat16":  # the graph's arrays of it need numpy to know the name
        import ml_dtypes  # noqa: F401  (~0.6 s to import: only on the bfloat16 path)
    return name


def dense_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape`` (in its own layout)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def channel_axis(rank: int, layout: str | None) -> int:
    """Channel axis of a rank >= 3 tensor in ``layout``."""
    return 1 if layout == "NCHW" else rank - 1


class GraphDefinition:
    """A small operation graph: one or more convs and their pointwise epilogue
    (the description; :class:`convengine.Graph` adds ``build``).

    ``io_dtype`` is the default dtype of inputs and the dtype float outputs are
    returned in; ``compute_dtype`` is the dtype of float intermediates (float16 and
    bfloat16 are reduced precision: engines refuse them unless allowed).
    ``layout`` is declared here once, for every rank 3-5 tensor: ``"NCHW"`` (the
    default, as for :func:`convengine.conv`) or ``"NHWC"``; ``tensor(..., layout=)``
    may override it for one input.
    """

    def __init__(
        self, io_dtype: Any = "float32", compute_dtype: Any = "float32", layout: str = "NCHW"
    ) -> None:
        self.io_dtype = _dtype_name(io_dtype)
        self.compute_dtype = _dtype_name(compute_dtype)
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConvSetupError(
                f"compute_dtype must be one of {COMPUTE_DTYPES}, got {self.compute_dtype!r}"
            )
        if not isinstance(layout, str) or layout.upper() not in LAYOUTS:
            raise ConvSetupError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
        self.layout = layout.upper()
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []
        self.problems: dict[str, ConvProblem] = {}

    # ------------------------------------------------------------ building

    def tensor(
        self,
        name: str,
        shape: Any,
        dtype: Any = None,
        layout: str | None = None,
        alignment: int = 16,
    ) -> Tensor:
        """Declare a graph input. ``layout`` defaults to the graph's for rank 3-5."""
        self._check_name(name, "tensor")
        try:
            shape_t = tuple(int(v) for v in shape)
        except TypeError:
            raise TypeError(f"tensor {name!r}: shape must be a sequence of ints") from None
        if any(v < 0 for v in shape_t):
            raise ConvSetupError(f"tensor {name!r}: shape must be >= 0, got {shape_t}")
        if alignment < 1 or alignment & (alignment - 1):
            raise ConvSetupError(
                f"tensor {name!r}: alignment must be a power of two, got {alignment}"
            )
        if layout is not None and layout.upper() not in LAYOUTS:
            raise ConvSetupError(
                f"tensor {name!r}: unknown layout {layout!r}; expected one of {LAYOUTS}"
            )
        lay = (layout or self.layout).upper() if len(shape_t) >= 3 else None
        t = Tensor(self, name, shape_t, _dtype_name(dtype or self.io_dtype), lay, alignment, None)
        self.tensors[name] = t
        return t

    def _check_name(self, name: str, what: str) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{what} name must be a non-empty string, got {name!r}")
        if name in self.tensors or any(n.name == name for n in self.nodes):
            raise ConvSetupError(f"{what} name {name!r} is already used in this graph")

    def _add(self, op: str, inputs: tuple[Tensor, ...], name: str | None, **attrs: Any) -> Tensor:
        name = name or f"{op}_{len(self.nodes)}"
        self._check_name(name, "node")
        for t in inputs:
            if not isinstance(t, Tensor) or t.graph is not self:
                raise ConvSetupError(
                    f"node {name!r} ({op}): input {t!r} is not a tensor of this graph"
                )
        out = f"{name}.out"
        self._check_name(out, "tensor")
        self.nodes.append(Node(op, name, tuple(t.name for t in inputs), out, attrs))
        layout = inputs[0].layout
        t = Tensor(self, out, None, self.compute_dtype, layout, 16, name)
        self.tensors[out] = t
        return t

    def conv_fprop(
        self, x: Tensor, w: Tensor, *, stride: Any = 1, padding: Any = 0,
        dilation: Any = 1, groups: int = 1, name: str | None = None,
    ) -> Tensor:
        """y = conv(x, w). int8/uint8 x and w accumulate exactly into an int32 y."""
        return self._add("conv_fprop", (x, w), name, stride=stride, padding=padding,
                         dilation=dilation, groups=groups)

    def conv_dgrad(
        self, dy: Tensor, w: Tensor, *, input_shape: Any, stride: Any = 1, padding: Any = 0,
        dilation: Any = 1, groups: int = 1, name: str | None = None,
    ) -> Tensor:
        """dx (of ``input_shape``) = gradient of conv w.r.t. its input."""
        return self._add("conv_dgrad", (dy, w), name, input_shape=input_shape, stride=stride,
                         padding=padding, dilation=dilation, groups=groups)

    def conv_wgrad(
        self, x: Tensor, dy: Tensor, *, weight_shape: Any, stride: Any = 1, padding: Any = 0,
        dilation: Any = 1, groups: int = 1, name: str | None = None,
    ) -> Tensor:
        """dw (of ``weight_shape``) = gradient of conv w.r.t. its weight."""
        return self._add("conv_wgrad", (x, dy), name, weight_shape=weight_shape, stride=stride,
                         padding=padding, dilation=dilation, groups=groups)

    def add(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
        """a + b, b broadcast (numpy rules) to a's shape."""
        return self._add("add", (a, b), name)

    def mul(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
        """a * b, b broadcast (numpy rules) to a's shape."""
        return self._add("mul", (a, b), name)

    def bias(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
        """a + b along a's channel axis; b has shape ``(C,)``."""
        return self._add("bias", (a, b), name)

    def scale(self, a: Tensor, factor: float, name: str | None = None) -> Tensor:
        """a * factor (the factor as float32, or float64 in a float64 graph)."""
        return self._add("scale", (a,), name, factor=factor)

    def relu(self, a: Tensor, name: str | None = None) -> Tensor:
        return self._add("relu", (a,), name)

    def clamp(self, a: Tensor, lo: float, hi: float, name: str | None = None) -> Tensor:
        return self._add("clamp", (a,), name, lo=lo, hi=hi)

    def sigmoid(self, a: Tensor, name: str | None = None) -> Tensor:
        return self._add("sigmoid", (a,), name)

    def silu(self, a: Tensor, name: str | None = None) -> Tensor:
        return self._add("silu", (a,), name)

    def gelu(self, a: Tensor, approximate: str = "none", name: str | None = None) -> Tensor:
        """GELU, exact (erf) or ``approximate="tanh"`` as in PyTorch."""
        return self._add("gelu", (a,), name, approximate=approximate)

    def requantize(
        self, a: Tensor, scale: float, zero_point: int = 0, dtype: Any = "int8",
        name: str | None = None,
    ) -> Tensor:
        """q = saturate(round_half_even(a * scale) + zero_point) in float32 arithmetic;
        ``scale`` is the multiplier (e.g. ``sx * sw / sy``), as in cuDNN's graph."""
        return self._add("requantize", (a,), name, scale=scale, zero_point=zero_point,
                         dtype=dtype)

    # ------------------------------------------------------------ validation

    @property
    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.is_output]

    def validate(self) -> GraphDefinition:
        """Infer every op output's shape and dtype; ConvSetupError naming the node."""
        self.problems = {}
        for node in self.nodes:
            try:
                self._infer(node)
            except (ConvSetupError, TypeError) as exc:
                raise ConvSetupError(f"node {node.name!r} ({node.op}): {exc}") from None
        if not self.outputs:
            raise ConvSetupError(
                "the graph has no output: call set_output(True) on the tensor(s) to return"
            )
        return self

    def _infer(self, node: Node) -> None:
        ins = [self.tensors[n] for n in node.inputs]
        out = self.tensors[node.output]
        for t in ins:
            if t.shape is None:
                raise ConvSetupError(f"input {t.name!r} has no shape (validate out of order)")
        if node.op in CONV_OPS:
            out.shape, out.dtype = self._infer_conv(node, ins)
            return
        a = ins[0]
        if a.dtype in QUANT_DTYPES:
            raise ConvSetupError(
                f"input {a.name!r} is {a.dtype}; pointwise ops take float or int32 "
                f"(conv accumulator) tensors, so requantize must be the last op"
            )
        out.shape, out.dtype = a.shape, self.compute_dtype
        if node.op in BINARY_OPS:
            self._check_operand(node, a, ins[1])
        elif node.op == "scale":
            node.attrs["factor"] = _finite(node.attrs["factor"], "factor")
        elif node.op == "clamp":
            lo, hi = _finite(node.attrs["lo"], "lo"), _finite(node.attrs["hi"], "hi")
            if lo > hi:
                raise ConvSetupError(f"clamp needs lo <= hi, got lo={lo}, hi={hi}")
            node.attrs.update(lo=lo, hi=hi)
        elif node.op == "gelu" and node.attrs["approximate"] not in GELU_MODES:
            raise ConvSetupError(
                f"approximate must be one of {GELU_MODES}, got {node.attrs['approximate']!r}"
            )
        elif node.op == "requantize":
            out.dtype = self._check_requantize(node)

    def _infer_conv(self, node: Node, ins: list[Tensor]) -> tuple[tuple[int, ...], str]:
        a, b = ins
        if a.layout is None or b.layout is None:
            raise ConvSetupError(
                f"inputs {a.name!r} {a.shape} and {b.name!r} {b.shape} must have 3-5 dims"
            )
        if a.layout != b.layout:
            raise ConvSetupError(
                f"layouts differ: {a.name!r} is {a.layout}, {b.name!r} is {b.layout}"
            )
        kinds = {t.dtype in QUANT_DTYPES for t in ins}
        if kinds == {True}:
            dtype, out_dtype = "int8", "int32"
        elif kinds == {False} and all(t.dtype in FLOAT_DTYPES for t in ins):
            dtype, out_dtype = a.dtype, self.compute_dtype
            if b.dtype != a.dtype:
                raise ConvSetupError(
                    f"mixed float dtypes {a.name!r}={a.dtype}, {b.name!r}={b.dtype}"
                )
        else:
            raise ConvSetupError(
                f"dtypes {a.name!r}={a.dtype}, {b.name!r}={b.dtype}: expected both float "
                f"(one of {FLOAT_DTYPES}) or both 8-bit integer ({QUANT_DTYPES})"
            )
        if dtype == "int8" and node.op != "conv_fprop":
            raise ConvSetupError("integer convolution is forward only (conv_fprop)")
        at = node.attrs
        assert a.shape is not None and b.shape is not None
        args = dict(stride=at["stride"], padding=at["padding"], dilation=at["dilation"],
                    groups=at["groups"], layout=a.layout, dtype=dtype)
        if node.op == "conv_fprop":
            try:
                p = make_problem("forward", a.shape, b.shape, x_name=a.name, w_name=b.name,
                                 **args)
            except ConvSetupError as exc:
                raise ConvSetupError(f"{exc}{_layout_hint(a, b, args)}") from None
            shape = p.y_shape()
        elif node.op == "conv_dgrad":
            p = make_problem("backward_data", _shape(at["input_shape"], "input_shape"),
                             b.shape, x_name="input_shape", w_name=b.name, **args)
            _expect(a, p.y_shape(), "the conv output of input_shape")
            at["input_shape"], shape = p.x_shape(), p.x_shape()
        else:
            p = make_problem("backward_weight", a.shape, _shape(at["weight_shape"], "weight_shape"),
                             x_name=a.name, w_name="weight_shape", **args)
            _expect(b, p.y_shape(), "the conv output of x and weight_shape")
            at["weight_shape"], shape = p.w_shape(), p.w_shape()
        at.update(stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups)
        self.problems[node.name] = p
        return shape, out_dtype

    def _check_operand(self, node: Node, a: Tensor, b: Tensor) -> None:
        assert a.shape is not None and b.shape is not None
        if b.dtype not in FLOAT_DTYPES:
            raise ConvSetupError(f"operand {b.name!r} is {b.dtype}; expected a float tensor")
        if node.op == "bias":
            if len(a.shape) < 3:
                raise ConvSetupError(f"bias needs a 3-5 dim activation, got {a.name!r} {a.shape}")
            axis = channel_axis(len(a.shape), a.layout)
            _expect(b, (a.shape[axis],), f"one value per channel of {a.name!r}, "
                                          f"axis {axis} in {a.layout}")
            return
        if b.layout is not None and a.layout is not None and b.layout != a.layout:
            raise ConvSetupError(
                f"layouts differ: {a.name!r} is {a.layout}, {b.name!r} is {b.layout}"
            )
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            shape = None
        if shape != a.shape:
            raise ConvSetupError(
                f"operand {b.name!r} of shape {b.shape} does not broadcast to "
                f"{a.name!r} of shape {a.shape}"
            )

    def _check_requantize(self, node: Node) -> str:
        at = node.attrs
        at["scale"] = _finite(at["scale"], "scale")
        if at["scale"] <= 0:
            raise ConvSetupError(f"scale must be > 0, got {at['scale']}")
        dtype = _dtype_name(at["dtype"])
        if dtype not in QUANT_DTYPES:
            raise ConvSetupError(f"dtype must be one of {QUANT_DTYPES}, got {dtype!r}")
        info = np.iinfo(dtype)
        zp = at["zero_point"]
        if isinstance(zp, bool) or not isinstance(zp, (int, np.integer)):
            raise ConvSetupError(f"zero_point must be an int, got {zp!r}")
        if not info.min <= zp <= info.max:
            raise ConvSetupError(
                f"zero_point {zp} outside the {dtype} range [{info.min}, {info.max}]"
            )
        at.update(dtype=dtype, zero_point=int(zp))
        return dtype

    # ------------------------------------------------------------ description

    def key(self, **flags: Any) -> GraphKey:
        """Validate, then the canonical description of the graph plus build ``flags``."""
        self.validate()
        tensors = []
        for t in self.tensors.values():
            assert t.shape is not None
            tensors.append({
                "name": t.name, "shape": list(t.shape), "strides": list(dense_strides(t.shape)),
                "dtype": t.dtype, "layout": t.layout, "alignment": t.alignment,
                "virtual": t.is_virtual, "output": t.is_output,
            })
        nodes = [
            {"op": n.op, "name": n.name, "inputs": list(n.inputs), "output": n.output,
             "attrs": {k: _jsonable(v) for k, v in sorted(n.attrs.items())}}
            for n in self.nodes
        ]
        doc = {
            "format": FORMAT_VERSION, "io_dtype": self.io_dtype,
            "compute_dtype": self.compute_dtype, "tensors": tensors, "nodes": nodes,
            "flags": {k: _jsonable(v) for k, v in sorted(flags.items())},
        }
        return GraphKey(json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False))


def _layout_hint(x: Tensor, w: Tensor, args: dict[str, Any]) -> str:
    """What to say about the layout when x and w do not make a conv in theirs."""
    assert x.shape is not None and w.shape is not None
    other = "NHWC" if args["layout"] == "NCHW" else "NCHW"
    try:
        make_problem("forward", x.shape, w.shape, **{**args, "layout": other})
    except (ConvSetupError, TypeError):
        return f" (shapes read as {args['layout']})"
    return (f" (shapes read as {args['layout']}; they fit {other}: declare "
            f"Graph(layout={other!r}) or tensor(..., layout={other!r}))")


def _finite(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ConvSetupError(f"{name} must be finite, got {v}")
    return v


def _shape(value: Any, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {value!r}") from None


def _expect(t: Tensor, shape: tuple[int, ...], why: str) -> None:
    if t.shape != tuple(shape):
        raise ConvSetupError(f"{t.name!r} has shape {t.shape}, expected {tuple(shape)} ({why})")


def _jsonable(value: Any) -> Any:
    """Attributes as JSON values: tuples become lists, numpy scalars Python ones."""
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise TypeError(f"attribute value {value!r} has no canonical form")
