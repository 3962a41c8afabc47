"""A float Conv node prepared once (:class:`ConvStep`): its weights laid out
channels-last, packed once for the algorithm convengine's heuristic picks per input
shape, the kernel called directly (no per-call validation, weight-cache lookup or NaN
scan of constant weights), and bias + residual + ReLU / ReLU6 / SiLU in one parallel
pass over the output (:mod:`convengine.fused_epilogue`).

Weights holding NaN or infinity, dtypes other than float32 and empty batches take
:func:`convengine.conv` (the NaN rule); activations the fused pass lacks run in numpy
after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import api, fused_epilogue, registry, select
from ..algorithms import blocked, winograd
from ..algorithms._finite import nonfinite
from ..threads import get_num_threads
from .ops import Array, hard_sigmoid, sigmoid, to_first, to_last

Kernel = Callable[[Array], Array]


def fused_activation(step: tuple[str, Any]) -> str | None:
    """The fused pass's name for an epilogue step ("relu", "relu6", "silu"), or None."""
    kind, arg = step
    if kind in ("relu", "silu"):
        return kind
    if kind == "clip":
        lo, hi = (None if v is None else float(np.asarray(v)) for v in arg)
        if lo == 0 and hi is None:
            return "relu"
        if lo == 0 and hi == 6:
            return "relu6"
    return None


def apply_steps(y: Array, steps: Sequence[tuple[str, Any]], extra: Sequence[Array]) -> Array:
    """The epilogue ``steps`` on the conv output ``y`` in numpy (in place where shapes
    allow): ``("add", i)`` adds ``extra[i]``, then relu, clip (lo, hi), leaky (alpha),
    sigmoid, silu, hardswish, hardsigmoid (alpha, beta)."""
    for kind, arg in steps:
        if kind == "add":
            r = extra[arg]
            if np.broadcast_shapes(y.shape, r.shape) == y.shape and r.dtype == y.dtype:
                np.add(y, r, out=y)
            else:
                y = y + r
        elif kind == "relu":
            np.maximum(y, 0, out=y)
        elif kind == "clip":
            lo, hi = arg
            if lo is not None:
                np.maximum(y, y.dtype.type(lo), out=y)
            if hi is not None:
                np.minimum(y, y.dtype.type(hi), out=y)
        elif kind == "leaky":
            np.multiply(y, y.dtype.type(arg), out=y, where=y < 0)
        elif kind == "sigmoid":
            y[...] = sigmoid(y)
        elif kind == "silu":
            y *= sigmoid(y)
        elif kind == "hardswish":
            y *= hard_sigmoid(y, 1 / 6, 0.5)
        elif kind == "hardsigmoid":
            y[...] = hard_sigmoid(y, *arg)
    return y


