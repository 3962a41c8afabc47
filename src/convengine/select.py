"""Choosing an algorithm: forced by name, or ``auto``: tuned, else a cheap heuristic.

Every registered algorithm answers ``supports(problem) -> None | reason``; the
heuristic walks a per-pass preference list and stops at the first that accepts, so
``auto`` always ends at ``reference``, which serves everything. Under the tuning
mode (``convengine.set_tuning``) ``auto`` first asks the tuner (``tune/``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import config, environment, registry, threads
from .algorithms import weight_cache
from .errors import ConvSetupError
from .heuristic import heuristic
from .problem import ConvProblem
from .registry import Algorithm
from .tune import tuner
from .tune.cache import TuningCache


def candidates(problem: ConvProblem) -> list[tuple[Algorithm, str | None]]:
    """Every algorithm of the problem's pass with None (can serve) or the reason not."""
    return [(algo, algo.supports(problem)) for algo in registry.all_for(problem.pass_)]


def settings(pass_: str) -> tuple[object, ...]:
    """Everything besides the problem that ``resolve``'s answer depends on: the
    environment variables, the tuning and exactness settings, the changes to the
    tuning caches, the pass's registry, the thread count (part of tuning keys) and
    whether the weights are transient. A remembered answer stays valid while this
    compares equal. It reads the other modules' state directly: every Python-level
    call here costs 3-5 us with the caches cold after a large kernel."""
    return (environment.snapshot(), config.generation, TuningCache.changes,
            registry._REGISTRY[pass_], registry._generation, threads.get_num_threads(),
            weight_cache.is_transient())


def resolve(problem: ConvProblem, algo: str = "auto") -> Algorithm:
    """The algorithm to run: ``auto`` or a forced name (ConvSetupError if it cannot)."""
    if not isinstance(algo, str):
        raise TypeError(f"algo must be a string ('auto' or an algorithm name), got {algo!r}")
    if algo == "auto":  # tuned timings had the weights' derived forms cached
        tuned = None if weight_cache.is_transient() else tuner.choose(problem)
        return tuned or heuristic(problem)
    chosen = (registry.labelled(algo, problem) if "[" in algo
              else registry.get(algo, problem.pass_))
    reason = chosen.supports(problem)
    if reason is not None:
        raise ConvSetupError(
            f"algo {algo!r} cannot serve this {problem.pass_} problem: {reason} "
            f"(problem: {problem.describe()}); use algo='auto' to fall back"
        )
    return chosen


@dataclass(frozen=True)
class Explanation:
    """What ``explain`` returns: each candidate with its verdict, and the choice."""

    problem: ConvProblem
    chosen: str
    supported: tuple[str, ...]
    refused: dict[str, str]
    workspace_bytes: dict[str, int]
    source: str = "heuristic"  # where ``chosen`` comes from: tuned or heuristic, and why
    timings: dict[str, str] = field(default_factory=dict)  # tuned: name -> median or error

    def __str__(self) -> str:
        lines = [self.problem.describe(), f"auto: {self.source}",
                 f"{'algorithm':<16}{'workspace':>12}{'tuned':>12}  verdict"]
        for name in (*self.supported, *self.refused):
            if name in self.refused:
                verdict, space = f"cannot: {self.refused[name]}", "-"
            else:
                verdict = "CHOSEN by auto" if name == self.chosen else "can serve"
                space = f"{self.workspace_bytes[name]:,}"
            timing = self.timings.get(name, "-")
            if timing.startswith("failed"):
                verdict, timing = f"{verdict}; tuning {timing}", "failed"
            lines.append(f"{name:<16}{space:>12}{timing:>12}  {verdict}")
        return "\n".join(lines)


def explain_problem(problem: ConvProblem) -> Explanation:
    supported, refused, space = [], {}, {}
    for algo, reason in candidates(problem):
        if reason is None:
            supported.append(algo.name)
            space[algo.name] = algo.workspace_bytes(problem)
        else:
            refused[algo.name] = reason
    tuned, source, timings = tuner.explain_choice(problem)  # never benchmarks
    chosen = (tuned or heuristic(problem)).name
    return Explanation(problem, chosen, tuple(supported), refused, space, source, timings)
