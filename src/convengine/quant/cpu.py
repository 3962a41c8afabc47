"""Which dense int8 code path runs: AMX, else AVX512-VNNI, else AVX2, else the
portable one.

Detected once at import from LLVM's view of the host CPU (AMX also needs Linux to
grant tile state, requested here). Force a path with the environment variable
``CONVENGINE_INT8_PATH=portable`` (or ``avx2``, ``vnni``, ``amx``, ``auto``) before import, or
with :func:`set_int8_path` at run time.
"""

from __future__ import annotations

import os

from .._host import FEATURES as _features
from ..errors import ConvSetupError
from ._amx import request_amx

INT8_PATHS = ("auto", "amx", "vnni", "avx2", "portable")


HAS_VNNI = bool(_features.get("avx512vnni") and _features.get("avx512bw"))
HAS_AVX2 = bool(_features.get("avx2"))
HAS_AMX = bool(HAS_VNNI and _features.get("amx-int8") and _features.get("amx-tile")
               and request_amx())
_forced = "auto"


def set_int8_path(path: str) -> None:
    """Force ``"portable"``, ``"avx2"``, ``"vnni"`` or ``"amx"``, or go back to ``"auto"``."""
    global _forced
    if path not in INT8_PATHS:
        raise ConvSetupError(f"int8 path must be one of {INT8_PATHS}, got {path!r}")
    if path == "vnni" and not HAS_VNNI:
        raise ConvSetupError("int8 path 'vnni' needs a CPU with AVX512-VNNI; this one lacks it")
    if path == "amx" and not HAS_AMX:
        raise ConvSetupError("int8 path 'amx' needs AMX-INT8 granted by the OS; not here")
    if path == "avx2" and not HAS_AVX2:
        raise ConvSetupError("int8 path 'avx2' needs a CPU with AVX2; this one lacks it")
    _forced = path


def int8_path() -> str:
    """The dense int8 path ``"auto"`` resolves to now: "amx", "vnni", "avx2" or
    "portable"."""
    if _forced != "auto":
        return _forced
    return "amx" if HAS_AMX else "vnni" if HAS_VNNI else "avx2" if HAS_AVX2 else "portable"


_env = os.environ.get("CONVENGINE_INT8_PATH", "auto").strip().lower() or "auto"
if _env not in INT8_PATHS:
    raise ConvSetupError(
        f"CONVENGINE_INT8_PATH must be one of {INT8_PATHS}, got {_env!r}"
    )
if (_env == "vnni" and not HAS_VNNI) or (_env == "amx" and not HAS_AMX) or \
        (_env == "avx2" and not HAS_AVX2):
    raise ConvSetupError(f"CONVENGINE_INT8_PATH={_env} is not available on this CPU")
_forced = _env
