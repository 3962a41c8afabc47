"""ONNX float operators on numpy arrays, with NCHW semantics, and the operator registry.

Every op is ``fn(inputs, attrs) -> [outputs]``: ``inputs`` in ``node.input`` order
(None for an omitted optional input), ``attrs`` from :func:`attributes`. Arrays may be
NCHW views of channels-last memory (what convs return): elementwise numpy ops keep
that memory order, convs and pools read it without a copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import api, problem
from ..errors import ConvSetupError
from ..threads import single_threaded_blas
from . import kernels, proto

if TYPE_CHECKING:  # annotations only: the messages are read through .proto, not onnx
    import onnx

Array = np.ndarray
Op = Callable[[Sequence["Array | None"], Mapping[str, Any]], list[Array]]
LATEST_OPSET = 21
COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.uint8),
                   np.dtype(np.int8))  # the dtypes the compiled pools take


# ------------------------------------------------------------------ attributes, layout


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes as Python values (strings decoded, tensors as arrays)."""
    attrs: dict[str, Any] = {}
    for a in node.attribute:
        value = proto.attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif proto.is_message(value, "TensorProto"):
            value = proto.to_array(value, f"attribute {a.name!r}")
        attrs[a.name] = value
    return attrs


# the axis orders of to_last / to_first per rank: a transpose by a ready tuple costs
# 0.2 us where np.moveaxis, which normalises its axes on every call, costs 3
_LAST = {nd: (0, *range(2, nd), 1) for nd in range(2, 8)}
_FIRST = {nd: (0, nd - 1, *range(1, nd - 1)) for nd in range(2, 8)}


def to_last(x: Array) -> Array:
    """(N, C, *S) -> (N, *S, C) view."""
    order = _LAST.get(x.ndim)
    return np.moveaxis(x, 1, -1) if order is None else x.transpose(order)


def to_first(y: Array) -> Array:
    """(N, *S, C) -> (N, C, *S) view."""
    order = _FIRST.get(y.ndim)
    return np.moveaxis(y, -1, 1) if order is None else y.transpose(order)


def is_channels_last(x: Array) -> bool:
    """True when the NCHW-shaped ``x`` is a view of C-contiguous NHWC memory."""
    return x.ndim >= 3 and to_last(x).flags.c_contiguous


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
    """Conv padding for convengine: explicit pairs or a mode string."""
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


def conv_args(attrs: Mapping[str, Any], w_shape: tuple[int, ...]) -> dict[str, Any]:
    """stride/padding/dilation/groups of a forward conv node with an NCHW weight."""
    ndim = len(w_shape) - 2
    if ndim < 1:
        raise ConvSetupError(f"weight W must have at least 3 dims (O, C/group, kernel), got "
                             f"shape {tuple(w_shape)}")
    _check_kernel_shape(attrs, tuple(w_shape[2:]))
    return {
        "stride": _ints(attrs, "strides", ndim, 1),
        "padding": _conv_padding(attrs, ndim),
        "dilation": _ints(attrs, "dilations", ndim, 1),
        "groups": int(attrs.get("group", 1)),
    }


def check_rank(x: Array, w_shape: tuple[int, ...]) -> None:
    if x.ndim != len(w_shape):
        raise ConvSetupError(f"input X has shape {x.shape}; expected {len(w_shape)} dims "
                             f"(N, C, spatial) to match the weight's shape {tuple(w_shape)}")


def operands(inputs: Sequence[Array | None], op: str, required: int, total: int
             ) -> list[Any]:
    """Pad optional inputs with None; check the required ones are there."""
    items = list(inputs) + [None] * (total - len(inputs))
    if len(items) > total:
        raise ConvSetupError(f"{op} takes at most {total} inputs, got {len(inputs)}")
    missing = [i for i in range(required) if items[i] is None]
    if missing:
        raise ConvSetupError(f"{op} needs inputs {list(range(required))}; missing {missing}")
    return [None if a is None else np.asarray(a) for a in items]


# ------------------------------------------------------------------ convolutions


def conv_last(x: Array, w_last: Array, b: Array | None, args: Mapping[str, Any]) -> Array:
    """Conv of NCHW-shaped ``x`` with a channels-last weight ``(O, *K, C/g)``; returns
    an NCHW view of the channels-last result (no copy when ``x`` is channels-last)."""
    check_rank(x, (0, 0, *w_last.shape[1:-1]))
    return to_first(api.conv(to_last(x), w_last, b, layout="NHWC", **args))


