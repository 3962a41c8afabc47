"""``convengine demo``: train a small CNN on scikit-learn's digits, quantize it, serve it.

Every convolution (forward, backward-data, backward-weight) goes through convengine;
the rest (ReLU, 2x2 max-pool, linear layer, softmax cross-entropy, Adam) is plain
numpy. The trained model is quantized (per-channel int8 weights, uint8 activations
calibrated on the training set) and the test set runs through :func:`convengine.qconv`
with bias, ReLU and requantization fused. Writes ``demo.png`` (loss curve, test digits
with their float and int8 predictions, time per layer by algorithm) and
``demo.json`` (the figures) to ``--out``. Needs the ``demo`` extra.

Model, NHWC throughout: x (N, 8, 8, 1) -> conv 3x3 (8) -> ReLU -> conv 3x3 (16) ->
ReLU -> max-pool 2x2 -> (N, 4, 4, 16) -> linear (10).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import api, quant

LAYOUT = "NHWC"
CONV: dict[str, Any] = {"padding": 1, "layout": LAYOUT}
CHANNELS = (8, 16)
BATCH = 32


@dataclass
class DemoResult:
    """What one run measured; ``files``: the paths written."""

    epochs: int
    seed: int
    trainer: str
    losses: list[float]
    float_accuracy: float
    int8_accuracy: float
    float_seconds: float
    int8_seconds: float
    layer_seconds: dict[str, float] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @property
    def int8_speedup(self) -> float:
        """Float time / int8 time on the test set (above 1: int8 faster)."""
        return self.float_seconds / self.int8_seconds


class _Timer:
    """Seconds per (layer, pass, algorithm), accumulated over calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._algo: dict[tuple, str] = {}

    def call(self, label: str, pass_: str, fn: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        elapsed = time.perf_counter() - start
        key = (label, pass_, *(a.shape for a in args[:2]))
        if key not in self._algo:  # asked after the call, which may have tuned it
            self._algo[key] = api.explain(*args, pass_=pass_, **kwargs).chosen
        self.seconds[f"{label} {pass_} [{self._algo[key]}]"] += elapsed
        return out


def _data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1], NHWC (N, 8, 8, 1); a fixed-seed 80/20 split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


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
           rng: np.random.Generator, timer: _Timer, progress: bool) -> list[float]:
    """Adam (lr 0.01), batches of 32; the mean loss of each epoch."""
    from tqdm import tqdm

    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    lr, beta1, beta2, step = 0.01, 0.9, 0.999, 0
    losses = []
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        batches = range(0, len(x), BATCH)
        total = 0.0
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{epochs}", disable=not progress,
                   leave=False)
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
        start = time.perf_counter()
        a = quant.qconv(a, scale, 0, layer["w_q"], layer["w_scale"], 0, layer["bias"],
                        out_scale=layer["out_scale"], out_zero_point=0, relu=True, **CONV)
        timer.seconds[f"conv{i + 1} int8 [qconv]"] += time.perf_counter() - start
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
    ax.set(title="time per layer [algorithm]", xlabel="ms, whole run (first calls compile)")
    ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"convengine demo: float {100 * r.float_accuracy:.1f}%, "
                 f"int8 {100 * r.int8_accuracy:.1f}%, int8 {r.int8_speedup:.2f}x float speed")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(epochs: int = 8, seed: int = 0, out: str | Path = "convengine-demo",
        progress: bool = True) -> DemoResult:
    """Train, quantize and evaluate; write ``demo.png`` and ``demo.json`` under ``out``."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    x_train, y_train, x_test, y_test = _data(seed)
    timer = _Timer()
    params = _init(rng)
    losses = _train(params, x_train, y_train, epochs, rng, timer, progress)
    train_seconds = dict(timer.seconds)

    timer = _Timer()
    float_logits, _ = _forward(params, x_test, timer)
    q = _quantize(params, x_train, _Timer())
    int8_logits = _int8_logits(q, x_test, timer)
    float_seconds, int8_seconds = _best_of([lambda: _forward(params, x_test, _Timer()),
                                            lambda: _int8_logits(q, x_test, _Timer())])
    pf, pq = float_logits.argmax(axis=1), int8_logits.argmax(axis=1)
    result = DemoResult(
        epochs=epochs, seed=seed, trainer="numpy (Adam), every conv pass through convengine",
        losses=losses, float_accuracy=float((pf == y_test).mean()),
        int8_accuracy=float((pq == y_test).mean()),
        float_seconds=float_seconds, int8_seconds=int8_seconds,
        layer_seconds={**{f"train: {k}": v for k, v in train_seconds.items()},
                       **{f"test: {k}": v for k, v in timer.seconds.items()}},
    )
    png, js = out / "demo.png", out / "demo.json"
    _figure(png, result, x_test, y_test, pf, pq)
    result.files = [str(png), str(js)]
    js.write_text(json.dumps({**asdict(result), "int8_speedup": result.int8_speedup}, indent=2))
    return result


def summary(r: DemoResult) -> str:
    """The lines ``convengine demo`` prints."""
    return "\n".join([
        f"trained {r.epochs} epochs (seed {r.seed}) with {r.trainer}",
        f"loss per epoch: {', '.join(f'{v:.3f}' for v in r.losses)}",
        f"test accuracy: float32 {100 * r.float_accuracy:.1f}%, "
        f"int8 (qconv, bias+ReLU+requantize fused) {100 * r.int8_accuracy:.1f}%",
        f"test set forward: float32 {1e3 * r.float_seconds:.1f} ms, int8 "
        f"{1e3 * r.int8_seconds:.1f} ms (int8 / float speed {r.int8_speedup:.2f}x)",
        "time per layer [algorithm]:",
        *(f"  {k:<48} {1e3 * v:9.1f} ms" for k, v in r.layer_seconds.items()),
        f"wrote {', '.join(r.files)}",
    ])
