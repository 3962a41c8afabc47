"""Tuning modes and the tuner: what ``algo="auto"`` runs once it has measured.

Modes (``set_tuning`` or the ``CONVENGINE_TUNING`` environment variable):

- ``"off"``: the heuristic only.
- ``"on"`` (default): on a cache miss, benchmark every candidate once for the
  problem's tuning key, store the result, then use it. The heuristic's pick stands
  unless another candidate beats it clearly on a quiet host (``bench.decide``); a
  measurement too noisy to trust is not stored (this process keeps the heuristic,
  a later one measures again).
- ``"cache-only"``: cached choices, else the heuristic; never benchmarks.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config, environment, exactness, registry, threads
from ..config import cache_dir
from ..heuristic import heuristic
from ..problem import ConvProblem
from ..registry import Algorithm
from . import bench, keys
from .cache import DB_NAME, Entry, Ident, TuningCache

MODES = config.TUNING_MODES
_caches: dict[str, TuningCache] = {}
_paths: dict[object, Path] = {}  # environment -> cache file
_caches_lock = threading.Lock()
_tuning_lock = threading.RLock()  # one benchmark at a time: parallel timings lie
_noisy: dict[Ident, str] = {}  # measured too noisily to store: the heuristic's pick


def get_tuning() -> str:
    """The current mode: set_tuning's, else ``$CONVENGINE_TUNING``, else ``"on"``."""
    return str(config.get("tuning"))


def set_tuning(mode: str | None) -> str | None:
    """Set the tuning mode for this process (``None``: follow ``$CONVENGINE_TUNING``
    again). Returns the previous setting, so it can be restored. An alias of
    ``convengine.config.set(tuning=mode)``."""
    previous: str | None = config.set(tuning=mode)["tuning"]
    return previous


def default_cache() -> TuningCache:
    """The cache of the current cache directory (one object per directory)."""
    env = (environment.snapshot(), config.generation)  # the cache-dir settings among them
    with _caches_lock:
        if env not in _paths:
            _paths[env] = cache_dir() / DB_NAME
        path = _paths[env]
        if str(path) not in _caches:
            _caches[str(path)] = TuningCache(path)
        return _caches[str(path)]


def ident(problem: ConvProblem) -> Ident:
    """(key, host, version, candidates): the key also names the thread count, which
    changes the ranking as much as the problem does, and an exact-only setting."""
    key = f"{keys.key_text(problem)} T{threads.get_num_threads()}"
    if not exactness.inexact_allowed():
        key += " exact-only"  # measured without the inexact candidates
    return (key, keys.host_signature(), keys.version(), keys.candidate_checksum(problem.pass_))


def _accuracy(pass_: str) -> dict[str, int]:
    """Tie-break score: ``accuracy``, then exact before inexact at equal accuracy."""
    return {a.name: 2 * a.accuracy + a.exact for a in registry.all_for(pass_)}


def pick(entry: Entry, problem: ConvProblem) -> Algorithm | None:
    """The best measured algorithm of ``entry`` that serves this exact problem
    (problems of one bucket can differ in what an algorithm supports)."""
    registered = {a.name: a for a in registry.all_for(problem.pass_)}
    ranked = bench.rank(entry.results, _accuracy(problem.pass_))
    for name in [entry.choice, *ranked]:
        algo = registered.get(name)
        if (algo is not None and algo.supports(problem) is None
                and exactness.eligible(algo, problem)):
            return algo
    return None


@dataclass(frozen=True)
class TuneResult:
    """What tuning one problem gave: ``choice`` (None if every candidate failed),
    every candidate's result, and ``source``: "tuned", "cache", "skipped" or "noisy"
    (not stored: the heuristic's pick stands); ``why`` says how the choice was made."""

    problem: ConvProblem
    key: str
    choice: str | None
    results: dict[str, dict[str, Any]]
    source: str
    why: str = ""

    @property
    def median_s(self) -> float | None:
        """The chosen algorithm's median time in seconds."""
        return None if self.choice is None else self.results[self.choice]["median_s"]


