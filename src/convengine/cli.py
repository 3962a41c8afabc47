"""The ``convengine`` command: bench, tune, cache, warmup, build-cache, explain, demo.

    convengine bench [--suite resnet50] [--pass forward,backward_data,backward_weight] [--compare torch]
    convengine tune --suite all
    convengine cache show | clear | export FILE | import FILE [--force]
    convengine explain --x 8,64,56,56 --w 64,64,3,3 --padding 1
    convengine warmup [--suite resnet50,mobilenet_v2] [--batch 1,8] [--dtype float32,int8] [--tune]
    convengine build-cache --target x86-64-v4-vnni,x86-64-v3 [--out DIR] [--suite ...] [--onnx FILES]
    convengine demo [--epochs 5] [--seed 0] [--out DIR] [--tune] [--quiet]

Passes are named as in the API (``forward``, ``backward_data``, ``backward_weight``);
the short spellings ``fwd``, ``bwd_data``, ``bwd_weight`` are accepted too. Tables go to
stdout, progress bars to stderr (on a terminal, unless ``--quiet``); ``--json FILE``
writes the results as JSON (``-``: to stdout, instead of the table). The layer suites,
whole-network benchmark and demo (:mod:`convengine.bench`) load inside the subcommand.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _host, _kernel_cache, _targets, api, select, threads
from ._version import __version__
from .errors import ConvSetupError
from .problem import PASSES, ConvProblem, make_problem
from .tune import bench as tune_bench
from .tune import keys, transfer, tuner
from .warmup import warmup

if TYPE_CHECKING:
    from .bench.suites import Layer
    from .peak import Peak

_NUMBER = re.compile(r"^-?[\d.,]+x?$|^-$")
PASS_ALIASES = {"fwd": "forward", "bwd_data": "backward_data", "bwd_weight": "backward_weight",
                **{p: p for p in PASSES}}


# --------------------------------------------------------------------------- helpers


def _passes(text: str) -> list[str]:
    out = []
    for item in text.split(","):
        if item.strip() not in PASS_ALIASES:
            raise ConvSetupError(
                f"--pass: unknown pass {item!r}; expected a comma-separated list of "
                f"{', '.join(PASSES)} (or fwd, bwd_data, bwd_weight)"
            )
        out.append(PASS_ALIASES[item.strip()])
    return out


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ConvSetupError(f"{name} must be comma-separated ints, got {text!r}") from None


def _spatial(text: str, name: str) -> int | tuple[int, ...]:
    """'2' -> 2 (every dim), '2,1' -> (2, 1)."""
    values = _ints(text, name)
    return values[0] if len(values) == 1 else values


def _padding(text: str) -> Any:
    """'1', '1,2', '1:2,0:1' (lo:hi per dim), 'same', 'same_lower' or 'valid'."""
    if text.lower() in ("same", "same_lower", "valid"):
        return text.lower()
    items = text.split(",")
    if any(":" in i for i in items):
        return tuple(_ints(i.replace(":", ","), "--padding") for i in items)
    return _spatial(text, "--padding")


def _emit_json(path: str | None, document: Any) -> None:
    if path is None:
        return
    text = json.dumps(document, indent=1, sort_keys=True, default=str)
    if path == "-":
        print(text)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def _progress(items: Sequence[Any], args: argparse.Namespace, desc: str) -> Iterable[Any]:
    if args.quiet or not sys.stderr.isatty():
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="layer", file=sys.stderr, leave=False)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:  # numbers right-aligned, text left-aligned
        cells = [c.rjust(w) if _NUMBER.match(c) else c.ljust(w)
                 for c, w in zip(r, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _set_threads(n: int) -> None:
    """Fix the thread count of numba and numpy's BLAS (capped at numba's limit)."""
    import numba

    limit = getattr(numba.config, "NUMBA_NUM_THREADS", n)
    if n < 1:
        raise ConvSetupError(f"--threads must be >= 1, got {n}")
    threads.set_num_threads(min(n, limit))


def _suite_names(text: str) -> list[str]:
    from .bench import suites

    return _names(text, [*suites.suite_names(), "all"], "--suite")


def _layers(args: argparse.Namespace) -> list[Layer]:
    from .bench import suites

    if args.suite not in [*suites.suite_names(), "all"]:
        raise ConvSetupError(f"--suite: unknown suite {args.suite!r}; expected one of "
                             f"{', '.join(suites.suite_names())}, all")
    layers = suites.suite(args.suite, args.batch)
    if args.layers:
        layers = [la for la in layers if args.layers in la.name]
        if not layers:
            raise ConvSetupError(
                f"--layers {args.layers!r} matches no layer of suite {args.suite!r}"
            )
    return layers


# --------------------------------------------------------------------------- bench


def _convengine_call(problem: ConvProblem, a: np.ndarray, b: np.ndarray,
                     algo: str) -> Callable[[], Any]:
    """The public API call of the problem's pass on channels-last arrays."""
    kw: dict[str, Any] = {
        "stride": problem.stride, "padding": problem.padding, "dilation": problem.dilation,
        "groups": problem.groups, "layout": "NHWC", "algo": algo,
    }
    if problem.pass_ == "forward":
        return lambda: api.conv(a, b, **kw)
    if problem.pass_ == "backward_data":
        return lambda: api.conv_backward_data(a, b, problem.x_shape("NHWC"), **kw)
    return lambda: api.conv_backward_weight(a, b, problem.w_shape("NHWC"), **kw)


