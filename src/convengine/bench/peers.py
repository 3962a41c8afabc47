"""convengine against the engines a user would pick instead, on whole networks.

    python bench/bench_peers.py --json peers.json          # both tables (about 6 min idle, 2 cores)
    convengine bench --peers --json peers.json              # the same
    python bench/bench_peers.py --models mobilenet_v2 --batch 1 --engines onnxruntime,convengine

Two tables, ResNet-50 and MobileNetV2 (:mod:`convengine.bench.models`, torchvision's
architectures, BatchNorm statistics randomized so that folding matters) at batch 1 and 8:

- ONNX files (legacy exporter, batch dimension dynamic; int8 = ONNX Runtime's
  ``quantize_static`` QDQ, per-channel int8 weights, uint8 activations, 2 calibration
  images): ``convengine.onnx.Session`` against ONNX Runtime (CPU execution provider,
  session defaults) and OpenVINO (CPU, ``INFERENCE_PRECISION_HINT=f32``,
  ``PERFORMANCE_HINT=LATENCY``, the input reshaped to the static shape it is run at).
- PyTorch programs (eval, ``torch.inference_mode()``): eager NCHW, eager channels_last,
  ``torch.compile`` (inductor, ``torch._inductor.config.freezing = True``) and
  ``convengine.torch.optimize``; inductor and ``optimize`` get the NCHW model and input
  as the user has them.

Every engine runs in a fresh process of its own (one per engine, model, batch and
precision), with ``--threads`` (2) set explicitly: ONNX Runtime
``intra_op_num_threads``, OpenVINO ``INFERENCE_NUM_THREADS``,
``torch.set_num_threads``, ``convengine.config.set(threads=...)``; nothing else in the
environment is changed. A process that never needs convengine (ONNX Runtime,
OpenVINO, eager, inductor) never imports it. Each reports its first call: the seconds
from the start of the session's (or compiled model's) creation to its first output,
with the disk caches (convengine's tuning and kernel caches, inductor's) as they are,
so the second run of this script shows the warm figure. After ``--warmup`` more calls,
the engines of one row take turns (``--rounds`` rounds, ``--settle`` seconds of idle
before each turn so that the previous engine's spinning threads have stopped), each turn
``--passes`` calls back to back timed by their median; a row's time is the best of its
rounds' medians. Ratios are peer time / convengine time (above 1: convengine faster).

Outputs are compared with a reference engine's for the same input (ONNX Runtime's for
the ONNX files, eager NCHW's for the PyTorch programs): ``diff`` is the largest
absolute difference over the reference's largest absolute value, ``equal`` the share
of output values equal to the reference's bit for bit (meaningful for int8, whose
dequantized outputs lie on a grid).

Needs the ``torch``, ``onnx`` and ``bench`` (OpenVINO) extras.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ONNX_ENGINES = ("onnxruntime", "openvino", "convengine")
TORCH_ENGINES = ("eager", "eager-cl", "inductor", "optimize")
ENGINES = ONNX_ENGINES + TORCH_ENGINES
MODELS = ("resnet50", "mobilenet_v2")
KINDS = ("fp32", "int8")
# the module each engine needs, and the extra that installs it
_NEEDS = {"onnxruntime": ("onnxruntime", "onnx"), "openvino": ("openvino", "bench"),
          "convengine": ("onnx", "onnx"), "eager": ("torch", "torch"),
          "eager-cl": ("torch", "torch"), "inductor": ("torch", "torch"),
          "optimize": ("torch", "torch")}
_LABEL = {"onnxruntime": "ORT", "openvino": "OV", "convengine": "ours", "eager": "eager",
          "eager-cl": "eager cl", "inductor": "inductor", "optimize": "ours"}

# ------------------------------------------------------------------ child side


def _network(name: str, width: float) -> Any:
    """The eval-mode network, seeded, with random BatchNorm statistics; the architectures
    are loaded from convengine's source by path, without importing convengine."""
    import torch

    spec = importlib.util.find_spec("convengine")  # finds the package, runs nothing
    assert spec is not None and spec.submodule_search_locations is not None
    path = Path(next(iter(spec.submodule_search_locations))) / "bench" / "models.py"
    mspec = importlib.util.spec_from_file_location("convengine_bench_models", path)
    assert mspec is not None and mspec.loader is not None
    models = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(models)
    torch.manual_seed(0)
    return models.randomized(getattr(models, name)(width=width))


