"""The canonical convolution problem, and the validation that builds it.

Every public call is normalised once, here, into a frozen and hashable
:class:`ConvProblem`. Dispatch, explain, the tuning cache and the plan cache all key
on it; kernels never re-derive shapes.

Conventions (``S`` spatial sizes, ``K`` kernel sizes, ``g`` groups):

- ``layout="NCHW"``: x ``(N, C, *S)``, w ``(O, C // g, *K)``, y ``(N, O, *S_out)``.
- ``layout="NHWC"``: x ``(N, *S, C)``, w ``(O, *K, C // g)``, y ``(N, *S_out, O)``.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import config
from .errors import ConvSetupError
from .interop.dlpack import dlpack_device, from_dlpack

PASSES = ("forward", "backward_data", "backward_weight")
LAYOUTS = ("NCHW", "NHWC")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
PADDING_MODES = ("valid", "same", "same_lower")

Pair = tuple[int, int]

FLOAT32, FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)

LIMIT_NAME = "the max_elements setting (convengine.config, $CONVENGINE_MAX_ELEMENTS)"


def max_elements() -> int:
    """The most values any array a call allocates may hold (the result, a padded copy,
    an algorithm's workspace; default 2**31, 8 GiB of float32), and the largest padded
    extent, stride, dilation or dilated kernel extent of any spatial dim. Problems over
    it are a ConvSetupError before anything is allocated; algorithms whose workspace
    would exceed it refuse the problem. Set with ``convengine.config.set(max_elements=n)``."""
    return int(config.get("max_elements"))


@dataclass(frozen=True)
class ConvProblem:
    """One convolution, fully normalised. Frozen, hashable, comparable.

    ``pass_`` says which of the three convolution passes is asked for; the shapes
    always describe the *forward* convolution (x, w -> y) that the pass belongs to.
    """

    pass_: str
    layout: str
    dtype: str
    batch: int
    in_channels: int
    out_channels: int
    groups: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    out_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[Pair, ...]
    dilation: tuple[int, ...]
    has_bias: bool = False

    def __hash__(self) -> int:
        """Hashed once: a problem keys several caches on every call."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(dataclasses.astuple(self))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the cached hash (string hashes differ between processes)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def ndim(self) -> int:
        """Spatial rank: 1, 2 or 3."""
        return len(self.in_size)

    @property
    def compute_dtype(self) -> np.dtype:
        """float64 for float64 inputs; float32 for everything else (prebuilt dtypes:
        ``np.dtype(...)`` costs 15 us a call with the caches cold after a kernel)."""
        return FLOAT64 if self.dtype == "float64" else FLOAT32

    @property
    def in_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def out_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def is_depthwise(self) -> bool:
        return self.groups == self.in_channels and self.groups > 1

    @property
    def is_pointwise(self) -> bool:
        """1x1 kernel, stride 1, no padding: the convolution is a plain GEMM."""
        return (
            all(k == 1 for k in self.kernel)
            and all(s == 1 for s in self.stride)
            and all(p == (0, 0) for p in self.padding)
        )

    @property
    def effective_kernel(self) -> tuple[int, ...]:
        """Kernel extent once dilated: ``d * (k - 1) + 1`` per dim."""
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilation))

    @property
    def flops(self) -> int:
        """Multiply-adds times two of the forward convolution (same for each pass)."""
        return (
            2
            * self.batch
            * self.out_channels
            * math.prod(self.out_size)
            * self.in_per_group
            * math.prod(self.kernel)
        )

    def x_shape(self, layout: str | None = None) -> tuple[int, ...]:
        if (layout or self.layout) == "NCHW":
            return (self.batch, self.in_channels, *self.in_size)
        return (self.batch, *self.in_size, self.in_channels)

    def w_shape(self, layout: str | None = None) -> tuple[int, ...]:
        if (layout or self.layout) == "NCHW":
            return (self.out_channels, self.in_per_group, *self.kernel)
        return (self.out_channels, *self.kernel, self.in_per_group)

    def y_shape(self, layout: str | None = None) -> tuple[int, ...]:
        if (layout or self.layout) == "NCHW":
            return (self.batch, self.out_channels, *self.out_size)
        return (self.batch, *self.out_size, self.out_channels)

    def result_shape(self, layout: str | None = None) -> tuple[int, ...]:
        """Shape of what this pass returns, in ``layout`` (default: the problem's)."""
        return {
            "forward": self.y_shape,
            "backward_data": self.x_shape,
            "backward_weight": self.w_shape,
        }[self.pass_](layout)

    def with_pass(self, pass_: str) -> ConvProblem:
        return dataclasses.replace(self, pass_=pass_)

    def describe(self) -> str:
        """One line a person can read, e.g. for explain() and the CLI."""
        pads = ",".join(f"{lo}:{hi}" for lo, hi in self.padding)
        return (
            f"{self.pass_} {self.ndim}-D {self.layout} {self.dtype} "
            f"x={self.x_shape()} w={self.w_shape()} -> y={self.y_shape()} "
            f"stride={self.stride} padding=({pads}) dilation={self.dilation} "
            f"groups={self.groups}{' +bias' if self.has_bias else ''}"
        )