def _torch_calls(problem: ConvProblem, a: np.ndarray,
                 b: np.ndarray) -> dict[str, Callable[[], Any]]:
    """PyTorch's call of the problem's pass, NCHW and channels-last; {} if PyTorch
    cannot express it (asymmetric padding)."""
    import torch
    from torch.nn import grad

    if any(lo != hi for lo, hi in problem.padding):
        return {}
    nd = problem.ndim
    conv = (torch.nn.functional.conv1d, torch.nn.functional.conv2d,
            torch.nn.functional.conv3d)[nd - 1]
    grad_input = (grad.conv1d_input, grad.conv2d_input, grad.conv3d_input)[nd - 1]
    grad_weight = (grad.conv1d_weight, grad.conv2d_weight, grad.conv3d_weight)[nd - 1]
    geometry = (problem.stride, tuple(lo for lo, _ in problem.padding), problem.dilation,
                problem.groups)
    first = torch.from_numpy(np.ascontiguousarray(np.moveaxis(a, -1, 1)))
    second = torch.from_numpy(np.ascontiguousarray(np.moveaxis(b, -1, 1)))
    formats = {"NCHW": torch.contiguous_format}
    if nd in (2, 3):
        formats["channels_last"] = torch.channels_last if nd == 2 else torch.channels_last_3d
    calls: dict[str, Callable[[], Any]] = {}
    for label, fmt in formats.items():
        t1, t2 = first.contiguous(memory_format=fmt), second.contiguous(memory_format=fmt)
        if problem.pass_ == "forward":
            calls[label] = partial(conv, t1, t2, None, *geometry)
        elif problem.pass_ == "backward_data":
            calls[label] = partial(grad_input, problem.x_shape("NCHW"), t2, t1, *geometry)
        else:
            calls[label] = partial(grad_weight, t1, problem.w_shape("NCHW"), t2, *geometry)
    return calls


def _interleaved(calls: dict[str, Callable[[], Any]], rounds: int,
                 budget_s: float) -> dict[str, float]:
    """Median seconds of each call, timed in interleaved rounds after one warm-up."""
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in calls}
    start = time.perf_counter()
    for r in range(rounds):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        if r >= 2 and time.perf_counter() - start > budget_s:
            break
    return {k: median(v) for k, v in times.items()}


