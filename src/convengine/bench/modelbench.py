"""Whole networks, side by side with PyTorch, as users run them.

Each side runs in a process of its own, started fresh with the environment the user
has (nothing exported, nothing pinned): ``torch`` is PyTorch eager alone (convengine
never imported), ``ours`` is the same PyTorch program with its convs on convengine.
The parent drives both, one pass at a time, interleaved (torch, ours, torch, ...), and
keeps the median of each; both sides use ``--threads`` threads (2). Before each timed
pass the host idles ``--settle`` seconds (0.2): after a pass, each side's OpenMP
workers spin for milliseconds (GNU OpenMP's default policy, PyTorch's and
convengine's alike), and without the pause every pass would start against the other
process's spinning threads, which no user running one of the two ever sees
(measured 2026-12-01 on an EPYC Zen 4, FX-quantized ResNet-50 at batch 1: PyTorch
14-16 ms and convengine 14-15 ms a pass alone in a process, with 0-100 ms of idle
between passes; 22.9 and 23.5 ms alternating without the pause). Ratios are
``torch / ours`` (above 1: convengine is faster). Outputs of the two sides are
compared (max |difference| over max |torch|).

Modes (``--modes``):

- ``infer``: eval, ``torch.no_grad()``; ours is ``convengine.torch.replace_convs``.
- ``fused``: the same model through ``convengine.torch.optimize`` (BatchNorm folded,
  ReLU/ReLU6/residual add in the conv epilogue) against PyTorch eager.
- ``train``: one training step (forward, ``out.float().sum().backward()``) in train mode.
- ``sgd``: the same step followed by ``torch.optim.SGD``'s update (lr 1e-6), as a
  training loop runs it: the weights change on every step (not in the defaults).
- ``int8``: FX-quantized (x86 engine, per-channel weights), ours through
  ``convengine.torch.replace_quantized_convs``.
- ``numpy``: convengine alone (no torch in its process): every conv of the model in
  network order, channels-last float32, against the sum of the same layers each
  repeated alone.

    convengine bench --model resnet50,mobilenet_v2 --compare torch   # or:
    python bench/bench_models.py --models resnet50,mobilenet_v2 --batch 1,8 \\
        --formats cl,nchw --modes infer,fused,train,int8,numpy --json out.json

Needs the ``torch`` extra (the architectures are :mod:`convengine.bench.models`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------ worker side


def _models() -> Any:
    """:mod:`convengine.bench.models`, loaded by path: a worker runs this file as a script,
    so that the PyTorch side never imports convengine."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("convengine_models",
                                                  Path(__file__).with_name("models.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(model: str, batch: int, fmt: str, mode: str, side: str, threads: int) -> Any:
    """A callable running one pass of ``model`` on ``side``, and one returning the output."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = getattr(_models(), model)()
    for m in net.modules():  # non-trivial BatchNorm statistics, the same on both sides
        if isinstance(m, torch.nn.BatchNorm2d) and m.running_mean is not None:
            g = torch.Generator().manual_seed(m.num_features)
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            assert m.running_var is not None
            m.running_var.uniform_(0.5, 1.5, generator=g)
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    memory_format = torch.channels_last if fmt == "cl" else torch.contiguous_format
    if side == "ours":
        import convengine as ce

        ce.set_num_threads(threads)
    if mode == "int8":
        net = _quantized(net.eval(), x, memory_format)
        if side == "ours":
            import convengine.torch as cet

            net = cet.replace_quantized_convs(net)
    else:
        net = net.to(memory_format=memory_format)
        training = mode in ("train", "sgd")
        net.train(training)
        if not training:
            net.eval()
        if side == "ours":
            import convengine.torch as cet

            net = cet.optimize(net) if mode == "fused" else cet.replace_convs(net)
    x = x.contiguous(memory_format=memory_format)

    if mode in ("train", "sgd"):
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-6) if mode == "sgd" else None

        def step() -> Any:
            net.zero_grad(set_to_none=True)
            out = net(x)
            out.float().sum().backward()
            if optimizer is not None:
                optimizer.step()
            return out
    else:
        def step() -> Any:
            with torch.no_grad():
                return net(x)
    return step


def _quantized(net: Any, x: Any, memory_format: Any) -> Any:
    """FX post-training quantization with PyTorch's x86 engine (per-channel weights)."""
    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "x86"
    net = net.to(memory_format=memory_format)
    prepared = prepare_fx(net, get_default_qconfig_mapping("x86"), (x,))
    with torch.no_grad():
        for i in range(4):
            prepared(torch.randn(x.shape, generator=torch.Generator().manual_seed(10 + i))
                     .contiguous(memory_format=memory_format))
    return convert_fx(prepared)


def _numpy_layers(shapes: list[dict[str, Any]], threads: int, rounds: int) -> dict[str, float]:
    """convengine alone: the convs in network order, and each repeated alone.

    As in the network, a conv whose input has the shape of the previous conv's output
    reads that output (still in cache); the others (a block's first conv and its
    downsample) read an input made beforehand. Weights are scaled by
    ``1 / sqrt(C/g * prod(K))`` so that values keep their scale along the chain."""
    import numpy as np

    import convengine as ce

    ce.set_num_threads(threads)
    rng = np.random.default_rng(0)
    calls = []
    for s in shapes:
        n, c, h, w_ = s["x"]
        o, cg, kh, kw = s["w"]
        x = rng.standard_normal((n, h, w_, c)).astype(np.float32)
        w = (rng.standard_normal((o, kh, kw, cg)) / np.sqrt(cg * kh * kw)).astype(np.float32)
        kwargs = dict(stride=s["stride"], padding=s["padding"], dilation=s["dilation"],
                      groups=s["groups"], layout="NHWC")
        calls.append((x, w, kwargs))

    def network(inputs: list[Any] | None = None) -> None:
        """One pass (each conv's input appended to ``inputs`` if given; else each
        output is freed once the next conv has read it, as in the network)."""
        y = None
        for x, w, kw in calls:
            if y is not None and y.shape == x.shape:
                x = y
            if inputs is not None:
                inputs.append(x)
            y = ce.conv(x, w, **kw)

    network()  # compile and tune
    order = []
    for _ in range(rounds):
        t = time.perf_counter()
        network()
        order.append(time.perf_counter() - t)
    # every layer's input, kept for the layers alone (only after the passes in order:
    # a network does not hold all its activations at once)
    chained: list[Any] = []
    network(chained)
    alone = 0.0
    for x, (_, w, kw) in zip(chained, calls):
        times = []
        for _ in range(max(5, rounds)):
            t = time.perf_counter()
            ce.conv(x, w, **kw)
            times.append(time.perf_counter() - t)
        alone += statistics.median(times)
    return {"order": statistics.median(order), "alone": alone}


def worker(threads: int) -> None:
    """Serve commands (JSON lines on stdin): setup, run, save, numpy."""
    step = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "setup":
            t = time.perf_counter()
            step = _build(cmd["model"], cmd["batch"], cmd["format"], cmd["mode"], cmd["side"],
                          threads)
            step()  # first pass: compiles (and tunes)
            reply: Any = {"first": time.perf_counter() - t}
            step()
        elif op == "run":
            assert step is not None
            t = time.perf_counter()
            step()
            reply = {"seconds": time.perf_counter() - t}
        elif op == "save":
            assert step is not None
            import numpy as np

            out = step()
            if out.is_quantized:
                out = out.dequantize()
            np.save(cmd["path"], out.detach().float().contiguous().numpy())
            reply = {"saved": cmd["path"]}
        elif op == "numpy":
            reply = _numpy_layers(cmd["shapes"], threads, cmd["rounds"])
        else:
            raise ValueError(f"unknown op {op!r}")
        print(json.dumps(reply), flush=True)


# ------------------------------------------------------------------ parent side


class Side:
    """One worker process (a fresh interpreter, the user's environment)."""

    def __init__(self, name: str, threads: int) -> None:
        self.name = name
        # this file loaded by path, outside the package: the PyTorch side never
        # imports convengine (and the package's directory never lands on sys.path)
        boot = ("import importlib.util as u; s = u.spec_from_file_location('modelbench', "
                f"{__file__!r}); m = u.module_from_spec(s); s.loader.exec_module(m); "
                f"m.worker({threads})")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker died (command {cmd['op']})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def conv_shapes(model: str, batch: int) -> list[dict[str, Any]]:
    """Every conv the model runs, in network order (forward hooks on a meta run)."""
    import torch

    net = getattr(_models(), model)().eval()
    shapes: list[dict[str, Any]] = []

    def hook(m: Any, inputs: Any, _: Any) -> None:
        shapes.append({"x": list(inputs[0].shape), "w": list(m.weight.shape),
                       "stride": list(m.stride), "padding": list(m.padding),
                       "dilation": list(m.dilation), "groups": m.groups})

    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        net(torch.zeros(batch, 3, 224, 224))
    return shapes


MODES = ("infer", "fused", "train", "sgd", "int8", "numpy")


def _compare(a: Any, b: Any) -> float:
    import numpy as np

    return float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"--modes: unknown {unknown}; expected some of {', '.join(MODES)}")
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batch.split(",")):
            if "numpy" in modes:
                side = Side("numpy", args.threads)
                r = side.ask(op="numpy", shapes=conv_shapes(model, batch), rounds=args.rounds)
                side.close()
                rows.append({"model": model, "batch": batch, "mode": "numpy", "format": "cl",
                             "order_ms": r["order"] * 1e3, "alone_ms": r["alone"] * 1e3,
                             "ratio": r["alone"] / r["order"]})
                print(_line(rows[-1]), flush=True)
            for mode in (m for m in modes if m != "numpy"):
                for fmt in args.formats.split(","):
                    if mode == "int8" and fmt != args.formats.split(",")[0]:
                        continue  # quantized models run in one format
                    rows.append(_pair(model, batch, fmt, mode, args))
                    print(_line(rows[-1]), flush=True)
    return rows


