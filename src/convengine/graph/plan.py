"""Execution plans: rank candidate engines, build the first that accepts, cache it.

``build_plan`` validates the graph, looks its canonical description (plus the
flags) up in the plan cache, and on a miss ranks the candidates
(engine x conv algorithm), tries them in order and keeps the first that builds
(``policy="tune"``: the conv algorithm the tuner measures fastest, then times every
engine of it that builds, interleaved, and keeps the fastest). If none
builds, the ConvSetupError lists every candidate and why it refused.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from statistics import median
from typing import Any

import numpy as np

from .. import devices, heuristic, params
from ..errors import ConvSetupError
from ..problem import FLOAT_DTYPES, as_array
from ..tune import tuner
from . import engines
from .engines import ENGINES, INT_ALGO, Built, Candidate, build, check_input
from .ir import GraphDefinition, GraphKey, Tensor
from .program import Program

POLICIES = ("heuristic", "all", "tune")
NO_CONV = "none"
TUNE_ROUNDS = 5
FUSED_FIRST_BYTES = 4 << 20  # conv outputs above this rank the fused engine first


class Outputs(dict[str, np.ndarray]):
    """The results of :meth:`Plan.execute`, by name or by :class:`Tensor`."""

    def __getitem__(self, key: Any) -> np.ndarray:
        return super().__getitem__(key.name if isinstance(key, Tensor) else key)


class Plan:
    """An executable plan for one canonical graph; immutable and thread-safe."""

    def __init__(self, key: GraphKey, prog: Program, chosen: Candidate, built: Built,
                 policy: str, verdicts: list[tuple[str, str]]) -> None:
        self.key = key
        self.program = prog
        self.candidate = chosen
        self._built = built
        self.policy = policy
        self.verdicts = verdicts  # (candidate name, "chosen" | "built" | "refused: ...")

    @property
    def engine_name(self) -> str:
        return self.candidate.name

    @property
    def workspace_bytes(self) -> int:
        """Scratch memory one execute allocates beyond its inputs and outputs."""
        return self._built.workspace_bytes

    def execute(self, bindings: Mapping[Any, Any]) -> Outputs:
        """Run on ``{tensor or name: array}`` for every graph input; returns the
        outputs (float ones in the graph's io_dtype) in their declared layout."""
        prog = self.program
        if any(devices.on_cuda(v) for v in bindings.values()):  # device tensors
            from . import gpu

            on_device: dict[str, Any] = gpu.execute(prog, bindings)  # torch tensors
            return Outputs(on_device)
        vals = {}
        for key, value in bindings.items():
            name = key.name if isinstance(key, Tensor) else key
            if name not in prog.tensors or prog.tensors[name].virtual:
                raise ConvSetupError(
                    f"{name!r} is not an input of this graph; inputs: {prog.inputs}")
            vals[name] = check_input(name, as_array(value, name), prog.tensors[name])
        if missing := [n for n in prog.inputs if n not in vals]:
            raise ConvSetupError(f"inputs not bound: {missing} (graph inputs: {prog.inputs})")
        return Outputs(self._built.run(vals))

    def describe(self) -> str:
        lines = [f"plan {self.key.digest[:16]}  engine {self.engine_name}  policy "
                 f"{self.policy}  workspace {self.workspace_bytes:,} bytes"]
        for node in self.program.nodes:
            lines.append(f"  {node.name}: {node.op}({', '.join(node.inputs)}) -> {node.output}")
        lines.append("  candidates:")
        lines += [f"    {name:<28} {verdict}" for name, verdict in self.verdicts]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Plan({self.engine_name}, workspace_bytes={self.workspace_bytes})"


class PlanCache:
    """Bounded LRU of plans keyed by the canonical description's SHA-256; thread-safe.

    A plan being built is built once: concurrent requests for the same key wait for it.
    """

    def __init__(self, maxsize: int = 128) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self._pending: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def get_or_build(self, key: GraphKey, builder: Callable[[], Plan]) -> Plan:
        digest = key.digest
        while True:
            with self._lock:
                plan = self._plans.get(digest)
                if plan is not None:
                    self._plans.move_to_end(digest)
                    self.hits += 1
                    return plan
                event = self._pending.get(digest)
                owner = event is None
                if owner:
                    event = self._pending[digest] = threading.Event()
                    self.misses += 1
            assert event is not None
            if not owner:
                event.wait()
                continue  # built (a hit now), or the build failed: try it ourselves
            try:
                plan = builder()
                with self._lock:
                    self._plans[digest] = plan
                    while len(self._plans) > self.maxsize:
                        self._plans.popitem(last=False)
                        self.evictions += 1
                return plan
            finally:
                with self._lock:
                    del self._pending[digest]
                event.set()


DEFAULT_CACHE = PlanCache()


def _algorithms(prog: Program, policy: str) -> list[str]:
    """Conv algorithms for the graph's first conv, best first: measured by the tuner
    (``policy="tune"``: ``tune_problem``, persistent), else the tuner's cached
    choice (per the tuning mode) ahead of the heuristic's preference order."""
    convs = prog.convs
    if not convs:
        return [NO_CONV]
    problem = prog.problems[convs[0].name]
    if problem.dtype == "int8":
        return [INT_ALGO]
    order = list(heuristic.preference(problem))  # the one preference ranking
    if len(convs) > 1:
        return order
    if policy == "tune":
        results = tuner.tune_problem(problem).results
        timed = sorted((r["median_s"], n) for n, r in results.items() if "median_s" in r)
        # the graph engines run algorithms by name: a searched parameter's label
        # counts for its algorithm
        first = list(dict.fromkeys(params.parse(n)[0] for _, n in timed))
    else:
        chosen = tuner.choose(problem)
        first = [] if chosen is None else [chosen.name]
    return first + [n for n in order if n not in first]


def engine_order(prog: Program) -> tuple[str, ...]:
    """Fusion first, unless the conv's whole output fits in the cores' L2 caches
    (``FUSED_FIRST_BYTES``): then partly_fused's epilogue passes hit the cache, tiling
    saves little and costs the conv some efficiency, so partly_fused leads.
    An int8 conv tries its kernel's own epilogue (``kernel_fused``) before all."""
    convs = prog.convs
    order: tuple[str, ...] = ENGINES
    if len(convs) == 1:
        spec = prog.tensors[convs[0].output]
        if 4 * math.prod(spec.shape) <= FUSED_FIRST_BYTES:
            order = ("partly_fused", "fused", "unfused")
        if prog.problems[convs[0].name].dtype == "int8":
            order = (engines.KERNEL_FUSED, *order)
    return order


def candidates(prog: Program, policy: str, deterministic: bool, reduced: bool) -> list[Candidate]:
    """Ranked candidates. ``all``: every engine x algorithm, by algorithm order then
    :func:`engine_order`. ``heuristic`` and ``tune``: the engines of the first
    algorithm that serves every conv under the flags, then the unfused fallback."""
    from .engines import algo_refusal

    algos = _algorithms(prog, policy)
    order = engine_order(prog)
    if policy == "all":
        return [Candidate(e, a) for a in algos for e in order]
    top = next(
        (a for a in algos if a == NO_CONV or all(
            algo_refusal(prog.problems[n.name], a, deterministic, reduced) is None
            for n in prog.convs)),
        algos[0],
    )
    ranked = [Candidate(e, top) for e in order]
    fallback = Candidate("unfused", "reference" if "reference" in algos else algos[-1])
    return ranked + ([fallback] if fallback not in ranked else [])


def build_plan(graph: GraphDefinition, policy: str = "heuristic", *, deterministic: bool = False,
               allow_reduced_precision: bool = False, cache: PlanCache | None = None) -> Plan:
    """Validate ``graph`` and return its plan from ``cache`` (default: the shared one)."""
    if policy not in POLICIES:
        raise ConvSetupError(f"unknown policy {policy!r}; expected one of {POLICIES}")
    flags = {"policy": policy, "deterministic": bool(deterministic),
             "allow_reduced_precision": bool(allow_reduced_precision)}
    key = graph.key(**flags)
    cache = DEFAULT_CACHE if cache is None else cache
    return cache.get_or_build(
        key, lambda: _make_plan(key, Program.from_graph(graph), policy, bool(deterministic),
                                bool(allow_reduced_precision)))


def _make_plan(key: GraphKey, prog: Program, policy: str, deterministic: bool,
               reduced: bool) -> Plan:
    verdicts: list[tuple[str, str]] = []
    built: list[tuple[Candidate, Built]] = []
    for cand in candidates(prog, policy, deterministic, reduced):
        result = build(cand, prog, deterministic, reduced)
        if isinstance(result, str):
            verdicts.append((cand.name, f"refused: {result}"))
            continue
        built.append((cand, result))
        verdicts.append((cand.name, "built"))
        if policy != "tune":
            break
    if not built:
        listing = "\n".join(f"  {name}: {verdict}" for name, verdict in verdicts)
        raise ConvSetupError(
            f"no engine can execute this graph (policy={policy!r}, deterministic="
            f"{deterministic}, allow_reduced_precision={reduced}); candidates:\n{listing}")
    chosen, best = built[0]
    if policy == "tune" and len(built) > 1:
        times = _time(prog, built)
        chosen, best = min(built, key=lambda cb: times[cb[0].name])
        verdicts = [(n, f"{v}, median {times[n] * 1e3:.3f} ms" if n in times else v)
                    for n, v in verdicts]
    verdicts = [(n, "chosen" + v[5:] if n == chosen.name else v) for n, v in verdicts]
    return Plan(key, prog, chosen, best, policy, verdicts)


def random_inputs(prog: Program) -> dict[str, np.ndarray]:
    """Seeded random values for every graph input, in the user's layout."""
    rng = np.random.default_rng(zlib.crc32(",".join(prog.inputs).encode()))
    vals = {}
    for name in prog.inputs:
        spec = prog.tensors[name]
        if spec.dtype in FLOAT_DTYPES:
            a = rng.standard_normal(spec.shape, dtype=np.float32).astype(spec.dtype)
        else:
            info = np.iinfo(spec.dtype)
            a = rng.integers(max(info.min, -128), min(info.max, 127), spec.shape,
                             dtype=spec.dtype, endpoint=True)
        vals[name] = a
    return vals


def _time(prog: Program, built: list[tuple[Candidate, Built]]) -> dict[str, float]:
    """Median wall time of each built candidate over interleaved rounds (A B C A B C)."""
    vals = random_inputs(prog)
    times: dict[str, list[float]] = {c.name: [] for c, _ in built}
    for _, b in built:
        b.run(vals)  # warm-up: compilation, first touch
    for _ in range(TUNE_ROUNDS):
        for c, b in built:
            t0 = time.perf_counter()
            b.run(vals)
            times[c.name].append(time.perf_counter() - t0)
    return {name: median(ts) for name, ts in times.items()}
