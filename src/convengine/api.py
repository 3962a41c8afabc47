"""The functional API: conv, its two gradients, the transposed conv, and explain.

Each call normalises its arguments into a :class:`ConvProblem`, resolves an
algorithm (both remembered for calls repeated with the same shapes and arguments),
converts the operands once into the kernels' canonical channels-last,
compute-dtype form (a no-op for contiguous channels-last float32/float64 input),
runs, and converts the result back to the caller's layout and dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import gpu, nan_rule, select
from .errors import ConvSetupError
from .problem import (
    ConvProblem,
    arg_key,
    as_array,
    check_float_dtypes,
    check_layout,
    check_shape,
    geometry,
    make_problem,
    normalize_padding,
    shape_tuple,
    spatial_tuple,
    split_shape,
    to_int,
    transpose_output_size,
)
from .registry import Algorithm, Bound

# ---------------------------------------------------------------- running a pass


def _check_bias(bias: Any, channels: int, dtype: np.dtype) -> np.ndarray | None:
    if bias is None:
        return None
    b = as_array(bias, "bias")
    if not (np.issubdtype(b.dtype, np.floating) or b.dtype.name == "bfloat16"):
        raise ConvSetupError(f"bias must be a float array, got dtype {b.dtype}")
    check_shape(b.shape, (channels,), "bias", "one value per output channel")
    return b.astype(dtype)


def _execute(
    problem: ConvProblem,
    algorithm: Algorithm,
    run: Bound,
    a: np.ndarray,
    b: np.ndarray,
    out_dtype: np.dtype,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """Run one pass, ``run(a, b)`` (``algorithm`` bound to ``problem``); ``a``/``b`` in
    the problem's layout. Empty problems short-cut.
    The operands go to the kernels C-contiguous, channels-last, in the compute dtype
    (converted at most once each: no copy for contiguous NHWC input of that dtype) and
    the result comes back in the caller's layout and ``out_dtype``."""
    if problem.batch == 0:
        return np.zeros(problem.result_shape(), dtype=out_dtype)
    dtype, nchw = problem.compute_dtype, problem.layout == "NCHW"
    if nchw:
        a, b = np.moveaxis(a, 1, -1), np.moveaxis(b, 1, -1)
    a, b = np.ascontiguousarray(a, dtype=dtype), np.ascontiguousarray(b, dtype=dtype)
    if algorithm.numpy_math:
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf propagate silently
            out = run(a, b)
    else:  # compiled code raises no numpy warnings (errstate costs 7-18 us cold)
        out = run(a, b)
    if nan_rule.must_recompute(problem, algorithm, b, out):  # one NaN rule for all algorithms
        with np.errstate(invalid="ignore", over="ignore"):
            out = nan_rule.reference(problem).run(problem, a, b)
    if bias is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            out += bias
    return np.ascontiguousarray(np.moveaxis(out, -1, 1) if nchw else out, dtype=out_dtype)


# ---------------------------------------------------------------- steady state

# Validated calls by what they were called with: (call, the operands' shapes and
# dtypes, the other arguments and their types, algo) -> (the select.settings
# they were resolved under, problem, algorithm, the algorithm bound to the problem).
# A model calls the same convolutions again and again; validating, building and
# resolving afresh runs some 25 Python functions, 50-80 us with the caches cold after
# a large kernel (as much as a small layer's kernel), where this costs one lookup and
# the settings check; the bound algorithm skips the kernels' own plan lookups.
_CALLS: dict[tuple, tuple[tuple[object, ...], ConvProblem, Algorithm, Bound]] = {}
_CALLS_MAX = 4096


def _call_key(pass_: str, a: np.ndarray, b: np.ndarray, *args: Any) -> tuple:
    """The memo key of a call: the arguments with their types (1 and True, 1 and 1.0
    compare equal but are not the same argument), tuples and lists through arg_key."""
    kinds = tuple(map(type, args))
    if tuple in kinds or list in kinds:
        try:
            args = tuple(map(arg_key, args))
        except TypeError:  # unhashable inside: the lookup fails the same way
            pass
    return (pass_, a.shape, a.dtype, b.shape, b.dtype, args, kinds)


