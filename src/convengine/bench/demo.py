"""``convengine demo``: train a small CNN on scikit-learn's digits, quantize it, serve it.

Every convolution (forward, backward-data, backward-weight) goes through convengine;
the rest (ReLU, 2x2 max-pool, linear layer, softmax cross-entropy, Adam) is plain
numpy. The trained model is quantized (per-channel int8 weights, uint8 activations
calibrated on the training set) and the test set runs through :func:`convengine.qconv`
with bias, ReLU and requantization fused. Writes ``demo.png`` (loss curve, test digits
with their float and int8 predictions, run time per layer by algorithm) and
``demo.json`` (the figures, the test set's indices into ``load_digits()`` and both
models' predictions) to ``--out``. Needs the ``demo`` extra.

It says what it does as it goes (``say``, one line each): loading the data, each
kernel numba compiles (with empty caches most of the first minute), a bar per epoch.
The first call of each layer's pass at each shape compiles its kernels, or loads them
from the cache: its time is reported apart ("first call (compile)"), never as the
layer's run time.

Model, NHWC throughout: x (N, 8, 8, 1) -> conv 3x3 (8) -> ReLU -> conv 3x3 (16) ->
ReLU -> max-pool 2x2 -> (N, 4, 4, 16) -> linear (10).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numba.core import event

from .. import api, quant
from ..tune import set_tuning

LAYOUT = "NHWC"
CONV: dict[str, Any] = {"padding": 1, "layout": LAYOUT}
CHANNELS = (8, 16)
BATCH = 32


@dataclass
class DemoResult:
    """What one run measured; ``files``: the paths written.

    Per layer, pass and algorithm (``"train: conv1 forward [winograd4]"``):
    ``layer_seconds`` the run time of the steady calls (every call but the first at
    each shape), ``layer_calls`` their count, ``first_call_seconds`` the first calls
    (compiling or loading kernels, tuning). ``compile_seconds``: numba's compilations
    during the run (``compiled`` kernels); ``seconds``: the whole run.
    """

    epochs: int
    seed: int
    trainer: str
    losses: list[float]
    float_accuracy: float
    int8_accuracy: float
    float_seconds: float
    int8_seconds: float
    layer_seconds: dict[str, float] = field(default_factory=dict)
    layer_calls: dict[str, int] = field(default_factory=dict)
    first_call_seconds: dict[str, float] = field(default_factory=dict)
    compile_seconds: float = 0.0
    compiled: int = 0
    seconds: float = 0.0
    test_indices: list[int] = field(default_factory=list)
    float_predictions: list[int] = field(default_factory=list)
    int8_predictions: list[int] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def int8_speedup(self) -> float:
        """Float time / int8 time on the test set (above 1: int8 faster)."""
        return self.float_seconds / self.int8_seconds


def say(text: str) -> None:
    """One line to stderr, now, above any progress bar."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr)


