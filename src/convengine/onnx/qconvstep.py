"""A QLinearConv node prepared once (:class:`QConvStep`): constant quantization
parameters and weights validated and packed once per input shape and thread count
(:func:`convengine.quant.api.bind`), the VNNI / depthwise kernel called directly
into a channels-last output from :func:`convengine.memory.empty` (a reused block),
a following ReLU folded into the requantization clamp (at the output zero point, as
``max(y, y_zp)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import memory
from ..quant import api as qapi
from ..quant import cpu
from ..threads import get_num_threads
from .ops import Array, to_first, to_last

Launch = Callable[[Array, Array], None]


class QConvStep:
    """``step(x) -> y``: QLinearConv of NCHW-shaped uint8/int8 ``x`` (a view of
    channels-last memory) with w ``(O, C/g, *K)``; y an NCHW view of channels-last
    ``(N, *S_out, O)`` memory of ``y_zp``'s dtype. Parameters as QLinearConv's inputs
    (scalars, or per output channel for ``w_scale``/``w_zp``), ``b`` int32 or None.
    Without ``y_zp``: the exact int32 accumulator (plus ``b``), as ConvInteger."""

    def __init__(self, w: Array, x_scale: Any, x_zp: Array, w_scale: Any, w_zp: Array,
                 b: Array | None, args: dict[str, Any], *, y_scale: Array | None = None,
                 y_zp: Array | None = None, relu: bool = False) -> None:
        self.w_last = np.ascontiguousarray(np.moveaxis(w, 1, -1))
        out_dtype = np.dtype(np.int32) if y_zp is None else np.asarray(y_zp).dtype
        self.params = (x_scale, x_zp, w_scale, w_zp, b, y_scale,
                       None if y_zp is None else np.asarray(y_zp), out_dtype, relu)
        self.args = args
        self._launches: dict[tuple[Any, ...], tuple[qapi.Plan, Launch]] = {}

    def __call__(self, x: Array) -> Array:
        xl = to_last(x)
        key = (xl.shape, xl.dtype, get_num_threads(), cpu.int8_path())
        found = self._launches.get(key)
        if found is None:
            found = self._launches[key] = self._bind(xl)
        plan, launch = found
        problem = plan.problem
        y = memory.empty((problem.batch * math.prod(problem.out_size), problem.out_channels),
                     dtype=plan.out_dtype)
        if y.size:
            launch(qapi._canonical(xl, problem), y)
        return to_first(y.reshape(problem.y_shape("NHWC")))

    def _bind(self, xl: Array) -> tuple[qapi.Plan, Launch]:
        xs, xzp, ws, wzp, b, ys, yzp, odt, relu = self.params
        plan = qapi._cached_plan((xl.shape, xl.dtype, self.w_last.shape, self.w_last.dtype,
                                  xs, xzp, ws, wzp, b, ys, yzp, odt, relu, "int32",
                                  self.args["stride"], self.args["padding"],
                                  self.args["dilation"], self.args["groups"], "NHWC", "auto"))
        return plan, qapi.bind(plan, self.w_last, xl.dtype)
