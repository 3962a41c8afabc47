"""A QLinearConv node prepared once (:class:`QConvStep`): constant quantization
parameters and weights validated and packed once per input shape and thread count
(:func:`convengine.quant.plan.bind`), the VNNI / depthwise kernel called directly
into a channels-last output from :func:`convengine.memory.empty` (a reused block),
a following ReLU folded into the requantization clamp (at the output zero point, as
``max(y, y_zp)``), and a following QLinearAdd computed from the rounded result in
the kernel's work items (:func:`convengine.quant.plan.residual`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .. import memory
from ..errors import ConvSetupError
from ..quant import cpu
from ..quant import plan as qplan
from ..threads import get_num_threads
from .ops import Array, to_first, to_last
from .qops import MICROSOFT_OPS, qlinear_add_params

QAdd = tuple[bool, list[Array]]  # (conv's result is A, [a_s, a_zp, b_s, b_zp, c_s, c_zp])
# (launch, allocate() -> y (rows, O), (rows, O), y's NHWC shape, x's canonical shape)
_Bound = tuple[qplan.Launch, Any, tuple[int, int], tuple[int, ...], tuple[int, ...]]


class QConvStep:
    """``step(x) -> y``: QLinearConv of NCHW-shaped uint8/int8 ``x`` (a view of
    channels-last memory) with w ``(O, C/g, *K)``; y an NCHW view of channels-last
    ``(N, *S_out, O)`` memory of ``y_zp``'s dtype. Parameters as QLinearConv's inputs
    (scalars, or per output channel for ``w_scale``/``w_zp``), ``b`` int32 or None.
    Without ``y_zp``: the exact int32 accumulator (plus ``b``), as ConvInteger.
    With ``add``: ``step(x, other)`` is QLinearAdd(y, other) (or (other, y)) with the
    add's constant parameters, its output of y's dtype."""

    def __init__(self, w: Array, x_scale: Any, x_zp: Array, w_scale: Any, w_zp: Array,
                 b: Array | None, args: dict[str, Any], *, y_scale: Array | None = None,
                 y_zp: Array | None = None, relu: bool = False, add: QAdd | None = None
                 ) -> None:
        self.w_last = np.ascontiguousarray(np.moveaxis(w, 1, -1))
        out_dtype = np.dtype(np.int32) if y_zp is None else np.asarray(y_zp).dtype
        self.params = (x_scale, x_zp, w_scale, w_zp, b, y_scale,
                       None if y_zp is None else np.asarray(y_zp), out_dtype, relu)
        self.args = args
        self.add = add
        if add is not None:
            ra, rb, fixed = map(float, qlinear_add_params(*add[1]))
            self._residual = qplan.residual_add(add[0], ra, rb, fixed, out_dtype)
        self._launches: dict[tuple[Any, ...], _Bound] = {}

    def __call__(self, x: Array, other: Array | None = None) -> Array:
        key = (x.shape, x.dtype, get_num_threads(), cpu.int8_path())
        bound = self._launches.get(key)
        if bound is None:
            bound = self._launches[key] = self._bind(to_last(x))
        launch, allocate, y_rows, shape, canonical = bound
        y = allocate()
        xc = np.ascontiguousarray(to_last(x)).reshape(canonical)
        if self.add is None:
            if y.size:
                launch(xc, y)
            return to_first(y.reshape(shape))
        if other is None:
            raise ConvSetupError("a QLinearConv fused with QLinearAdd needs the add's other "
                                 "operand; none was given")
        ol = to_last(np.asarray(other))
        if ol.shape != shape or ol.dtype.itemsize != 1:  # broadcasting: the add apart
            if y.size:
                launch(xc, y)
            return self._add_apart(to_first(y.reshape(shape)), other)
        if y.size:
            launch(xc, y, (np.ascontiguousarray(ol).reshape(y_rows[0], -1), *self._residual))
        return to_first(y.reshape(shape))

    def _add_apart(self, y: Array, other: Array) -> Array:
        """QLinearAdd of y and ``other`` by the operator itself (a fused step only)."""
        if self.add is None:
            raise ConvSetupError("this QLinearConv step has no fused QLinearAdd")
        a_s, a_zp, b_s, b_zp, c_s, c_zp = self.add[1]
        a, b = (y, other) if self.add[0] else (other, y)
        return MICROSOFT_OPS["QLinearAdd"]([a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp], {})[0]

    def _bind(self, xl: Array) -> _Bound:
        """Everything a call with x of ``xl``'s shape and dtype needs, worked out once:
        the kernel's launcher, the output's allocator, its ``(rows, O)`` and NHWC
        shapes and the kernel's canonical shape of x."""
        xs, xzp, ws, wzp, b, ys, yzp, odt, relu = self.params
        plan = qplan.cached_plan((xl.shape, xl.dtype, self.w_last.shape, self.w_last.dtype,
                                  xs, xzp, ws, wzp, b, ys, yzp, odt, relu, "int32",
                                  self.args["stride"], self.args["padding"],
                                  self.args["dilation"], self.args["groups"], "NHWC", "auto"))
        problem = plan.problem
        y_rows = (problem.batch * math.prod(problem.out_size), problem.out_channels)
        small = math.prod(y_rows) * plan.out_dtype.itemsize < memory.MIN_BYTES
        canonical = qplan.canonical(np.empty(xl.shape, xl.dtype), problem).shape
        allocate = functools.partial(np.empty, y_rows, plan.out_dtype) if small \
            else memory.allocator(y_rows, plan.out_dtype)
        return (qplan.bind(plan, self.w_last, xl.dtype), allocate, y_rows,
                tuple(problem.y_shape("NHWC")), canonical)
