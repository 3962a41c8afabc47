"""The environment variables convengine reads on every call, read cheaply.

``os.environ.get`` runs four Python-level calls (get, ``__getitem__``, key encoding,
value decoding): 5 us with warm caches is nothing, but right after a large kernel has
evicted the interpreter's code and data it measured 25-30 us, as much as a small
convolution's kernel. On POSIX ``os.environ`` keeps its contents in a plain dict of
bytes (``os.environ._data``, updated by every assignment to ``os.environ``), so one
dict lookup reads a variable; elsewhere this falls back to ``os.environ.get``.
"""

from __future__ import annotations

import os
import sys

# The variables whose values change what ``auto`` picks (see select.resolve).
SETTINGS = ("CONVENGINE_TUNING", "CONVENGINE_INEXACT", "CONVENGINE_CACHE_DIR",
            "CONVENGINE_MAX_ELEMENTS", "CONVENGINE_INT8_PATH", "XDG_CACHE_HOME", "HOME")

_data = getattr(os.environ, "_data", None)
_RAW: dict[bytes, bytes] | None = (
    _data if os.name == "posix" and isinstance(_data, dict) else None
)
_KEYS = tuple(os.fsencode(name) for name in SETTINGS)
_ENCODING = sys.getfilesystemencoding()


def get(name: str, default: str) -> str:
    """``os.environ.get(name, default)``."""
    if _RAW is None:
        return os.environ.get(name, default)
    value = _RAW.get(name.encode(_ENCODING, "surrogateescape"))
    return default if value is None else value.decode(_ENCODING, "surrogateescape")


def snapshot() -> tuple[object, ...]:
    """The raw values of :data:`SETTINGS` (None where unset), comparable across calls."""
    if _RAW is None:
        return tuple(map(os.environ.get, SETTINGS))
    return tuple(map(_RAW.get, _KEYS))
