"""One kernel parameter's values side by side, per layer, interleaved in one process.

For every layer of the suites (at each batch and pass) that ``auto`` runs on ALGO with
the tuning off, ALGO runs with PARAM at each value in turn (``blocked[inside=0]``,
``blocked[inside=1]``, ...), in rounds whose order alternates, and the medians are
compared to the first value's (put the host's default first). The question it
answers: does a cost-model default hold on this CPU, or does another value win across
the layers? (``convengine tune`` answers per layer, with its own noise rules;
``bench/tuned_vs_default.py`` re-measures its choices.) Lab figures: one layer repeated.

    python bench/param_ab.py winograd4 block_kib 1024,256,512,2048 \\
        --passes forward,backward_data --batch 8,1 --suite resnet50 --json out.json

``--weights LO,HI`` keeps the layers whose packed weights (as the forward sees them)
lie in (LO, HI] bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import convengine as ce
from convengine import registry, select
from convengine.bench import suites


def weight_bytes(layer: suites.Layer) -> int:
    """The weights' bytes, float32."""
    return 4 * math.prod(layer.w)


def calls(layer: suites.Layer, pass_: str, label: str, rng: np.random.Generator
          ) -> Callable[[], Any]:
    """One call of ``pass_`` on ``layer`` with algorithm ``label``, NHWC operands."""
    kw = {k: v for k, v in layer.conv_args().items() if k != "layout"}
    xs, ws = (layer.x[0], *layer.x[2:], layer.x[1]), (layer.w[0], *layer.w[2:], layer.w[1])
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    dy = rng.standard_normal(ce.conv(x, w, layout="NHWC", **kw).shape, dtype=np.float32)
    if pass_ == "forward":
        return lambda: ce.conv(x, w, layout="NHWC", algo=label, **kw)
    if pass_ == "backward_data":
        return lambda: ce.conv_backward_data(dy, w, xs, layout="NHWC", algo=label, **kw)
    return lambda: ce.conv_backward_weight(x, dy, ws, layout="NHWC", algo=label, **kw)


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds a call of each, ``rounds`` rounds in alternating order, each
    round repeating a call for about 20 ms."""
    for fn in fns.values():
        fn()
        fn()
    first = next(iter(fns.values()))
    start = time.perf_counter()
    first()
    reps = max(1, int(0.02 / max(time.perf_counter() - start, 1e-5)))
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for k in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            for _ in range(reps):
                fns[k]()
            times[k].append((time.perf_counter() - start) / reps)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("algo")
    p.add_argument("param")
    p.add_argument("values", help="comma list; the first is the reference (the default)")
    p.add_argument("--suite", default="resnet50,mobilenet_v2")
    p.add_argument("--passes", default="forward")
    p.add_argument("--batch", default="8")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--weights", default="", help="LO,HI: weight bytes in (LO, HI] only")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    ce.set_num_threads(a.threads)
    ce.set_tuning("off")
    values = a.values.split(",")
    lo, hi = (int(v) for v in a.weights.split(",")) if a.weights else (-1, math.inf)
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for batch in (int(b) for b in a.batch.split(",")):
        for suite in a.suite.split(","):
            for layer in suites.suite(suite, batch=batch):
                if not lo < weight_bytes(layer) <= hi:
                    continue
                for pass_ in a.passes.split(","):
                    problem = layer.problem(pass_, layout="NHWC")
                    algo = registry.get(a.algo, pass_)
                    if (algo.supports(problem) is not None
                            or a.param not in algo.space(problem)
                            or select.resolve(problem).name != a.algo):
                        continue
                    fns = {v: calls(layer, pass_, f"{a.algo}[{a.param}={v}]", rng)
                           for v in values}
                    med = interleaved(fns, a.rounds)
                    default = algo.space(problem)[a.param][0]
                    rows.append({"suite": suite, "layer": layer.name, "batch": batch,
                                 "pass": pass_, "default": default, "median_s": med})
                    speeds = "  ".join(f"{v}: {med[values[0]] / med[v]:.2f}" for v in values)
                    print(f"b{batch:<2} {suite:<13} {layer.name:<18} {pass_:<15} "
                          f"default {default!s:<6} {speeds}", flush=True)
    for v in values:
        speed = [r["median_s"][values[0]] / r["median_s"][v] for r in rows]
        if speed:
            print(f"{a.param}={v}: speed against {values[0]}: geometric mean "
                  f"{statistics.geometric_mean(speed):.3f}, lowest {min(speed):.2f}, "
                  f"highest {max(speed):.2f}, {len(speed)} layers")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": argv, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
