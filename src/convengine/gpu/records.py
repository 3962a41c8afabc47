"""The GPU autotuner's choices in convengine's tuning cache (:mod:`convengine.tune.cache`),
under the device's name: a later process launches the recorded configuration of a
kernel and size bucket without autotuning again (``convengine cache show`` lists them).

An entry's key is ``gpu <kernel> <bucketed sizes, constexprs and operand dtypes>``, its
host the device (``NVIDIA H200 sm_90``), its candidates a digest of the configuration
list, its results every configuration's median (configurations that failed to compile
or run are kept as errors).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import triton

from .._version import __version__
from ..tune.cache import Entry, Ident
from ..tune.tuner import default_cache


def config_text(c: triton.Config) -> str:
    """A configuration as the cache stores it (JSON: blocks, warps, stages)."""
    return json.dumps({**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages},
                      sort_keys=True)


def ident(kernel: str, key: tuple[Any, ...], device: str,
          configs: list[triton.Config]) -> Ident:
    """(key, host, version, candidates) of one autotuning decision."""
    digest = hashlib.sha256("|".join(map(config_text, configs)).encode()).hexdigest()[:16]
    return (f"gpu {kernel} {' '.join(map(str, key))}", device,
            f"convengine {__version__} triton {triton.__version__}", f"triton-configs {digest}")


def recorded(which: Ident) -> triton.Config | None:
    """The configuration recorded for ``which``, or None."""
    entry = default_cache().get(which)
    if entry is None:
        return None
    kwargs = json.loads(entry.choice)
    warps, stages = kwargs.pop("num_warps"), kwargs.pop("num_stages")
    return triton.Config(kwargs, num_warps=warps, num_stages=stages)


def _median_s(timing: Any) -> float:
    """The autotuner's timing (ms, or [median, p20, p80] ms) in seconds."""
    ms = timing[0] if isinstance(timing, (list, tuple)) else timing
    return float(ms) / 1e3


def record(which: Ident, pass_: str, problem: str, timings: dict[triton.Config, Any]) -> None:
    """Store the autotuner's ``timings`` (config -> time) and its fastest choice."""
    results: dict[str, dict[str, Any]] = {}
    for config, timing in timings.items():
        median = _median_s(timing)
        results[config_text(config)] = ({"median_s": median} if math.isfinite(median)
                                        else {"error": "did not compile or run"})
    timed = [k for k, r in results.items() if "median_s" in r]
    if not timed:
        return
    choice = min(timed, key=lambda k: results[k]["median_s"])
    key, host, version, candidates = which
    default_cache().put([Entry(key, pass_, host, version, candidates, choice, results, problem)])