def _bench_one(layer: Layer, pass_: str, args: argparse.Namespace,
               suite_name: str) -> dict[str, Any]:
    problem = layer.problem(pass_, layout="NHWC")
    result = tuner.tune_problem(problem, force=args.retune)
    row: dict[str, Any] = {
        "suite": suite_name, "layer": layer.name, "pass": pass_, "count": layer.count,
        "problem": problem.describe(), "gflop": problem.flops / 1e9, "algo": result.choice,
        "tuning": result.source, "candidates": result.results,
    }
    if result.choice is None:
        return row
    a, b = tune_bench.operands(problem)
    calls = {"convengine": _convengine_call(problem, a, b, result.choice)}
    if args.compare == "torch":
        import torch

        with torch.inference_mode():
            torch_calls = _torch_calls(problem, a, b)
            calls.update({f"torch {k}": f for k, f in torch_calls.items()})
            medians = _interleaved(calls, args.rounds, args.budget)
            if torch_calls:
                mine = np.asarray(calls["convengine"](), dtype=np.float64)
                theirs = calls["torch NCHW"]().double().numpy()
                theirs = np.moveaxis(theirs, 1, -1)
                scale = max(float(np.linalg.norm(theirs)), 1e-30)
                row["rel_err_vs_torch"] = float(np.linalg.norm(mine - theirs)) / scale
    else:
        medians = _interleaved(calls, args.rounds, args.budget)
    row["median_s"] = medians["convengine"]
    row["gflops"] = problem.flops / medians["convengine"] / 1e9
    torch_times = {k[6:]: v for k, v in medians.items() if k.startswith("torch ")}
    if torch_times:
        best = min(torch_times, key=lambda k: torch_times[k])
        row["torch_median_s"], row["torch_layout"] = torch_times[best], best
        row["torch_medians_s"] = torch_times
        row["ratio"] = torch_times[best] / medians["convengine"]
    return row


def _fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.2f}"


def cmd_bench(args: argparse.Namespace) -> int:
    if args.peers:
        return _bench_peers(args)
    if args.model is not None:
        return _bench_model(args)
    _set_threads(args.threads)
    if args.compare == "torch":
        try:
            import torch
        except ImportError:
            raise ConvSetupError(
                "--compare torch needs PyTorch: pip install 'convengine[torch]'"
            ) from None
        torch.set_num_threads(args.threads)
    passes, layers = _passes(args.pass_), _layers(args)
    measured = _peak()
    work = [(la, p) for la in layers for p in passes]
    rows = [_bench_one(la, p, args, args.suite)
            for la, p in _progress(work, args, f"bench {args.suite}")]
    timed = [r for r in rows if "median_s" in r]
    for r in timed:  # the suites are float32: the fraction of the FMA peak
        r["peak_fraction"] = r["gflops"] / measured.fp32_gflops
    total = {"convengine_s": sum(r["median_s"] * r["count"] for r in timed)}
    compared = [r for r in timed if "ratio" in r]
    if compared:
        total["torch_s"] = sum(r["torch_median_s"] * r["count"] for r in compared)
        total["convengine_compared_s"] = sum(r["median_s"] * r["count"] for r in compared)
        total["ratio"] = total["torch_s"] / total["convengine_compared_s"]
        total["geomean_ratio"] = math.exp(sum(math.log(r["ratio"]) for r in compared)
                                          / len(compared))
    document = {"convengine": __version__, "host": keys.host_signature(),
                "threads": args.threads, "suite": args.suite, "peak": asdict(measured),
                "rows": rows, "total": total}
    _emit_json(args.json, document)
    if args.json != "-":
        print(_bench_report(rows, total, args, measured))
    return 0


def _peak() -> Peak:
    """The host's measured peak on the threads set (cached; see :mod:`convengine.peak`)."""
    from . import peak

    return peak.peak(threads.get_num_threads())


def _peak_line(measured: Peak) -> str:
    line = (f"measured peak on {measured.threads} threads: {measured.fp32_gflops:.0f} "
            f"GFLOP/s float32 FMA")
    if measured.int8_gops is not None:
        line += f", {measured.int8_gops:.0f} GOPS int8 VNNI"
    line += f" ({measured.note})" if measured.note else ""
    return f"{line}; caches {_host.CACHES.describe()}"


