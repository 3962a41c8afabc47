"""convengine.onnx.Session side by side with ONNX Runtime (CPU, default configuration,
``threads`` intra-op threads) on torchvision's ResNet-50 and MobileNetV2 at 224x224:
float (legacy exporter) and quantize_static int8 (QOperator and QDQ, per channel).

    python bench/bench_onnx.py                       # the full table (minutes)
    python bench/bench_onnx.py --models resnet50 --batches 1 --kinds float --rounds 3
    python bench/bench_onnx.py --memory              # peak RSS over batch-8 ResNet-50 runs

Each runtime serves its session in a process of its own (as a user runs one of
them), fed commands over a pipe; times are medians of interleaved rounds (one call of
each runtime per round, after a warm-up call); the ratio is ONNX Runtime's time over
convengine's (> 1: convengine is faster), with the lowest and highest of the rounds'
own ratios beside it (how much the host moved). In one process ONNX Runtime's
worker threads, which spin after each of its runs, stalled convengine's next parallel
steps by 4-6 ms each (MobileNetV2 batch 1: 13.4 ms against 4.5 with their spinning
off). Each timed call starts ``--settle`` seconds (default 0.2) after the previous
one, so that neither runtime's spinning threads share the cores with the other's
call; ``--settle 0`` measures back to back. ``--burst N`` makes each timed turn N
calls back to back after the settle, timed by their median: the steady state of a
busy server, where ``--burst 1`` (the default) is a call after an idle spell, which
a GNU OpenMP pool pays in its first parallel region (docs/interop.md). The "host
busy" column is the share of the host's CPU time that other processes used during
the timed rounds: figures taken while it is high are not comparable; ``--max-busy``
drops (and replaces, up to ``--patience`` times the rounds) rounds above a share, and
"rounds kept" says how many were kept of how many run. Outputs are checked against
ONNX Runtime's before timing. Needs the torch and onnx extras.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np


def _export_child(name: str, kind: str, batch: int, path: str) -> None:
    """In a child process: write the model's ONNX bytes to ``path``."""
    import torch

    from convengine.bench import models
    from convengine.bench import onnx_models as om

    torch.manual_seed(0)
    model = models.randomized(om.MODELS[name](1.0))
    data = om.export(model, (batch, 3, 224, 224), dynamo=False)
    if kind != "float":
        data = om.quantize(data, (1, 3, 224, 224), qdq=kind == "qdq", per_channel=True,
                           samples=2)
    with open(path, "wb") as f:
        f.write(data)