def _resolve_call(
    key: tuple, build: Callable[[], ConvProblem], algo: str
) -> tuple[ConvProblem, Algorithm, Bound]:
    """The (problem, algorithm, algorithm bound to the problem) of a call: remembered
    under ``key`` while the settings stay, else validated by ``build()`` and resolved."""
    try:
        hit = _CALLS.get(key)
    except TypeError:  # an unhashable argument (an array as padding, ...): no memo
        problem = build()
        chosen = select.resolve(problem, algo)
        return problem, chosen, chosen.bind(problem)
    if hit is not None and hit[0] == select.settings(hit[1].pass_):
        return hit[1], hit[2], hit[3]
    problem = build()
    chosen = select.resolve(problem, algo)
    bound = chosen.bind(problem)
    if len(_CALLS) >= _CALLS_MAX:
        _CALLS.clear()
    # the settings after resolving: tuning on a miss adds to the tuning caches
    _CALLS[key] = (select.settings(problem.pass_), problem, chosen, bound)
    return problem, chosen, bound


# ---------------------------------------------------------------- problem builders


def forward_problem(
    x: np.ndarray,
    w: np.ndarray,
    bias: Any = None,
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
    layout: Any = "NCHW",
) -> ConvProblem:
    dtype = check_float_dtypes(x=x, w=w)
    return make_problem("forward", x.shape, w.shape, dtype=dtype, has_bias=bias is not None,
                        stride=stride, padding=padding, dilation=dilation, groups=groups,
                        layout=layout)


def backward_data_problem(
    dy: np.ndarray, w: np.ndarray, input_shape: Sequence[int], **conv_args: Any
) -> ConvProblem:
    dtype = check_float_dtypes(dy=dy, w=w)
    problem = make_problem(
        "backward_data", _shape(input_shape, "input_shape"), w.shape, dtype=dtype,
        x_name="input_shape", **conv_args,
    )
    check_shape(dy.shape, problem.y_shape(), "dy",
                f"the conv output of input_shape {problem.x_shape()}, {geometry(problem)}")
    return problem


def backward_weight_problem(
    x: np.ndarray, dy: np.ndarray, weight_shape: Sequence[int], **conv_args: Any
) -> ConvProblem:
    dtype = check_float_dtypes(x=x, dy=dy)
    problem = make_problem(
        "backward_weight", x.shape, _shape(weight_shape, "weight_shape"), dtype=dtype,
        w_name="weight_shape", **conv_args,
    )
    why = (f"the conv output of x {x.shape} and weight_shape {problem.w_shape()}, "
           f"{geometry(problem)}")
    check_shape(dy.shape, problem.y_shape(), "dy", why)
    return problem