def _bench_report(rows: list[dict[str, Any]], total: dict[str, float],
                  args: argparse.Namespace, measured: Peak) -> str:
    header = ["layer", "pass", "algo", "ms", "GFLOP/s", "% peak"]
    compare = any("ratio" in r for r in rows)
    if compare:
        header += ["torch ms", "torch layout", "vs torch"]
    table = []
    for r in rows:
        cells = [r["layer"], r["pass"], r["algo"] or "FAILED", _fmt_ms(r.get("median_s")),
                 f"{r['gflops']:.1f}" if "gflops" in r else "-",
                 f"{100 * r['peak_fraction']:.1f}" if "peak_fraction" in r else "-"]
        if compare:
            cells += [_fmt_ms(r.get("torch_median_s")), r.get("torch_layout", "-"),
                      f"{r['ratio']:.2f}x" if "ratio" in r else "-"]
        table.append(cells)
    lines = [f"convengine {__version__} bench: suite {args.suite}, {args.threads} threads, "
             f"host {keys.host_signature()}", _peak_line(measured),
             "% peak: GFLOP/s as a percentage of the float32 peak (Winograd counted by "
             "direct FLOPs: may exceed 100)", "convengine runs channels-last (NHWC) arrays"
             + ("; PyTorch the faster of NCHW and channels-last" if compare else ""),
             "", _table(table, header), ""]
    line = f"network total (layers x their count): convengine {total['convengine_s'] * 1e3:.1f} ms"
    if "ratio" in total:
        line += (f", PyTorch {total['torch_s'] * 1e3:.1f} ms: {total['ratio']:.2f}x PyTorch's "
                 f"speed (geometric mean per layer {total['geomean_ratio']:.2f}x)")
    lines.append(line)
    return "\n".join(lines)


def _bench_model(args: argparse.Namespace) -> int:
    """Whole networks (:mod:`convengine.bench.modelbench`): with ``--compare torch`` every
    mode side by side with PyTorch, else convengine alone (its convs in network order)."""
    from .bench import modelbench

    modes = "infer,fused,train,int8,numpy" if args.compare == "torch" else "numpy"
    argv = ["--models", args.model, "--modes", modes, "--rounds", str(args.rounds),
            "--threads", str(args.threads),
            "--batch", str(args.batch) if args.batch else "1,8"]
    if args.json is not None and args.json != "-":
        argv += ["--json", args.json]
    modelbench.main(argv)
    return 0


def _bench_peers(args: argparse.Namespace) -> int:
    """Whole networks against ONNX Runtime, OpenVINO, PyTorch eager and ``torch.compile``,
    each engine in a fresh process (:mod:`convengine.bench.peers`; extras torch, onnx
    and bench): ``--model``, ``--batch``, ``--threads`` and ``--json`` passed on."""
    from .bench import peers

    argv = ["--threads", str(args.threads)]
    if args.model is not None:
        argv += ["--models", args.model]
    if args.batch:
        argv += ["--batch", str(args.batch)]
    if args.json is not None and args.json != "-":
        argv += ["--json", args.json]
    return int(peers.main(argv))


# --------------------------------------------------------------------------- tune