class _CompileWatch(event.Listener):
    """numba's compilations while installed (outermost per thread): says each one as it
    starts and adds up their seconds."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.seconds, self.count = say, 0.0, 0
        self._local = threading.local()

    def on_start(self, ev: Any) -> None:
        starts = self._local.__dict__.setdefault("starts", [])
        if not starts:
            fn = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
            tag = getattr(fn, "__globals__", {}).get("__kernel_tag__")
            name = getattr(fn, "__qualname__", "a kernel")
            self.say(f"  compiling {name}" + (f" ({tag})" if tag else "") + " ...")
        starts.append(time.perf_counter())

    def on_end(self, ev: Any) -> None:
        starts = self._local.__dict__.get("starts")
        if not starts:
            return
        elapsed = time.perf_counter() - starts.pop()
        if not starts:
            self.seconds += elapsed
            self.count += 1

    @contextmanager
    def installed(self) -> Iterator[_CompileWatch]:
        with event.install_listener("numba:compile", self):
            yield self


class _Timer:
    """Seconds per (layer, pass, algorithm): the first call at each shape (it compiles
    or loads the kernels, or tunes) apart from the steady calls."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.first: dict[str, float] = defaultdict(float)
        self._algo: dict[tuple, str] = {}
        self._say = say

    def record(self, key: tuple, name: str, elapsed: float) -> None:
        """Counts one call of ``name`` (shape ``key``) that took ``elapsed`` seconds."""
        if key in self._algo:
            self.seconds[name] += elapsed
            self.calls[name] += 1
            return
        self._algo[key] = name
        self.first[name] += elapsed
        if self._say is not None and elapsed > 0.5:
            self._say(f"  first call of {name}: {elapsed:.1f} s")

    def call(self, label: str, pass_: str, fn: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        elapsed = time.perf_counter() - start
        key = (label, pass_, *(a.shape for a in args[:2]))
        name = self._algo.get(key)
        if name is None:  # asked after the call, which may have tuned it
            name = f"{label} {pass_} [{api.explain(*args, pass_=pass_, **kwargs).chosen}]"
        self.record(key, name, elapsed)
        return out


def _data(seed: int) -> tuple[np.ndarray, ...]:
    """Digits scaled to [0, 1], NHWC (N, 8, 8, 1); a fixed-seed 80/20 split: x_train,
    y_train, x_test, y_test and the test set's indices into ``load_digits()``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]], order[cut:]


def _init(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-initialised parameters; conv weights (O, 3, 3, C) as NHWC wants."""
    c1, c2 = CHANNELS

    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {"w1": he((c1, 3, 3, 1), 9), "b1": np.zeros(c1, np.float32),
            "w2": he((c2, 3, 3, c1), 9 * c1), "b2": np.zeros(c2, np.float32),
            "w3": he((16 * c2, 10), 16 * c2), "b3": np.zeros(10, np.float32)}


def _pool(a: np.ndarray) -> np.ndarray:
    n, h, w, c = a.shape
    return a.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def _forward(p: dict[str, np.ndarray], x: np.ndarray, timer: _Timer) -> tuple[np.ndarray, dict]:
    z1 = timer.call("conv1", "forward", api.conv, x, p["w1"], p["b1"], **CONV)
    a1 = np.maximum(z1, 0)
    z2 = timer.call("conv2", "forward", api.conv, a1, p["w2"], p["b2"], **CONV)
    a2 = np.maximum(z2, 0)
    pooled = _pool(a2)
    logits = pooled.reshape(len(x), -1) @ p["w3"] + p["b3"]
    return logits, {"x": x, "a1": a1, "a2": a2, "pooled": pooled}


def _loss_and_grads(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, timer: _Timer
                    ) -> tuple[float, dict[str, np.ndarray]]:
    logits, s = _forward(p, x, timer)
    shifted = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(shifted)
    prob /= prob.sum(axis=1, keepdims=True)
    n = len(x)
    loss = float(-np.log(prob[np.arange(n), y] + 1e-12).mean())
    dlogits = prob
    dlogits[np.arange(n), y] -= 1
    dlogits /= n
    flat = s["pooled"].reshape(n, -1)
    g = {"w3": flat.T @ dlogits, "b3": dlogits.sum(axis=0)}
    dpooled = (dlogits @ p["w3"].T).reshape(s["pooled"].shape)
    a2 = s["a2"]
    up = np.repeat(np.repeat(s["pooled"], 2, axis=1), 2, axis=2)
    winners = a2 == up  # ties share the gradient's route, as a max-pool mask
    dz2 = np.repeat(np.repeat(dpooled, 2, axis=1), 2, axis=2) * winners * (a2 > 0)
    g["w2"] = timer.call("conv2", "backward_weight", api.conv_backward_weight,
                         s["a1"], dz2, p["w2"].shape, **CONV)
    g["b2"] = dz2.sum(axis=(0, 1, 2))
    da1 = timer.call("conv2", "backward_data", api.conv_backward_data,
                     dz2, p["w2"], s["a1"].shape, **CONV)
    dz1 = da1 * (s["a1"] > 0)
    g["w1"] = timer.call("conv1", "backward_weight", api.conv_backward_weight,
                         x, dz1, p["w1"].shape, **CONV)
    g["b1"] = dz1.sum(axis=(0, 1, 2))
    return loss, g


def _train(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, epochs: int,
           rng: np.random.Generator, timer: _Timer, progress: bool,
           say: Callable[[str], None]) -> list[float]:
    """Adam (lr 0.01), batches of 32; the mean loss of each epoch."""
    from tqdm import tqdm

    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    lr, beta1, beta2, step = 0.01, 0.9, 0.999, 0
    losses = []
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        batches = range(0, len(x), BATCH)
        total, start_s = 0.0, time.perf_counter()
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{epochs}", disable=not progress,
                   leave=False, file=sys.stderr)
        for start in bar:
            idx = order[start:start + BATCH]
            loss, g = _loss_and_grads(p, x[idx], y[idx], timer)
            total += loss * len(idx)
            step += 1
            for k in p:
                m[k] = beta1 * m[k] + (1 - beta1) * g[k]
                v[k] = beta2 * v[k] + (1 - beta2) * g[k] ** 2
                mhat = m[k] / (1 - beta1 ** step)
                vhat = v[k] / (1 - beta2 ** step)
                p[k] -= (lr * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)
            bar.set_postfix(loss=f"{loss:.3f}")
        losses.append(total / len(x))
        say(f"epoch {epoch + 1}/{epochs}: loss {losses[-1]:.3f} "
            f"({time.perf_counter() - start_s:.1f} s)")
    return losses


