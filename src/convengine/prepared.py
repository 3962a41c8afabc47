"""A forward conv whose weights are constant, prepared once (inference).

``PreparedConv(w, **conv_args)(x)`` computes ``conv(x, w)`` for channels-last x
``(N, *S, C)`` and w ``(O, *K, C/g)``, like :func:`convengine.conv` with
``layout="NHWC"``, but does once what every call of ``conv`` does again: it packs the
weights for the algorithm the heuristic picks (``blocked``'s panels, Winograd's
transformed panels) and binds the kernel per input shape, so a call runs the kernel
directly: no argument validation, no weight-cache comparison of the weights, no NaN
scan of them. The caller promises that w does not change (an ONNX session's
initializers, an optimized inference module's folded weights).

Weights holding NaN or infinity, dtypes other than float32 and empty batches go
through :func:`convengine.conv` (the NaN rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import api, registry, select
from .algorithms import blocked, winograd
from .algorithms._finite import nonfinite
from .threads import get_num_threads

Kernel = Callable[[np.ndarray], np.ndarray]


class PreparedConv:
    """``conv(x (N, *S, C)) -> y (N, *S_out, O)`` with constant w ``(O, *K, C/g)``
    and the keyword arguments of :func:`convengine.conv` (stride, padding, dilation,
    groups), channels-last."""

    def __init__(self, w: np.ndarray, **args: Any) -> None:
        self._w: np.ndarray | None = np.ascontiguousarray(w)
        self.w_shape = w.shape
        self.args = args
        self.fast = w.dtype == np.float32 and not nonfinite(self._w)
        self._w_users = 0  # kernels that read w itself (not only packed panels)
        self._kernels: dict[tuple[Any, ...], Kernel] = {}
        self._packed: dict[tuple[Any, ...], np.ndarray] = {}

    def serves(self, x: np.ndarray) -> bool:
        """Whether x goes to the prepared kernel (float32 weights and x, finite weights,
        a non-empty batch) rather than through :func:`convengine.conv`."""
        return self.fast and x.dtype == np.float32 and x.shape[0] > 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not self.serves(x):
            return api.conv(x, self.weights(), layout="NHWC", **self.args)
        key = (x.shape, get_num_threads())
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._kernels[key] = self._kernel(x)
            if not self._w_users:  # only packed panels are read: keep the weights once
                self._w = None
        return kernel(np.ascontiguousarray(x))

    def weights(self) -> np.ndarray:
        """w ``(O, *K, C/g)``, rebuilt from ``blocked``'s panels when only they are kept
        (:func:`convengine.algorithms.blocked.pack_weight` reordered back)."""
        if self._w is None:
            wp = next(v for k, v in self._packed.items() if k[0] == "blocked")
            self._w = blocked.unpack_weight(wp, self.w_shape)
        return self._w

    def _kernel(self, x: np.ndarray) -> Kernel:
        """``kernel(x) -> y`` for x's shape and the current thread count: the
        heuristic's algorithm, its weights packed once. (Not the tuner's: it would
        benchmark every conv on the first call, and a choice it stored while the host
        was busy can be several times slower: measured here, a MobileNetV2 1x1 layer
        on flat_gemm at 0.26 ms where blocked takes 0.08.)"""
        w = self.weights()
        problem = api.forward_problem(x, w, layout="NHWC", **self.args)
        algo = select.heuristic(problem)
        if algo.name == "blocked":
            nr = blocked.VEC * blocked._nvec(problem.out_channels)
            wp = self._pack(("blocked", nr), lambda: blocked.pack_weight(w, problem.ndim, nr))
            return lambda x: blocked._forward(problem, x, wp)
        self._w_users += 1
        if algo.name in select.WINOGRAD_TILE:
            m = select.WINOGRAD_TILE[algo.name]
            up = self._pack(("winograd", m), lambda: winograd.packed_transform(w, m))
            direct = registry.get("direct", "forward")

            def run_winograd(x: np.ndarray) -> np.ndarray:
                y = winograd.winograd_fwd(problem, x, up, m)
                # None: x held NaN or infinity; the direct loops place them as IEEE does
                return direct.run(problem, x, w) if y is None else y
            return run_winograd
        bound = algo.bind(problem)
        if not algo.numpy_math:
            return lambda x: bound(x, w)

        def run_numpy(x: np.ndarray) -> np.ndarray:
            with np.errstate(invalid="ignore", over="ignore"):
                return bound(x, w)
        return run_numpy

    def _pack(self, kind: tuple[Any, ...], make: Callable[[], np.ndarray]) -> np.ndarray:
        packed = self._packed.get(kind)
        if packed is None:
            packed = self._packed[kind] = make()
        return packed
