"""Autotuning: measure the candidates once per problem class, remember the choice.

``tuner`` holds the modes and the tuning entry points, ``keys`` the bucketed keys
and host signature, ``bench`` the benchmark loop, ``cache`` the SQLite + memory
store, ``transfer`` the JSON export and import.
"""

from ..config import cache_dir
from .cache import TuningCache, TuningCacheWarning
from .keys import TuningKey, host_signature, tuning_key
from .transfer import export_cache, import_cache
from .tuner import (
    MODES,
    TuneResult,
    choose,
    default_cache,
    explain_choice,
    get_tuning,
    set_tuning,
    tune,
    tune_problem,
    tuned_variant,
)

__all__ = [
    "MODES",
    "TuneResult",
    "TuningCache",
    "TuningCacheWarning",
    "TuningKey",
    "cache_dir",
    "choose",
    "default_cache",
    "explain_choice",
    "export_cache",
    "get_tuning",
    "host_signature",
    "import_cache",
    "set_tuning",
    "tune",
    "tune_problem",
    "tuned_variant",
    "tuning_key",
]
