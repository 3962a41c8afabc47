"""A soak run: convengine's PyTorch and ONNX entry points, over and over, in one process.

Looks for heap corruption (issue 44: glibc's "double free or corruption (!prev)" seen
after MobileNetV2's FX int8 passes in a benchmark worker). A rotating mix of
workloads, each built afresh every iteration (set-up and teardown are where a bad
free shows) and compared with a reference:

- ``float_<model>``: ``replace_convs`` inference against the same model in eager
  PyTorch (max |difference| / max |reference|);
- ``fused_<model>``: ``optimize`` (BatchNorm folded, epilogues fused) against eager;
- ``train_<model>``: one training step (forward, ``loss.backward()``; BatchNorm
  statistics frozen, no dropout) through ``replace_convs`` against the same step in float64: the
  output and the first conv's weight gradient (a gradient off by more, with the output
  within bounds, where a ReLU's input within float32's error of zero switched sign is
  reported as such, not as a mismatch: the step's own gradient jumps there);
- ``int8fx_<model>``: FX int8 (x86 engine, per-channel) through
  ``replace_quantized_convs`` against PyTorch's own quantized model: the fraction of
  outputs equal and the max difference;
- ``onnx_{fp32,qdq,qop}_<model>``: ``convengine.onnx.Session`` of the legacy export
  and its ``quantize_static`` QDQ / QOperator versions against ONNX Runtime;
- ``repro``: the README's sequence: MobileNetV2's FX int8 passes, then ResNet-50's
  training-step set-up and first step, in the same process;
- ``int8_exit``: MobileNetV2's FX int8 passes in a fresh interpreter that then exits
  normally (interpreter teardown frees everything; the exit status is checked).

``--threads-py N`` runs the rotation from N Python threads at once (torch.fx's
tracing patches ``nn.Module.__call__`` process-wide, so a thread tracing excludes the
others from running modules meanwhile: :class:`TraceLock`). Halfway through,
the workers pause and the process forks: the child runs one workload and exits with its
status, which the parent checks. Exactness is not the soak's job (the tests check
it); a mismatch is a result past ``--tol`` (float) or ``--int8-tol`` (int8, as a
fraction of max |reference|), which a corrupted buffer would give.

    python bench/soak.py --minutes 5 --size 64                    # in this process
    python bench/soak.py --supervise --minutes 35 --size 96       # glibc-checked child

``--supervise`` runs the soak in a child with ``MALLOC_CHECK_=3``,
``MALLOC_PERTURB_=165`` (with glibc's ``libc_malloc_debug.so.0`` preloaded where it
exists: since glibc 2.34 ``MALLOC_CHECK_`` is read only there), ``PYTHONMALLOC=malloc``
(glibc sees Python's own allocations), ``PYTHONFAULTHANDLER=1`` and ``LIBC_FATAL_STDERR_=1``, passing on
``CONVENGINE_CHECKED`` if set, and reports the child's exit status, its signal, any
glibc heap message and the last workload lines before it. Needs the torch and onnx
extras (onnxruntime for the int8 ONNX models and the references).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

MODELS = ("resnet50", "mobilenet_v2")
#: every workload, in rotation order
WORKLOADS = tuple(
    [f"{kind}_{m}" for kind in ("float", "fused", "train", "int8fx") for m in MODELS]
    + [f"onnx_{kind}_{m}" for kind in ("fp32", "qdq", "qop") for m in MODELS]
    + ["repro", "int8_exit"])
#: glibc's fatal heap messages (malloc.c's malloc_printerr strings)
GLIBC = re.compile(r"double free|corrupted|corruption|malloc\(\)|free\(\)|realloc\(\)|"
                   r"munmap_chunk|malloc_consolidate|Fatal Python error|Segmentation fault")


@dataclass
class Result:
    """One workload run: what it compared and whether that stayed within bounds."""

    ok: bool = True
    error: str = ""
    rel: float = 0.0  # max |ours - ref| / max |ref| over the outputs compared
    equal: float | None = None  # int8: fraction of outputs equal to the reference
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ the workloads


class TraceLock:
    """torch.fx traces (``prepare_fx``, ``convert_fx``, ``optimize``) by patching
    ``nn.Module.__call__`` for the whole process: while one thread traces, no other
    may run a module (else: "NameError: module is not installed as a submodule")."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._tracing = False
        self._waiting = 0  # tracers waiting: new runs wait behind them

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._cond:
            while self._tracing or self._waiting:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._tracing or self._running:
                self._cond.wait()
            self._waiting -= 1
            self._tracing = True
        try:
            yield
        finally:
            with self._cond:
                self._tracing = False
                self._cond.notify_all()