@dataclass
class _QuantModel:
    """uint8 activations (scale, zero point 0 after ReLU), int8 per-channel weights."""

    x_scale: float
    layers: list[dict[str, Any]]
    w3: np.ndarray
    b3: np.ndarray


def _quantize(p: dict[str, np.ndarray], x_calib: np.ndarray, timer: _Timer) -> _QuantModel:
    """Per-channel symmetric int8 weights; activation scales from the calibration
    set's maxima (after ReLU the zero point is 0)."""
    _, s = _forward(p, x_calib, timer)
    x_scale = float(x_calib.max()) / 255
    layers = []
    for w, b, act in ((p["w1"], p["b1"], s["a1"]), (p["w2"], p["b2"], s["a2"])):
        w_scale = np.maximum(np.abs(w).reshape(len(w), -1).max(axis=1), 1e-8) / 127
        w_q = quant.quantize_per_channel(w, w_scale, np.zeros(len(w), np.int64), axis=0)
        layers.append({"w_q": w_q, "w_scale": w_scale.astype(np.float32), "bias": b,
                       "out_scale": max(float(act.max()), 1e-8) / 255})
    return _QuantModel(x_scale, layers, p["w3"], p["b3"])


def _int8_logits(q: _QuantModel, x: np.ndarray, timer: _Timer) -> np.ndarray:
    a = quant.quantize(x, q.x_scale, 0, np.uint8)
    scale = q.x_scale
    for i, layer in enumerate(q.layers):
        start, shape = time.perf_counter(), a.shape
        a = quant.qconv(a, scale, 0, layer["w_q"], layer["w_scale"], 0, layer["bias"],
                        out_scale=layer["out_scale"], out_zero_point=0, relu=True, **CONV)
        timer.record((i, shape), f"conv{i + 1} int8 [qconv]", time.perf_counter() - start)
        scale = layer["out_scale"]
    pooled = quant.dequantize(_pool(a), scale, 0)
    return pooled.reshape(len(x), -1) @ q.w3 + q.b3


def _best_of(fns: list[Any], rounds: int = 9) -> list[float]:
    """The fastest of ``rounds`` runs of each function, rounds interleaved."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def _figure(path: Path, r: DemoResult, x: np.ndarray, y: np.ndarray, pf: np.ndarray,
            pq: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(15, 5), layout="constrained")
    grid = fig.add_gridspec(2, 12)
    ax = fig.add_subplot(grid[:, :3])
    ax.plot(range(1, len(r.losses) + 1), r.losses, marker="o")
    ax.set(title="training loss", xlabel="epoch", ylabel="cross-entropy")
    for i in range(12):
        sub = fig.add_subplot(grid[i // 6, 3 + i % 6])
        sub.imshow(x[i, :, :, 0], cmap="gray_r")
        ok = pf[i] == y[i] and pq[i] == y[i]
        sub.set_title(f"float {pf[i]}, int8 {pq[i]}", fontsize=8, color="black" if ok else "red")
        sub.axis("off")
    ax = fig.add_subplot(grid[:, 9:])
    names = sorted(r.layer_seconds, key=r.layer_seconds.__getitem__)
    ax.barh(names, [1e3 * r.layer_seconds[n] for n in names])
    ax.set(title="run time per layer [algorithm]", xlabel="ms, whole run (first calls apart)")
    ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"convengine demo: float {100 * r.float_accuracy:.1f}%, "
                 f"int8 {100 * r.int8_accuracy:.1f}%, int8 {r.int8_speedup:.2f}x float speed")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(epochs: int = 5, seed: int = 0, out: str | Path = "convengine-demo",
        progress: bool = True, say: Callable[[str], None] | None = say,
        tune: bool = False) -> DemoResult:
    """Train, quantize and evaluate; write ``demo.png`` and ``demo.json`` under ``out``.
    ``progress``: a bar per epoch; ``say``: where the lines saying what it does go
    (None: nowhere); ``tune``: tune each conv on its first call (compiles every
    candidate algorithm; default: tuning off, the heuristic picks)."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    tell = say or (lambda text: None)
    if tune:  # as the process is set: the default tunes
        return _run(epochs, seed, Path(out), progress, tell, tune)
    previous = set_tuning("off")
    try:
        return _run(epochs, seed, Path(out), progress, tell, tune)
    finally:
        set_tuning(previous)