def _input(batch: int, size: int) -> Any:
    import numpy as np

    return np.random.default_rng(1).standard_normal((batch, 3, size, size)).astype(np.float32)


def _export_child(name: str, width: float, size: int, folder: str) -> None:
    """Write ``fp32.onnx`` and ``int8.onnx`` (QDQ) of the network into ``folder``."""
    from convengine.bench import onnx_models as om

    data = om.export(_network(name, width), (1, 3, size, size), dynamo=False)
    Path(folder, "fp32.onnx").write_bytes(data)
    Path(folder, "int8.onnx").write_bytes(
        om.quantize(data, (1, 3, size, size), qdq=True, per_channel=True, samples=2))


def _make(engine: str, onnx_path: str, model: str, width: float, batch: int, size: int,
          threads: int) -> Any:
    """After the imports (and, for PyTorch, the model): ``create``, which builds the
    engine's session or program (the timed part) and returns ``run``, one call giving
    the output."""
    x = _input(batch, size)
    if engine in ONNX_ENGINES:
        if engine == "onnxruntime":
            import onnxruntime as ort

            def create() -> Any:
                options = ort.SessionOptions()
                options.intra_op_num_threads = threads
                options.log_severity_level = 3  # errors only (unused initializers)
                session = ort.InferenceSession(onnx_path, options,
                                               providers=["CPUExecutionProvider"])
                return lambda: session.run(None, {"input": x})[0]
        elif engine == "openvino":
            import openvino as ov

            def create() -> Any:
                core = ov.Core()
                net = core.read_model(onnx_path)
                net.reshape({net.input(0).any_name: list(x.shape)})
                compiled = core.compile_model(net, "CPU", {
                    "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
                    "PERFORMANCE_HINT": "LATENCY"})
                request = compiled.create_infer_request()

                def run() -> Any:
                    request.infer({0: x})
                    return request.get_output_tensor(0).data
                return run
        else:
            import convengine as ce
            import convengine.onnx as ceo

            ce.config.set(threads=threads)

            def create() -> Any:
                session = ceo.Session(onnx_path)
                return lambda: session.run(None, {"input": x})[0]
        return create
    import torch

    torch.set_num_threads(threads)
    net = _network(model, width)
    xt = torch.from_numpy(x)
    if engine == "eager-cl":
        net = net.to(memory_format=torch.channels_last)
        xt = xt.contiguous(memory_format=torch.channels_last)
    if engine == "optimize":
        import convengine as ce
        import convengine.torch as cet

        ce.config.set(threads=threads)

    def create() -> Any:  # type: ignore[no-redef]  # the PyTorch engines' create
        if engine == "inductor":
            from torch._inductor import config as inductor_config

            inductor_config.freezing = True
            program = torch.compile(net)
        elif engine == "optimize":
            program = cet.optimize(net)
        else:
            program = net

        def run() -> Any:
            with torch.inference_mode():
                return program(xt).contiguous().numpy()
        return run
    return create


def _serve_child(engine: str, onnx_path: str, model: str, width: float, batch: int,
                 size: int, threads: int, warmup: int, out: str) -> None:
    """Build the engine, time its first call, save that output to ``out`` (.npy), run
    ``warmup`` calls, print a JSON line, then answer each ``run N`` line on stdin with
    the JSON list of N back-to-back calls' seconds."""
    import numpy as np

    start = time.perf_counter()
    create = _make(engine, onnx_path, model, width, batch, size, threads)
    imported = time.perf_counter()
    run = create()
    np.save(out, np.array(run(), copy=True))
    first = time.perf_counter() - imported
    for _ in range(warmup):
        run()
    print(json.dumps({"load_s": imported - start, "first_s": first}), flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line.split()[1])):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        print(json.dumps(times), flush=True)


# ------------------------------------------------------------------ parent side


class _Child:
    """One engine's process (:func:`_serve_child`); a failure is kept, not raised."""

    def __init__(self, engine: str, onnx_path: str, out: str, args: argparse.Namespace,
                 model: str, batch: int, tmp: str) -> None:
        self.engine, self.error = engine, ""
        self.setup: dict[str, Any] = {}
        self.log = os.path.join(tmp, f"{engine}.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve-child", engine, onnx_path,
                 model, str(args.width), str(batch), str(args.size), str(args.threads),
                 str(args.warmup), out], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True)
        self.setup = self._reply() or {}

    def _reply(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline() if not self.error else ""
        if line:
            return json.loads(line)
        if not self.error:
            tail = Path(self.log).read_text().strip().splitlines()[-1:] or ["(no output)"]
            self.error = f"exit {self.proc.wait()}: {tail[0][:200]}"
            print(f"  {self.engine} failed: {self.error}", file=sys.stderr, flush=True)
        return None

    def call(self, passes: int) -> float | None:
        """The median seconds of ``passes`` calls back to back (None once failed)."""
        if self.error:
            return None
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"run {passes}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        times = self._reply()
        return None if times is None else statistics.median(times)

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=120)


