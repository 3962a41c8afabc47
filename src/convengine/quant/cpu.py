"""Which dense int8 code path runs: AMX, else AVX512-VNNI, else AVX2, else the
portable one.

The CPU's instruction set comes from :mod:`convengine._host` (lowered by
``CONVENGINE_ISA``); AMX also needs Linux to grant tile state. Force a path with the
``int8_path`` setting (:mod:`convengine.config`, ``CONVENGINE_INT8_PATH``): ``portable``,
``avx2``, ``vnni``, ``amx`` or ``auto``.
"""

from __future__ import annotations

from .. import config
from .._host import HAS_AMX, HAS_AVX2, HAS_VNNI

__all__ = ["HAS_AMX", "HAS_AVX2", "HAS_VNNI", "int8_path", "set_int8_path"]


def set_int8_path(path: str) -> None:
    """Force ``"portable"``, ``"avx2"``, ``"vnni"`` or ``"amx"``, or go back to ``"auto"``
    (an alias of ``config.set(int8_path=path)``)."""
    config.set(int8_path=path)


def int8_path() -> str:
    """The dense int8 path ``"auto"`` resolves to now: "amx", "vnni", "avx2" or
    "portable"."""
    forced = config.get("int8_path")
    if forced != "auto":
        return str(forced)
    return "amx" if HAS_AMX else "vnni" if HAS_VNNI else "avx2" if HAS_AVX2 else "portable"