def _conv(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, w, b = operands(inputs, "Conv", 2, 3)
    check_rank(x, w.shape)
    return [conv_last(x, np.moveaxis(w, 1, -1), b, conv_args(attrs, w.shape))]


def _conv_transpose(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """ConvTranspose. Pads, ``output_shape`` and ``output_padding`` select a window
    ``out[j] = full[j + begin]`` of the full transposed output (zero outside it); the
    engine computes the part of the window that overlaps ``full``."""
    x, w, b = operands(inputs, "ConvTranspose", 2, 3)
    check_rank(x, w.shape)
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
    problem.check_elements((x.shape[0], w.shape[1] * groups, *length), "the ConvTranspose "
                           "output", "check output_shape, pads and output_padding")
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


# ------------------------------------------------------------------ pointwise


def _unary(name: str, fn: Callable[..., Array]) -> Op:
    def op(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
        (x,) = operands(inputs, name, 1, 1)
        return [np.asarray(fn(x, attrs), dtype=x.dtype)]
    return op


def _binary(name: str, fn: Callable[[Array, Array], Array]) -> Op:
    def op(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
        a, b = operands(inputs, name, 2, 2)
        if a.dtype != b.dtype:
            raise ConvSetupError(f"{name} needs two inputs of one dtype, got {a.dtype} and "
                                 f"{b.dtype}")
        return [np.asarray(fn(a, b))]
    return op


def sigmoid(x: Array) -> Array:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def hard_sigmoid(x: Array, alpha: float, beta: float) -> Array:
    t = x * x.dtype.type(alpha) + x.dtype.type(beta)
    return np.clip(t, 0, 1, out=t)


def _div(a: Array, b: Array) -> Array:
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates
    return a / b


def _clip(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, lo, hi = operands(inputs, "Clip", 1, 3)
    lo = attrs.get("min") if lo is None else lo  # opset < 11: attributes
    hi = attrs.get("max") if hi is None else hi
    y = x if lo is None else np.maximum(x, np.asarray(lo, x.dtype))
    y = y if hi is None else np.minimum(y, np.asarray(hi, x.dtype))
    return [np.array(y, copy=y is x)]


def _batch_norm(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, scale, bias, mean, var = operands(inputs, "BatchNormalization", 5, 5)
    if attrs.get("training_mode", 0):
        raise NotImplementedError("BatchNormalization with training_mode=1 is not supported "
                                  "(inference only)")
    shape = (-1, *(1,) * (x.ndim - 2))
    inv = scale / np.sqrt(var + np.float32(attrs.get("epsilon", 1e-5)))
    shift = bias - mean * inv
    return [(x * inv.astype(x.dtype).reshape(shape) + shift.astype(x.dtype).reshape(shape))]


def _softmax(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = operands(inputs, "Softmax", 1, 1)
    opset = int(attrs.get("opset", LATEST_OPSET))
    axis = int(attrs.get("axis", -1 if opset >= 13 else 1))
    axis = axis + x.ndim if axis < 0 else axis
    if opset < 13:  # coerced to 2-D at axis
        y2 = _softmax([x.reshape(int(np.prod(x.shape[:axis])), -1)], {"axis": 1})[0]
        return [y2.reshape(x.shape)]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return [e / e.sum(axis=axis, keepdims=True)]


# ------------------------------------------------------------------ pools, reductions


def _pool_geometry(x: Array, attrs: Mapping[str, Any]) -> tuple[Any, ...]:
    """kernel, stride, dilation, output size, (lo, hi) pads of a pool node."""
    ndim = x.ndim - 2
    if "kernel_shape" not in attrs:
        raise ConvSetupError("pool needs attribute kernel_shape")
    kernel = _ints(attrs, "kernel_shape", ndim, 0)
    stride = _ints(attrs, "strides", ndim, 1)
    dilation = _ints(attrs, "dilations", ndim, 1)
    mode = _auto_pad(attrs)
    sizes = x.shape[2:]
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        from ..problem import same_padding

        pads = same_padding(sizes, kernel, stride, dilation, lower=mode == "SAME_LOWER")
    else:
        pads = _pads(attrs, ndim) if mode == "NOTSET" else ((0, 0),) * ndim
    ceil = bool(attrs.get("ceil_mode", 0)) and mode == "NOTSET"
    if min(kernel + stride + dilation, default=1) < 1 or \
            min((p for pair in pads for p in pair), default=0) < 0:
        raise ConvSetupError(f"pool kernel_shape {list(kernel)}, strides {list(stride)} and "
                             f"dilations {list(dilation)} must be >= 1, pads >= 0; got pads "
                             f"{[list(p) for p in pads]}")
    out = []
    for n, k, s, d, (lo, hi) in zip(sizes, kernel, stride, dilation, pads, strict=True):
        extent = d * (k - 1) + 1
        if lo >= extent or hi >= extent:  # as ONNX Runtime: a window meets the input
            raise ConvSetupError(f"pool pads {[list(p) for p in pads]} must be smaller than "
                                 f"the (dilated) kernel extent {extent}")
        span = n + lo + hi - extent
        size = (-(-span // s) if ceil else span // s) + 1
        if ceil and (size - 1) * s >= n + lo:  # the last window must start inside
            size -= 1
        if size < 1:
            raise ConvSetupError(f"pool output would be empty: input spatial shape "
                                 f"{list(sizes)}, pads {[list(p) for p in pads]}, kernel_shape "
                                 f"{list(kernel)}, dilations {list(dilation)}")
        out.append(size)
    problem.check_elements((*x.shape[:2], *out, *kernel), "a pool's (output, kernel tap) "
                           "pairs", "reduce kernel_shape")
    return kernel, stride, dilation, tuple(out), tuple(tuple(p) for p in pads)


def _windows(x: Array, attrs: Mapping[str, Any], fill: Any
             ) -> tuple[Array, tuple[int, ...], list[tuple[slice, ...]]]:
    """x channels-last, padded with ``fill`` (and for ceil_mode at the end); the output
    size and the slices that select each kernel tap's inputs."""
    kernel, stride, dilation, out, pads = _pool_geometry(x, attrs)
    sizes = x.shape[2:]
    widths = [(lo, max(hi, (m - 1) * s + d * (k - 1) + 1 - n - lo))
              for n, k, s, d, m, (lo, hi) in zip(sizes, kernel, stride, dilation, out, pads,
                                                  strict=True)]
    xl = to_last(x)
    problem.check_elements((x.shape[0], *(n + lo + hi for n, (lo, hi) in zip(
        sizes, widths, strict=True)), x.shape[1]), "the padded pool input", "reduce pads")
    if any(lo or hi for lo, hi in widths):
        xl = np.pad(xl, ((0, 0), *widths, (0, 0)), constant_values=fill)
    taps = [tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                  for o, d, s, m in zip(offset, dilation, stride, out, strict=True))
            for offset in np.ndindex(*kernel)]
    return xl, out, taps


def _max_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """MaxPool (auto_pad, pads, strides, dilations, ceil_mode); no Indices output."""
    (x,) = operands(inputs, "MaxPool", 1, 1)
    if int(attrs.get("storage_order", 0)):
        raise NotImplementedError("MaxPool storage_order=1 (Indices) is not supported")
    kernel, stride, dilation, out, pads = _pool_geometry(x, attrs)
    if x.ndim == 4 and x.dtype in COMPILED_DTYPES and is_channels_last(x) and \
            dilation == (1, 1) and all(
            -lo + k - 1 >= 0 and (m - 1) * s - lo <= n - 1
            for n, k, s, m, (lo, _) in zip(x.shape[2:], kernel, stride, out, pads, strict=True)):
        y = kernels.max_pool_last(to_last(x), kernel, stride, dilation,
                                  (pads[0][0], pads[1][0]), out)
        return [to_first(y)]  # every window meets x: one compiled pass
    lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    xl, out, taps = _windows(x, attrs, lowest)
    y = xl[(slice(None), *taps[0])].copy()
    for tap in taps[1:]:
        np.maximum(y, xl[(slice(None), *tap)], out=y)
    return [to_first(y)]


def _average_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """AveragePool; ``count_include_pad`` counts the explicit pads, never the ceil_mode
    overhang (as onnx.reference and ONNX Runtime)."""
    (x,) = operands(inputs, "AveragePool", 1, 1)
    xl, out, taps = _windows(x, attrs, 0)
    y = np.zeros((x.shape[0], *out, x.shape[1]), x.dtype)
    for tap in taps:
        y += xl[(slice(None), *tap)]
    kernel, stride, dilation, _, pads = _pool_geometry(x, attrs)
    include = int(attrs.get("count_include_pad", 0))
    count = np.ones((), x.dtype)
    for n, k, s, d, m, (lo, hi) in zip(x.shape[2:], kernel, stride, dilation, out, pads,
                                        strict=True):
        pos = np.arange(m)[:, None] * s + np.arange(k)[None, :] * d - lo
        first, end = (-lo, n + hi) if include else (0, n)
        count = np.multiply.outer(count, ((pos >= first) & (pos < end)).sum(1).astype(x.dtype))
    return [to_first(y / count[..., None])]


def _global_pool(name: str, reduce: Callable[..., Array]) -> Op:
    def op(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
        (x,) = operands(inputs, name, 1, 1)
        y = reduce(to_last(x), axis=tuple(range(1, x.ndim - 1)))
        return [y.astype(x.dtype, copy=False).reshape(*y.shape, *(1,) * (x.ndim - 2))]
    return op


_mean_pool = _global_pool("GlobalAveragePool", np.mean)


def _global_average_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any]
                         ) -> list[Array]:
    """GlobalAveragePool: channels-last float memory summed in one compiled pass (in
    float64, then divided and rounded once), else numpy's mean."""
    (x,) = operands(inputs, "GlobalAveragePool", 1, 1)
    xl = to_last(x)
    if x.ndim < 3 or not xl.flags.c_contiguous or x.dtype not in (np.float32, np.float64):
        return _mean_pool(inputs, attrs)
    y = kernels.channel_means(xl.reshape(x.shape[0], math.prod(x.shape[2:]), x.shape[1]))
    return [y.reshape(*y.shape, *(1,) * (x.ndim - 2))]


def _axes(attrs: Mapping[str, Any], given: Array | None) -> list[int] | None:
    axes = attrs.get("axes") if given is None else given
    return None if axes is None else [int(a) for a in np.ravel(axes)]


def _reduce_mean(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, axes_in = operands(inputs, "ReduceMean", 1, 2)
    axes = _axes(attrs, axes_in)
    keep = bool(attrs.get("keepdims", 1))
    if not axes:
        if int(attrs.get("noop_with_empty_axes", 0)):
            return [x]
        axes = list(range(x.ndim))
    return [np.asarray(x.mean(axis=tuple(axes), keepdims=keep), dtype=x.dtype)]


# ------------------------------------------------------------------ linear algebra


def matmul_quiet(a: Array, b: Array) -> Array:
    """``np.matmul`` on single-threaded BLAS: OpenBLAS's own pool, once woken, spins
    next to convengine's kernels (measured: the conv after a multi-threaded 1x1280 @
    1280x1000 GEMM ran 40x slower)."""
    with single_threaded_blas():
        return np.matmul(a, b)


def _gemm(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    a, b, c = operands(inputs, "Gemm", 2, 3)
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = matmul_quiet(a, b)
    alpha = float(attrs.get("alpha", 1.0))
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if c is not None:
        y += c * y.dtype.type(attrs.get("beta", 1.0))
    return [y]


def _matmul(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    a, b = operands(inputs, "MatMul", 2, 2)
    return [matmul_quiet(a, b)]


# ------------------------------------------------------------------ shapes and data movement


def _flatten(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = operands(inputs, "Flatten", 1, 1)
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(math.prod(x.shape[:axis]), -1)]


def _reshape(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, shape = operands(inputs, "Reshape", 2, 2)
    dims = [int(d) for d in shape]
    if not int(attrs.get("allowzero", 0)):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return [x.reshape(dims)]


def _transpose(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = operands(inputs, "Transpose", 1, 1)
    perm = attrs.get("perm")
    return [np.transpose(x, None if perm is None else [int(p) for p in perm])]


def _concat(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    xs = [np.asarray(a) for a in inputs if a is not None]
    if not xs:
        raise ConvSetupError("Concat needs at least one input")
    axis = int(attrs["axis"])
    axis = axis + xs[0].ndim if axis < 0 else axis
    if axis == 1 and all(is_channels_last(a) for a in xs):  # stay channels-last
        return [to_first(np.concatenate([to_last(a) for a in xs], axis=-1))]
    return [np.concatenate(xs, axis=axis)]


def _pad(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, pads, value, axes_in = operands(inputs, "Pad", 1, 4)
    mode = attrs.get("mode", "constant")
    pads = attrs.get("pads") if pads is None else pads  # opset < 11: attributes
    value = attrs.get("value", 0) if value is None else value
    axes = _axes({}, axes_in) or list(range(x.ndim))
    if pads is None:
        raise ConvSetupError("Pad needs pads (input 1 or the attribute)")
    pads = [int(p) for p in np.ravel(pads)]
    if len(pads) != 2 * len(axes):
        raise ConvSetupError(f"Pad needs {2 * len(axes)} pads (begin and end per axis), got "
                             f"{pads}")
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        width[a % x.ndim] = (pads[i], pads[i + len(axes)])
    crop = tuple(slice(-min(lo, 0), x.shape[i] + min(hi, 0)) for i, (lo, hi) in enumerate(width))
    x = x[crop]
    width = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
    problem.check_elements([n + lo + hi for n, (lo, hi) in zip(x.shape, width, strict=True)],
                           "the Pad output", "check pads")
    modes = ("constant", "reflect", "edge", "wrap")
    if mode not in modes:
        raise ConvSetupError(f"Pad mode={mode!r}; expected one of {modes}")
    if mode == "constant":
        return [np.pad(x, width, constant_values=np.asarray(value, x.dtype))]
    return [np.pad(x, width, mode=mode)]


def _slice(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, starts, ends, axes_in, steps = operands(inputs, "Slice", 3, 5)
    axes = _axes({}, axes_in) or list(range(len(starts)))
    steps = [1] * len(axes) if steps is None else [int(s) for s in steps]
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        n = x.shape[a]
        s, e = int(np.clip(s, -n - 1, n + 1)), int(np.clip(e, -n - 1, n + 1))
        index[a % x.ndim] = slice(*slice(s, e, st).indices(n))
    return [x[tuple(index)]]


def _squeeze(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, axes_in = operands(inputs, "Squeeze", 1, 2)
    axes = _axes(attrs, axes_in)
    return [np.squeeze(x, axis=None if axes is None else tuple(axes))]


def _unsqueeze(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, axes_in = operands(inputs, "Unsqueeze", 1, 2)
    axes = _axes(attrs, axes_in)
    if axes is None:
        raise ConvSetupError("Unsqueeze needs axes (input 1 or the attribute)")
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(a % rank for a in axes))]


def _shape(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = operands(inputs, "Shape", 1, 1)
    start, end = attrs.get("start", 0), attrs.get("end")
    return [np.array(x.shape[start:end], dtype=np.int64)]


def _gather(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, idx = operands(inputs, "Gather", 2, 2)
    return [np.take(x, idx.astype(np.int64), axis=int(attrs.get("axis", 0)))]


def _cast(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = operands(inputs, "Cast", 1, 1)
    return [x.astype(proto.np_dtype(int(attrs["to"])))]


def _constant(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    kinds = {"value": None, "value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}
    for name, dtype in kinds.items():
        if name in attrs:
            return [np.asarray(attrs[name], dtype=dtype)]
    raise NotImplementedError(f"Constant supports the attributes {sorted(kinds)}, got "
                              f"{sorted(attrs)}")


def _identity(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    (x,) = operands(inputs, "Identity", 1, 1)
    return [x]


def _dropout(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, _, training = operands(inputs, "Dropout", 1, 3)
    if training is not None and bool(training):
        raise NotImplementedError("Dropout with training_mode=True is not supported")
    return [x]


# ------------------------------------------------------------------ Resize


def _source_coords(mode: str, n_in: int, n_out: int, scale: float) -> Array:
    """Input coordinate of every output index along one axis (``n_in * scale`` is the
    unrounded output length the align_corners and half_pixel_symmetric rules use)."""
    j = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (j + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / (n_in * scale))
        return offset + (j + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (j + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "align_corners":
        length = n_in * scale
        return j * (n_in - 1) / (length - 1) if length > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return j / scale
    if mode == "tf_half_pixel_for_nn":
        return (j + 0.5) / scale
    raise NotImplementedError(f"Resize coordinate_transformation_mode={mode!r} is not "
                              f"supported")


def _nearest(coords: Array, mode: str) -> Array:
    rounders: dict[str, Callable[[Array], Array]] = {"round_prefer_floor": lambda c: np.ceil(c - 0.5),
                "round_prefer_ceil": lambda c: np.floor(c + 0.5),
                "floor": np.floor, "ceil": np.ceil}
    if mode not in rounders:
        raise ConvSetupError(f"Resize nearest_mode={mode!r}; expected one of {sorted(rounders)}")
    return rounders[mode](coords)


def _resize(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """Resize, modes nearest and linear (separable, per axis), without antialias."""
    x, _roi, scales, sizes = operands(inputs, "Resize", 1, 4)
    mode = attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear") or int(attrs.get("antialias", 0)) or \
            attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise NotImplementedError(
            f"Resize supports mode nearest and linear, without antialias or "
            f"keep_aspect_ratio_policy; got mode={mode!r}, antialias="
            f"{attrs.get('antialias', 0)}, policy={attrs.get('keep_aspect_ratio_policy')!r}")
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    axes = [int(a) % x.ndim for a in attrs.get("axes", range(x.ndim))]
    out, factors = list(x.shape), [1.0] * x.ndim
    if sizes is not None and sizes.size:
        for a, s in zip(axes, sizes, strict=True):
            out[a], factors[a] = int(s), int(s) / x.shape[a]
    elif scales is not None and scales.size:
        for a, s in zip(axes, scales, strict=True):
            out[a], factors[a] = int(np.floor(x.shape[a] * float(s))), float(s)
    else:
        raise ConvSetupError("Resize needs scales (input 2) or sizes (input 3)")
    if min(out, default=1) < 0:
        raise ConvSetupError(f"Resize output shape {out} has a negative dim")
    problem.check_elements(out, "the Resize output", "check scales and sizes")
    y = x
    for axis, (n_in, n_out, f) in enumerate(zip(x.shape, out, factors, strict=True)):
        if n_in == n_out and f == 1.0:
            continue
        c = _source_coords(transform, n_in, n_out, f)
        if mode == "nearest":
            idx = np.clip(_nearest(c, attrs.get("nearest_mode", "round_prefer_floor")),
                          0, n_in - 1).astype(np.intp)
            y = np.take(y, idx, axis=axis)
            continue
        c = np.clip(c, 0, n_in - 1)
        lo = np.floor(c).astype(np.intp)
        hi = np.minimum(lo + 1, n_in - 1)
        shape = [1] * y.ndim
        shape[axis] = n_out
        frac = (c - lo).astype(y.dtype).reshape(shape)
        a = np.take(y, lo, axis=axis)
        y = a + (np.take(y, hi, axis=axis) - a) * frac
    return [np.asarray(y, dtype=x.dtype)]


# ------------------------------------------------------------------ registry


def _leaky(x: Array, attrs: Mapping[str, Any]) -> Array:
    return np.where(x >= 0, x, x * x.dtype.type(attrs.get("alpha", 0.01)))


OPS: dict[str, Op] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "BatchNormalization": _batch_norm,
    "Relu": _unary("Relu", lambda x, a: np.maximum(x, np.zeros((), x.dtype))),
    "Clip": _clip,
    "Sigmoid": _unary("Sigmoid", lambda x, a: sigmoid(x)),
    "HardSigmoid": _unary("HardSigmoid", lambda x, a: hard_sigmoid(
        x, a.get("alpha", 0.2), a.get("beta", 0.5))),
    "HardSwish": _unary("HardSwish", lambda x, a: x * hard_sigmoid(x, 1 / 6, 0.5)),
    "LeakyRelu": _unary("LeakyRelu", _leaky),
    "Tanh": _unary("Tanh", lambda x, a: np.tanh(x)),
    "Add": _binary("Add", np.add),
    "Sub": _binary("Sub", np.subtract),
    "Mul": _binary("Mul", np.multiply),
    "Div": _binary("Div", _div),
    "MatMul": _matmul,
    "Gemm": _gemm,
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalAveragePool": _global_average_pool,
    "GlobalMaxPool": _global_pool("GlobalMaxPool", np.max),
    "ReduceMean": _reduce_mean,
    "Softmax": _softmax,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Concat": _concat,
    "Pad": _pad,
    "Slice": _slice,
    "Resize": _resize,
    "Shape": _shape,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Cast": _cast,
    "Constant": _constant,
    "Identity": _identity,
    "Dropout": _dropout,
}
# ops whose semantics changed with the opset; they receive attrs["opset"]
OPSET_DEPENDENT = {"Softmax"}
# outputs that exist in the operator but that this runner does not produce
SINGLE_OUTPUT = {"BatchNormalization", "MaxPool", "Dropout"}