def _pair(model: str, batch: int, fmt: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    sides = [Side("torch", args.threads), Side("ours", args.threads)]
    try:
        setup = {s.name: s.ask(op="setup", model=model, batch=batch, format=fmt, mode=mode,
                               side=s.name) for s in sides}
        times: dict[str, list[float]] = {"torch": [], "ours": []}
        for _ in range(args.rounds):
            for s in sides:
                time.sleep(args.settle)  # the other side's OpenMP workers stop spinning
                times[s.name].append(s.ask(op="run")["seconds"])
        with tempfile.TemporaryDirectory() as tmp:
            outs = {s.name: np.load(s.ask(op="save", path=f"{tmp}/{s.name}.npy")["saved"])
                    for s in sides}
    finally:
        for s in sides:
            s.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    per_round = [t / o for t, o in zip(times["torch"], times["ours"], strict=True)]
    return {"model": model, "batch": batch, "mode": mode, "format": fmt,
            "torch_ms": med["torch"] * 1e3, "ours_ms": med["ours"] * 1e3,
            "ratio": med["torch"] / med["ours"],
            "ratio_range": [min(per_round), max(per_round)],
            "torch_range_ms": [min(times["torch"]) * 1e3, max(times["torch"]) * 1e3],
            "ours_range_ms": [min(times["ours"]) * 1e3, max(times["ours"]) * 1e3],
            "first_pass_s": {k: v["first"] for k, v in setup.items()},
            "max_rel_diff": _compare(outs["torch"], outs["ours"])}


def _line(r: dict[str, Any]) -> str:
    head = f"{r['model']:<13} b{r['batch']:<2} {r['mode']:<6} {r['format']:<4}"
    if r["mode"] == "numpy":
        return (f"{head} network order {r['order_ms']:8.1f} ms, layers alone {r['alone_ms']:8.1f} ms,"
                f" order/alone {1 / r['ratio']:.2f}")
    return (f"{head} torch {r['torch_ms']:8.1f} ms  ours {r['ours_ms']:8.1f} ms  "
            f"torch/ours {r['ratio']:.2f} (rounds {r['ratio_range'][0]:.2f}-"
            f"{r['ratio_range'][1]:.2f})  diff {r['max_rel_diff']:.1e}  "
            f"first pass ours {r['first_pass_s']['ours']:.1f} s")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,mobilenet_v2")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--formats", default="cl,nchw", help="cl (channels_last) and/or nchw")
    p.add_argument("--modes", default="infer,fused,train,int8,numpy")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settle", type=float, default=0.2,
                   help="seconds of idle before each timed pass (see the module doc)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    started = datetime.now(timezone.utc)
    print(f"{started:%Y-%m-%d %H:%M} UTC, {_cpu()}, {os.cpu_count()} CPUs, "
          f"threads {args.threads}, rounds {args.rounds}", flush=True)
    rows = run(args)
    geo: dict[str, float] = {}
    for mode in {r["mode"] for r in rows}:
        ratios = [r["ratio"] for r in rows if r["mode"] == mode]
        geo[mode] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print("geometric means:", ", ".join(f"{k} {v:.2f}" for k, v in sorted(geo.items())))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"date": f"{started:%Y-%m-%d %H:%M} UTC", "cpu": _cpu(), "threads": args.threads,
             "rounds": args.rounds, "rows": rows, "geomean": geo}, indent=1) + "\n")


if __name__ == "__main__":
    main()