def cmd_tune(args: argparse.Namespace) -> int:
    if args.threads is not None:
        _set_threads(args.threads)
    problems = [la.problem(p, layout=args.layout) for la in _layers(args)
                for p in _passes(args.pass_)]
    stored = [tuner.default_cache().get(tuner.ident(p)) for p in problems] if args.recheck else []
    results = tuner.tune(problems, force=args.force or args.recheck,
                         progress=False if args.quiet else None)
    rows: list[dict[str, Any]] = [
        {"key": r.key, "choice": r.choice, "source": r.source, "why": r.why,
         "median_s": r.median_s, "problem": r.problem.describe(), "results": r.results}
        for r in results
    ]
    for row, entry in zip(rows, stored):
        row["was"] = None if entry is None else entry.choice
    _emit_json(args.json, {"cache": str(tuner.default_cache().path), "entries": rows})
    if args.json != "-" and not args.quiet:
        table = [[r["key"], r["choice"] or "FAILED", _fmt_ms(r["median_s"]), r["source"],
                  r["why"]] + ([r["was"] or "-"] if args.recheck else []) for r in rows]
        print(_table(table, ["tuning key", "choice", "ms", "source", "why"]
                     + (["was"] if args.recheck else [])))
        fresh = sum(r["source"] == "tuned" for r in rows)
        changed = sum(r.get("was") not in (None, r["choice"]) for r in rows)
        print(f"\n{fresh} tuned, {len(rows) - fresh} already cached or not stored"
              + (f", {changed} choices changed" if args.recheck else "")
              + f"; cache: {tuner.default_cache().path}")
    return 0


# --------------------------------------------------------------------------- cache


def _entry_cells(e: Any) -> str:
    parts = []
    for name, r in sorted(e.results.items(), key=lambda kv: kv[1].get("median_s", math.inf)):
        parts.append(f"{name} {r['median_s'] * 1e3:.2f}" if "median_s" in r else f"{name} failed")
    return ", ".join(parts)


def cmd_cache(args: argparse.Namespace) -> int:
    cache = tuner.default_cache()
    if args.action == "show":
        host, version = keys.host_signature(), keys.version()
        entries = cache.entries()

        def stale(e: Any) -> bool:
            return (e.host != host or e.version != version
                    or e.candidates != keys.candidate_checksum(e.pass_))

        _emit_json(args.json, {
            "cache": str(cache.path), "host": host, "convengine": version,
            "usable": cache.failure is None, "failure": cache.failure,
            "kernels": str(_kernel_cache.kernel_dir()), "kernel_count": _kernel_cache.count(),
            "compiled_for": _kernel_cache.describe_target(),
            "entries": [{**e.to_json(), "stale": stale(e)} for e in entries],
        })
        if args.json != "-":
            unusable = f" (unusable: {cache.failure})" if cache.failure else ""
            print(f"cache: {cache.path}{unusable}")
            print(f"kernels: {_kernel_cache.kernel_dir()} ({_kernel_cache.count()} compiled, "
                  f"for {_kernel_cache.describe_target()})")
            print(f"host:  {host}\n")
            table = [[e.key, e.choice, _fmt_ms(e.results[e.choice]["median_s"]),
                      "stale" if stale(e) else "", _entry_cells(e)] for e in entries]
            print(_table(table, ["tuning key", "choice", "ms", "", "candidates (ms)"])
                  if table else "(no entries)")
        return 0
    if args.action == "clear":  # both caches, each reporting on its own line
        status = 0
        for clear in (cache.clear, _kernel_cache.clear):
            try:
                print(clear())
            except OSError as exc:
                print(f"convengine cache clear: error: {exc}", file=sys.stderr)
                status = 2
        return status
    if args.action == "export":
        n = transfer.export_cache(args.file)
        print(f"exported {n} entries to {args.file}")
        return 0
    report = transfer.import_cache(args.file, force=args.force)
    print(report)
    return 0


# --------------------------------------------------------------------------- warmup

WARMUP_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8")


def _names(text: str, allowed: Sequence[str], option: str) -> list[str]:
    names = [v.strip() for v in text.split(",")]
    for v in names:
        if v not in allowed:
            raise ConvSetupError(f"{option}: unknown value {v!r}; expected a comma-separated "
                                 f"list of {', '.join(allowed)}")
    return names


