"""A forward conv whose weights are constant, prepared once (inference).

``PreparedConv(w, bias=None, activation="none", layout="NCHW", **conv_args)(x,
residual=None)`` computes ``act(conv(x, w) + bias [+ residual])`` (a call's
``activation=`` overrides the prepared one) in ``layout`` as :func:`convengine.conv`
takes it (NCHW: x ``(N, C, *S)``, w ``(O, C/g, *K)``; NHWC: x ``(N, *S, C)``, w
``(O, *K, C/g)``), like :func:`convengine.conv` followed by
:mod:`convengine.fused_epilogue`, but does once what every call of ``conv`` does
again: it packs the weights for the algorithm the heuristic picks (``blocked``'s panels, Winograd's
transformed panels) and binds the kernel per input shape, so a call runs the kernel
directly: no argument validation, no weight-cache comparison of the weights, no NaN
scan of them. ``blocked`` and the depthwise kernels apply the epilogue in their store
(ReLU and ReLU6; SiLU, and a depthwise conv's residual, in a pass after); the other
algorithms in one pass after the conv. The caller promises
that w does not change (an ONNX session's initializers, an optimized inference
module's folded weights).

The kernels work channels-last: NCHW operands are moved there and the result back
(one copy each way); hold NHWC data to avoid them.
Weights holding NaN or infinity, dtypes other than float32 and empty batches go
through :func:`convengine.conv` (the NaN rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import api, builders, fused_epilogue, heuristic, registry
from .algorithms.blocked import forward as blocked
from .algorithms.depthwise import forward as depthwise
from .algorithms.winograd import kernels as winograd
from .finite import nonfinite
from .problem import as_array, check_layout
from .threads import get_num_threads
from .tune import tuner

CONV_ARGS = frozenset({"stride", "padding", "dilation", "groups"})
Kernel = Callable[[np.ndarray, "np.ndarray | None", str], np.ndarray]


class PreparedConv:
    """``conv(x, residual=None) -> y``: ``act(conv(x, w) + bias [+ residual])`` with
    constant w, bias ``(O,)`` or None, activation one of
    :data:`convengine.fused_epilogue.ACTIVATIONS`, residual of y's shape, float32, and
    the keyword arguments of :func:`convengine.conv` (stride, padding, dilation,
    groups, layout). NCHW (the default, as for ``conv``): x ``(N, C, *S)``, w
    ``(O, C/g, *K)``, y ``(N, O, *S_out)``; NHWC: x ``(N, *S, C)``, w ``(O, *K, C/g)``,
    y ``(N, *S_out, O)``, the kernels' own layout (residual C-contiguous there). The
    epilogue computes in float32: a conv in another dtype takes no bias, residual or
    activation (a ValueError says so)."""

    def __init__(self, w: np.ndarray, *, bias: np.ndarray | None = None,
                 activation: str = "none", layout: str = "NCHW", **args: Any) -> None:
        _check_activation(activation)
        unknown = sorted(set(args) - CONV_ARGS)
        if unknown:
            raise TypeError(f"PreparedConv got unexpected keyword argument(s) {unknown}; "
                            f"expected some of {sorted(CONV_ARGS | {'layout'})}")
        self.layout = check_layout(layout)
        w = as_array(w, "w")
        if self.layout == "NCHW":
            w = np.moveaxis(w, 1, -1)
        if bias is not None and np.shape(bias) != (w.shape[0],):
            raise ValueError(f"bias must have shape ({w.shape[0]},), got {np.shape(bias)}")
        self._w: np.ndarray | None = np.ascontiguousarray(w)
        self.w_shape = w.shape
        self.args = args
        self.bias = None if bias is None else np.array(bias, np.float32)  # a copy: constant
        self.activation = activation
        self.fast = w.dtype == np.float32 and not nonfinite(self._w)
        self._w_users = 0  # kernels that read w itself (not only packed panels)
        self._kernels: dict[tuple[Any, ...], Kernel] = {}
        self._packed: dict[tuple[Any, ...], np.ndarray] = {}
        self._out_shapes: dict[tuple[int, ...], tuple[int, ...]] = {}

    def serves(self, x: np.ndarray) -> bool:
        """Whether x goes to the prepared kernel (float32 weights and x, finite weights,
        a non-empty batch) rather than through :func:`convengine.conv`."""
        return self.fast and x.dtype == np.float32 and x.shape[0] > 0

    def __call__(self, x: np.ndarray, residual: np.ndarray | None = None,
                 activation: str | None = None) -> np.ndarray:
        """y for x (and residual) in the prepared layout."""
        if self.layout == "NHWC":
            return self.run_nhwc(x, residual, activation)
        x = np.ascontiguousarray(np.moveaxis(as_array(x, "x"), 1, -1))
        if residual is not None:
            residual = np.ascontiguousarray(np.moveaxis(as_array(residual, "residual"), 1, -1))
        return np.ascontiguousarray(np.moveaxis(self.run_nhwc(x, residual, activation), -1, 1))

    def run_nhwc(self, x: np.ndarray, residual: np.ndarray | None = None,
                 activation: str | None = None) -> np.ndarray:
        """y ``(N, *S_out, O)`` for channels-last x ``(N, *S, C)`` whatever the layout."""
        act = self.activation if activation is None else activation
        _check_activation(act)
        if residual is not None and (residual.dtype != np.float32
                                     or not residual.flags.c_contiguous):
            raise ValueError(f"residual must be C-contiguous float32, got {residual.dtype}"
                             f"{'' if residual.flags.c_contiguous else ' (not contiguous)'}")
        if not self.serves(x):
            return self._epilogue(api.conv(x, self.weights(), layout="NHWC", **self.args),
                                  residual, act)
        key = (x.shape, get_num_threads())
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self._kernel(x)
            if not self._w_users:  # only packed panels are read: keep the weights once
                self._w = None
        return kernel(x, residual, act)

    def _epilogue(self, y: np.ndarray, residual: np.ndarray | None, activation: str
                  ) -> np.ndarray:
        """``act(y + bias [+ residual])`` in one pass over y, in place (none needed:
        y itself)."""
        if self.bias is None and residual is None and activation == "none":
            return y
        if y.dtype != np.float32:
            raise ValueError(f"bias, residual and activation need a float32 conv; this one "
                             f"computes in {y.dtype} (w {self.w_shape}): pass "
                             f"bias=None, activation='none' and no residual")
        _check_residual(residual, y.shape)
        y = np.ascontiguousarray(y)  # the pass works in place
        bias = np.zeros(y.shape[-1], np.float32) if self.bias is None else self.bias
        res = None if residual is None else residual.reshape(-1, y.shape[-1])
        fused_epilogue.apply(y.reshape(-1, y.shape[-1]), bias, res, activation)
        return y

    def out_shape(self, x: np.ndarray) -> tuple[int, ...]:
        """The output's shape ``(N, *S_out, O)`` for channels-last x ``(N, *S, C)``."""
        shape = self._out_shapes.get(x.shape)
        if shape is None:
            problem = builders.forward_problem(x, self.weights(), layout="NHWC", **self.args)
            shape = self._out_shapes[x.shape] = tuple(problem.y_shape("NHWC"))
        return shape

    def weights(self) -> np.ndarray:
        """w channels-last ``(O, *K, C/g)``, rebuilt from ``blocked``'s panels when only they are kept
        (:func:`convengine.algorithms.blocked.forward.pack_weight` reordered back)."""
        if self._w is None:
            wp = next(v for k, v in self._packed.items() if k[0] == "blocked")
            self._w = blocked.unpack_weight(wp, self.w_shape)
        return self._w

    def _kernel(self, x: np.ndarray) -> Kernel:
        """``kernel(x) -> y`` for x's shape and the current thread count: the
        heuristic's algorithm, its weights packed once, with the parameters
        ``convengine tune`` found for it (:func:`convengine.tune.tuned_variant`: the
        cache only). (Not the tuner's algorithm: it would benchmark every conv on the
        first call, and a choice it stored while the host was busy can be several
        times slower: measured here, a MobileNetV2 1x1 layer on flat_gemm at 0.26 ms
        where blocked takes 0.08.)"""
        w = self.weights()
        problem = builders.forward_problem(x, w, layout="NHWC", **self.args)
        algo = tuner.tuned_variant(problem, heuristic.heuristic(problem))
        chosen = dict(algo.params)
        if algo.name == "blocked":
            nr = blocked.VEC * chosen.get("nvec", blocked.panel_vectors(problem.out_channels))
            wp = self._pack(("blocked", nr), lambda: blocked.pack_weight(w, problem.ndim, nr))
            bias = None
            if self.bias is not None:
                bias = np.zeros(wp.shape[0] * nr, np.float32)
                bias[:self.bias.size] = self.bias
            y_shape = problem.y_shape("NHWC")
            forward = blocked.bind_forward(problem, wp, bias, params=chosen)

            def run_blocked(x: np.ndarray, residual: np.ndarray | None, act: str
                            ) -> np.ndarray:
                _check_residual(residual, y_shape)  # x of any strides: padded or copied once
                inside = act if act in blocked.EPILOGUE_ACTIVATIONS else "none"
                y = forward(x, residual, inside)
                if inside != act:  # SiLU: in a pass after
                    fused_epilogue.apply(y.reshape(-1, y.shape[-1]),
                                         np.zeros(y.shape[-1], np.float32), None, act)
                return y
            return run_blocked
        self._w_users += 1
        if algo.name in heuristic.WINOGRAD_TILE:
            m = heuristic.WINOGRAD_TILE[algo.name]
            up = self._pack(("winograd", m), lambda: winograd.packed_transform(w, m))
            direct = registry.get("direct", "forward")

            def run_winograd(x: np.ndarray, residual: np.ndarray | None, act: str
                             ) -> np.ndarray:
                x = np.ascontiguousarray(x)
                y = winograd.winograd_fwd(problem, x, up, m, chosen)
                # None: x held NaN or infinity; the direct loops place them as IEEE does
                return self._epilogue(direct.run(problem, x, w) if y is None else y,
                                      residual, act)
            return run_winograd
        bound = algo.bind(problem)
        if isinstance(bound, depthwise.DepthwisePlan):
            taps = bound.taps(w, problem.compute_dtype)  # laid out once

            def run_depthwise(x: np.ndarray, residual: np.ndarray | None, act: str
                              ) -> np.ndarray:
                x = np.ascontiguousarray(x)
                if residual is None and act in blocked.EPILOGUE_ACTIVATIONS:  # in the store
                    return bound(x, w, self.bias, blocked.EPILOGUE_ACTIVATIONS.index(act),
                                 taps)
                return self._epilogue(bound(x, w, taps=taps), residual, act)
            return run_depthwise
        if not algo.numpy_math:
            return lambda x, residual, act: self._epilogue(bound(np.ascontiguousarray(x), w),
                                                           residual, act)

        def run_numpy(x: np.ndarray, residual: np.ndarray | None, act: str) -> np.ndarray:
            with np.errstate(invalid="ignore", over="ignore"):
                y = bound(np.ascontiguousarray(x), w)
            return self._epilogue(y, residual, act)
        return run_numpy

    def _pack(self, kind: tuple[Any, ...], make: Callable[[], np.ndarray]) -> np.ndarray:
        packed = self._packed.get(kind)
        if packed is None:
            packed = self._packed[kind] = make()
        return packed


def _check_activation(activation: str) -> None:
    if activation not in fused_epilogue.ACTIVATIONS:
        raise ValueError(f"activation must be one of {fused_epilogue.ACTIVATIONS}, "
                         f"got {activation!r}")


def _check_residual(residual: np.ndarray | None, y_shape: tuple[int, ...]) -> None:
    if residual is not None and residual.shape != tuple(y_shape):
        raise ValueError(f"residual must have the output's shape {tuple(y_shape)}, got "
                         f"{residual.shape}")