def tune_problem(problem: ConvProblem, *, force: bool = False) -> TuneResult:
    """Benchmark the candidates of one problem (unless cached) and store the result.

    Ignores the mode: this is the explicit request to measure. Empty problems
    (batch 0) are skipped. A cached entry of the problem's bucket is used when one
    of its measured algorithms serves this exact problem; ``choice`` is that one."""
    if not isinstance(problem, ConvProblem):
        raise TypeError(f"problem must be a ConvProblem, got {type(problem).__name__}")
    cache, key = default_cache(), ident(problem)
    if problem.batch == 0:
        return TuneResult(problem, key[0], None, {}, "skipped")
    with _tuning_lock:
        entry = None if force else cache.get(key)
        cached = None if entry is None else pick(entry, problem)
        if entry is not None and cached is not None:  # else: measure this very problem
            return TuneResult(problem, key[0], cached.name, entry.results, "cache")
        candidates = [a for a in registry.all_for(problem.pass_)
                      if a.supports(problem) is None and exactness.eligible(a, problem)]

        default = heuristic(problem).name
        results = bench.benchmark(problem, bench.timed_candidates(candidates), keep=default)
        ranked = bench.rank(results, _accuracy(problem.pass_))
        if not ranked:
            return TuneResult(problem, key[0], None, results, "tuned")
        choice, why = bench.decide(results, ranked, default)
        if why == "noisy":
            _noisy[key] = choice
            return TuneResult(problem, key[0], choice, results, "noisy", why)
        _noisy.pop(key, None)
        cache.put([Entry(key[0], problem.pass_, key[1], key[2], key[3], choice,
                         results, problem.describe())])
        return TuneResult(problem, key[0], choice, results, "tuned", why)


def choose(problem: ConvProblem) -> Algorithm | None:
    """The tuned algorithm for ``auto`` under the current mode; None: use the heuristic."""
    mode = get_tuning()
    if mode == "off" or problem.batch == 0:
        return None
    key = ident(problem)
    entry = default_cache().get(key)
    if entry is None and key in _noisy:
        return None  # measured too noisily in this process: the heuristic
    if entry is None and mode == "on":
        tune_problem(problem)
        entry = default_cache().get(key)
    if entry is None:
        return None
    return pick(entry, problem)


def explain_choice(problem: ConvProblem) -> tuple[Algorithm | None, str, dict[str, str]]:
    """For explain(): the cached choice (never benchmarks), where the choice comes
    from in words, and each measured candidate's result as text."""
    mode = get_tuning()
    entry = default_cache().get(ident(problem)) if problem.batch else None
    timings = {} if entry is None else {
        name: (f"{r['median_s'] * 1e3:.3f} ms" if "median_s" in r else f"failed: {r['error']}")
        for name, r in entry.results.items()
    }
    if mode == "off":
        return None, "heuristic; tuning is off", timings
    if entry is None:
        later = "tuned on first call" if mode == "on" else "not tuned: cache-only"
        return None, f"heuristic; {later}", timings
    algo = pick(entry, problem)
    return algo, "tuned, from the cache" if algo else "heuristic; no tuned candidate fits", timings


def _progress(items: list[ConvProblem], enabled: bool | None) -> Iterable[ConvProblem]:
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency, but a bar is not worth failing over
        return items
    return tqdm(items, desc="tuning", unit="problem", file=sys.stderr)


def tune(
    problems: Iterable[ConvProblem], *, force: bool = False, progress: bool | None = None
) -> list[TuneResult]:
    """Pre-tune a list of problems (e.g. a model's layers), one result each.

    Cached problems are not measured again unless ``force``. ``progress``: show a
    bar (default: when stderr is a terminal).
    """
    items = list(problems)
    for i, p in enumerate(items):
        if not isinstance(p, ConvProblem):
            raise TypeError(f"problems[{i}] must be a ConvProblem, got {type(p).__name__}")
    return [tune_problem(p, force=force) for p in _progress(items, progress)]
