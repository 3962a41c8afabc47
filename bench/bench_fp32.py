"""Side-by-side fp32 CPU benchmark: convengine against PyTorch (oneDNN), one process.

For every layer of the chosen suites, pass and batch size, the candidates run in
interleaved rounds (A B C A B C ...) and the median of each is kept:

- ``ours``: ``convengine`` with channels-last (NHWC) operands and ``--algo``
  (default ``auto``);
- ``torch_nchw`` and ``torch_cl``: PyTorch with NCHW-contiguous and channels-last
  tensors; the faster of the two is the reference.

Threads are fixed to ``--threads`` (2) on both sides; nothing else is set: PyTorch
runs in its default configuration (convengine's own pool waits passively, see
``convengine.threads``). Printed ratios are
``torch_best / ours`` (above 1: convengine is faster), with geometric means per
group (ResNet-50 3x3 stride-1, all ResNet-50, MobileNetV2 depthwise, ...).
``--memory`` also compares the peak memory of one call: the rise of the process's
peak resident set (``VmHWM`` after resetting it through ``/proc/self/clear_refs``)
above the resident set before the call, with glibc's mmap threshold pinned at 64 KiB
so that every large buffer is mapped and unmapped (none recycled from earlier calls);
that setting adds page faults to both sides' times, so take timings from a run
without ``--memory``. The same method measures both sides; inputs exist before the
call, the output is counted.

Timing runs pin glibc's mmap threshold at 32 MiB (its dynamic maximum) and the trim
threshold at 64 MiB, the state glibc reaches by itself once a large buffer has been
freed. Without that, a fresh process maps every large buffer anew and page-faults
it until some free raises the threshold: in a run of MobileNetV2 alone, PyTorch's
12-14 MiB outputs of the first depthwise layers faulted 3,100-3,500 pages a call
(3-5x slower) while ours, freed and reused, did not, and the ratios depended on
which layers ran first.

    python bench/bench_fp32.py --suite resnet50,mobilenet_v2 --batch 8,1 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np

import convengine as ce
from convengine.bench import suites
from convengine.peak import cpu_name

PASSES = ("forward", "backward_data", "backward_weight")
PAGE = 4096
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters


def _torch():
    try:
        import torch
    except ImportError:
        sys.exit("bench_fp32 needs PyTorch: pip install 'convengine[torch]'")
    return torch


def groups_of(suite: str, layer: suites.Layer) -> list[str]:
    """The summary groups a layer counts in."""
    k = layer.w[2:]
    out = [suite]
    if suite == "resnet50" and all(v == 3 for v in k) and layer.stride == 1:
        out.append("resnet50 3x3 s1")
    if layer.groups > 1 and layer.groups == layer.x[1]:
        out.append(f"{suite} depthwise")
    return out


def operands(layer: suites.Layer, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """float32 NCHW x, w, dy for one layer."""
    x = rng.standard_normal(layer.x, dtype=np.float32)
    w = rng.standard_normal(layer.w, dtype=np.float32) / math.sqrt(math.prod(layer.w[1:]))
    y_shape = layer.problem().y_shape()
    return {"x": x, "w": w, "dy": rng.standard_normal(y_shape, dtype=np.float32)}


def calls(layer: suites.Layer, pass_: str, ops: dict[str, np.ndarray], algo: str,
          prepared: bool = False) -> dict[str, Callable[[], Any]]:
    torch = _torch()
    args = layer.conv_args()
    nhwc = {k: np.ascontiguousarray(np.moveaxis(v, 1, -1)) for k, v in ops.items()}
    kw = {k: v for k, v in args.items() if k != "layout"}
    ours_kw = dict(kw, layout="NHWC", algo=algo)
    x_nhwc_shape, w_nhwc_shape = nhwc["x"].shape, nhwc["w"].shape
    ours = {
        "forward": lambda: ce.conv(nhwc["x"], nhwc["w"], **ours_kw),
        "backward_data": lambda: ce.conv_backward_data(
            nhwc["dy"], nhwc["w"], x_nhwc_shape, **ours_kw),
        "backward_weight": lambda: ce.conv_backward_weight(
            nhwc["x"], nhwc["dy"], w_nhwc_shape, **ours_kw),
    }[pass_]
    out = {"ours": ours}
    if prepared and pass_ == "forward":  # constant weights: no per-call weight check
        out["ours_prepared"] = functools.partial(
            ce.PreparedConv(nhwc["w"], layout="NHWC", **kw), nhwc["x"])
    nd = len(layer.x) - 2
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
            3: torch.nn.functional.conv3d}[nd]
    as_tuple = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)  # noqa: E731
    mask = {"backward_data": [True, False, False], "backward_weight": [False, True, False]}
    for name, fmt in (("torch_nchw", torch.contiguous_format),
                      ("torch_cl", {2: torch.channels_last, 3: torch.channels_last_3d}.get(nd))):
        if fmt is None:
            continue
        t = {k: torch.from_numpy(v).contiguous(memory_format=fmt) for k, v in ops.items()}

        def run(t=t):
            if pass_ == "forward":
                return conv(t["x"], t["w"], **kw)
            return torch.ops.aten.convolution_backward(
                t["dy"], t["x"], t["w"], None, as_tuple(kw["stride"]), as_tuple(kw["padding"]),
                as_tuple(kw["dilation"]), False, (0,) * nd, kw["groups"], mask[pass_])

        out[name] = run
    return out


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, budget_s: float
                ) -> dict[str, float]:
    """Median seconds per candidate over interleaved rounds (after one warm-up each);
    stops early after ``budget_s`` once 3 rounds are in."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    start = time.perf_counter()
    for r in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
        if r >= 2 and time.perf_counter() - start > budget_s:
            break
    return {k: statistics.median(v) for k, v in times.items()}


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Rise of the peak resident set during one call of fn (after a warm-up call)."""
    fn()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    before = _status("VmRSS")
    out = fn()
    peak = _status("VmHWM")
    del out
    return peak - before


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="resnet50,mobilenet_v2")
    p.add_argument("--passes", default=",".join(PASSES))
    p.add_argument("--batch", default="8,1")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--budget", type=float, default=3.0, help="seconds per layer before "
                   "stopping early (at least 3 rounds)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--algo", default="auto")
    p.add_argument("--tuning", default="off", choices=("off", "on", "cache-only"),
                   help="convengine's tuning mode for algo=auto (default off: the heuristic; "
                   "tuning on a busy shared host picks by noise)")
    p.add_argument("--only", default="", help="comma list of layer-name substrings")
    p.add_argument("--depthwise-only", action="store_true",
                   help="of the suites, keep only depthwise layers")
    p.add_argument("--memory", action="store_true", help="also compare peak memory "
                   "(forward); pins glibc's mmap threshold, which adds page faults to every "
                   "timing: run timings and memory separately")
    p.add_argument("--prepared", action="store_true", help="forward: also time "
                   "convengine.PreparedConv (weights packed once, no per-call comparison "
                   "of them), reported as ratio_prepared: a lab figure against eager "
                   "PyTorch, which handles its weights on every call")
    p.add_argument("--json", default=None, help="also write the rows and means to this file")
    a = p.parse_args(argv)

    torch = _torch()
    torch.set_num_threads(a.threads)
    ce.set_num_threads(a.threads)
    ce.set_tuning(a.tuning)
    libc = ctypes.CDLL(None)
    if a.memory:  # M_MMAP_THRESHOLD fixed: big buffers mapped fresh (and page-faulted)
        libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    else:  # glibc's steady state from the first call on (see the module docstring)
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 64 << 20)
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    only = [s for s in a.only.split(",") if s]
    for batch in (int(b) for b in a.batch.split(",")):
        for suite in a.suite.split(","):
            for layer in suites.suite(suite, batch=batch):
                if only and not any(s in layer.name for s in only):
                    continue
                if a.depthwise_only and not (layer.groups > 1 and layer.groups == layer.x[1]):
                    continue
                ops = operands(layer, rng)
                for pass_ in a.passes.split(","):
                    fns = calls(layer, pass_, ops, a.algo, a.prepared)
                    med = interleaved(fns, a.rounds, a.budget)
                    best = min(v for k, v in med.items() if k.startswith("torch"))
                    problem = layer.problem(pass_, layout="NHWC")
                    row = {
                        "suite": suite, "layer": layer.name, "batch": batch, "pass": pass_,
                        "groups": groups_of(suite, layer),
                        "algo": ce.explain(problem).chosen if a.algo == "auto" else a.algo,
                        "tuning": a.tuning,
                        "median_s": med, "ratio": best / med["ours"],
                        "ours_gflops": problem.flops / med["ours"] / 1e9,
                        "torch_gflops": problem.flops / best / 1e9,
                    }
                    if "ours_prepared" in med:
                        row["ratio_prepared"] = best / med["ours_prepared"]
                    if a.memory and pass_ == "forward":
                        mem = {k: peak_bytes(f) for k, f in fns.items()}
                        tb = min(v for k, v in mem.items() if k.startswith("torch"))
                        row["peak_bytes"] = mem
                        # a rise under one page (the call reused resident pages) counts as one
                        row["memory_ratio"] = max(mem["ours"], PAGE) / max(tb, PAGE)
                    rows.append(row)
                    extra = (f"  mem {row['memory_ratio']:.2f}x" if "memory_ratio" in row else "")
                    if "ratio_prepared" in row:
                        extra += f"  prepared {row['ratio_prepared']:5.2f}"
                    print(f"b{batch:<2} {suite:<13} {layer.name:<22} {pass_:<16} "
                          f"{row['algo']:<14} ours {row['ours_gflops']:6.1f} GF/s  torch "
                          f"{row['torch_gflops']:6.1f}  ratio {row['ratio']:5.2f}{extra}",
                          flush=True)
                del ops  # before the next layer's operands are made
    if not rows:
        sys.exit(f"no layer of {a.suite} matches --only {a.only!r}"
                 f"{' and --depthwise-only' if a.depthwise_only else ''}")
    summary: dict[str, float] = {}
    for batch in sorted({r["batch"] for r in rows}):
        for pass_ in PASSES:
            for group in sorted({g for r in rows for g in r["groups"]}):
                sel = [r["ratio"] for r in rows
                       if r["batch"] == batch and r["pass"] == pass_ and group in r["groups"]]
                if sel:
                    summary[f"b{batch} {pass_} {group}"] = geomean(sel)
                sel = [r["ratio_prepared"] for r in rows if r["batch"] == batch
                       and r["pass"] == pass_ and group in r["groups"] and "ratio_prepared" in r]
                if sel:
                    summary[f"b{batch} {pass_} {group} (PreparedConv)"] = geomean(sel)
    mem = [r["memory_ratio"] for r in rows if "memory_ratio" in r]
    print("\ngeometric means of torch_best / ours (above 1: convengine faster)")
    for k, v in summary.items():
        print(f"  {k:<50} {v:5.2f}")
    if mem:
        print(f"  peak memory ours / torch_best: geomean {geomean(mem):.2f}, max {max(mem):.2f}")
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(), "cpu": cpu_name(),
        "threads": a.threads, "torch": torch.__version__, "convengine": ce.__version__,
        "numpy": np.__version__, "rounds": a.rounds, "argv": sys.argv[1:],
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "summary": summary, "rows": rows}, f, indent=1)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