# --------------------------------------------------------------------------- #
# argument normalisation


def as_array(value: Any, name: str) -> np.ndarray:
    """Turn an array-like (numpy, DLPack-capable, or ``__array__``) into an ndarray.

    DLPack is tried first so that torch CPU tensors and JAX arrays come in without
    a copy where their layout allows.
    """
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        view = from_dlpack(value)  # None for e.g. a GPU tensor: take the slow road
        if view is not None:
            return view
        if not hasattr(value, "__array__"):
            raise TypeError(
                f"{name} ({type(value).__name__}) cannot be exported to numpy through "
                f"DLPack (device {dlpack_device(value)}) and has no __array__; move it "
                f"to host (CPU) memory first"
            )
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - re-raised with the argument's name
        raise TypeError(
            f"{name} must be an array-like (numpy array, DLPack-capable tensor or an "
            f"object with __array__); got {type(value).__name__}: {exc}"
        ) from exc


_DTYPE_NAMES: dict[np.dtype, str] = {}  # numpy builds ``dtype.name`` in Python: slow


def dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, remembered per dtype."""
    dtype = np.dtype(dtype)
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def float_dtype_name(dtype: np.dtype) -> str | None:
    """'float32' etc. for the float dtypes the engine computes in, else None."""
    name = dtype_name(dtype)
    return name if name in FLOAT_DTYPES else None


def check_float_dtypes(**arrays: np.ndarray) -> str:
    """All arrays must share one supported float dtype; return its name.

    Integer inputs belong to the quantized API; complex inputs are not supported.
    """
    names = {arg: dtype_name(a.dtype) for arg, a in arrays.items()}
    kinds = set(names.values())
    if len(kinds) == 1 and (kind := kinds.pop()) in FLOAT_DTYPES:
        return kind
    listing = ", ".join(f"{arg}.dtype={dt}" for arg, dt in names.items())
    for arg, a in arrays.items():
        dt = names[arg]
        if dt not in FLOAT_DTYPES:
            hint = (
                " (integer convolution belongs to the quantized API, convengine.qconv)"
                if np.issubdtype(a.dtype, np.integer) or dt == "bool"
                else ""
            )
            raise ConvSetupError(
                f"unsupported dtype {arg}.dtype={dt} ({listing}); expected one of "
                f"{', '.join(FLOAT_DTYPES)}{hint}"
            )
    if len(set(names.values())) > 1:
        raise ConvSetupError(
            f"mixed float dtypes ({listing}); x and w must share one dtype"
        )
    return next(iter(names.values()))


def to_int(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an int or a sequence of ints, got {value!r}"
        ) from None


def shape_tuple(value: Any, name: str) -> tuple[int, ...]:
    """A shape argument (``input_shape``, ``weight_shape``): a sequence (or 1-D integer
    array) of ints, numpy integers included; TypeError naming ``name`` otherwise."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of ints, got {type(value).__name__} "
                        f"{value!r}")
    shape = []
    for v in value:
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} must be a sequence of ints, got {value!r}")
        try:
            shape.append(operator.index(v))
        except TypeError:
            raise TypeError(f"{name} must be a sequence of ints, got {value!r} "
                            f"({type(v).__name__} {v!r} in it)") from None
    return tuple(shape)


