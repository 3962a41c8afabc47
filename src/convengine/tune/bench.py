"""The benchmark loop: time every candidate on one problem and rank them.

Inputs are random canonical operands (channels-last, compute dtype) built from the
problem alone, so the tuner needs no kernel internals: only ``Algorithm.run``,
``supports`` and ``accuracy``. Each candidate runs once untimed (warm-up: numba
compilation, first-touch), its output is checked (shape, finite, agreement with
the other candidates' consensus), then rounds run interleaved (A B C A B C ...) and a
candidate whose median is over ``ELIMINATE`` times the best is dropped (after the
first round, only over ``ELIMINATE_FIRST``); timing stops when one is left. The
heuristic's pick (``keep``) is never dropped: it runs every round, so that one slow
run (measured here: 139 ms for a 2 ms stem, a first timed run) cannot hand its place
to a slower candidate, which :func:`decide` would then have to take. From
``MIN_ROUNDS`` on, a candidate none of whose runs came near beating ``keep`` by a
margin is dropped too (:func:`_cannot_win`).
``reference`` (the float64 oracle, never the fastest where another serves) is not
timed when another candidate serves.

:func:`decide` then keeps the heuristic's pick unless the fastest beats it clearly:
by ``MARGIN`` in medians whose spread (the runs' interquartile range over their
median) stays under ``QUIET`` on both, while other processes took under ``BUSY`` of
the host's CPU time (``/proc/stat``): a win measured on a busy host is no win. (A
busy neighbour can slow a parallel kernel consistently, every run waiting for a
scheduler tick: measured 8 ms for a 0.3 ms kernel with a tight spread.)
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

import numpy as np

from ..problem import ConvProblem
from ..registry import Algorithm

ELIMINATE = 1.5  # drop candidates slower than this times the best (as Burn does)
ELIMINATE_FIRST = 3.0  # ... but after a single round only when clearly slower
TIE = 0.05  # medians within 5% of the best are a tie: the more accurate one wins
DISAGREE = 1e-2  # relative L2 distance to the most accurate output that fails a candidate
MIN_ROUNDS, MAX_ROUNDS, BUDGET_S = 3, 15, 0.5
MARGIN = 0.15  # the fastest replaces the heuristic's pick only when this much faster
QUIET = 0.25  # ... and the runs of both spread less than this around their medians
BUSY = 0.15  # ... and other processes took less than this share of the host's CPU time
# a parameter's other value (the same algorithm: same arithmetic, no accuracy at stake)
# replaces the current one when this much faster, with both spreads under PARAM_QUIET
PARAM_MARGIN, PARAM_QUIET = 0.08, 0.10

# What one candidate measured: {"median_s", "runs", "eliminated"} or {"error"}.
Result = dict[str, Any]


def operands(problem: ConvProblem) -> tuple[np.ndarray, np.ndarray]:
    """Random canonical inputs of the problem's pass, seeded by its shapes: uniform in
    [-1, 1), zero-mean as the consensus check needs (a normal sample cost 7x more to
    draw: 0.47 of a first ResNet-50 pass's 3.1 s of tuning, Emerald Rapids)."""
    rng = np.random.default_rng(zlib.crc32(problem.describe().encode()))
    shapes = {
        "forward": (problem.x_shape("NHWC"), problem.w_shape("NHWC")),
        "backward_data": (problem.y_shape("NHWC"), problem.w_shape("NHWC")),
        "backward_weight": (problem.x_shape("NHWC"), problem.y_shape("NHWC")),
    }[problem.pass_]
    return tuple(_uniform(rng, s).astype(problem.compute_dtype, copy=False)  # type: ignore[return-value]
                 for s in shapes)


def _uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values uniform in [-1, 1), drawn and scaled in place."""
    values = rng.random(shape, dtype=np.float32)
    values *= 2
    values -= 1
    return values


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _check(problem: ConvProblem, out: Any) -> str | None:
    """Why an output is unusable, or None."""
    expected = {
        "forward": problem.y_shape("NHWC"),
        "backward_data": problem.x_shape("NHWC"),
        "backward_weight": problem.w_shape("NHWC"),
    }[problem.pass_]
    if not isinstance(out, np.ndarray) or out.shape != expected:
        shape = getattr(out, "shape", None)
        return f"returned {type(out).__name__} of shape {shape}, expected {expected}"
    if not np.isfinite(out).all():
        return "returned non-finite values on finite input"
    return None


def _disagreements(
    outputs: dict[str, np.ndarray], accuracy: Mapping[str, int]
) -> dict[str, Result]:
    """Failures for outputs far from the consensus: the output that agrees with the
    most others (ties: the more accurate algorithm) is taken as the truth."""
    names = list(outputs)
    if not names:  # every candidate failed: nothing to agree on
        return {}
    norms = {n: float(np.linalg.norm(outputs[n])) for n in names}

    def distance(a: str, b: str) -> float:
        diff = float(np.linalg.norm(outputs[a] - outputs[b]))
        return diff / max(norms[a], norms[b], 1e-30)

    dist = {(a, b): distance(a, b) for i, a in enumerate(names) for b in names[i + 1:]}
    dist.update({(b, a): d for (a, b), d in list(dist.items())})
    votes = {a: sum(dist[a, b] <= DISAGREE for b in names if b != a) for a in names}
    truth = max(names, key=lambda n: (votes[n], accuracy[n]))
    return {
        n: {"error": f"disagrees with {truth}: relative error {dist[n, truth]:.2e}"}
        for n in names if n != truth and dist[n, truth] > DISAGREE
    }


def benchmark(problem: ConvProblem, candidates: Sequence[Algorithm],
              keep: str | None = None) -> dict[str, Result]:
    """Warm up, check and time each candidate; one :data:`Result` per label (the
    name, with parameters set: :attr:`Algorithm.label`). ``keep`` (the heuristic's
    pick) is timed every round, never eliminated."""
    a, b = operands(problem)
    results: dict[str, Result] = {}
    outputs: dict[str, np.ndarray] = {}
    for algo in candidates:
        try:
            out = algo.run(problem, a, b)
        except Exception as exc:  # noqa: BLE001 - a failing candidate is recorded, not fatal
            results[algo.label] = {"error": _error(exc)}
            continue
        reason = _check(problem, out)
        if reason:
            results[algo.label] = {"error": reason}
        else:
            outputs[algo.label] = out
    results.update(_disagreements(outputs, {c.label: c.accuracy for c in candidates}))
    del outputs
    alive = [c for c in candidates if c.label not in results]
    times: dict[str, list[float]] = {c.label: [] for c in alive}
    host_before = _cpu_seconds()
    eliminated: set[str] = set()
    spent, rounds = 0.0, 0
    while alive and rounds < MAX_ROUNDS and (rounds < MIN_ROUNDS or spent < BUDGET_S):
        for algo in alive:
            start = time.perf_counter()
            try:
                algo.run(problem, a, b)
            except Exception as exc:  # noqa: BLE001 - flaky candidates are failures too
                results[algo.label] = {"error": _error(exc)}
            dt = time.perf_counter() - start
            times[algo.label].append(dt)
            spent += dt
        rounds += 1
        alive = [c for c in alive if c.label not in results]
        if alive:
            best = min(median(times[c.label]) for c in alive)
            limit = (ELIMINATE_FIRST if rounds == 1 else ELIMINATE) * best
            slow = {c.label for c in alive if median(times[c.label]) > limit and c.label != keep}
            if rounds >= MIN_ROUNDS:
                slow |= _cannot_win(times, [c.label for c in alive], keep)
            eliminated |= slow
            alive = [c for c in alive if c.label not in slow]
        if len(alive) <= 1 and rounds >= MIN_ROUNDS:
            break  # nothing left to compare
    others = _others_share(host_before, _cpu_seconds())
    for name, ts in times.items():
        if name not in results:
            results[name] = {
                "median_s": median(ts), "runs": len(ts), "eliminated": name in eliminated,
                "spread": _spread(ts), "others_busy": others,
            }
    return results


def _cannot_win(times: Mapping[str, list[float]], alive: Sequence[str],
                keep: str | None) -> set[str]:
    """The candidates besides ``keep`` whose fastest run is not ``PARAM_MARGIN`` (the
    smaller margin :func:`decide` is called with) under ``keep``'s median: on these
    runs they could not replace it. Timing them further only confirmed a loss: a first
    ResNet-50 pass (batch 1) made 255-280 timed runs with this rule against 404-419
    without it (Emerald Rapids), the same choices."""
    if keep is None or keep not in alive:
        return set()
    bar = median(times[keep]) / (1 + PARAM_MARGIN)
    return {name for name in alive if name != keep and min(times[name]) > bar}


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(wall clock, CPU seconds the whole host spent busy, this process's CPU seconds),
    from ``/proc/stat``; None where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait (steal counts)
    own = os.times()
    return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system


def _others_share(before: tuple[float, float, float] | None,
                  after: tuple[float, float, float] | None) -> float:
    """The share of the host's CPU time that other processes (or the hypervisor)
    took between ``before`` and ``after``: 0 on a quiet host."""
    if before is None or after is None or after[0] - before[0] < 0.05:
        return 0.0
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, others / ((after[0] - before[0]) * (os.cpu_count() or 1)))


def _spread(ts: Sequence[float]) -> float:
    """The interquartile range of the runs over their median (one stray run among five
    or more moves it little; with fewer, the full range)."""
    if len(ts) < 5:
        low, high = min(ts), max(ts)
    else:
        low, high = np.percentile(ts, [25, 75])
    return float(high - low) / max(median(ts), 1e-12)


def timed_candidates(candidates: Sequence[Algorithm]) -> list[Algorithm]:
    """The candidates worth timing: all but ``reference`` where another serves."""
    others = [c for c in candidates if c.name != "reference"]
    return others or list(candidates)


def decide(results: Mapping[str, Result], ranked: Sequence[str], default: str,
           margin: float = MARGIN, quiet: float = QUIET) -> tuple[str, str]:
    """(choice, why): ``ranked[0]`` where it beats ``default`` (the heuristic's pick)
    by ``margin`` on a quiet host, the runs of both spread under ``quiet`` (or
    ``default`` failed or was eliminated), else ``default``; ``why`` is "faster",
    "agrees", "margin" (too close to call) or "noisy" (the runs spread too much to
    trust)."""
    best = ranked[0]
    mine = results.get(default, {})
    if best == default:
        return default, "agrees"
    if max((r.get("others_busy", 0.0) for r in results.values()), default=0.0) > BUSY:
        return default, "noisy"
    if "median_s" not in mine or mine.get("eliminated"):
        return best, "faster"
    spreads = (results[best].get("spread", 0.0), mine.get("spread", 0.0))
    if max(spreads) > quiet:
        return default, "noisy"
    if results[best]["median_s"] * (1 + margin) > mine["median_s"]:
        return default, "margin"
    return best, "faster"


def rank(results: Mapping[str, Result], accuracy: Mapping[str, int]) -> list[str]:
    """Successful candidates best first: those within ``TIE`` of the fastest, most
    accurate first, then the rest by time. Deterministic given the timings."""
    ok = {n: r["median_s"] for n, r in results.items() if "median_s" in r}
    if not ok:
        return []
    best = min(ok.values())

    def order(name: str) -> tuple[bool, int, float, str]:
        tied = ok[name] <= best * (1 + TIE)
        return (not tied, -accuracy.get(name, 0) if tied else 0, ok[name], name)

    return sorted(ok, key=order)