def _compare(got: Any, ref: Any) -> dict[str, float]:
    import numpy as np

    got, ref = np.asarray(got, np.float32), np.asarray(ref, np.float32)
    if got.shape != ref.shape:
        return {"diff": math.inf, "equal": 0.0}
    return {"diff": float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30)),
            "equal": float((got == ref).mean())}


def _row(engines: list[str], onnx_path: str, model: str, batch: int,
         args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """One row: the engines started one after another (so that each first call has the
    host to itself), then ``rounds`` interleaved turns; outputs compared with the
    first engine's (the reference)."""
    import numpy as np

    result: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        children = []
        try:
            for engine in engines:
                out = os.path.join(tmp, f"{engine}.npy")
                children.append((_Child(engine, onnx_path, out, args, model, batch, tmp), out))
            rounds: dict[str, list[float]] = {e: [] for e in engines}
            for _ in range(args.rounds):
                for child, _out in children:
                    if not child.error:
                        time.sleep(args.settle)
                    seconds = child.call(args.passes)
                    if seconds is not None:
                        rounds[child.engine].append(seconds)
        finally:
            for child, _out in children:
                child.close()
        ref = None
        for child, out in children:
            r: dict[str, Any] = {"error": child.error, **child.setup,
                                 "rounds_ms": [s * 1e3 for s in rounds[child.engine]]}
            if rounds[child.engine] and not child.error:
                r["ms"] = min(rounds[child.engine]) * 1e3
                got = np.load(out)
                if ref is None:
                    ref, r["reference"] = got, True
                r.update(_compare(got, ref))
            result[child.engine] = r
    return result


def _export(model: str, args: argparse.Namespace, folder: str) -> None:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--export-child", model,
                           str(args.width), str(args.size), folder], capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"exporting {model} failed:\n{done.stderr[-2000:]}")


def _ratio(rows: dict[str, Any], peer: str, ours: str) -> float | None:
    p, o = rows.get(peer, {}).get("ms"), rows.get(ours, {}).get("ms")
    return p / o if p and o else None


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    if digits == 0:  # milliseconds: 3 significant figures
        return f"{v:.0f}" if v >= 100 else f"{v:.1f}"
    return f"{v:.{digits}f}"


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


_NAMES = {"resnet50": "ResNet-50", "mobilenet_v2": "MobileNetV2"}


def onnx_table(rows: list[dict[str, Any]], engines: list[str], kinds: list[str]) -> str:
    peers = [e for e in ("onnxruntime", "openvino") if e in engines]
    head = "| model | batch |"
    for kind in kinds:
        head += f" {kind} ms {' / '.join(_LABEL[e] for e in engines)} |"
        head += "".join(f" vs {_LABEL[p]} |" for p in peers if "convengine" in engines)
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    best: list[float] = []
    for r in rows:
        line = f"| {_NAMES.get(r['model'], r['model'])} | {r['batch']} |"
        for kind in kinds:
            cells = r[kind]
            line += f" {' / '.join(_fmt(cells[e].get('ms'), 0) for e in engines)} |"
            if "convengine" in engines:
                ratios = [_ratio(cells, p, "convengine") for p in peers]
                line += "".join(f" {_fmt(q)} |" for q in ratios)
                if ratios and all(q is not None for q in ratios):
                    best.append(min(q for q in ratios if q is not None))
        lines.append(line)
    if best:
        lines.append(f"\ngeometric mean of the faster peer's time / ours: {_geomean(best):.2f} "
                     f"(lowest row {min(best):.2f}, {len(best)} rows)")
    return "\n".join(lines)


