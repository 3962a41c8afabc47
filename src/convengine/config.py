"""Every global setting of convengine in one place.

Each setting has a value set in this process (``set``/``override``), else its
environment variable, else a default::

    import convengine as ce

    ce.config.get("tuning")                 # "on"
    previous = ce.config.set(tuning="off")  # {"tuning": None}: was following the env
    with ce.config.override(inexact=False, threads=1):
        ...                                 # restored on exit, as np.errstate
    ce.config.set(**previous)               # None follows the environment again

=================  ==========================  ===========  ==================================
setting            environment variable        default      meaning
=================  ==========================  ===========  ==================================
``threads``        (numba's ``NUMBA_NUM_THREADS``)  all cores  threads of the kernels and GEMMs
``tuning``         ``CONVENGINE_TUNING``       ``"on"``     ``"off"``, ``"on"``, ``"cache-only"``
``inexact``        ``CONVENGINE_INEXACT``      ``True``     ``auto`` may pick Winograd (float32/16)
``int8_path``      ``CONVENGINE_INT8_PATH``    ``"auto"``   ``"auto"``, ``"amx"``, ``"vnni"``,
                                                            ``"avx2"``, ``"portable"``
``max_elements``   ``CONVENGINE_MAX_ELEMENTS`` ``2**31``    largest array a problem may need
``cache_dir``      ``CONVENGINE_CACHE_DIR``    ``~/.cache/convengine``  tuning and kernel caches
``isa``            ``CONVENGINE_ISA``          the CPU's    read at import; see :mod:`._host`
``checked``        ``CONVENGINE_CHECKED``      ``False``    read at import; see :mod:`.checked`
=================  ==========================  ===========  ==================================

``isa`` and ``checked`` are read once at import (the kernels are compiled for them):
set the environment variables before ``import convengine``. The others apply from the next
call. :data:`generation` counts the changes, so that a memo of a choice that depends
on the settings knows when to forget it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _host, checked, environment, threads
from .errors import ConvSetupError

TUNING_MODES = ("off", "on", "cache-only")
INT8_PATHS = ("auto", "amx", "vnni", "avx2", "portable")
_BOOLEANS = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


@dataclass(frozen=True)
class Setting:
    """One setting: its name, environment variable, default and meaning."""

    name: str
    env: str | None
    default: Any
    doc: str


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("threads", None, "all cores", "threads of convengine's kernels and GEMMs"),
    Setting("tuning", "CONVENGINE_TUNING", "on",
            "'off': the heuristic; 'on': measure on a cache miss; 'cache-only'"),
    Setting("inexact", "CONVENGINE_INEXACT", True,
            "whether algo='auto' may pick inexact algorithms (Winograd) for float32/16"),
    Setting("int8_path", "CONVENGINE_INT8_PATH", "auto",
            "the dense int8 code path: 'auto', 'amx', 'vnni', 'avx2' or 'portable'"),
    Setting("max_elements", "CONVENGINE_MAX_ELEMENTS", 2**31,
            "the most elements any array of a problem may hold (ConvSetupError above)"),
    Setting("cache_dir", "CONVENGINE_CACHE_DIR", "$XDG_CACHE_HOME/convengine",
            "the directory of the tuning cache and the compiled kernels"),
    Setting("isa", "CONVENGINE_ISA", "the CPU's",
            "the instruction set the kernels use ('avx2', 'avx512', 'avx512_vnni', 'amx'),"
            " at most the CPU's; read at import"),
    Setting("checked", "CONVENGINE_CHECKED", False,
            "kernels check every tile's range against their buffers (BoundsError), the"
            " memory pool guards and poisons its blocks; read at import"),
)}

_explicit: dict[str, Any] = {}  # the values set in this process
generation = 0  # incremented by every change


def _tuning(value: Any, source: str) -> str:
    word = value.strip().lower() if isinstance(value, str) else value
    if word not in TUNING_MODES:
        raise ConvSetupError(f"{source} must be one of {TUNING_MODES}, got {value!r}")
    return str(word)


def _inexact(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if word not in _BOOLEANS:
        raise ConvSetupError(f"{source} must be True/False or one of {sorted(_BOOLEANS)}, "
                             f"got {value!r}")
    return _BOOLEANS[word]


def _int8_path(value: Any, source: str) -> str:
    word = (value.strip().lower() or "auto") if isinstance(value, str) else value
    if word not in INT8_PATHS:
        raise ConvSetupError(f"{source} must be one of {INT8_PATHS}, got {value!r}")
    needs = {"vnni": _host.HAS_VNNI, "amx": _host.HAS_AMX, "avx2": _host.HAS_AVX2}
    if not needs.get(word, True):
        raise ConvSetupError(f"{source}={word!r} is not available on this CPU "
                             f"(instruction set {_host.ISA!r})")
    return str(word)


def _max_elements(value: Any, source: str) -> int:
    try:
        number = int(value) if isinstance(value, str) else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ConvSetupError(f"{source} must be a positive int, got {value!r}")
    return number


def _cache_dir(value: Any, source: str) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConvSetupError(f"{source} must be a directory path, got {value!r}")
    return Path(value).expanduser()


_PARSERS = {"tuning": _tuning, "inexact": _inexact, "int8_path": _int8_path,
            "max_elements": _max_elements, "cache_dir": _cache_dir}


def get(name: str) -> Any:
    """The current value of setting ``name`` (see :data:`SETTINGS`)."""
    if name == "threads":
        return threads.get_num_threads()
    if name == "isa":
        return _host.ISA
    if name == "checked":
        return checked.CHECKED
    if name not in SETTINGS:
        raise ConvSetupError(f"unknown setting {name!r}; expected one of {sorted(SETTINGS)}")
    if name in _explicit:
        return _explicit[name]
    if name == "cache_dir":
        return cache_dir()
    setting = SETTINGS[name]
    raw = environment.get(setting.env, "") if setting.env else ""
    if not raw.strip():
        return setting.default
    return _PARSERS[name](raw, f"${setting.env}")


def cache_dir() -> Path:
    """The directory of the tuning cache and the compiled kernels: the ``cache_dir``
    set here, else ``$CONVENGINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/convengine``
    (default ``~/.cache/convengine``)."""
    if "cache_dir" in _explicit:
        return Path(_explicit["cache_dir"])
    own = os.environ.get("CONVENGINE_CACHE_DIR")
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "convengine"


def set(**settings: Any) -> dict[str, Any]:  # noqa: A001 - config.set, as the user reads it
    """Set settings for this process (a value of None follows the environment again).
    Returns the previous explicit values (None where the environment was followed),
    so that ``set(**previous)`` restores them. All are checked before any changes."""
    global generation
    valid: dict[str, Any] = {}
    for name, value in settings.items():
        if name in ("isa", "checked"):
            raise ConvSetupError(f"{name} is fixed at import: set ${SETTINGS[name].env} "
                                 "before importing convengine")
        if name not in SETTINGS:
            raise ConvSetupError(f"unknown setting {name!r}; expected one of {sorted(SETTINGS)}")
        if name == "threads":
            valid[name] = value
        else:
            valid[name] = None if value is None else _PARSERS[name](value, name)
    previous: dict[str, Any] = {}
    for name, value in valid.items():
        if name == "threads":
            previous[name] = threads.get_num_threads()
            if value is not None:
                threads.set_num_threads(value)
            continue
        previous[name] = _explicit.get(name)
        if value is None:
            _explicit.pop(name, None)
        else:
            _explicit[name] = value
    generation += 1
    return previous


@contextmanager
def override(**settings: Any) -> Iterator[None]:
    """Apply ``settings`` inside a ``with`` block and restore the previous ones after."""
    previous = set(**settings)
    try:
        yield
    finally:
        set(**previous)


def describe() -> str:
    """A table of every setting: name, environment variable, current value."""
    rows = [f"{'setting':<14}{'environment variable':<26}value"]
    for name, setting in SETTINGS.items():
        rows.append(f"{name:<14}{setting.env or '-':<26}{get(name)!r}")
    return "\n".join(rows)
