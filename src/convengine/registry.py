"""The algorithm registry: every algorithm registers one entry per pass it serves.

Kernels see canonical arrays only, whatever the user's layout:

- forward:          ``run(problem, x, w) -> y``
- backward_data:    ``run(problem, dy, w) -> dx``
- backward_weight:  ``run(problem, x, dy) -> dw``

with x ``(N, *S, C)``, w ``(O, *K, C // g)``, y/dy ``(N, *S_out, O)`` (channels-last),
C-contiguous, in ``problem.compute_dtype``. ``run`` returns the result in the same
channels-last form and dtype. Bias is not the kernel's business.

An algorithm may also register ``prepare(problem) -> fn`` (or None), with ``fn(a, b)``
doing what ``run(problem, a, b)`` does: the API keeps ``fn`` with a remembered call, so
that a plan ``run`` would look up on every call is looked up once.

An algorithm with parameters the tuner may choose registers ``tunables(problem) ->``
:data:`convengine.params.Space`; its ``run`` and ``prepare`` then take a keyword
``params`` (a mapping, absent: the defaults), and :meth:`Algorithm.variant` binds one
choice of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import numpy as np

from . import devices
from . import params as tunable
from .errors import ConvSetupError
from .problem import PASSES, ConvProblem

Supports = Callable[[ConvProblem], "str | None"]
Tunables = Callable[[ConvProblem], tunable.Space]
Run = Callable[[ConvProblem, np.ndarray, np.ndarray], np.ndarray]


class Bound(Protocol):
    """An algorithm bound to one problem: ``fn(a, b)`` does ``run(problem, a, b)``."""

    def __call__(self, a: np.ndarray, b: np.ndarray, /) -> np.ndarray: ...


def no_workspace(problem: ConvProblem) -> int:
    return 0


@dataclass(frozen=True)
class Algorithm:
    """One algorithm for one pass.

    ``supports(problem)`` returns None when it can serve the problem, else the
    reason it cannot. ``workspace_bytes(problem)`` bounds its scratch memory beyond
    the inputs and the output. ``exact`` is False for reduced-precision algorithms
    (Winograd, low-precision accumulation); ``accuracy`` orders algorithms for
    tie-breaks (higher is more accurate). ``tunables`` (None: none) gives the
    parameters the tuner may set on a problem; ``params`` are those this object runs
    with (:meth:`variant`), ``label`` names both.
    """

    name: str
    pass_: str
    run: Run
    supports: Supports
    workspace_bytes: Callable[[ConvProblem], int] = no_workspace
    exact: bool = True
    deterministic: bool = True
    accuracy: int = 1
    numpy_math: bool = True  # runs numpy arithmetic: its FP warnings are silenced around it
    prepare: Callable[[ConvProblem], Bound | None] | None = None
    tunables: Tunables | None = None
    params: tuple[tuple[str, int], ...] = ()

    @property
    def label(self) -> str:
        """The name, with the parameters set (``blocked[tasks=4]``)."""
        return tunable.label(self.name, dict(self.params))

    def space(self, problem: ConvProblem) -> tunable.Space:
        """The parameters the tuner may set on ``problem`` (empty: none)."""
        return {} if self.tunables is None else self.tunables(problem)

    def variant(self, chosen: tunable.Params) -> Algorithm:
        """This algorithm running with the parameters ``chosen`` (a ValueError names
        one it does not have); no parameters: the registered algorithm itself."""
        if not chosen:
            return self
        if self.tunables is None:
            raise ValueError(f"algorithm {self.name!r} has no tunable parameters, "
                             f"got {dict(chosen)}")
        fixed = dict(chosen)
        return replace(
            self, run=functools.partial(cast(Any, self.run), params=fixed),
            prepare=None if self.prepare is None else functools.partial(cast(Any, self.prepare),
                                                                        params=fixed),
            params=tuple(sorted(fixed.items())))

    def bind(self, problem: ConvProblem) -> Bound:
        """``fn(a, b)`` running this algorithm on ``problem``: ``prepare(problem)``
        where that gives one, else ``run`` with the problem bound."""
        prepared = None if self.prepare is None else self.prepare(problem)
        return functools.partial(self.run, problem) if prepared is None else prepared


_REGISTRY: dict[str, dict[str, Algorithm]] = {p: {} for p in PASSES}
_generation = 0  # registrations so far: remembered choices (select.settings) check it


def register(
    name: str,
    pass_: str,
    *,
    supports: Supports,
    workspace_bytes: Callable[[ConvProblem], int] = no_workspace,
    exact: bool = True,
    deterministic: bool = True,
    accuracy: int = 1,
    numpy_math: bool = True,
    prepare: Callable[[ConvProblem], Bound | None] | None = None,
    tunables: Tunables | None = None,
) -> Callable[[Run], Run]:
    """Decorator registering ``run`` as algorithm ``name`` for ``pass_``.
    ``numpy_math=False`` for kernels that run compiled code only: the API then skips
    silencing numpy's floating-point warnings around them (a few us a call).
    ``prepare`` and ``tunables``: see the module docstring."""
    if pass_ not in PASSES:
        raise ValueError(f"unknown pass {pass_!r}; expected one of {PASSES}")

    def decorate(run: Run) -> Run:
        global _generation
        _REGISTRY[pass_][name] = Algorithm(name, pass_, run, supports, workspace_bytes,
                                           exact, deterministic, accuracy, numpy_math,
                                           prepare, tunables)
        _generation += 1
        return run

    return decorate


def unregister(name: str, pass_: str) -> None:
    """Remove a registered algorithm (e.g. a plug-in or a test's stand-in)."""
    global _generation
    get(name, pass_)
    del _REGISTRY[pass_][name]
    _generation += 1


def _check_pass(pass_: str) -> None:
    if pass_ not in PASSES:
        raise ConvSetupError(f"unknown pass {pass_!r}; expected one of {PASSES}")


def algorithms(pass_: str = "forward", device: str = "cpu") -> list[str]:
    """Names of the algorithms registered for a pass, in registration order;
    ``device="cuda"``: the GPU (Triton) algorithms of :mod:`convengine.gpu`."""
    _check_pass(pass_)
    if device == "cuda":
        return devices.gpu_algorithms(pass_)
    if device != "cpu":
        raise ConvSetupError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return list(_REGISTRY[pass_])


def get(name: str, pass_: str) -> Algorithm:
    """The algorithm ``name`` for ``pass_``; ConvSetupError naming the known ones."""
    _check_pass(pass_)
    try:
        return _REGISTRY[pass_][name]
    except KeyError:
        raise ConvSetupError(
            f"unknown algo {name!r} for pass {pass_!r}; expected 'auto' or one of "
            f"{algorithms(pass_)}"
        ) from None


def labelled(label: str, problem: ConvProblem) -> Algorithm:
    """The algorithm a label names (``blocked`` or ``blocked[tasks=4]``, as the tuner
    stores its choices) with its parameters, for ``problem``; ConvSetupError naming
    what does not fit (a malformed label, an unknown algorithm, a parameter it does
    not have on this problem or a value outside its range)."""
    try:
        name, chosen = tunable.parse(label)
    except ValueError as exc:
        raise ConvSetupError(f"algo {label!r}: {exc}") from None
    algo = get(name, problem.pass_)
    reason = tunable.check(algo.space(problem), chosen)
    if reason is not None:
        raise ConvSetupError(f"algo {label!r} on this {problem.pass_} problem: {reason} "
                             f"(problem: {problem.describe()})")
    return algo.variant(chosen)


def all_for(pass_: str) -> list[Algorithm]:
    _check_pass(pass_)
    return list(_REGISTRY[pass_].values())