def check_elements(shape: Sequence[int], name: str, why: str) -> None:
    """ConvSetupError if an array of ``shape`` would hold more than max_elements() values."""
    count = math.prod(shape)
    limit = max_elements()
    if count > limit:
        raise ConvSetupError(
            f"{name} would have shape {tuple(shape)}: {count:,} elements, more than the "
            f"{limit:,} allowed by {LIMIT_NAME}; {why}"
        )


def _check_extents(
    in_size: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[Pair],
    dilation: Sequence[int],
) -> None:
    """Every padded extent, stride, dilation and dilated kernel extent within max_elements()
    (the kernels index in int64; nothing that large is a convolution)."""
    limit = max_elements()
    for i, (n, k, s, (lo, hi), d) in enumerate(zip(in_size, kernel, stride, padding, dilation)):
        for name, value in (("padding", n + lo + hi), ("stride", s), ("dilation", d),
                            ("dilation", d * (k - 1) + 1)):
            if value > limit:
                raise ConvSetupError(
                    f"{name} too large in spatial dim {i}: padded input {n} + {lo}+{hi}, "
                    f"stride {s}, dilation {d}, kernel {k} give an extent of {value:,}, "
                    f"more than {limit:,} ({LIMIT_NAME})"
                )


def spatial_tuple(value: Any, ndim: int, name: str, minimum: int) -> tuple[int, ...]:
    """An int or one int per spatial dim, each >= minimum."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        items = tuple(to_int(v, name) for v in value)
        if len(items) != ndim:
            raise ConvSetupError(
                f"{name} must be an int or {ndim} ints (one per spatial dim), "
                f"got {len(items)}: {tuple(value)!r}"
            )
    else:
        items = (to_int(value, name),) * ndim
    for v in items:
        if v < minimum:
            raise ConvSetupError(f"{name} must be >= {minimum} in every dim, got {items}")
    return items


def same_padding(
    in_size: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    lower: bool,
) -> tuple[Pair, ...]:
    """ONNX SAME_UPPER (extra pixel at the end) or SAME_LOWER: out = ceil(in / stride)."""
    pads = []
    for n, k, s, d in zip(in_size, kernel, stride, dilation):
        out = -(-n // s)
        total = max((out - 1) * s + d * (k - 1) + 1 - n, 0)
        small, big = total // 2, total - total // 2
        pads.append((big, small) if lower else (small, big))
    return tuple(pads)


def normalize_padding(
    padding: Any,
    in_size: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
) -> tuple[Pair, ...]:
    """Accept int, one int per dim, one (lo, hi) pair per dim, or a mode string."""
    ndim = len(in_size)
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return ((0, 0),) * ndim
        if mode in ("same", "same_lower"):
            return same_padding(in_size, kernel, stride, dilation, lower=mode == "same_lower")
        raise ConvSetupError(
            f"unknown padding mode {padding!r}; expected an int, one int or (lo, hi) "
            f"pair per spatial dim, or one of {PADDING_MODES}"
        )
    if isinstance(padding, Sequence):
        if len(padding) != ndim:
            raise ConvSetupError(
                f"padding must be an int, {ndim} ints or {ndim} (lo, hi) pairs "
                f"(one per spatial dim), got {len(padding)} entries: {padding!r}"
            )
        pairs = []
        for item in padding:
            if isinstance(item, Sequence) and not isinstance(item, str):
                if len(item) != 2:
                    raise ConvSetupError(
                        f"padding pairs must be (lo, hi), got {item!r} in {padding!r}"
                    )
                pairs.append((to_int(item[0], "padding"), to_int(item[1], "padding")))
            else:
                p = to_int(item, "padding")
                pairs.append((p, p))
    else:
        p = to_int(padding, "padding")
        pairs = [(p, p)] * ndim
    if any(lo < 0 or hi < 0 for lo, hi in pairs):
        raise ConvSetupError(f"padding must be >= 0, got {tuple(pairs)}")
    return tuple(pairs)


def output_size(
    in_size: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[Pair],
    dilation: Sequence[int],
    names: tuple[str, str] = ("x", "w"),
) -> tuple[int, ...]:
    """Forward output size per dim; ConvSetupError (naming ``names``, the arguments x and
    w came from) if the kernel does not fit."""
    out = []
    for i, (n, k, s, (lo, hi), d) in enumerate(zip(in_size, kernel, stride, padding, dilation)):
        padded, extent = n + lo + hi, d * (k - 1) + 1
        size = (padded - extent) // s + 1
        if padded < extent:
            raise ConvSetupError(
                f"kernel larger than the padded input in spatial dim {i} ({names[1]} "
                f"kernel over {names[0]}): dilated kernel "
                f"extent {extent} > padded input {padded} (input {n} + padding {lo}+{hi}; "
                f"kernel {k}, dilation {d}); "
                f"the computed output size would be {size}"
            )
        out.append(size)
    return tuple(out)


def check_layout(layout: Any) -> str:
    if not isinstance(layout, str) or layout.upper() not in LAYOUTS:
        raise ConvSetupError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    return layout.upper()


def _check_rank(shape: tuple[int, ...], name: str) -> int:
    if len(shape) not in (3, 4, 5):
        raise ConvSetupError(
            f"{name} must have 3, 4 or 5 dims (batch, channels and 1-3 spatial dims), "
            f"got {len(shape)} dims with shape {shape}"
        )
    return len(shape) - 2


def split_shape(shape: tuple[int, ...], layout: str) -> tuple[int, int, tuple[int, ...]]:
    """(lead, channels, spatial) of an activation or weight shape in a layout."""
    if layout == "NCHW":
        return shape[0], shape[1], tuple(shape[2:])
    return shape[0], shape[-1], tuple(shape[1:-1])


_PROBLEMS: dict[tuple, ConvProblem] = {}  # make_problem's answers by its arguments
_PROBLEMS_MAX = 4096


def arg_key(value: Any) -> Any:
    """A hashable key for an argument that tells ``1`` from ``True`` and ``1.0``, also
    inside tuples and lists; TypeError if the argument is not hashable."""
    kind = type(value)
    if kind is int or kind is str:
        return value
    if kind is tuple or kind is list:
        return (kind, tuple(v if type(v) is int else arg_key(v) for v in value))
    hash(value)
    return (kind, value)


def make_problem(pass_: str, x_shape: Sequence[int], w_shape: Sequence[int], **kwargs: Any
                 ) -> ConvProblem:
    """Validate the forward shapes (x, w) and build the problem for one pass (see
    :func:`build_problem`). Repeated calls with equal arguments (the steady state of
    a model) get the problem built the first time: building it costs tens of
    microseconds, a lookup one."""
    try:
        key = (pass_, arg_key(x_shape), arg_key(w_shape),
               *((name, arg_key(v)) for name, v in sorted(kwargs.items())))
    except TypeError:  # an unhashable argument (e.g. an array as padding): no memo
        return build_problem(pass_, x_shape, w_shape, **kwargs)
    problem = _PROBLEMS.get(key)
    if problem is None:
        problem = build_problem(pass_, x_shape, w_shape, **kwargs)
        if len(_PROBLEMS) >= _PROBLEMS_MAX:
            _PROBLEMS.clear()
        _PROBLEMS[key] = problem
    return problem


def build_problem(
    pass_: str,
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    dtype: str,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
    layout: Any = "NCHW",
    has_bias: bool = False,
    x_name: str = "x",
    w_name: str = "w",
) -> ConvProblem:
    """Validate the forward shapes (x, w) and build the problem for one pass."""
    if pass_ not in PASSES:
        raise ConvSetupError(f"unknown pass {pass_!r}; expected one of {PASSES}")
    layout = check_layout(layout)
    x_shape, w_shape = shape_tuple(x_shape, x_name), shape_tuple(w_shape, w_name)
    ndim = _check_rank(x_shape, x_name)
    if len(w_shape) != len(x_shape):
        raise ConvSetupError(
            f"{x_name} and {w_name} ranks differ: {x_name} has shape {x_shape} "
            f"({len(x_shape)} dims), {w_name} has shape {w_shape} ({len(w_shape)} dims)"
        )
    groups = to_int(groups, "groups")
    if groups < 1:
        raise ConvSetupError(f"groups must be >= 1, got {groups}")
    batch, channels, in_size = split_shape(x_shape, layout)
    out_channels, w_channels, kernel = split_shape(w_shape, layout)
    if batch < 0 or channels < 1 or out_channels < 1 or min(in_size + kernel) < 1:
        raise ConvSetupError(
            f"empty dims: {x_name} shape {x_shape} and {w_name} shape {w_shape} need "
            f"channels, kernel and spatial sizes >= 1 (only the batch may be 0)"
        )
    if channels % groups:
        raise ConvSetupError(f"groups={groups} does not divide the input channels C={channels}")
    if out_channels % groups:
        raise ConvSetupError(
            f"groups={groups} does not divide the output channels O={out_channels}"
        )
    if w_channels != channels // groups:
        raise ConvSetupError(
            f"channel mismatch: {w_name} shape {w_shape} ({layout}) has {w_channels} "
            f"input channels per group, expected C // groups = {channels} // {groups} "
            f"= {channels // groups} (C from {x_name} shape {x_shape})"
        )
    stride_t = spatial_tuple(stride, ndim, "stride", 1)
    dilation_t = spatial_tuple(dilation, ndim, "dilation", 1)
    padding_t = normalize_padding(padding, in_size, kernel, stride_t, dilation_t)
    _check_extents(in_size, kernel, stride_t, padding_t, dilation_t)
    out_size = output_size(in_size, kernel, stride_t, padding_t, dilation_t, (x_name, w_name))
    result = {"forward": ("the output y", (batch, out_channels, *out_size)),
              "backward_data": (x_name, x_shape), "backward_weight": (w_name, w_shape)}
    name, shape = result[pass_]
    check_elements(shape, name, f"from {x_name} {x_shape}, {w_name} {w_shape}, stride "
                   f"{stride_t}, padding {padding_t}, dilation {dilation_t}")
    return ConvProblem(
        pass_=pass_,
        layout=layout,
        dtype=dtype,
        batch=batch,
        in_channels=channels,
        out_channels=out_channels,
        groups=groups,
        in_size=in_size,
        kernel=kernel,
        out_size=out_size,
        stride=stride_t,
        padding=padding_t,
        dilation=dilation_t,
        has_bias=has_bias,
    )


def geometry(problem: ConvProblem) -> str:
    """The arguments besides the shapes, for messages: stride, padding, dilation, groups."""
    return (f"stride {problem.stride}, padding {problem.padding}, dilation "
            f"{problem.dilation}, groups {problem.groups}, layout {problem.layout}")


def check_shape(actual: Sequence[int], expected: Sequence[int], name: str, why: str) -> None:
    if tuple(actual) != tuple(expected):
        raise ConvSetupError(
            f"{name} has shape {tuple(actual)}, expected {tuple(expected)} ({why})"
        )


def transpose_output_size(
    in_size: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[Pair],
    dilation: Sequence[int],
    output_padding: Sequence[int],
) -> tuple[int, ...]:
    """Output size of a transposed convolution (the forward conv's input size)."""
    out = []
    for i, (n, k, s, (lo, hi), d, op) in enumerate(
        zip(in_size, kernel, stride, padding, dilation, output_padding)
    ):
        size = (n - 1) * s - lo - hi + d * (k - 1) + 1 + op
        if size < 1:
            raise ConvSetupError(
                f"transposed convolution output would be empty in spatial dim {i}: "
                f"computed size {size} from input {n}, stride {s}, padding {lo}+{hi}, "
                f"dilated kernel {d * (k - 1) + 1} (kernel {k}, dilation {d}), "
                f"output_padding {op}"
            )
        out.append(size)
    return tuple(out)