def cmd_warmup(args: argparse.Namespace) -> int:
    from .bench import suites

    if args.threads is not None:
        _set_threads(args.threads)
    names = _suite_names(args.suite)
    batches: list[int | None] = list(_ints(args.batch, "--batch")) if args.batch else [None]
    dtypes = _names(args.dtype, WARMUP_DTYPES, "--dtype")
    floats = [d for d in dtypes if d != "int8"]
    passes = _passes(args.pass_)
    layers = [la for n in names for b in batches for la in suites.suite(n, b)]
    problems = [la.problem(p, dtype=d, layout=args.layout)
                for la in layers for d in floats for p in passes]
    int8 = [la.problem("forward", layout=args.layout) for la in layers if "int8" in dtypes]
    start = time.perf_counter()
    done = warmup(problems, int8=int8, tune=args.tune is not None,
                  search=args.tune == "search", progress=False if args.quiet else None)
    total = time.perf_counter() - start
    _emit_json(args.json, {"seconds": total, "calls": [
        {"problem": w.problem.describe(), "kind": w.kind, "seconds": w.seconds} for w in done]})
    if args.json != "-" and not args.quiet:
        slow = sorted(done, key=lambda w: -w.seconds)[:5]
        print(f"warmed {len(done)} calls in {total:.1f} s (kernels: "
              f"{_kernel_cache.kernel_dir()}); slowest:")
        for w in slow:
            print(f"  {w.seconds:7.2f} s  {w.kind:5s}  {w.problem.describe()}")
    return 0


# --------------------------------------------------------------------------- explain


def cmd_explain(args: argparse.Namespace) -> int:
    problem = make_problem(
        PASS_ALIASES.get(args.pass_, args.pass_), _ints(args.x, "--x"), _ints(args.w, "--w"),
        dtype=args.dtype, stride=_spatial(args.stride, "--stride"),
        padding=_padding(args.padding), dilation=_spatial(args.dilation, "--dilation"),
        groups=args.groups, layout=args.layout,
    )
    if args.tune:
        tuner.tune_problem(problem)
    ex = select.explain_problem(problem)
    _emit_json(args.json, {
        "problem": problem.describe(), "chosen": ex.chosen, "source": ex.source,
        "supported": list(ex.supported), "refused": ex.refused,
        "workspace_bytes": ex.workspace_bytes, "timings": ex.timings,
    })
    if args.json != "-":
        print(ex)
    return 0


# --------------------------------------------------------------------------- build-cache


def cmd_build_cache(args: argparse.Namespace) -> int:
    """Compile the suites' kernels for each target into the shipped-kernel folder."""
    from . import shipping

    names = [n.strip() for n in args.target.split(",") if n.strip()]
    for name in names:  # every target checked before the first is built
        shipping.check_target(name)
    out = Path(args.out) if args.out else _targets.PACKAGED
    warmup_args = ["--suite", args.suite, "--dtype", args.dtype, "--pass", args.pass_,
                   "--quiet"] + (["--batch", args.batch] if args.batch else []) + (
                   [] if args.no_tune else ["--tune=algorithms"])
    models = shipping.check_models([Path(p) for p in args.onnx.split(",") if p] if args.onnx
                                   else [])
    for name in names:
        print(f"build-cache: compiling for {name} (convengine warmup {' '.join(warmup_args)}"
              f"{', then a session run of ' + args.onnx if models else ''})",
              file=sys.stderr, flush=True)
        built = shipping.build(name, out, warmup_args, models)
        print(f"{built.target}: {built.files} files, {built.bytes / 2**20:.1f} MiB in "
              f"{built.folder} ({built.seconds:.0f} s)")
    return 0


# --------------------------------------------------------------------------- parser


