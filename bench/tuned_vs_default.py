"""After ``convengine tune``: the tuned choice against the untuned default, re-measured.

For every layer of the suites, pass and batch size, in one process, with the tuning
cache that ``convengine tune`` filled (``$CONVENGINE_CACHE_DIR``): the heuristic's
algorithm at its cost-model parameters (what an untuned call runs) and the tuner's
stored choice (algorithm and parameters, a label such as ``blocked[tasks=4]``), each
run on the canonical operands in interleaved rounds (A B A B ...), medians kept.
Layers whose choice is the default are reported as such and not timed. Printed:
``default / tuned`` per layer (above 1: tuning made it faster), the geometric mean
and the lowest ratio over the layers whose choice differs.

    convengine tune --suite resnet50 --batch 8 --threads 2
    python bench/tuned_vs_default.py --suite resnet50 --batch 8 --threads 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from datetime import datetime, timezone

import numba

from convengine import config, threads
from convengine.bench import suites
from convengine.heuristic import heuristic
from convengine.tune import bench, keys, tuner


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="resnet50")
    p.add_argument("--passes", default="forward,backward_data,backward_weight")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layout", default="NCHW", help="as given to convengine tune")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    threads.set_num_threads(args.threads)
    config.set(tuning="cache-only")
    rows = []
    for suite_name in args.suite.split(","):
        for layer in suites.suite(suite_name, args.batch):
            for pass_ in args.passes.split(","):
                problem = layer.problem(pass_, layout=args.layout)
                default, tuned = heuristic(problem), tuner.choose(problem)
                row = {"suite": suite_name, "layer": layer.name, "pass": pass_,
                       "default": default.label, "tuned": None if tuned is None else tuned.label}
                if tuned is not None and tuned.label != default.label:
                    a, b = bench.operands(problem)
                    times: dict[str, list[float]] = {"default": [], "tuned": []}
                    for algo in (default, tuned):
                        algo.run(problem, a, b)  # warm-up
                    for _ in range(args.rounds):
                        for name, algo in (("default", default), ("tuned", tuned)):
                            start = time.perf_counter()
                            algo.run(problem, a, b)
                            times[name].append(time.perf_counter() - start)
                    row.update({f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()})
                    row["ratio"] = row["default_ms"] / row["tuned_ms"]
                rows.append(row)
                shown = (f"{row['default_ms']:8.3f} / {row['tuned_ms']:8.3f} ms  "
                         f"{row['ratio']:.2f}" if "ratio" in row else "same choice")
                print(f"{layer.name:<22}{pass_:<16}{row['default']:<14}"
                      f"{row['tuned'] or '-':<28}{shown}", flush=True)
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    summary = {"changed": len(ratios), "layers": len(rows),
               "geomean": math.exp(statistics.fmean(map(math.log, ratios))) if ratios else None,
               "lowest": min(ratios) if ratios else None}
    print(f"choices that differ from the default: {summary['changed']} of {len(rows)}; "
          f"default / tuned geometric mean {summary['geomean'] or 1:.3f}, "
          f"lowest {summary['lowest'] or 1:.3f}")
    if args.json:
        meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "cpu": _cpu(), "host": keys.host_signature(), "threads": args.threads,
                "numba_threads": numba.get_num_threads(), "args": vars(args)}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