def _run(epochs: int, seed: int, out: Path, progress: bool, tell: Callable[[str], None],
         tune: bool) -> DemoResult:
    begin = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tell("loading scikit-learn's digits ...")
    x_train, y_train, x_test, y_test, test_indices = _data(seed)
    watch = _CompileWatch(tell)
    with watch.installed():
        tell(f"training on {len(x_train)} digits, {epochs} epochs; the first batch compiles "
             "the kernels of each conv pass (or loads them from the cache), "
             + ("tuning each: every candidate algorithm is compiled and timed" if tune else
                "the heuristic picks the algorithms (--tune: time every candidate)"))
        timer = _Timer(tell)
        params = _init(rng)
        losses = _train(params, x_train, y_train, epochs, rng, timer, progress, tell)
        train = timer

        tell(f"testing on {len(x_test)} digits; quantizing to int8 (calibrated on the "
             "training set); the int8 kernels compile on their first call")
        timer = _Timer(tell)
        float_logits, _ = _forward(params, x_test, timer)
        q = _quantize(params, x_train, _Timer())
        int8_logits = _int8_logits(q, x_test, timer)
        tell("timing the test set's forward, float32 against int8 (best of 9) ...")
        float_seconds, int8_seconds = _best_of([lambda: _forward(params, x_test, timer),
                                                lambda: _int8_logits(q, x_test, timer)])
    pf, pq = float_logits.argmax(axis=1), int8_logits.argmax(axis=1)
    result = DemoResult(
        epochs=epochs, seed=seed, trainer="numpy (Adam), every conv pass through convengine",
        losses=losses, float_accuracy=float((pf == y_test).mean()),
        int8_accuracy=float((pq == y_test).mean()),
        float_seconds=float_seconds, int8_seconds=int8_seconds,
        layer_seconds={f"{phase}: {k}": v for phase, t in (("train", train), ("test", timer))
                       for k, v in t.seconds.items()},
        layer_calls={f"{phase}: {k}": v for phase, t in (("train", train), ("test", timer))
                     for k, v in t.calls.items()},
        first_call_seconds={f"{phase}: {k}": v for phase, t in (("train", train),
                                                                ("test", timer))
                            for k, v in t.first.items()},
        compile_seconds=watch.seconds, compiled=watch.count,
        test_indices=test_indices.tolist(), float_predictions=pf.tolist(),
        int8_predictions=pq.tolist(),
    )
    tell(f"writing {out / 'demo.png'} ...")
    png, js = out / "demo.png", out / "demo.json"
    _figure(png, result, x_test, y_test, pf, pq)
    result.files = [str(png), str(js)]
    result.seconds = time.perf_counter() - begin
    js.write_text(json.dumps({**asdict(result), "int8_speedup": result.int8_speedup}, indent=1))
    return result


def summary(r: DemoResult) -> str:
    """The lines ``convengine demo`` prints."""
    rows = [(k, r.layer_calls.get(k, 0), r.layer_seconds.get(k, 0.0), first)
            for k, first in r.first_call_seconds.items()]
    first_total = sum(r.first_call_seconds.values())
    return "\n".join([
        f"trained {r.epochs} epochs (seed {r.seed}) with {r.trainer}",
        f"loss per epoch: {', '.join(f'{v:.3f}' for v in r.losses)}",
        f"test accuracy: float32 {100 * r.float_accuracy:.1f}%, "
        f"int8 (qconv, bias+ReLU+requantize fused) {100 * r.int8_accuracy:.1f}%",
        f"test set forward: float32 {1e3 * r.float_seconds:.1f} ms, int8 "
        f"{1e3 * r.int8_seconds:.1f} ms (int8 / float speed {r.int8_speedup:.2f}x)",
        "time per layer [algorithm]: run time of the steady calls; first calls (compile) apart",
        f"  {'layer, pass [algorithm]':<44} {'calls':>6} {'run ms':>9} {'ms/call':>8} "
        f"{'first call (compile) ms':>24}",
        *(f"  {k:<44} {n:6d} {1e3 * s:9.1f} {1e3 * s / max(n, 1):8.3f} {1e3 * f:24.1f}"
          for k, n, s, f in rows),
        f"spent {r.compile_seconds:.1f} s compiling {r.compiled} kernels (numba), in "
        f"first calls that took {first_total:.1f} s together, of the {r.seconds:.1f} s run",
        f"wrote {', '.join(r.files)}",
    ])
