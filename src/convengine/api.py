"""The functional API: conv, its two gradients, the transposed conv, explain, and qconv.

Each call normalises its arguments into a :class:`ConvProblem`, resolves an
algorithm (both remembered for calls repeated with the same shapes and arguments),
converts the operands once into the kernels' canonical channels-last,
compute-dtype form (a no-op for contiguous channels-last float32/float64 input),
runs, and converts the result back to the caller's layout and dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import builders, devices, nan_rule, quant, select
from .errors import ConvSetupError
from .problem import (
    ConvProblem,
    arg_key,
    as_array,
)
from .registry import Algorithm, Bound

# ---------------------------------------------------------------- running a pass


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


# ---------------------------------------------------------------- public calls


def _gpu_dispatch() -> Any:
    """The GPU backend's float calls (imported on the first device call: torch, triton)."""
    from .gpu import dispatch

    return dispatch


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
    if devices.wanted(algo, x, w):  # CUDA operands or a GPU algo: convengine.gpu
        return _gpu_dispatch().conv(
            x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
            layout=layout, algo=algo)
    x, w = as_array(x, "x"), as_array(w, "w")
    problem, chosen, run = _resolve_call(
        _call_key("forward", x, w, bias is None, stride, padding, dilation, groups, layout,
                  algo),
        lambda: builders.forward_problem(x, w, bias, stride=stride, padding=padding,
                                         dilation=dilation, groups=groups, layout=layout),
        algo)
    b = (None if bias is None
         else builders.check_bias(bias, problem.out_channels, problem.compute_dtype))
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
    return _gradient("backward_data", ("dy", "w"), dy, w, input_shape, stride, padding,
                     dilation, groups, layout, algo)


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
    return _gradient("backward_weight", ("x", "dy"), x, dy, weight_shape, stride, padding,
                     dilation, groups, layout, algo)


def _gradient(pass_: str, names: tuple[str, str], a: Any, b: Any, shape: Sequence[int],
              stride: Any, padding: Any, dilation: Any, groups: int, layout: str,
              algo: str) -> np.ndarray:
    """A gradient call, ``pass_`` "backward_data" (dy, w -> dx of ``shape``) or
    "backward_weight" (x, dy -> dw of ``shape``); ``names``: the operands' names. The
    result has the first operand's dtype."""
    if devices.wanted(algo, a, b):
        return getattr(_gpu_dispatch(), f"conv_{pass_}")(
            a, b, shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
            layout=layout, algo=algo)
    a, b = as_array(a, names[0]), as_array(b, names[1])
    problem, chosen, run = _resolve_call(
        _call_key(pass_, a, b, shape, stride, padding, dilation, groups, layout, algo),
        lambda: builders.BUILDERS[pass_](a, b, shape, stride=stride, padding=padding,
                                         dilation=dilation, groups=groups, layout=layout),
        algo)
    return _execute(problem, chosen, run, a, b, a.dtype)


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
    if devices.wanted(algo, x, w):
        return _gpu_dispatch().conv_transpose(
            x, w, bias, stride=stride, padding=padding, output_padding=output_padding,
            dilation=dilation, groups=groups, layout=layout, algo=algo)
    x, w = as_array(x, "x"), as_array(w, "w")
    problem, chosen, run = _resolve_call(
        _call_key("transpose", x, w, bias is None, stride, padding, output_padding, dilation,
                  groups, layout, algo),
        lambda: builders.transpose_problem(x, w, bias, stride=stride, padding=padding,
                                           output_padding=output_padding, dilation=dilation,
                                           groups=groups, layout=layout),
        algo)
    b = (None if bias is None
         else builders.check_bias(bias, problem.in_channels, problem.compute_dtype))
    if x.shape != problem.y_shape():
        x = _zero_extend(x, problem.y_shape())
    return _execute(problem, chosen, run, x, w, x.dtype, b)


def _zero_extend(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` padded with zeros at the end of each dim up to ``shape``."""
    return np.pad(a, [(0, t - n) for n, t in zip(a.shape, shape)])




def explain(*args: Any, pass_: str = "forward", **kwargs: Any) -> select.Explanation:
    """Which algorithms can serve a call, why the others cannot, and what auto runs.

    Takes the arguments of the call named by ``pass_`` ("forward", "backward_data",
    "backward_weight" or "transpose"), or a single :class:`ConvProblem`.
    Returns an :class:`Explanation`; ``print`` it for a table.
    """
    if len(args) == 1 and isinstance(args[0], ConvProblem) and not kwargs:
        return select.explain_problem(args[0])
    if pass_ not in builders.BUILDERS:
        raise ConvSetupError(f"unknown pass_ {pass_!r}; expected one of {tuple(builders.BUILDERS)}")
    kwargs.pop("algo", None)
    if devices.wanted(None, *args):  # CUDA operands: the GPU algorithms' verdicts
        return _gpu_dispatch().explain(pass_, *args, **kwargs)
    arrays = [as_array(a, f"argument {i}") if hasattr(a, "shape") else a for i, a in enumerate(args)]
    return select.explain_problem(builders.BUILDERS[pass_](*arrays, **kwargs))


@functools.wraps(quant.qconv)
def qconv(x_q: Any, *args: Any, **kwargs: Any) -> Any:
    # host arrays: convengine.quant.qconv; device tensors or a GPU algo: the GPU backend
    w_q = args[2] if len(args) > 2 else kwargs.get("w_q")
    if devices.wanted(kwargs.get("algo"), x_q, w_q):
        from .gpu import quant as gpu_quant

        return gpu_quant.qconv(x_q, *args, **kwargs)
    return quant.qconv(x_q, *args, **kwargs)