def transpose_problem(
    x: np.ndarray,
    w: np.ndarray,
    bias: Any = None,
    *,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
    layout: Any = "NCHW",
) -> ConvProblem:
    """A transposed conv is the backward-data pass of the forward conv whose input it
    produces: w ``(C_in, C_out // g, *K)`` is that forward conv's weight."""
    dtype = check_float_dtypes(x=x, w=w)
    if x.ndim not in (3, 4, 5) or w.ndim != x.ndim:
        # make_problem phrases rank errors; feed it the shapes as they are
        make_problem("forward", x.shape, w.shape, dtype=dtype, layout=layout)
    ndim, layout = x.ndim - 2, check_layout(layout)
    _, x_channels, in_size = split_shape(x.shape, layout)
    w_lead, w_channels, kernel = split_shape(w.shape, layout)
    if min(x_channels, *in_size, w_lead, w_channels, *kernel) < 1:
        raise ConvSetupError(f"empty dims: x shape {x.shape} and w shape {w.shape} ({layout}) "
                             f"need channels, kernel and spatial sizes >= 1 (only the batch "
                             f"may be 0)")
    stride_t = spatial_tuple(stride, ndim, "stride", 1)
    dilation_t = spatial_tuple(dilation, ndim, "dilation", 1)
    out_pad = spatial_tuple(output_padding, ndim, "output_padding", 0)
    for op, s, d in zip(out_pad, stride_t, dilation_t):
        if op >= s and op >= d:
            raise ConvSetupError(
                f"output_padding must be smaller than stride or dilation, got "
                f"output_padding={out_pad}, stride={stride_t}, dilation={dilation_t}"
            )
    if isinstance(padding, str) and padding.lower() in ("same", "same_lower"):
        # the transposed output is in * stride; pad away what overhangs
        total = [
            max((n - 1) * s + d * (k - 1) + 1 + op - n * s, 0)
            for n, k, s, d, op in zip(in_size, kernel, stride_t, dilation_t, out_pad)
        ]
        lower = padding.lower() == "same_lower"
        pads: Any = tuple(
            (t - t // 2, t // 2) if lower else (t // 2, t - t // 2) for t in total
        )
    else:
        pads = normalize_padding(padding, in_size, kernel, stride_t, dilation_t)
    out_size = transpose_output_size(in_size, kernel, stride_t, pads, dilation_t, out_pad)
    groups = to_int(groups, "groups")
    if groups < 1:
        raise ConvSetupError(f"groups must be >= 1, got {groups}")
    channels = w_channels * groups
    nchw = layout == "NCHW"
    fwd_x = (x.shape[0], channels, *out_size) if nchw else (x.shape[0], *out_size, channels)
    problem = make_problem(
        "backward_data", fwd_x, w.shape, dtype=dtype, stride=stride_t, padding=pads,
        dilation=dilation_t, groups=groups, layout=layout, has_bias=bias is not None,
        x_name="output", w_name="w",
    )
    # output_padding below the dilation (not the stride) can make the forward conv of
    # the output longer than x: x then stands for a dy zero-extended at the end
    expected = list(problem.y_shape())
    for dim, n in zip(range(2, 2 + ndim) if nchw else range(1, 1 + ndim), in_size):
        expected[dim] = n
    check_shape(x.shape, expected, "x", f"input of the transposed convolution, {geometry(problem)}")
    return problem


def _shape(value: Any, name: str) -> tuple[int, ...]:
    return shape_tuple(value, name)


# ---------------------------------------------------------------- public calls


def conv(
    x: Any,
    w: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    algo: str = "auto",
) -> np.ndarray:
    """N-d convolution (cross-correlation, as in PyTorch and ONNX).

    x ``(N, C, *S)`` and w ``(O, C // groups, *K)`` in NCHW, or x ``(N, *S, C)`` and
    w ``(O, *K, C // groups)`` in NHWC; bias ``(O,)``. Returns y in the same layout.
    """
    if gpu.wanted(algo, x, w):  # CUDA operands or a GPU algo: convengine.gpu
        return gpu.route("conv", x, w, bias, stride=stride, padding=padding, dilation=dilation,
                         groups=groups, layout=layout, algo=algo)
    x, w = as_array(x, "x"), as_array(w, "w")
    problem, chosen, run = _resolve_call(
        _call_key("forward", x, w, bias is None, stride, padding, dilation, groups, layout,
                  algo),
        lambda: forward_problem(x, w, bias, stride=stride, padding=padding,
                                dilation=dilation, groups=groups, layout=layout),
        algo)
    b = None if bias is None else _check_bias(bias, problem.out_channels, problem.compute_dtype)
    return _execute(problem, chosen, run, x, w, x.dtype, b)


def conv_backward_data(
    dy: Any,
    w: Any,
    input_shape: Sequence[int],
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    algo: str = "auto",
) -> np.ndarray:
    """Gradient of :func:`conv` w.r.t. x: dy ``(N, O, *S_out)`` -> dx of ``input_shape``."""
    if gpu.wanted(algo, dy, w):
        return gpu.route("conv_backward_data", dy, w, input_shape, stride=stride,
                         padding=padding, dilation=dilation, groups=groups, layout=layout,
                         algo=algo)
    dy, w = as_array(dy, "dy"), as_array(w, "w")
    problem, chosen, run = _resolve_call(
        _call_key("backward_data", dy, w, input_shape, stride, padding, dilation, groups,
                  layout, algo),
        lambda: backward_data_problem(dy, w, input_shape, stride=stride, padding=padding,
                                      dilation=dilation, groups=groups, layout=layout),
        algo)
    return _execute(problem, chosen, run, dy, w, dy.dtype)


def conv_backward_weight(
    x: Any,
    dy: Any,
    weight_shape: Sequence[int],
    *,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    algo: str = "auto",
) -> np.ndarray:
    """Gradient of :func:`conv` w.r.t. w: (x, dy) -> dw of ``weight_shape``."""
    if gpu.wanted(algo, x, dy):
        return gpu.route("conv_backward_weight", x, dy, weight_shape, stride=stride,
                         padding=padding, dilation=dilation, groups=groups, layout=layout,
                         algo=algo)
    x, dy = as_array(x, "x"), as_array(dy, "dy")
    problem, chosen, run = _resolve_call(
        _call_key("backward_weight", x, dy, weight_shape, stride, padding, dilation, groups,
                  layout, algo),
        lambda: backward_weight_problem(x, dy, weight_shape, stride=stride, padding=padding,
                                        dilation=dilation, groups=groups, layout=layout),
        algo)
    return _execute(problem, chosen, run, x, dy, x.dtype)


def conv_transpose(
    x: Any,
    w: Any,
    bias: Any = None,
    *,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    layout: str = "NCHW",
    algo: str = "auto",
) -> np.ndarray:
    """Transposed convolution; w ``(C_in, C_out // groups, *K)`` as in PyTorch/ONNX.

    Output size per dim: ``(S - 1) * stride - lo - hi + dilation * (K - 1) + 1 + output_padding``.
    """
    if gpu.wanted(algo, x, w):
        return gpu.route("conv_transpose", x, w, bias, stride=stride, padding=padding,
                         output_padding=output_padding, dilation=dilation, groups=groups,
                         layout=layout, algo=algo)
    x, w = as_array(x, "x"), as_array(w, "w")
    problem, chosen, run = _resolve_call(
        _call_key("transpose", x, w, bias is None, stride, padding, output_padding, dilation,
                  groups, layout, algo),
        lambda: transpose_problem(x, w, bias, stride=stride, padding=padding,
                                  output_padding=output_padding, dilation=dilation,
                                  groups=groups, layout=layout),
        algo)
    b = None if bias is None else _check_bias(bias, problem.in_channels, problem.compute_dtype)
    if x.shape != problem.y_shape():
        x = _zero_extend(x, problem.y_shape())
    return _execute(problem, chosen, run, x, w, x.dtype, b)


def _zero_extend(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` padded with zeros at the end of each dim up to ``shape``."""
    return np.pad(a, [(0, t - n) for n, t in zip(a.shape, shape)])


_BUILDERS: dict[str, Callable[..., ConvProblem]] = {
    "forward": forward_problem,
    "backward_data": backward_data_problem,
    "backward_weight": backward_weight_problem,
    "transpose": transpose_problem,
}


def explain(*args: Any, pass_: str = "forward", **kwargs: Any) -> select.Explanation:
    """Which algorithms can serve a call, why the others cannot, and what auto runs.

    Takes the arguments of the call named by ``pass_`` ("forward", "backward_data",
    "backward_weight" or "transpose"), or a single :class:`ConvProblem`.
    Returns an :class:`Explanation`; ``print`` it for a table.
    """
    if len(args) == 1 and isinstance(args[0], ConvProblem) and not kwargs:
        return select.explain_problem(args[0])
    if pass_ not in _BUILDERS:
        raise ConvSetupError(f"unknown pass_ {pass_!r}; expected one of {tuple(_BUILDERS)}")
    kwargs.pop("algo", None)
    if gpu.wanted(None, *args):  # CUDA operands: the GPU algorithms' verdicts
        return gpu.route("explain", pass_, *args, **kwargs)
    arrays = [as_array(a, f"argument {i}") if hasattr(a, "shape") else a for i, a in enumerate(args)]
    return select.explain_problem(_BUILDERS[pass_](*arrays, **kwargs))
