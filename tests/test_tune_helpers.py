"""Shared set-up of the tuning tests (no tests here): tiny problems, numpy-only candidates.

The numba algorithms compile on first use (seconds each); the tuner's behaviour
does not depend on which algorithms it measures, so these tests keep only the
numpy ones. Subprocess scripts call :func:`restrict_registry` themselves.
"""

from __future__ import annotations

import numpy as np

from convengine import registry
from convengine.problem import PASSES, ConvProblem, make_problem

FAST = ("reference", "im2col", "implicit_gemm", "1x1")


def fast_registry() -> dict[str, dict[str, registry.Algorithm]]:
    """The registry tables restricted to :data:`FAST`, one per pass."""
    return {p: {n: a for n, a in registry._REGISTRY[p].items() if n in FAST} for p in PASSES}


def restrict_registry() -> None:
    """For subprocess scripts: keep only the numpy algorithms, for the process's life."""
    registry._REGISTRY.update(fast_registry())


def problem(pass_: str = "forward", c: int = 6, o: int = 4, size: int = 7, k: int = 3,
            batch: int = 2, **kw: object) -> ConvProblem:
    """A tiny NCHW problem."""
    kw.setdefault("padding", k // 2)
    groups = int(kw.get("groups", 1))  # type: ignore[call-overload]
    return make_problem(pass_, (batch, c, size, size), (o, c // groups, k, k), dtype="float32",
                        **kw)


def operands(p: ConvProblem, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random float32 NCHW x and w of a forward problem."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(p.x_shape()).astype(np.float32),
            rng.standard_normal(p.w_shape()).astype(np.float32))
