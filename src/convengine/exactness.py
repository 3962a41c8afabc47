"""Which algorithms ``auto`` may run, by accuracy.

Inexact algorithms (Winograd: about 1e-5 relative error for F(4x4,3x3) in float32,
where the direct sum gives about 1e-7) never serve float64 problems, and serve the
narrower dtypes unless switched off with ``allow_inexact(False)`` or
``CONVENGINE_INEXACT=off``. The switch binds ``auto`` (the heuristic and the tuner);
an algorithm forced by name always runs.
"""

from __future__ import annotations

from . import config
from .problem import ConvProblem
from .registry import Algorithm


def allow_inexact(allowed: bool | None) -> bool | None:
    """Let ``auto`` pick inexact algorithms for float32/16 (True, the default) or not
    (False); None follows ``$CONVENGINE_INEXACT`` again. Returns the previous setting.
    An alias of ``convengine.config.set(inexact=allowed)``."""
    if allowed is not None and not isinstance(allowed, bool):
        raise TypeError(f"allowed must be True, False or None, got {allowed!r}")
    previous: bool | None = config.set(inexact=allowed)["inexact"]
    return previous


def inexact_allowed() -> bool:
    """The current setting: allow_inexact's, else ``$CONVENGINE_INEXACT``, else True."""
    return bool(config.get("inexact"))


def eligible(algo: Algorithm, problem: ConvProblem) -> bool:
    """Whether ``auto`` may run ``algo`` on ``problem`` as far as accuracy goes."""
    return algo.exact or (problem.dtype != "float64" and inexact_allowed())
