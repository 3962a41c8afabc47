"""Which algorithms ``auto`` may run, by accuracy.

Inexact algorithms (Winograd: about 1e-5 relative error for F(4x4,3x3) in float32,
where the direct sum gives about 1e-7) never serve float64 problems, and serve the
narrower dtypes unless switched off with ``allow_inexact(False)`` or
``CONVENGINE_INEXACT=off``. The switch binds ``auto`` (the heuristic and the tuner);
an algorithm forced by name always runs.
"""

from __future__ import annotations

from . import environment
from .errors import ConvSetupError
from .problem import ConvProblem
from .registry import Algorithm

ENV = "CONVENGINE_INEXACT"
_WORDS = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}

_allowed: bool | None = None  # allow_inexact's choice; None: follow the environment


def allow_inexact(allowed: bool | None) -> bool | None:
    """Let ``auto`` pick inexact algorithms for float32/16 (True, the default) or not
    (False); None follows ``$CONVENGINE_INEXACT`` again. Returns the previous setting."""
    global _allowed
    if allowed is not None and not isinstance(allowed, bool):
        raise TypeError(f"allowed must be True, False or None, got {allowed!r}")
    previous, _allowed = _allowed, allowed
    return previous


def inexact_allowed() -> bool:
    """The current setting: allow_inexact's, else ``$CONVENGINE_INEXACT``, else True."""
    if _allowed is not None:
        return _allowed
    word = environment.get(ENV, "on").strip().lower()
    if word not in _WORDS:
        raise ConvSetupError(f"${ENV} must be one of {sorted(_WORDS)}, got {word!r}")
    return _WORDS[word]


def eligible(algo: Algorithm, problem: ConvProblem) -> bool:
    """Whether ``auto`` may run ``algo`` on ``problem`` as far as accuracy goes."""
    return algo.exact or (problem.dtype != "float64" and inexact_allowed())