def winograd_panels(w: Array, m: int) -> Array:
    """``winograd.pack_weights(winograd.weight_transform(w, m))`` one panel of output
    channels at a time: the float64 transform of a whole 512x512 layer would take
    four times the packed panels again, while the network's activations are alive."""
    width = winograd.nr(w.itemsize)
    o = w.shape[0]
    panels = np.empty((-(-o // width), (m + 2) ** (w.ndim - 2), w.shape[-1], width), w.dtype)
    for i, start in enumerate(range(0, o, width)):
        panels[i] = winograd.pack_weights(winograd.weight_transform(w[start:start + width], m))[0]
    return panels


class ConvStep:
    """``step(x, extra) -> y``: the conv of NCHW-shaped ``x`` (a view of channels-last
    memory, as every step returns) with w ``(O, C/g, *K)``, bias ``(O,)`` or None,
    then ``steps`` (``("add", i)`` adds ``extra[i]``, then activations); y an NCHW view
    of channels-last memory."""

    def __init__(self, w: Array, b: Array | None, args: Mapping[str, Any],
                 steps: Sequence[tuple[str, Any]]) -> None:
        self._w_last: Array | None = np.ascontiguousarray(np.moveaxis(w, 1, -1))
        self.w_shape = self._w_last.shape
        self._w_users = 0  # kernels that read w_last (not only packed panels)
        out_channels = w.shape[0]
        self.bias = (np.zeros(out_channels, w.dtype) if b is None
                     else np.ascontiguousarray(b, dtype=w.dtype))
        self.args = dict(args)
        self.steps = list(steps)
        self.fast = w.dtype == np.float32 and not nonfinite(self._w_last)
        adds = [arg for kind, arg in self.steps if kind == "add"]
        self.residual = adds[0] if len(adds) == 1 and self.steps[0][0] == "add" else None
        rest = self.steps[1:] if self.residual is not None else self.steps
        act = fused_activation(rest[0]) if len(rest) == 1 else None
        self.activation = act or "none"
        self.rest = [] if act else rest  # run in numpy after the fused pass
        self._kernels: dict[tuple[Any, ...], Kernel] = {}
        self._packed: dict[tuple[Any, ...], Array] = {}

    # -------------------------------------------------------------- running

    def __call__(self, x: Array, extra: Sequence[Array]) -> Array:
        xl = to_last(x)
        if not self.fast or xl.dtype != np.float32 or xl.shape[0] == 0:
            y = to_first(api.conv(xl, self.w_last(), self.bias, layout="NHWC", **self.args))
            return apply_steps(y, self.steps, extra)
        key = (xl.shape, get_num_threads())
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self._kernel(xl)
            if not self._w_users:  # only packed panels are read: keep the weights once
                self._w_last = None
        y = kernel(np.ascontiguousarray(xl))
        rows = y.reshape(-1, y.shape[-1])
        residual, rest = None, self.rest
        if self.residual is not None:
            r = to_last(np.asarray(extra[self.residual]))
            if r.shape == y.shape and r.dtype == np.float32:
                residual = np.ascontiguousarray(r).reshape(rows.shape)
        if self.residual is None or residual is not None:
            fused_epilogue.apply(rows, self.bias, residual, self.activation)
        else:  # a broadcasting residual: bias fused, the rest in numpy
            fused_epilogue.apply(rows, self.bias, None, "none")
            rest = self.steps
        return apply_steps(to_first(y), rest, extra) if rest else to_first(y)

    def w_last(self) -> Array:
        """w ``(O, *K, C/g)``, rebuilt from ``blocked``'s panels when only they are kept
        (:func:`convengine.algorithms.blocked.pack_weight` reordered back)."""
        if self._w_last is None:
            wp = next(v for k, v in self._packed.items() if k[0] == "blocked")
            self._w_last = blocked.unpack_weight(wp, self.w_shape)
        return self._w_last

    # -------------------------------------------------------------- planning

    def _kernel(self, xl: Array) -> Kernel:
        """``kernel(x (N, *S, C)) -> y (N, *S_out, O)`` for x's shape and the current
        thread count: the heuristic's algorithm, its weights packed once. (Not the
        tuner's: it would benchmark every conv in a session's first run, and a choice
        it stored while the host was busy can be several times slower: measured here,
        a MobileNetV2 1x1 layer on flat_gemm at 0.26 ms where blocked takes 0.08.)"""
        w = self.w_last()
        problem = api.forward_problem(xl, w, layout="NHWC", **self.args)
        algo = select.heuristic(problem)
        if algo.name == "blocked":
            nr = blocked.VEC * blocked._nvec(problem.out_channels)
            wp = self._pack(("blocked", nr),
                            lambda: blocked.pack_weight(w, problem.ndim, nr))
            return lambda x: blocked._forward(problem, x, wp)
        self._w_users += 1
        if algo.name in select.WINOGRAD_TILE:
            m = select.WINOGRAD_TILE[algo.name]
            up = self._pack(("winograd", m), lambda: winograd_panels(w, m))
            direct = registry.get("direct", "forward")

            def run_winograd(x: Array) -> Array:
                y = winograd.winograd_fwd(problem, x, up, m)
                # None: x held NaN or infinity; the direct loops place them as IEEE does
                return direct.run(problem, x, w) if y is None else y
            return run_winograd
        bound = algo.bind(problem)
        if not algo.numpy_math:
            return lambda x: bound(x, w)

        def run_numpy(x: Array) -> Array:
            with np.errstate(invalid="ignore", over="ignore"):
                return bound(x, w)
        return run_numpy

    def _pack(self, kind: tuple[Any, ...], make: Callable[[], Array]) -> Array:
        packed = self._packed.get(kind)
        if packed is None:
            packed = self._packed[kind] = make()
        return packed
