"""Which int8 code path runs: VNNI where the CPU has it, else the portable one.

Detected once at import from LLVM's view of the host CPU. Force a path with the
environment variable ``CONVENGINE_INT8_PATH=portable`` (or ``vnni``, ``auto``) before
import, or with :func:`set_int8_path` at run time.
"""

from __future__ import annotations

import os
import platform

from ..errors import ConvSetupError

INT8_PATHS = ("auto", "vnni", "portable")


def _detect_vnni() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features()
    except Exception:  # noqa: BLE001 - no feature list: assume the worst
        return False
    return bool(features.get("avx512vnni") and features.get("avx512bw"))


HAS_VNNI = _detect_vnni()
_forced = "auto"


def set_int8_path(path: str) -> None:
    """Force ``"portable"`` or ``"vnni"``, or go back to ``"auto"``."""
    global _forced
    if path not in INT8_PATHS:
        raise ConvSetupError(f"int8 path must be one of {INT8_PATHS}, got {path!r}")
    if path == "vnni" and not HAS_VNNI:
        raise ConvSetupError("int8 path 'vnni' needs a CPU with AVX512-VNNI; this one lacks it")
    _forced = path


def int8_path() -> str:
    """The dense int8 path ``"auto"`` resolves to now: ``"vnni"`` or ``"portable"``."""
    if _forced != "auto":
        return _forced
    return "vnni" if HAS_VNNI else "portable"


_env = os.environ.get("CONVENGINE_INT8_PATH", "auto").strip().lower() or "auto"
if _env not in INT8_PATHS:
    raise ConvSetupError(
        f"CONVENGINE_INT8_PATH must be one of {INT8_PATHS}, got {_env!r}"
    )
if _env == "vnni" and not HAS_VNNI:
    raise ConvSetupError("CONVENGINE_INT8_PATH=vnni needs a CPU with AVX512-VNNI")
_forced = _env
