"""Ahead-of-time warm-up: compile (and optionally tune) everything a model needs.

``warmup(problems)`` runs each problem once through the public API on random
operands, in the problem's own layout and dtype, so that every kernel the problem's
algorithm uses is compiled, and cached on disk for later processes (generated
kernels under ``<cache dir>/kernels``, see ``_kernel_cache``; the others in numba's
cache). Without ``tune`` it never benchmarks: the tuning mode is ``cache-only`` while
it runs (the cached choice, else the heuristic), so it compiles what a process with
a warm tuning cache, or with tuning off, will run. With ``tune`` it first tunes the
problems (``convengine.tune``), which compiles every candidate. ``int8``: forward
problems whose shapes run through ``qconv`` (uint8 x, int8 w). A Docker build or a CI
step runs it once: ``convengine warmup --suite resnet50 --batch 1``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import api
from .problem import ConvProblem
from .tune import tuner


class Warmed(NamedTuple):
    """One warmed call: its problem, ``"float"`` or ``"int8"``, and the seconds taken
    (compilation, or loading from the cache, included)."""

    problem: ConvProblem
    kind: str
    seconds: float


def _dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes  # loaded on the bfloat16 path only (~0.6 s to import)

        return ml_dtypes.bfloat16
    return np.dtype(name)


def _float_call(p: ConvProblem, rng: np.random.Generator) -> Callable[[], Any]:
    """The public API call of ``p``'s pass, on random operands in ``p``'s layout."""
    dt = _dtype(p.dtype)

    def rand(shape: tuple[int, ...]) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32).astype(dt)

    kw: dict[str, Any] = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation,
                          "groups": p.groups, "layout": p.layout}
    if p.pass_ == "forward":
        x, w = rand(p.x_shape()), rand(p.w_shape())
        return lambda: api.conv(x, w, **kw)
    if p.pass_ == "backward_data":
        dy, w = rand(p.y_shape()), rand(p.w_shape())
        return lambda: api.conv_backward_data(dy, w, p.x_shape(), **kw)
    x, dy = rand(p.x_shape()), rand(p.y_shape())
    return lambda: api.conv_backward_weight(x, dy, p.w_shape(), **kw)


def _int8_call(p: ConvProblem, rng: np.random.Generator) -> Callable[[], Any]:
    """``qconv`` on uint8 x and int8 w of ``p``'s forward shapes: x over the whole
    range and, on the AVX2 path, x halved too (full-range random bytes take the int16
    tiles there, x below 128 the ``vpmaddubsw`` tiles: see ``kernels.few_heavy_pairs``)."""
    from .quant import cpu, qconv

    x = rng.integers(0, 256, p.x_shape(), dtype=np.uint8)
    w = rng.integers(-127, 128, p.w_shape(), dtype=np.int8)
    inputs = (x, x >> 1) if cpu.int8_path() == "avx2" else (x,)

    def call() -> Any:
        for xs in inputs:
            y = qconv(xs, 0.02, 128, w, 0.01, 0, None, out_scale=0.05, out_zero_point=128,
                      stride=p.stride, padding=p.padding, dilation=p.dilation,
                      groups=p.groups, layout=p.layout)
        return y
    return call


def _bar(items: Sequence[Any], enabled: bool | None) -> Iterable[Any]:
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="warm-up", unit="call", file=sys.stderr)


def _checked(problems: Iterable[ConvProblem], name: str) -> list[ConvProblem]:
    items = list(problems)
    for i, p in enumerate(items):
        if not isinstance(p, ConvProblem):
            raise TypeError(f"{name}[{i}] must be a ConvProblem, got {type(p).__name__}")
        if name == "int8" and p.pass_ != "forward":
            raise ValueError(f"int8[{i}] must be a forward problem, got pass {p.pass_!r}")
    return items


def warmup(problems: Iterable[ConvProblem] = (), *, int8: Iterable[ConvProblem] = (),
           tune: bool = False, search: bool = True,
           progress: bool | None = None) -> list[Warmed]:
    """Compile (and with ``tune``, tune first) every kernel ``problems`` need, and
    the int8 kernels of ``qconv`` on the shapes of the forward problems ``int8``; one
    :class:`Warmed` per call made. ``search``: tuning searches the chosen algorithms'
    parameters too (False: algorithms only, as a first call's tuning does).
    ``progress``: a bar on stderr (default: when stderr is a terminal)."""
    items, quantized = _checked(problems, "problems"), _checked(int8, "int8")
    if tune:
        tuner.tune(items, progress=progress, search=search)
    calls = [(p, "float") for p in items] + [(p, "int8") for p in quantized]
    rng = np.random.default_rng(0)
    previous = tuner.set_tuning("cache-only")
    try:
        done = []
        for p, kind in _bar(calls, progress):
            call = (_int8_call if kind == "int8" else _float_call)(p, rng)
            start = time.perf_counter()
            call()
            done.append(Warmed(p, kind, time.perf_counter() - start))
        return done
    finally:
        tuner.set_tuning(previous)