def torch_table(rows: list[dict[str, Any]], engines: list[str]) -> str:
    peers = [e for e in engines if e != "optimize"]
    head = f"| model | batch | {' / '.join(_LABEL[e] for e in engines)} (ms) |"
    if "optimize" in engines:
        head += "".join(f" vs {_LABEL[p]} |" for p in peers)
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    geo: dict[str, list[float]] = {p: [] for p in peers}
    for r in rows:
        cells = r["torch"]
        line = (f"| {_NAMES.get(r['model'], r['model'])} | {r['batch']} | "
                f"{' / '.join(_fmt(cells[e].get('ms'), 0) for e in engines)} |")
        if "optimize" in engines:
            for p in peers:
                q = _ratio(cells, p, "optimize")
                line += f" {_fmt(q)} |"
                if q is not None:
                    geo[p].append(q)
        lines.append(line)
    means = [f"vs {_LABEL[p]} {_geomean(v):.2f}" for p, v in geo.items() if v]
    if means:
        lines.append("\ngeometric means of peer / ours: " + ", ".join(means))
    return "\n".join(lines)


def details_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | batch | program | engine | ms (best) | rounds' medians ms | "
             "first call s | load s | diff / max | equal |", "|---|" * 1 + "---|" * 9]
    for r in rows:
        for kind in (*KINDS, "torch"):
            for engine, c in r.get(kind, {}).items():
                if c.get("error"):
                    lines.append(f"| {r['model']} | {r['batch']} | {kind} | {engine} | "
                                 f"failed: {c['error']} | | | | | |")
                    continue
                ref = " (reference)" if c.get("reference") else ""
                lines.append(
                    f"| {r['model']} | {r['batch']} | {kind} | {engine} | {_fmt(c.get('ms'), 0)} | "
                    f"{', '.join(_fmt(m, 0) for m in c['rounds_ms'])} | "
                    f"{_fmt(c.get('first_s'))} | {_fmt(c.get('load_s'))} | "
                    f"{c.get('diff', math.nan):.1e}{ref} | {c.get('equal', math.nan):.3f} |")
    return "\n".join(lines)


def _tables(rows: list[dict[str, Any]], engines: list[str], kinds: list[str]) -> str:
    onnx_engines = [e for e in ONNX_ENGINES if e in engines]
    torch_engines = [e for e in TORCH_ENGINES if e in engines]
    tables = []
    if onnx_engines:
        tables.append("ONNX files (" + ", ".join(kinds) + "), ms and peer / ours:\n\n"
                      + onnx_table(rows, onnx_engines, kinds))
    if torch_engines:
        tables.append("PyTorch programs, ms and peer / ours:\n\n"
                      + torch_table(rows, torch_engines))
    tables.append("Per engine (first call: creation to first output; diff and equal "
                  "against the reference):\n\n" + details_table(rows))
    return "\n\n".join(tables)