def _common(p: argparse.ArgumentParser, json_help: str) -> None:
    p.add_argument("--json", metavar="FILE", help=f"{json_help} as JSON to FILE ('-': stdout)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def cmd_demo(args: argparse.Namespace) -> int:
    """Train, quantize and serve the digits CNN (:mod:`convengine.bench.demo`)."""
    print(f"convengine demo: a small CNN on scikit-learn's digits, {args.epochs} epochs, "
          "then int8 (progress on stderr)", file=sys.stderr, flush=True)
    try:
        from .bench import demo

        result = demo.run(epochs=args.epochs, seed=args.seed, out=args.out,
                          progress=sys.stderr.isatty() and not args.quiet,
                          say=None if args.quiet else demo.say, tune=args.tune)
    except ImportError as exc:
        print(f"convengine demo: {exc}; install the extra: pip install 'convengine[demo]'",
              file=sys.stderr)
        return 2
    print(demo.summary(result))
    return 0


_SUITES = "resnet50, mobilenet_v2, unet3d, conv1d, all"  # test_cli checks: bench.suites' names
_PASS_HELP = ("comma-separated passes: forward, backward_data, backward_weight (or fwd, "
              "bwd_data, bwd_weight)")


def _suite_args(p: argparse.ArgumentParser, default_pass: str, threads: int | None) -> None:
    p.add_argument("--suite", default="resnet50", help=f"layer suite: {_SUITES} (default resnet50)")
    p.add_argument("--pass", dest="pass_", default=default_pass, metavar="PASSES",
                   help=f"{_PASS_HELP} (default {default_pass})")
    p.add_argument("--batch", type=int,
                   help="batch size (default: the suite's, see convengine.bench.suites)")
    p.add_argument("--layers", metavar="TEXT", help="only layers whose name contains TEXT")
    p.add_argument("--threads", type=int, default=threads,
                   help="threads of numba and BLAS; part of the tuning key (default "
                        f"{threads or 'as in any process: numba default'})")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="convengine",
        description="Benchmark, tune and inspect convengine's convolution algorithms.",
    )
    top.add_argument("--version", action="version", version=f"convengine {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("bench", help="tune and time a layer suite, optionally against PyTorch")
    _suite_args(p, "forward", threads=2)
    against = p.add_mutually_exclusive_group()
    against.add_argument("--compare", choices=["torch"], help="also time PyTorch, interleaved")
    against.add_argument("--peers", action="store_true",
                         help="whole networks (--model, default both) against ONNX Runtime, "
                              "OpenVINO, PyTorch eager and torch.compile, each engine in a fresh "
                              "process, batch 1 and 8 unless --batch (needs the torch, onnx and "
                              "bench extras; see convengine.bench.peers)")
    p.add_argument("--model", metavar="NAMES",
                   help="whole networks instead of a layer suite: resnet50 and/or mobilenet_v2, "
                        "comma-separated (needs the torch extra; see convengine.bench.modelbench)")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds per layer (default 7)")
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds per layer after which timing stops (>= 3 rounds; default 1)")
    p.add_argument("--retune", action="store_true", help="tune again even if cached")
    _common(p, "results")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="fill the tuning cache for a layer suite")
    _suite_args(p, ",".join(PASSES), threads=None)
    p.add_argument("--layout", default="NCHW", choices=["NCHW", "NHWC"],
                   help="the layout your calls use (part of the tuning key; default NCHW)")
    p.add_argument("--force", action="store_true", help="tune again even if cached")
    p.add_argument("--recheck", action="store_true",
                   help="measure the stored choices again and show which changed")
    _common(p, "results")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("cache", help="show, clear, export or import the tuning cache "
                                     "(clear: the compiled kernels too)")
    p.add_argument("action", choices=["show", "clear", "export", "import"])
    p.add_argument("file", nargs="?", help="JSON file for export / import")
    p.add_argument("--force", action="store_true",
                   help="import: take entries measured on another host as this host's")
    _common(p, "show: the entries")
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("warmup", help="compile (and with --tune, tune) every kernel of "
                                      "layer suites ahead of time, e.g. in a Docker build")
    p.add_argument("--suite", default="resnet50",
                   help=f"comma-separated suites: {_SUITES} (default resnet50)")
    p.add_argument("--batch", help="comma-separated batch sizes (default: each suite's)")
    p.add_argument("--dtype", default="float32",
                   help=f"comma-separated: {', '.join(WARMUP_DTYPES)} (default float32)")
    p.add_argument("--pass", "--passes", dest="pass_", default="forward", metavar="PASSES",
                   help=f"{_PASS_HELP} (default forward)")
    p.add_argument("--layout", default="NCHW", choices=["NCHW", "NHWC"],
                   help="the layout your calls use (default NCHW)")
    p.add_argument("--threads", type=int, help="threads of numba and BLAS, as your calls use")
    p.add_argument("--tune", nargs="?", const="search", choices=("search", "algorithms"),
                   help="tune the problems first: the algorithms and their parameters "
                        "(search, the default), or the algorithms only, as a first call "
                        "does (algorithms)")
    _common(p, "per-call seconds")
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser("build-cache", help="compile kernels for portable CPU targets into "
                                           "the folder a built wheel ships (see the "
                                           "deployment guide)")
    p.add_argument("--target", required=True,
                   help="comma-separated: x86-64-v3 (AVX2), x86-64-v4 (AVX-512), "
                        "x86-64-v4-vnni (AVX-512 VNNI)")
    p.add_argument("--out", help="folder of the shipped targets (default: the package's "
                                 "_shipped folder, which `python -m build` packs)")
    p.add_argument("--suite", default="resnet50,mobilenet_v2",
                   help="comma-separated suites (default resnet50,mobilenet_v2)")
    p.add_argument("--batch", default="1", help="comma-separated batch sizes (default 1)")
    p.add_argument("--dtype", default="float32,int8",
                   help="comma-separated dtypes (default float32,int8)")
    p.add_argument("--pass", "--passes", dest="pass_", default="forward", metavar="PASSES",
                   help=f"{_PASS_HELP} (default forward)")
    p.add_argument("--onnx", metavar="FILES",
                   help="comma-separated ONNX model files to run once each through "
                        "convengine.onnx.Session as well (extra onnx)")
    p.add_argument("--no-tune", action="store_true",
                   help="the heuristic's algorithms only (default: every candidate, as "
                        "tuning on a first call compiles them)")
    p.set_defaults(func=cmd_build_cache)

    p = sub.add_parser("explain", help="the algorithm table for one problem")
    p.add_argument("--x", required=True, help="input shape, e.g. 8,64,56,56")
    p.add_argument("--w", required=True, help="weight shape, e.g. 64,64,3,3")
    p.add_argument("--stride", default="1")
    p.add_argument("--padding", default="0", help="1 | 1,2 | 1:2,0:1 | same | valid")
    p.add_argument("--dilation", default="1")
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--layout", default="NCHW", choices=["NCHW", "NHWC"])
    p.add_argument("--dtype", default="float32",
                   choices=["float16", "bfloat16", "float32", "float64"])
    p.add_argument("--pass", dest="pass_", default="forward", choices=sorted(PASS_ALIASES),
                   metavar="PASS", help="forward, backward_data or backward_weight (or fwd, "
                                        "bwd_data, bwd_weight; default forward)")
    p.add_argument("--tune", action="store_true", help="tune the problem first")
    _common(p, "the explanation")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="train a small CNN on the digits, quantize it to int8, "
                                    "serve it (extra demo)")
    p.add_argument("--epochs", type=int, default=5, help="training epochs (default 5)")
    p.add_argument("--seed", type=int, default=0, help="split, init and batch order (default 0)")
    p.add_argument("--out", default="convengine-demo",
                   help="directory for demo.png and demo.json (default convengine-demo)")
    p.add_argument("--quiet", action="store_true",
                   help="only the summary: no progress lines, no bars")
    p.add_argument("--tune", action="store_true",
                   help="tune each conv on its first call, as algo='auto' does by default "
                        "(compiles every candidate; the demo's default: the heuristic picks)")
    p.set_defaults(func=cmd_demo)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "action", None) in ("export", "import") and not args.file:
        parser().error(f"cache {args.action} needs a FILE")
    try:
        return int(args.func(args))
    except (ConvSetupError, ValueError, OSError, sqlite3.Error) as exc:
        print(f"convengine {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