class Soak:
    """The workloads, their cached exports and references, and the tally."""

    def __init__(self, args: argparse.Namespace) -> None:
        import numpy as np
        import torch

        import convengine as ce

        self.args = args
        self.np, self.torch = np, torch
        for message in ("torch.ao.quantization is deprecated", "Please use quant_min"):
            warnings.filterwarnings("ignore", message=message)
        logging.getLogger().setLevel(logging.ERROR)  # quantize_static's pre-processing hint
        torch.set_num_threads(args.threads)
        ce.set_num_threads(args.threads)
        torch.backends.quantized.engine = "x86"
        self._lock = threading.Lock()  # the ONNX caches
        self._tally_lock = threading.Lock()
        self.fx = TraceLock()
        self._onnx: dict[tuple[str, str], tuple[bytes, Any]] = {}
        self.tally: dict[str, dict[str, Any]] = {}

    # -------------------------------------------------------------- helpers

    def _net(self, model: str, seed: int) -> Any:
        """``model`` with seeded weights and non-trivial BatchNorm statistics."""
        from convengine.bench import models

        torch = self.torch
        torch.manual_seed(seed)
        net = getattr(models, model)(width=self.args.width)
        g = torch.Generator().manual_seed(seed)
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
        return net

    def _input(self, seed: int, batch: int = 1) -> Any:
        s = self.args.size
        return self.torch.randn(batch, 3, s, s, generator=self.torch.Generator().manual_seed(seed))

    def _rel(self, ours: Any, ref: Any) -> float:
        np = self.np
        ours, ref = (np.asarray(a, dtype=np.float64) for a in (ours, ref))
        if ours.shape != ref.shape:
            raise ValueError(f"output shape {ours.shape}, reference {ref.shape}")
        if not np.isfinite(ours).all():
            return float("inf")
        return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))

    def _float_check(self, r: Result, ours: Any, ref: Any, what: str, tol: float) -> None:
        rel = self._rel(ours, ref)
        r.rel = max(r.rel, rel)
        if not rel <= tol:
            r.ok = False
            r.notes.append(f"{what} rel {rel:.1e} > {tol:.0e}")

    def _int8_check(self, r: Result, ours: Any, ref: Any) -> None:
        np = self.np
        ours, ref = np.asarray(ours), np.asarray(ref)
        r.rel = max(r.rel, self._rel(ours, ref))
        equal = float(np.mean(ours == ref))
        r.equal = equal if r.equal is None else min(r.equal, equal)
        if not r.rel <= self.args.int8_tol:
            r.ok = False
            r.notes.append(f"int8 rel {r.rel:.1e} > {self.args.int8_tol:.0e}")

    def _quantized(self, net: Any, x: Any, passes: int = 4) -> Any:
        """FX post-training quantization, x86 engine (as bench_models.py's worker)."""
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

        torch = self.torch
        with self.fx.tracing():
            prepared = prepare_fx(net.eval(), get_default_qconfig_mapping("x86"), (x,))
            with torch.no_grad():
                for i in range(passes):
                    prepared(torch.randn(x.shape,
                                         generator=torch.Generator().manual_seed(10 + i)))
            return convert_fx(prepared)

    # -------------------------------------------------------------- PyTorch programs

    def float_(self, model: str, seed: int) -> Result:
        import convengine.torch as cet

        torch, r = self.torch, Result()
        net = self._net(model, seed).eval()
        x = self._input(seed, 1 + seed % 2)
        with torch.no_grad(), self.fx.running():
            ref = net(x)
            ours = cet.replace_convs(net)(x)
        self._float_check(r, ours, ref, "output", self.args.tol)
        return r

    def fused(self, model: str, seed: int) -> Result:
        import convengine.torch as cet

        torch, r = self.torch, Result()
        net = self._net(model, seed).eval()
        x = self._input(seed, 1 + seed % 2)
        with torch.no_grad():
            with self.fx.running():
                ref = net(x)
            with self.fx.tracing():
                fast = cet.optimize(net)
            with self.fx.running():
                ours = fast(x)
        self._float_check(r, ours, ref, "output", self.args.tol)
        return r

    def train(self, model: str, seed: int) -> Result:
        """One training step (frozen BatchNorm statistics, no dropout) against the
        same step in float64: the output and the first conv's weight gradient. A
        mismatch: past ``--train-tol`` and past 10x eager float32's own error."""
        import convengine.torch as cet

        torch, r = self.torch, Result()
        ref_net = self._net(model, seed).train()
        for m in ref_net.modules():
            # train-mode BatchNorm over 2 images of a few pixels is ill-conditioned, and
            # dropout draws different masks in float64
            if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.Dropout)):
                m.eval()
        nets = (copy.deepcopy(ref_net).double(), ref_net,
                cet.replace_convs(copy.deepcopy(ref_net)))
        x = self._input(seed, 2)
        outs, grads, relu_inputs = [], [], []
        with self.fx.running():
            for n in nets:
                inputs: list[Any] = []
                hooks = [m.register_forward_pre_hook(
                    lambda _m, args, inputs=inputs: inputs.append(args[0].detach().clone()))
                    for m in n.modules() if isinstance(m, torch.nn.ReLU)]
                n.zero_grad(set_to_none=True)
                out = n(x.to(next(iter(n.parameters())).dtype))
                out.square().mean().backward()
                for hook in hooks:
                    hook.remove()
                outs.append(out.detach())
                grads.append(next(iter(n.parameters())).grad.detach().clone())  # first conv's
                relu_inputs.append(inputs)
        for what, (exact, eager, ours) in (("output", outs), ("conv1 grad", grads)):
            eager_rel = self._rel(eager, exact)
            self._float_check(r, ours, exact, f"{what} (eager float32 {eager_rel:.1e})",
                              max(self.args.train_tol, 10 * eager_rel))
        flips = self._sign_flips(relu_inputs[2], relu_inputs[0])
        if not r.ok and flips and r.notes[-1].startswith("conv1 grad") and len(r.notes) == 1:
            # the output agreed; a ReLU whose input sits within float32's error of zero
            # switched: the gradient of the step itself differs there, in eager float32 too
            # (seed 133: one flip at 1.2e-7, eager and ours both 7.8e-4 off)
            r.ok = True
            r.notes[-1] += f", explained by ReLU sign flips: {flips}"
        return r

    def _sign_flips(self, ours: list[Any], exact: list[Any]) -> str:
        """Where ReLU inputs (one array per call, in call order) of ours and the float64
        step have different signs: "call i: n at |input| <= v (max m)", or ""."""
        found = []
        for i, (a, b) in enumerate(zip(ours, exact, strict=True)):
            flipped = (a > 0) != (b > 0)
            if flipped.any():
                found.append(f"call {i}: {int(flipped.sum())} at |input| <= "
                             f"{float(b[flipped].abs().max()):.1e} (max {float(b.abs().max()):.1e})")
        return "; ".join(found)

    def int8fx(self, model: str, seed: int, passes: int = 3) -> Result:
        import convengine.torch as cet

        torch, r = self.torch, Result()
        x = self._input(seed)
        q = self._quantized(self._net(model, seed), x)
        with torch.no_grad(), self.fx.running():
            ref_net = copy.deepcopy(q)
            ours = cet.replace_quantized_convs(q)
            for i in range(passes):
                xi = self._input(seed + 100 * i)
                self._int8_check(r, ours(xi), ref_net(xi))
        return r

    def repro(self, seed: int) -> Result:
        """MobileNetV2's FX int8 passes, then ResNet-50's training-step set-up."""
        import convengine.torch as cet

        r = self.int8fx("mobilenet_v2", seed, passes=5)
        net = self._net("resnet50", seed).train()
        ref_net = copy.deepcopy(net)
        cet.replace_convs(net)
        x = self._input(seed)
        outs = []
        with self.fx.running():
            for n in (ref_net, net):
                self.torch.manual_seed(seed)
                out = n(x)
                out.float().sum().backward()
                outs.append(out.detach())
        # train-mode BatchNorm (as bench_models.py's step): 10x the looser bound
        self._float_check(r, outs[1], outs[0], "resnet50 train output", 10 * self.args.train_tol)
        return r

    def int8_exit(self, seed: int) -> Result:
        """MobileNetV2's FX int8 passes in a fresh interpreter that exits normally."""
        cmd = [sys.executable, os.path.abspath(__file__), "--workloads", "int8fx_mobilenet_v2",
               "--iterations", "1", "--no-fork", "--threads-py", "1", "--quiet",
               "--size", str(self.args.size), "--width", str(self.args.width),
               "--threads", str(self.args.threads), "--seed", str(seed)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        r = Result()
        heap = [ln for ln in proc.stderr.splitlines() if GLIBC.search(ln)]
        if proc.returncode != 0 or heap:
            r.ok = False
            r.error = (f"child exit {_status(proc.returncode)}; "
                       + "; ".join(heap[:3] or proc.stderr.strip().splitlines()[-3:]))
        return r

    # -------------------------------------------------------------- ONNX sessions

    def _onnx_model(self, model: str, kind: str) -> tuple[bytes, Any]:
        """The model's ONNX bytes (exported once) and an ONNX Runtime session of them."""
        with self._lock:
            if (model, kind) not in self._onnx:
                import onnxruntime as ort

                from convengine.bench import models
                from convengine.bench import onnx_models as om

                shape = (1, 3, self.args.size, self.args.size)
                net = models.randomized(self._net(model, 0))
                with self.fx.tracing():
                    data = om.export(net, shape, dynamo=False)
                if kind != "fp32":
                    data = om.quantize(data, shape, qdq=kind == "qdq", per_channel=True,
                                       samples=2)
                options = ort.SessionOptions()
                options.intra_op_num_threads = self.args.threads
                options.log_severity_level = 3
                self._onnx[model, kind] = (data, ort.InferenceSession(
                    data, options, providers=["CPUExecutionProvider"]))
            return self._onnx[model, kind]

    def onnx(self, kind: str, model: str, seed: int) -> Result:
        import convengine.onnx as ceo

        r = Result()
        data, ort_session = self._onnx_model(model, kind)
        session = ceo.Session(data, threads=self.args.threads)
        for i in range(2):
            feed = {"input": self._input(seed + 100 * i, 1 + i).numpy()}
            ours, ref = session.run(None, feed)[0], ort_session.run(None, feed)[0]
            if kind == "fp32":
                self._float_check(r, ours, ref, "output", self.args.tol)
            else:
                self._int8_check(r, ours, ref)
        return r

    # -------------------------------------------------------------- dispatch

    def run(self, name: str, seed: int) -> Result:
        if name == "repro":
            return self.repro(seed)
        if name == "int8_exit":
            return self.int8_exit(seed)
        head, model = name.rsplit("_", 1) if not name.endswith("mobilenet_v2") else (
            name[: -len("_mobilenet_v2")], "mobilenet_v2")
        if head.startswith("onnx_"):
            return self.onnx(head[len("onnx_"):], model, seed)
        fn: Callable[[str, int], Result] = {"float": self.float_, "fused": self.fused,
                                            "train": self.train, "int8fx": self.int8fx}[head]
        return fn(model, seed)

    def record(self, name: str, r: Result, seconds: float) -> None:
        with self._tally_lock:
            t = self.tally.setdefault(name, {"runs": 0, "errors": 0, "mismatches": 0,
                                             "max_rel": 0.0, "min_equal": None, "seconds": 0.0})
            t["runs"] += 1
            t["seconds"] += seconds
            if r.error:
                t["errors"] += 1
            elif not r.ok:
                t["mismatches"] += 1
            t["max_rel"] = max(t["max_rel"], r.rel)
            if r.equal is not None:
                t["min_equal"] = r.equal if t["min_equal"] is None else min(t["min_equal"],
                                                                            r.equal)


def _status(rc: int) -> str:
    if rc < 0:
        return f"signal {signal.Signals(-rc).name}"
    return str(rc)


def _line(it: int, start: float, thread: str, name: str, r: Result, seconds: float) -> str:
    state = "ERROR" if r.error else ("ok" if r.ok else "MISMATCH")
    eq = "" if r.equal is None else f" equal {r.equal:.4f}"
    extra = f" {r.error}" if r.error else ("" if not r.notes else " " + "; ".join(r.notes))
    return (f"[it {it:5d} t={time.monotonic() - start:7.1f}s {thread}] {name:<22} {state:<8} "
            f"rel {r.rel:.1e}{eq} {seconds:6.1f}s{extra}")


# ------------------------------------------------------------------ the soak loop


def soak(args: argparse.Namespace) -> int:
    """Run the rotation until the deadline or the iteration count; 0 if all went well."""
    names = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"--workloads: unknown {unknown}; expected some of "
                         f"{', '.join(WORKLOADS)}")
    s = Soak(args)
    start = time.monotonic()
    deadline = start + 60 * args.minutes if args.minutes else None
    limit = args.iterations
    cond = threading.Condition()
    state = {"next": 0, "busy": 0, "paused": False, "fork_done": args.no_fork}
    fork_result: dict[str, Any] = {}

    def out(line: str) -> None:
        if not args.quiet:
            print(line, flush=True)

    def worker(k: int) -> None:
        while True:
            with cond:
                while state["paused"]:
                    cond.wait()
                if (deadline is not None and time.monotonic() >= deadline) or (
                        limit is not None and state["next"] >= limit):
                    return
                it = state["next"]
                state["next"] += 1
                state["busy"] += 1
            name = names[it % len(names)]
            t = time.perf_counter()
            try:
                r = s.run(name, args.seed + it)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                r = Result(ok=False, error=f"{type(exc).__name__}: {exc}")
                out("".join(traceback.format_exception(exc)).rstrip())
            seconds = time.perf_counter() - t
            s.record(name, r, seconds)
            out(_line(it, start, f"py{k}", name, r, seconds))
            with cond:
                state["busy"] -= 1
                cond.notify_all()

    def fork_now() -> None:
        """Pause the workers, fork; the child runs one workload and exits with 0 / 1."""
        with cond:
            state["paused"] = True
            while state["busy"]:
                cond.wait()
        name = args.fork_workload
        pid = os.fork()
        if pid == 0:  # the child: one workload, then out without teardown
            code = 1
            try:
                s.torch.set_num_threads(1)  # the parent's OpenMP team did not fork
                t = time.perf_counter()
                r = s.run(name, args.seed + 7919)
                out(_line(-1, start, "fork", name, r, time.perf_counter() - t))
                code = 0 if r.ok and not r.error else 1
            except BaseException:  # noqa: BLE001 - the exit status says it
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        t = time.monotonic()
        status = None
        while time.monotonic() - t < args.fork_timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        code = None if status is None else os.waitstatus_to_exitcode(status)
        fork_result.update(workload=name, exit=("hung, killed" if code is None
                                                else _status(code)))
        out(f"[fork] child ran {name}: exit {fork_result['exit']}")
        with cond:
            state["paused"] = False
            state["fork_done"] = True
            cond.notify_all()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True)
               for k in range(args.threads_py)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        if not state["fork_done"]:
            half = ((deadline is not None and time.monotonic() >= (start + deadline) / 2)
                    or (limit is not None and state["next"] >= limit // 2))
            if half:
                fork_now()
        time.sleep(0.2)
    for th in threads:
        th.join()

    minutes = (time.monotonic() - start) / 60
    errors = sum(t["errors"] for t in s.tally.values())
    mismatches = sum(t["mismatches"] for t in s.tally.values())
    fork_ok = not fork_result or fork_result["exit"] == "0"
    summary = {"minutes": round(minutes, 2), "iterations": sum(t["runs"] for t in s.tally.values()),
               "errors": errors, "mismatches": mismatches, "fork": fork_result or None,
               "size": args.size, "width": args.width, "threads_py": args.threads_py,
               "threads": args.threads, "workloads": s.tally}
    if not args.quiet:
        print(f"\nsummary: {minutes:.1f} min, {summary['iterations']} iterations, "
              f"{errors} errors, {mismatches} mismatches, fork "
              f"{fork_result.get('exit', 'not run')}")
        print(f"{'workload':<22} {'runs':>5} {'err':>4} {'mism':>5} {'max rel':>8} "
              f"{'min equal':>9} {'s/run':>6}")
        for name in names:
            t = s.tally.get(name)
            if t is None:
                continue
            eq = "" if t["min_equal"] is None else f"{t['min_equal']:.4f}"
            print(f"{name:<22} {t['runs']:>5} {t['errors']:>4} {t['mismatches']:>5} "
                  f"{t['max_rel']:>8.1e} {eq:>9} {t['seconds'] / t['runs']:>6.1f}")
        print("SUMMARY " + json.dumps(summary), flush=True)
    return 0 if errors == 0 and mismatches == 0 and fork_ok else 1


# ------------------------------------------------------------------ the supervisor

CHECK_ENV = {"MALLOC_CHECK_": "3", "MALLOC_PERTURB_": "165", "PYTHONMALLOC": "malloc",
             "PYTHONFAULTHANDLER": "1", "LIBC_FATAL_STDERR_": "1"}
#: glibc's malloc debugging library (MALLOC_CHECK_ moved there in glibc 2.34)
MALLOC_DEBUG = "/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"


def supervise(argv: list[str], report: str | None, cmd: list[str] | None = None) -> int:
    """Run the soak (``argv`` without ``--supervise``; or ``cmd``) in a glibc-checked
    child."""
    env = dict(os.environ, **CHECK_ENV)  # CONVENGINE_CHECKED passes through as set
    if os.path.exists(MALLOC_DEBUG):  # glibc >= 2.34 reads MALLOC_CHECK_ only with it
        env["LD_PRELOAD"] = " ".join(filter(None, [MALLOC_DEBUG, env.get("LD_PRELOAD")]))
    cmd = cmd or [sys.executable, "-u", os.path.abspath(__file__), *argv]
    shown = {k: env[k] for k in (*CHECK_ENV, "LD_PRELOAD", "CONVENGINE_CHECKED") if k in env}
    print(f"supervising: {' '.join(f'{k}={v}' for k, v in shown.items())} {' '.join(cmd)}",
          flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", bufsize=1)
    assert proc.stdout is not None
    last: collections.deque[str] = collections.deque(maxlen=12)
    heap: list[str] = []
    summary = None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.startswith("[it ") or line.startswith("[fork]"):
            last.append(line.rstrip())
        elif line.startswith("SUMMARY "):
            summary = json.loads(line[len("SUMMARY "):])
        if GLIBC.search(line):
            heap.append(line.rstrip())
    rc = proc.wait()
    result = {"exit": _status(rc), "signal": signal.Signals(-rc).name if rc < 0 else None,
              "minutes": round((time.monotonic() - start) / 60, 2), "heap_messages": heap,
              "last_lines": list(last), "summary": summary,
              "env": {k: env[k] for k in (*CHECK_ENV, "LD_PRELOAD", "CONVENGINE_CHECKED")
                      if k in env}}
    print("\n--- supervisor ---")
    print(f"child exit {result['exit']}, {result['minutes']} min; heap messages: "
          f"{len(heap)}{'' if not heap else ': ' + ' | '.join(heap[:5])}")
    if rc != 0 or summary is None:
        print("last workload lines before the end:")
        for ln in last:
            print("  " + ln)
    if summary is not None:
        print(f"child summary: {summary['iterations']} iterations, {summary['errors']} errors, "
              f"{summary['mismatches']} mismatches, fork {summary['fork']}")
    if report:
        with open(report, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0 if rc == 0 and not heap and summary is not None else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=None, help="soak this long")
    p.add_argument("--iterations", type=int, default=None, help="or this many workload runs")
    p.add_argument("--size", type=int, default=96, help="input height and width (224: ImageNet)")
    p.add_argument("--width", type=float, default=1.0, help="channel width factor of the models")
    p.add_argument("--workloads", default="", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--threads-py", type=int, default=2, help="Python threads running workloads")
    p.add_argument("--threads", type=int, default=2, help="convengine's and torch's threads")
    p.add_argument("--tol", type=float, default=1e-4, help="float outputs: max rel difference")
    p.add_argument("--train-tol", type=float, default=1e-3,
                   help="training steps (output, first conv's gradient, against float64): "
                        "the least bound (see Soak.train)")
    p.add_argument("--int8-tol", type=float, default=0.1,
                   help="int8 outputs: max |difference| / max |reference|")
    p.add_argument("--fork-workload", default="int8fx_mobilenet_v2", choices=WORKLOADS)
    p.add_argument("--fork-timeout", type=float, default=900.0)
    p.add_argument("--no-fork", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no output; the exit status says it")
    p.add_argument("--supervise", action="store_true",
                   help="run the soak in a glibc-checked child and report on it")
    p.add_argument("--report", default=None, help="--supervise: write the report (JSON) here")
    args = p.parse_args(argv)
    if args.minutes is None and args.iterations is None:
        p.error("give --minutes or --iterations")
    for name in ("size", "threads_py", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.supervise:
        child = [a for a in argv if a != "--supervise"]
        if args.report:
            i = child.index("--report") if "--report" in child else None
            child = (child[:i] + child[i + 2:]) if i is not None else [
                a for a in child if not a.startswith("--report=")]
        return supervise(child, args.report)
    return soak(args)


if __name__ == "__main__":
    sys.exit(main())