def host() -> dict[str, Any]:
    """The CPU (``lscpu``'s model name, family and model), load, versions."""
    cpu: dict[str, Any] = {"model_name": platform.processor(), "family": None, "model": None}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                                   check=True).stdout.splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "Model name":
                cpu["model_name"] = value
            elif key == "CPU family":
                cpu["family"] = int(value)
            elif key == "Model":
                cpu["model"] = int(value)
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("convengine", "numpy", "torch", "onnx", "onnxruntime", "openvino"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {"cpu": cpu, "cpus_visible": os.cpu_count(), "versions": versions}


def _split(value: str, allowed: tuple[str, ...], option: str) -> list[str]:
    items = [v for v in value.split(",") if v]
    unknown = [v for v in items if v not in allowed]
    if unknown or not items:
        raise ValueError(f"{option}: unknown {unknown or value!r}; expected some of "
                         f"{', '.join(allowed)}")
    return items


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked: lists split and validated, counts positive."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=", ".join(MODELS))
    p.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    p.add_argument("--engines", default=",".join(ENGINES), help=", ".join(ENGINES))
    p.add_argument("--kinds", default=",".join(KINDS), help="ONNX precisions: fp32, int8")
    p.add_argument("--passes", type=int, default=10,
                   help="calls per turn, timed by their median")
    p.add_argument("--warmup", type=int, default=2, help="calls after the first, untimed")
    p.add_argument("--rounds", type=int, default=2,
                   help="interleaved turns per engine; a row keeps the best")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settle", type=float, default=0.2,
                   help="seconds of idle before each turn")
    p.add_argument("--width", type=float, default=1.0,
                   help="channel width factor (small for a quick check)")
    p.add_argument("--size", type=int, default=224, help="image height and width")
    p.add_argument("--json", default=None, help="write the rows and the host here")
    p.add_argument("--tables", default=None, metavar="JSON",
                   help="print the tables of a run's --json file (a partial one too)")
    p.add_argument("--export-child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--serve-child", nargs=9, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_child or args.export_child or args.tables:
        return args
    args.models = _split(args.models, MODELS, "--models")
    args.engines = _split(args.engines, ENGINES, "--engines")
    args.kinds = _split(args.kinds, KINDS, "--kinds")
    try:
        args.batch = [int(b) for b in args.batch.split(",")]
    except ValueError:
        raise ValueError(f"--batch: expected comma-separated positive ints, got "
                         f"{args.batch!r}") from None
    for name in ("passes", "rounds", "threads", "size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.batch) < 1 or args.warmup < 0 or args.settle < 0 or args.width <= 0:
        raise ValueError("--batch must be >= 1, --warmup and --settle >= 0, --width > 0")
    missing = sorted({f"{_NEEDS[e][0]} (extra {_NEEDS[e][1]}) for {e}" for e in args.engines
                      if importlib.util.find_spec(_NEEDS[e][0]) is None})
    if missing or importlib.util.find_spec("torch") is None:  # torch exports the models
        raise ValueError(f"not installed: {'; '.join(missing) or 'torch (extra torch)'}: "
                         "pip install -e '.[torch,onnx,bench]', or leave these out of --engines")
    return args


def _write(args: argparse.Namespace, argv: list[str] | None, info: dict[str, Any],
           started: float, load_before: tuple[float, ...], rows: list[dict[str, Any]],
           complete: bool) -> None:
    command = ["bench/bench_peers.py", *(sys.argv[1:] if argv is None else argv)]
    Path(args.json).write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), **info,
        "command": " ".join(command), "complete": complete,
        "options": {k: getattr(args, k) for k in ("models", "batch", "engines", "kinds",
                                                  "passes", "warmup", "rounds", "threads",
                                                  "settle", "width", "size")},
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "wall_s": time.time() - started, "rows": rows}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables (and write ``--json``); 0 on success, 2 for
    bad options."""
    try:
        args = parse(argv)
    except ValueError as error:
        print(f"bench_peers: {error}", file=sys.stderr)
        return 2
    if args.export_child:
        name, width, size, folder = args.export_child
        _export_child(name, float(width), int(size), folder)
        return 0
    if args.serve_child:
        e, path, model, width, batch, size, threads, warmup, out = args.serve_child
        _serve_child(e, path, model, float(width), int(batch), int(size), int(threads),
                     int(warmup), out)
        return 0
    if args.tables:
        saved = json.loads(Path(args.tables).read_text())
        print(_tables(saved["rows"], saved["options"]["engines"], saved["options"]["kinds"]))
        return 0
    started = time.time()
    onnx_engines = [e for e in ONNX_ENGINES if e in args.engines]
    torch_engines = [e for e in TORCH_ENGINES if e in args.engines]
    info = host()
    load_before = os.getloadavg()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
          f"{info['cpu']['model_name']} (family {info['cpu']['family']} model "
          f"{info['cpu']['model']}), {info['cpus_visible']} CPUs visible, {args.threads} "
          f"threads, best of {args.rounds} rounds of {args.passes} passes (median) after "
          f"{1 + args.warmup}, load {load_before[0]:.2f}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            folder = os.path.join(tmp, model)
            os.mkdir(folder)
            if onnx_engines:
                _export(model, args, folder)
            for batch in args.batch:
                row: dict[str, Any] = {"model": model, "batch": batch}
                for kind in args.kinds if onnx_engines else ():
                    row[kind] = _row(onnx_engines, os.path.join(folder, f"{kind}.onnx"),
                                     model, batch, args)
                if torch_engines:
                    row["torch"] = _row(torch_engines, "", model, batch, args)
                rows.append(row)
                for kind, cells in row.items():
                    if isinstance(cells, dict):
                        print(f"  {model} batch {batch} {kind}: " + ", ".join(
                            f"{e} {_fmt(c.get('ms'), 0)} ms (first {_fmt(c.get('first_s'))} s)"
                            for e, c in cells.items()), file=sys.stderr)
                print(f"  {model} batch {batch} done at {time.time() - started:.0f} s",
                      file=sys.stderr, flush=True)
                if args.json:  # after every row: an interrupted run keeps its rows
                    _write(args, argv, info, started, load_before, rows, complete=False)
    wall = time.time() - started
    load_after = os.getloadavg()
    print(_tables(rows, args.engines, args.kinds) + f"\n\nwall {wall:.0f} s, load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after", flush=True)
    if args.json:
        _write(args, argv, info, started, load_before, rows, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
