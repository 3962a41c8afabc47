"""Tuning modes and the tuner: what ``algo="auto"`` runs once it has measured.

Modes (``set_tuning`` or the ``CONVENGINE_TUNING`` environment variable):

- ``"off"``: the heuristic only.
- ``"on"`` (default): on a cache miss, benchmark every candidate once for the
  problem's tuning key, store the result, then use it. The heuristic's pick stands
  unless another candidate beats it clearly on a quiet host (``bench.decide``); a
  measurement too noisy to trust is not stored (this process keeps the heuristic,
  a later one measures again).
- ``"cache-only"``: cached choices, else the heuristic; never benchmarks.

The explicit requests (:func:`tune`, ``convengine tune``, ``warmup --tune``) also
search the chosen algorithm's parameters (:mod:`convengine.params`): one parameter at
a time, its other values timed against the current choice, a value kept only where it
wins clearly on a quiet host (:func:`_search`). The stored choice is then a
label such as ``blocked[tasks=4]``. A first call's tuning times algorithms only, at
their cost-model defaults: a search multiplies the first call's timings.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import config, environment, exactness, params, registry, threads
from ..config import cache_dir
from ..errors import ConvSetupError
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


def _accuracy(pass_: str, labels: Iterable[str]) -> dict[str, int]:
    """Tie-break score of each label: its algorithm's ``accuracy``, then exact before
    inexact at equal accuracy."""
    score = {a.name: 2 * a.accuracy + a.exact for a in registry.all_for(pass_)}
    return {lab: score.get(_base(lab), 0) for lab in labels}


def _base(label: str) -> str:
    """The algorithm name of a label ("" where it is malformed)."""
    try:
        return params.parse(label)[0]
    except ValueError:
        return ""


def variant(label: str, problem: ConvProblem) -> Algorithm | None:
    """The registered algorithm a label names, with its parameters, where it serves
    this exact problem and accepts them on it; else None (problems of one bucket can
    differ in what an algorithm supports and in its parameters' ranges)."""
    try:
        algo = registry.labelled(label, problem)
    except ConvSetupError:
        return None
    if algo.supports(problem) is not None or not exactness.eligible(algo, problem):
        return None
    return algo


def pick(entry: Entry, problem: ConvProblem) -> Algorithm | None:
    """The best measured algorithm (with its parameters) of ``entry`` that serves
    this exact problem."""
    ranked = bench.rank(entry.results, _accuracy(problem.pass_, entry.results))
    for label in [entry.choice, *ranked]:
        algo = variant(label, problem)
        if algo is not None:
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


def _searched(entry: Entry, algo: Algorithm, problem: ConvProblem) -> bool:
    """Whether ``entry`` holds a parameter search of ``algo`` (or it has nothing to
    search on ``problem``)."""
    return (not params.alternatives(algo.space(problem))
            or any(_base(lab) == algo.name and lab != algo.name for lab in entry.results))


def tune_problem(problem: ConvProblem, *, force: bool = False,
                 search: bool = False) -> TuneResult:
    """Benchmark the candidates of one problem (unless cached) and store the result;
    with ``search``, also the chosen algorithm's parameters (:func:`_search`).

    Ignores the mode: this is the explicit request to measure. Empty problems
    (batch 0) are skipped. A cached entry of the problem's bucket is used when one
    of its measured algorithms serves this exact problem (and, with ``search``, holds
    a search of its parameters); ``choice`` is that one's label."""
    if not isinstance(problem, ConvProblem):
        raise TypeError(f"problem must be a ConvProblem, got {type(problem).__name__}")
    cache, key = default_cache(), ident(problem)
    if problem.batch == 0:
        return TuneResult(problem, key[0], None, {}, "skipped")
    with _tuning_lock:
        entry = None if force else cache.get(key)
        cached = None if entry is None else pick(entry, problem)
        if entry is not None and cached is not None:  # else: measure this very problem
            if not search or _searched(entry, registry.get(cached.name, problem.pass_),
                                       problem):
                return TuneResult(problem, key[0], cached.label, entry.results, "cache")
            results, choice, why = dict(entry.results), cached.label, "cached"
        else:
            candidates = [a for a in registry.all_for(problem.pass_)
                          if a.supports(problem) is None and exactness.eligible(a, problem)]
            default = heuristic(problem).name
            results = bench.benchmark(problem, bench.timed_candidates(candidates),
                                      keep=default)
            ranked = bench.rank(results, _accuracy(problem.pass_, results))
            if not ranked:
                return TuneResult(problem, key[0], None, results, "tuned")
            choice, why = bench.decide(results, ranked, default)
        if why != "noisy" and search:
            chosen = variant(choice, problem)
            if chosen is not None:
                found, searched = _search(problem, chosen)
                results.update(searched)
                if found.label != choice:
                    choice, why = found.label, "faster"
        if why == "noisy":
            _noisy[key] = choice
            return TuneResult(problem, key[0], choice, results, "noisy", why)
        _noisy.pop(key, None)
        cache.put([Entry(key[0], problem.pass_, key[1], key[2], key[3], choice,
                         results, problem.describe())])
        return TuneResult(problem, key[0], choice, results, "tuned", why)


def _search(problem: ConvProblem, start: Algorithm) -> tuple[Algorithm, dict[str, Any]]:
    """(the best variant found, every timing): from ``start``, one parameter at a time,
    each of its other values timed against the current best, a value kept where
    :func:`bench.decide` takes it over the current best (faster by ``PARAM_MARGIN``,
    runs spread under ``PARAM_QUIET``, on a quiet host; a comparison too noisy to
    trust keeps the current value). A variant found is then timed against ``start``
    once more, in rounds of its own, and kept only if it wins again: on a shared host
    a single round of comparisons let 5%-level wins through that re-measured 0.93-1.04
    of the default (Emerald Rapids, MobileNetV2's backward passes)."""
    base = registry.get(start.name, problem.pass_)
    space = base.space(problem)
    current, results = start, {}
    for key, values in space.items():
        if len(values) < 2:
            continue
        mine = dict(current.params)
        tried = [base.variant(_without_defaults(space, {**mine, key: v}))
                 for v in values if v != params.value(space, mine, key)]
        found = bench.benchmark(problem, [current, *tried], keep=current.label)
        results.update(found)
        ranked = bench.rank(found, _accuracy(problem.pass_, found))
        if not ranked:
            continue
        label, _ = bench.decide(found, ranked, current.label, bench.PARAM_MARGIN,
                                bench.PARAM_QUIET)
        current = variant(label, problem) or current
    if current.label != start.label:
        again = bench.benchmark(problem, [start, current], keep=start.label)
        results.update(again)
        label, _ = bench.decide(again, bench.rank(again, _accuracy(problem.pass_, again)),
                                start.label, bench.PARAM_MARGIN, bench.PARAM_QUIET)
        if label != current.label:
            current = start
    return current, results


def _without_defaults(space: params.Space, chosen: params.Params) -> dict[str, int]:
    """``chosen`` without the parameters at their defaults (a label names the others)."""
    return {k: v for k, v in chosen.items() if v != space[k][0]}


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


def tuned_variant(problem: ConvProblem, algo: Algorithm) -> Algorithm:
    """``algo`` with the parameters the tuning cache holds for ``problem`` where the
    stored choice is ``algo`` itself (under either layout: the kernels see
    channels-last operands either way); else ``algo``. Never benchmarks; tuning
    ``off``: ``algo``. For callers that choose the algorithm themselves."""
    if get_tuning() == "off" or problem.batch == 0:
        return algo
    other = "NCHW" if problem.layout == "NHWC" else "NHWC"
    for p in (problem, replace(problem, layout=other)):
        entry = default_cache().get(ident(p))
        if entry is not None and _base(entry.choice) == algo.name:
            return variant(entry.choice, problem) or algo
    return algo


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
    if algo is None:
        return None, "heuristic; no tuned candidate fits", timings
    with_params = f" with {algo.label}" if algo.params else ""
    return algo, f"tuned, from the cache{with_params}", timings


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
    problems: Iterable[ConvProblem], *, force: bool = False, progress: bool | None = None,
    search: bool = True,
) -> list[TuneResult]:
    """Pre-tune a list of problems (e.g. a model's layers), one result each: the
    algorithm, then (``search``) its parameters.

    Cached problems are not measured again unless ``force``. ``progress``: show a
    bar (default: when stderr is a terminal).
    """
    items = list(problems)
    for i, p in enumerate(items):
        if not isinstance(p, ConvProblem):
            raise TypeError(f"problems[{i}] must be a ConvProblem, got {type(p).__name__}")
    return [tune_problem(p, force=force, search=search) for p in _progress(items, progress)]