def _model_bytes(name: str, kind: str, batch: int) -> bytes:
    """The model, exported and quantized in a child process: the timing process never
    imports torch (whose OpenMP pool, and the torch.mm path of convengine's GEMMs, would
    then spin next to both runtimes)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        subprocess.run([sys.executable, __file__, "--export-child", name, kind, str(batch),
                        path], check=True, capture_output=True)
        with open(path, "rb") as f:
            return f.read()


def _serve_child(runtime: str, path: str, batch: int, threads: int, out: str) -> None:
    """In a child process: build ``runtime``'s session of the model at ``path``, save
    its output for the seeded input to ``out`` (.npy), say "ready", then answer each
    line ``run N`` on stdin with the median seconds of N calls back to back."""
    with open(path, "rb") as f:
        data = f.read()
    if runtime == "convengine":
        import convengine.onnx as ceo

        session = ceo.Session(data, threads=threads)
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3  # errors only: not the unused-initializer warnings
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    feed = {"input": np.random.default_rng(0).standard_normal(
        (batch, 3, 224, 224)).astype(np.float32)}
    np.save(out, session.run(None, feed)[0])
    print("ready", flush=True)
    for line in sys.stdin:  # "run N": N calls back to back, their median
        times = []
        for _ in range(int(line.split()[1])):
            start = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - start)
        print(float(np.median(times)), flush=True)


class _Child:
    """A runtime's session in a child process (:func:`_serve_child`)."""

    def __init__(self, runtime: str, path: str, batch: int, threads: int, out: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-child", runtime, path, str(batch),
             str(threads), out], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {runtime} child failed (exit {self.proc.wait()})")

    def call(self, burst: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"run {burst}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def ticks(self) -> int:
        """The child's CPU time so far, in clock ticks (/proc/<pid>/stat)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole host since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def _own_ticks() -> float:
    t = os.times()
    return (t.user + t.system) * os.sysconf("SC_CLK_TCK")


def _round(settle: float, burst: int, ours: _Child, theirs: _Child
           ) -> tuple[float, float, float]:
    """One burst of each runtime: (convengine s, ONNX Runtime s: each its burst's
    median, the share of the host's CPU time other processes took meanwhile)."""
    def own() -> float:
        return _own_ticks() + ours.ticks() + theirs.ticks()

    busy0, total0, own0 = *_cpu_ticks(), own()
    time.sleep(settle)
    mine = ours.call(burst)
    time.sleep(settle)
    theirs_s = theirs.call(burst)
    busy1, total1, own1 = *_cpu_ticks(), own()
    others = max(0.0, (busy1 - busy0) - (own1 - own0)) / max(1, total1 - total0)
    return mine, theirs_s, others


def bench(name: str, kind: str, batch: int, rounds: int, threads: int, settle: float,
          max_busy: float, patience: int, burst: int = 1) -> dict:
    """Rounds whose host-busy share exceeds ``max_busy`` are dropped and replaced, up
    to ``patience * rounds`` attempts (both runtimes' calls of a round go together)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        with open(path, "wb") as f:
            f.write(_model_bytes(name, kind, batch))
        outs = [os.path.join(tmp, f"{r}.npy") for r in ("convengine", "onnxruntime")]
        ours = _Child("convengine", path, batch, threads, outs[0])
        theirs = _Child("onnxruntime", path, batch, threads, outs[1])
        got, expected = np.load(outs[0]), np.load(outs[1])
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    kept, tried = [], 0
    try:
        while len(kept) < rounds and tried < patience * rounds:
            tried += 1
            r = _round(settle, burst, ours, theirs)
            if r[2] <= max_busy:
                kept.append(r)
    finally:
        ours.close()
        theirs.close()
    used = kept or [r]
    mine = float(np.median([r[0] for r in used]))
    ort_ = float(np.median([r[1] for r in used]))
    per_round = [r[1] / r[0] for r in used]
    return {"model": name, "kind": kind, "batch": batch, "convengine_ms": mine * 1e3,
            "onnxruntime_ms": ort_ * 1e3, "speedup": ort_ / mine,
            "speedup_range": (min(per_round), max(per_round)), "max_err": err,
            "host_busy": float(np.mean([r[2] for r in used])),
            "rounds": f"{len(kept)}/{tried}"}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_child(runtime: str, threads: int) -> None:
    """In a fresh process holding only ``runtime``'s session: the RSS after building
    the session and the peak RSS over two batch-8 ResNet-50 runs (MiB)."""
    data = _model_bytes("resnet50", "float", 8)
    if runtime == "convengine":
        import convengine.onnx as ceo

        session = ceo.Session(data, threads=threads)
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    del data
    x = np.random.default_rng(0).standard_normal((8, 3, 224, 224)).astype(np.float32)
    built = _rss_mib()
    for _ in range(2):
        session.run(None, {"input": x})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{built:.1f} {peak:.1f}")


def memory(threads: int) -> None:
    for runtime in ("onnxruntime", "convengine"):
        out = subprocess.run([sys.executable, __file__, "--peak-child", runtime,
                              "--threads", str(threads)], capture_output=True, text=True,
                             check=True).stdout.split()
        print(f"{runtime:12s} peak RSS {out[-1]} MiB (after building the session: "
              f"{out[-2]} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2")
    parser.add_argument("--kinds", default="float,qoperator,qdq")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--settle", type=float, default=0.2,
                        help="seconds of idle before each timed call (0: back to back)")
    parser.add_argument("--burst", type=int, default=1,
                        help="calls back to back after each settle, timed by their median "
                             "(1: a call after an idle host, as a server between requests; "
                             "more: the steady state of a busy one)")
    parser.add_argument("--max-busy", type=float, default=1.0,
                        help="drop rounds in which other processes took more than this share "
                             "of the host's CPU time (1.0: keep every round)")
    parser.add_argument("--patience", type=int, default=5,
                        help="at most this many times --rounds attempts to fill the rounds")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--peak-child", choices=["convengine", "onnxruntime"])
    parser.add_argument("--export-child", nargs=4, metavar=("MODEL", "KIND", "BATCH", "PATH"))
    parser.add_argument("--serve-child", nargs=5,
                        metavar=("RUNTIME", "PATH", "BATCH", "THREADS", "OUT"))
    args = parser.parse_args()
    if args.serve_child:
        runtime, path, batch, threads, out = args.serve_child
        _serve_child(runtime, path, int(batch), int(threads), out)
        return
    if args.export_child:
        name, kind, batch, path = args.export_child
        _export_child(name, kind, int(batch), path)
        return
    if args.peak_child:
        _peak_child(args.peak_child, args.threads)
        return
    if args.memory:
        memory(args.threads)
        return
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or ''}"
          f"{os.cpu_count()} CPUs visible, {args.threads} threads, {args.rounds} rounds, "
          f"{args.settle} s settle, {args.burst} call(s) per burst (median), rounds with "
          f"host busy <= {args.max_busy:.0%}")
    print("| model | kind | batch | convengine ms | ONNX Runtime ms | ORT / convengine | "
          "its range over the rounds | max err / max | host busy | rounds kept |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for kind in args.kinds.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                r = bench(name, kind, batch, args.rounds, args.threads, args.settle,
                          args.max_busy, args.patience, args.burst)
                print(f"| {r['model']} | {r['kind']} | {r['batch']} | {r['convengine_ms']:.1f} | "
                      f"{r['onnxruntime_ms']:.1f} | {r['speedup']:.2f} | "
                      f"{r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f} | {r['max_err']:.1e} | "
                      f"{r['host_busy']:.0%} | {r['rounds']} |", flush=True)


if __name__ == "__main__":
    main()
