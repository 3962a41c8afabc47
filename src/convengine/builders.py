"""Problem builders: the arguments of each public call, validated into a ConvProblem.

One builder per call (``forward``, ``backward_data``, ``backward_weight``,
``transpose``), shared by the CPU front (:mod:`convengine.api`) and the GPU backend,
which hands them array metadata (anything with ``shape``, ``ndim`` and ``dtype``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import ConvSetupError
from .problem import (
    ConvProblem,
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


def check_bias(bias: Any, channels: int, dtype: np.dtype) -> np.ndarray | None:
    """``bias`` as a float array of ``channels`` values in ``dtype`` (None stays None)."""
    if bias is None:
        return None
    b = as_array(bias, "bias")
    if not (np.issubdtype(b.dtype, np.floating) or b.dtype.name == "bfloat16"):
        raise ConvSetupError(f"bias must be a float array, got dtype {b.dtype}")
    check_shape(b.shape, (channels,), "bias", "one value per output channel")
    return b.astype(dtype)


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
        "backward_data", shape_tuple(input_shape, "input_shape"), w.shape, dtype=dtype,
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
        "backward_weight", x.shape, shape_tuple(weight_shape, "weight_shape"), dtype=dtype,
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


BUILDERS: dict[str, Callable[..., ConvProblem]] = {
    "forward": forward_problem,
    "backward_data": backward_data_problem,
    "backward_weight": backward_weight_problem,
    "transpose": transpose_problem,
}
