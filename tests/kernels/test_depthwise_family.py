"""The float depthwise family (``algorithms/depthwise/``), each variant against
:mod:`convengine.algorithms.depthwise.reference`, on the instruction-set level in use.

Forward (``forward.depthwise2d_kernel``): every kernel shape of up to 3x3 taps and the
1-D ones (1xK) up to MAX_TAPS taps, strides 1 and 2, dilations 1 and 2, with and without
the epilogue (bias, each activation of ``CPU_STORE``, NaN passing them), streaming
stores; float32 and float64 (the vector holds half as many); the serial kernel and the
parallel one with its tasks split by rows or by channels. Backward-data (data.py's
kernel, any stride and kernel size; the stride-1 forward plan with the taps reversed)
and backward-weight (``weight.weight_kernel``) per kernel shape, stride,
dilation, serial or split tasks and bands of rows. Each case runs on four geometries
(padded "same", unpadded, padded on the low side only, padded beyond the kernel's
reach) and three channel counts (whole register blocks, a ragged last one, fewer than
a vector).

Tolerance: every output is a sum of n rounded operations (K taps: one product, K - 1
fused multiply-adds, plus the bias; backward-weight: N*OH*OW per task, plus the tasks'
partial sums), so |got - ref| <= gamma_n * sum |terms| < (n + 1) u sum |terms|
elementwise (u = 2^-24 float32, 2^-53 float64; Higham, Accuracy and Stability, 3.1),
with sum |terms| the reference run on the absolute values. Compilation dominates a
first run (minutes: the fast tier loads about 35 kernel modules, the slow one about 45
more); warm, the fast tier takes about 10 s.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import pytest

import convengine as ce
from convengine import memory
from convengine.algorithms.depthwise import data, forward, reference, weight
from convengine.epilogue_codes import CPU_STORE, Activation
from convengine.problem import make_problem

RNG = np.random.default_rng(2024)
DTYPES = (np.float32, np.float64)
SHAPES = [(kh, kw) for kh in (1, 2, 3) for kw in (1, 2, 3)]  # every 2-D shape up to 3x3
SHAPES_1D = [(1, k) for k in range(4, forward.MAX_TAPS + 1)]  # and 1xK up to MAX_TAPS taps


class Geometry(NamedTuple):
    """Spatial arguments of one call: input (H, W), low-side padding, output (OH, OW)."""

    name: str
    batch: int
    in_size: tuple[int, int]
    pad: tuple[int, int]
    out_size: tuple[int, int]


def _geometries(kernel, stride, dilation) -> list[Geometry]:
    """The four geometries for one kernel shape, stride and dilation."""
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]

    def geometry(name, batch, size, low, high):
        out = tuple((s + lo + hi - e) // st + 1
                    for s, lo, hi, e, st in zip(size, low, high, ext, stride))
        return Geometry(name, batch, size, low, out)

    same = [(e - 1) // 2 for e in ext]
    return [
        geometry("same", 2, (5, 11), same, [e - 1 - lo for e, lo in zip(ext, same)]),
        geometry("valid", 1, (ext[0] + 1, ext[1] + 4), (0, 0), (0, 0)),
        geometry("low", 1, (4, 10), [e - 1 for e in ext], (0, 0)),
        geometry("beyond", 1, (2, 3), [e + 1 for e in ext], (1, 2)),  # pixels without taps
    ]


def _lanes(dtype) -> int:
    return forward.VECTOR_BYTES // np.dtype(dtype).itemsize


def _channels(dtype, nvec: int) -> list[int]:
    """Channel counts: two whole register blocks (``nvec`` vectors), one whole block
    then one vector and 3 lanes, 3 (fewer than a vector)."""
    lanes = _lanes(dtype)
    return [2 * nvec * lanes, nvec * lanes + lanes + 3, 3]


def _taps(w: np.ndarray, dtype) -> np.ndarray:
    """w (C, KH, KW) as the forward kernels take it (the layout ``_block_intrinsic``
    documents): (ceil(C / L), KH*KW, L) with ``wk[c // L, t, c % L] = w[c, t]``, zero
    past C."""
    c, lanes = w.shape[0], _lanes(dtype)
    wk = np.zeros((-(-c // lanes), w.shape[1] * w.shape[2], lanes), dtype)
    wk[np.arange(c) // lanes, :, np.arange(c) % lanes] = w.reshape(c, -1)
    return wk


def _sentinel(count: int, dtype) -> np.ndarray:
    """A NaN-filled ``raw`` buffer long enough for a kernel to put ``count`` outputs in,
    with a vector to spare at its end (to see writes past y)."""
    spare = (memory.ALIGN + forward.VECTOR_BYTES) // np.dtype(dtype).itemsize
    return np.full(count + spare, np.nan, dtype)


def _check_in_place(y: np.ndarray, raw: np.ndarray, what: str) -> None:
    """y is a view of raw starting on a cache line, and raw outside y is untouched."""
    start = (y.ctypes.data - raw.ctypes.data) // raw.itemsize
    assert 0 <= start and start + y.size <= raw.size, f"{what}: y not in raw"
    assert y.ctypes.data % memory.ALIGN == 0, f"{what}: y not on a cache line"
    outside = np.concatenate([raw[:start], raw[start + y.size:]])
    assert np.isnan(outside).all(), f"{what}: wrote outside y"


def _unit(dtype) -> float:
    return float(np.finfo(dtype).eps) / 2


def assert_bounded(got: np.ndarray, want: np.ndarray, magnitude: np.ndarray, ops: int,
                   what: str) -> None:
    """got within (ops + 1) u * magnitude of want (float64), elementwise (u: got's unit
    roundoff); NaN exactly where want is NaN."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN pattern differs"
    err = np.abs(got.astype(np.float64) - want)[~nan]
    bound = (ops + 1) * _unit(got.dtype) * magnitude[~nan]
    worst = np.argmax(err - bound, axis=None) if err.size else 0
    assert (err <= bound).all(), (
        f"{what}: error {err[worst]:.3g} > bound {bound[worst]:.3g} ({ops} roundings)")


def _problem(pass_: str, x_shape: tuple[int, ...], kernel: tuple[int, ...], dtype, **args):
    """The depthwise problem (NHWC) of x_shape and kernel, for one pass."""
    c = x_shape[-1]
    return make_problem(pass_, x_shape, (c, *kernel, 1), dtype=np.dtype(dtype).name,
                        layout="NHWC", groups=c, **args)


# ------------------------------------------------------------------ the reference


def test_reference_matches_the_definition_loop() -> None:
    """reference.forward against a loop over outputs and taps straight from the
    formula (stride, dilation, low padding, bias, ReLU6)."""
    x, w, b = RNG.standard_normal((2, 5, 6, 3)), RNG.standard_normal((3, 2, 3)), RNG.random(3)
    stride, pad, dil, out = (2, 1), (1, 2), (2, 1), (3, 6)
    want = np.zeros((2, *out, 3))
    for n, oh, ow, c, i, j in np.ndindex(2, *out, 3, 2, 3):
        ih, iw = oh * stride[0] - pad[0] + i * dil[0], ow * stride[1] - pad[1] + j * dil[1]
        if 0 <= ih < 5 and 0 <= iw < 6:
            want[n, oh, ow, c] += x[n, ih, iw, c] * w[c, i, j]
    want = np.clip(want + b, 0, 6)
    got = reference.forward(x, w, out, stride, pad, dil, b, Activation.RELU6)
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)


def test_reference_passes_are_adjoint() -> None:
    """<forward(x, w), dy> = <x, backward_data(dy, w)> = <w, backward_weight(x, dy)>."""
    x, w = RNG.standard_normal((2, 6, 7, 4)), RNG.standard_normal((4, 3, 2))
    stride, pad, dil, out = (2, 3), (2, 1), (1, 2), (4, 3)
    dy = RNG.standard_normal((2, *out, 4))
    inner = np.vdot(reference.forward(x, w, out, stride, pad, dil), dy)
    assert np.isclose(inner, np.vdot(x, reference.backward_data(dy, w, (6, 7), stride, pad,
                                                                   dil)), rtol=1e-12)
    assert np.isclose(inner, np.vdot(w, reference.backward_weight(x, dy, (3, 2), stride,
                                                                     pad, dil)), rtol=1e-12)


def test_reference_activations() -> None:
    v = np.array([-1.0, 0.5, 7.0, np.nan])
    np.testing.assert_array_equal(reference.activation(v, Activation.RELU), [0, 0.5, 7, np.nan])
    np.testing.assert_array_equal(reference.activation(v, Activation.RELU6), [0, 0.5, 6, np.nan])
    with pytest.raises(ValueError, match="act must be one of"):
        reference.activation(v, Activation.SILU)


def test_assert_bounded_fails_past_the_bound() -> None:
    want = np.ones(4)
    got = np.full(4, 1 + np.finfo(np.float32).eps, np.float32)  # 1 + 2u
    assert_bounded(got, want, np.ones(4), 1, "2u within 2u")
    with pytest.raises(AssertionError, match="error"):
        assert_bounded(got, want, np.ones(4), 0, "2u beyond u")
    with pytest.raises(AssertionError, match="NaN pattern"):
        assert_bounded(np.full(4, np.nan, np.float32), want, np.ones(4), 9, "NaN")


# ------------------------------------------------------------------ forward


class Forward(NamedTuple):
    """A forward kernel variant: kernel shape, strides, dilations, store."""

    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    streaming: bool = False
    epilogue: bool = False

    def __str__(self) -> str:
        return (f"{self.kernel[0]}x{self.kernel[1]}-s{self.stride[0]}{self.stride[1]}"
                f"-d{self.dilation[0]}{self.dilation[1]}"
                f"{'-streaming' if self.streaming else ''}{'-epilogue' if self.epilogue else ''}")


STRIDED = [((2, 2), (1, 1)), ((1, 1), (2, 2)), ((2, 2), (2, 2))]
FORWARD_FAST = [
    *(Forward(k) for k in [*SHAPES, (1, 5), (1, forward.MAX_TAPS)]),
    *(Forward(k, s, d) for k in [(3, 3), (1, 3)] for s, d in STRIDED),
    Forward((3, 3), (2, 1), (1, 2)),  # height stride and width dilation apart
    Forward((3, 3), epilogue=True), Forward((1, 3), epilogue=True),
    Forward((3, 3), (2, 2), epilogue=True),
    Forward((3, 3), streaming=True), Forward((3, 3), streaming=True, epilogue=True),
    Forward((1, forward.MAX_TAPS), epilogue=True),  # test_plans runs it
]
# about 40 kernel modules more (minutes to compile): the other shapes strided and
# dilated, the other 1-D ones, the epilogue on every shape
FORWARD_SLOW = [v for v in [
    *(Forward(k, s, d) for k in SHAPES for s, d in STRIDED),
    *(Forward(k) for k in SHAPES_1D),
    *(Forward((1, k), (2, 2), (2, 2)) for k in (5, forward.MAX_TAPS)),
    *(Forward(k, epilogue=True) for k in SHAPES),
    Forward((3, 3), (2, 2), (2, 2), epilogue=True),
    Forward((3, 3), (1, 2), (2, 1)), Forward((1, 3), streaming=True),
    Forward((3, 3), dilation=(2, 2), streaming=True),
] if v not in FORWARD_FAST]
# (kernel, row_parts, channel_parts) callers: the serial kernel, the parallel one split
# by rows or by GRAIN-channel slices (as many as there are, up to the parts asked)
LAYOUTS = {"serial": (1, 1, 1), "rows": (0, 3, 1), "channels": (0, 1, 2)}
# the variants run in the parallel layouts too (the task split is shared by all)
PARALLEL = [Forward((3, 3)), Forward((3, 3), (2, 2)), Forward((1, 3)),
            Forward((3, 3), streaming=True), Forward((3, 3), epilogue=True),
            Forward((3, 3), streaming=True, epilogue=True)]


def _cases(fast: list, slow: list, parallel: list, layouts: dict) -> list:
    """(variant, layout) parameters: the layouts of the serial kernel for every variant,
    those of the parallel one too for the variants in ``parallel``; ``slow`` marked."""
    def params(variant, marks=()):
        return [pytest.param(variant, layout, id=f"{variant}-{layout}", marks=marks)
                for layout, (which, *_) in layouts.items() if which == 1 or variant in parallel]

    return [p for v in fast for p in params(v)] + [
        p for v in slow for p in params(v, pytest.mark.slow)]


def _run_forward(variant: Forward, dtype, layout: str, x, w, geometry: Geometry, bias, act):
    """y from the variant's kernel in ``layout`` (bias and act with the epilogue)."""
    which, rows, channels = LAYOUTS[layout]
    kernel = forward.depthwise2d_kernel(*variant.kernel, variant.stride[1], *variant.dilation,
                                        variant.streaming, variant.epilogue)[which]
    c = x.shape[3]
    rows = min(rows, geometry.batch * geometry.out_size[0])
    channels = min(channels, -(-c // forward.GRAIN))
    count = geometry.batch * math.prod(geometry.out_size) * c
    raw = _sentinel(count, dtype)
    no_bias = np.zeros(0)  # what the plans pass without the epilogue
    # act as an int, as the plans pass it (an IntEnum compiles another signature)
    y = kernel(x, _taps(w, dtype), *geometry.out_size, variant.stride[0], *geometry.pad,
               rows, channels, raw, bias if variant.epilogue else no_bias, int(act))
    _check_in_place(y, raw, f"{variant} {layout}")
    return y


def _forward_case(variant: Forward, dtype, layout: str, act: int) -> None:
    """The variant on every geometry and channel count (the parallel layouts: those
    with more than one GRAIN of channels)."""
    channel_counts = _channels(dtype, forward.NVEC)[:None if layout == "serial" else 2]
    if variant.streaming:  # whole vectors only: whole blocks, a block and a vector
        channel_counts = [c - c % _lanes(dtype) for c in channel_counts[:2]]
    taps = math.prod(variant.kernel)
    for geometry in _geometries(variant.kernel, variant.stride, variant.dilation):
        for c in channel_counts:
            what = f"{variant} {np.dtype(dtype)} {layout} {geometry.name} C={c} act={act}"
            x = 2 * RNG.standard_normal((geometry.batch, *geometry.in_size, c)).astype(dtype)
            w = RNG.standard_normal((c, *variant.kernel)).astype(dtype)
            bias = RNG.standard_normal(c).astype(dtype) if variant.epilogue else None
            if variant.epilogue:  # one NaN, which passes the activations
                x[0, 0, -1, c // 2] = np.nan
            y = _run_forward(variant, dtype, layout, x, w, geometry, bias, act)
            args = (geometry.out_size, variant.stride, geometry.pad, variant.dilation)
            want = reference.forward(x, w, *args, bias, act)
            size = reference.forward(np.abs(x), np.abs(w), *args,
                                     None if bias is None else np.abs(bias))
            assert_bounded(y, want, size, taps + (bias is not None), what)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("variant", "layout"), _cases(
    [v for v in FORWARD_FAST if not v.epilogue], [v for v in FORWARD_SLOW if not v.epilogue],
    PARALLEL, LAYOUTS))
def test_forward_kernel(variant: Forward, layout: str, dtype) -> None:
    _forward_case(variant, dtype, layout, Activation.NONE)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("variant", "layout"), _cases(
    [v for v in FORWARD_FAST if v.epilogue], [v for v in FORWARD_SLOW if v.epilogue],
    PARALLEL, LAYOUTS))
def test_forward_kernel_epilogue(variant: Forward, layout: str, dtype) -> None:
    """y = act(conv + bias) in the kernel's store, each activation (the parallel
    layouts: ReLU6); a NaN input stays NaN."""
    for act in CPU_STORE if layout == "serial" else (Activation.RELU6,):
        _forward_case(variant, dtype, layout, act)


# ------------------------------------------------------------------ backward-data


class Backward(NamedTuple):
    """A backward variant: kernel shape, strides, dilations."""

    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)

    def __str__(self) -> str:
        return (f"{self.kernel[0]}x{self.kernel[1]}-s{self.stride[0]}{self.stride[1]}"
                f"-d{self.dilation[0]}{self.dilation[1]}")


# one kernel module serves every shape: the variants are what decides which taps reach
# a pixel (strides, dilations, kernel sizes past MAX_TAPS)
DATA = [Backward((3, 3)), Backward((3, 3), (2, 2)), Backward((3, 3), (3, 2), (2, 1)),
        Backward((1, 1), (2, 2)), Backward((2, 3), (2, 1)), Backward((5, 5), (2, 2)),
        Backward((5, 5), dilation=(2, 2)), Backward((1, 7), (1, 3), (1, 2)),
        Backward((1, 31), (1, 2))]
# (kernel, parts): the serial kernel with one task or three in turn, the parallel one
DATA_LAYOUTS = {"serial": (1, 1), "serial-tasks": (1, 3), "parallel": (0, 2)}


@functools.cache
def _data_kernels() -> tuple:
    """data.py's kernels (parallel, serial) as its plans hold them: the parallel one for
    a large problem on two threads, the serial one on one thread."""
    problem = _problem("backward_data", (8, 64, 64, 64), (3, 3), np.float32, stride=2,
                       padding=1)
    previous = ce.get_num_threads()
    try:
        kernels = []
        for threads in (2, 1):
            ce.set_num_threads(threads)
            kernels.append(data.backward_data_plan(problem).kernel)
    finally:
        ce.set_num_threads(previous)
    assert kernels[0] is not kernels[1]
    return tuple(kernels)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("variant", "layout"), _cases(DATA, [], DATA[:3], DATA_LAYOUTS))
def test_backward_data_kernel(variant: Backward, layout: str, dtype) -> None:
    which, parts = DATA_LAYOUTS[layout]
    kernel = _data_kernels()[which]
    taps = math.prod(variant.kernel)
    for geometry in _geometries(variant.kernel, variant.stride, variant.dilation):
        for c in _channels(dtype, forward.NVEC):
            what = f"{variant} {np.dtype(dtype)} {layout} {geometry.name} C={c}"
            dy = RNG.standard_normal((geometry.batch, *geometry.out_size, c)).astype(dtype)
            w = RNG.standard_normal((c, *variant.kernel)).astype(dtype)
            raw = _sentinel(geometry.batch * math.prod(geometry.in_size) * c, dtype)
            dx = kernel(dy, w, *geometry.in_size, *variant.stride, *geometry.pad,
                        *variant.dilation, min(parts, geometry.batch * geometry.in_size[0]),
                        raw)
            _check_in_place(dx, raw, what)
            args = (geometry.in_size, variant.stride, geometry.pad, variant.dilation)
            assert_bounded(dx, reference.backward_data(dy, w, *args),
                           reference.backward_data(np.abs(dy), np.abs(w), *args), taps, what)


# ------------------------------------------------------------------ backward-weight


WEIGHT_FAST = [
    *(Backward(k) for k in [(1, 1), (1, 3), (3, 1), (2, 2), (3, 3), (1, forward.MAX_TAPS)]),
    *(Backward((3, 3), s, d) for s, d in STRIDED), Backward((3, 3), (2, 1), (1, 2)),
]
WEIGHT_SLOW = [v for v in [*(Backward(k, s, d) for k in SHAPES
                             for s, d in [((1, 1), (1, 1)), *STRIDED]),
                           *(Backward(k) for k in SHAPES_1D)]
               if v not in WEIGHT_FAST]
# (kernel, output rows per band, parts): the serial kernel with one task of one-row
# bands or three tasks of two-row bands in turn, the parallel one with two tasks
WEIGHT_LAYOUTS = {"serial": (1, 1, 1), "serial-bands": (1, 2, 3), "parallel": (0, 64, 2)}
WEIGHT_PARALLEL = [Backward((3, 3)), Backward((3, 3), (2, 2)), Backward((1, 3))]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("variant", "layout"), _cases(WEIGHT_FAST, WEIGHT_SLOW,
                                                       WEIGHT_PARALLEL, WEIGHT_LAYOUTS))
def test_backward_weight_kernel(variant: Backward, layout: str, dtype) -> None:
    which, band, parts = WEIGHT_LAYOUTS[layout]
    kernel = weight.weight_kernel(*variant.kernel, variant.stride[1],
                                  variant.dilation[1])[which]
    for geometry in _geometries(variant.kernel, variant.stride, variant.dilation):
        for c in _channels(dtype, weight.NVEC):
            what = f"{variant} {np.dtype(dtype)} {layout} {geometry.name} C={c}"
            x = RNG.standard_normal((geometry.batch, *geometry.in_size, c)).astype(dtype)
            dy = RNG.standard_normal((geometry.batch, *geometry.out_size, c)).astype(dtype)
            dw = np.full((c, math.prod(variant.kernel)), np.nan, dtype)  # overwritten
            rows = geometry.batch * geometry.out_size[0]
            kernel(x, dy, dw, variant.stride[0], *geometry.pad, variant.dilation[0], band,
                   min(parts, rows))
            args = (variant.kernel, variant.stride, geometry.pad, variant.dilation)
            assert_bounded(dw.reshape(c, *variant.kernel),
                           reference.backward_weight(x, dy, *args),
                           reference.backward_weight(np.abs(x), np.abs(dy), *args),
                           rows * geometry.out_size[1] + parts, what)


# ------------------------------------------------------------------ the plans


def _as2d(problem, values: tuple[int, ...], lead: int) -> tuple[int, int]:
    """A 1-D problem's (v,) as (lead, v); 2-D values unchanged."""
    return (lead, values[0]) if problem.ndim == 1 else (values[0], values[1])


# (id, x shape NHWC, kernel, conv args)
PLANS = [
    ("3x3-s2-asym", (2, 7, 8, 19), (3, 3), dict(stride=2, padding=((1, 0), (2, 1)))),
    ("3x3-d2", (1, 6, 9, 40), (3, 3), dict(padding=((2, 1), (0, 2)), dilation=2)),
    ("1d-k3", (2, 13, 19), (3,), dict(padding=1)),
    ("1d-k9", (1, 12, 33), (forward.MAX_TAPS,), dict(padding=((8, 0),))),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("xs", "k", "args"), [c[1:] for c in PLANS], ids=[c[0] for c in PLANS])
def test_plans(xs, k, args, dtype) -> None:
    """What ``direct`` runs: forward (with bias and ReLU6, and without), backward-data
    (data.py's plan; at stride 1 also the forward kernels' with the taps reversed),
    backward-weight; a 1-D problem is the KH = 1 case of the reference."""
    problem = _problem("forward", xs, k, dtype, **args)
    c, taps = xs[-1], math.prod(k)
    geometry = (_as2d(problem, problem.stride, 1),
                _as2d(problem, tuple(lo for lo, _ in problem.padding), 0),
                _as2d(problem, problem.dilation, 1))
    x4_shape = (xs[0], *_as2d(problem, problem.in_size, 1), c)
    y4_shape = (xs[0], *_as2d(problem, problem.out_size, 1), c)
    x = RNG.standard_normal(xs).astype(dtype)
    w = RNG.standard_normal(problem.w_shape("NHWC")).astype(dtype)
    dy = RNG.standard_normal(problem.y_shape("NHWC")).astype(dtype)
    x4, w3, dy4 = x.reshape(x4_shape), w.reshape(c, *_as2d(problem, k, 1)), dy.reshape(y4_shape)
    bias = RNG.standard_normal(c).astype(dtype)
    plan = forward.forward_plan(problem)
    for b, act in ((None, Activation.NONE), (bias, Activation.RELU6)):
        y = plan(x, w, b, int(act))
        assert y.shape == dy.shape
        size = reference.forward(np.abs(x4), np.abs(w3), y4_shape[1:3], *geometry,
                                 None if b is None else np.abs(b))
        assert_bounded(y.reshape(y4_shape), reference.forward(
            x4, w3, y4_shape[1:3], *geometry, b, act), size, taps + 1, f"forward {act!r}")
    backward_data = problem.with_pass("backward_data")
    data_plans = [data.backward_data_plan(backward_data)]
    if problem.stride == (1,) * problem.ndim:
        data_plans.append(forward.backward_data_plan(backward_data))
    else:
        assert forward.backward_data_plan(backward_data) is None
    want = reference.backward_data(dy4, w3, x4_shape[1:3], *geometry)
    size = reference.backward_data(np.abs(dy4), np.abs(w3), x4_shape[1:3], *geometry)
    for data_plan in data_plans:
        dx = data_plan(dy, w)
        assert dx.shape == xs
        assert_bounded(dx.reshape(x4_shape), want, size, taps, type(data_plan).__name__)
    dw = weight.backward_weight_plan(problem.with_pass("backward_weight"))(x, dy)
    assert dw.shape == w.shape
    assert_bounded(dw.reshape(w3.shape), reference.backward_weight(x4, dy4, w3.shape[1:],
                                                                    *geometry),
                   reference.backward_weight(np.abs(x4), np.abs(dy4), w3.shape[1:], *geometry),
                   math.prod(y4_shape[:3]) + ce.get_num_threads(), "backward-weight")


@pytest.mark.parametrize("flip", [False, True])
def test_plan_lays_out_the_taps(flip: bool) -> None:
    """DepthwisePlan.taps: the layout the blocks read (:func:`_taps`), the taps
    reversed for backward-data."""
    c = _lanes(np.float32) + 3
    problem = _problem("forward", (1, 5, 5, c), (2, 3), np.float32, padding=1)
    plan = (forward.backward_data_plan(problem.with_pass("backward_data")) if flip
            else forward.forward_plan(problem))
    w = RNG.standard_normal((c, 2, 3, 1)).astype(np.float32)
    want = w.reshape(c, 6)[:, ::-1].reshape(c, 2, 3) if flip else w.reshape(c, 2, 3)
    np.testing.assert_array_equal(plan.taps(w, np.float32), _taps(want, np.float32))


@pytest.mark.parametrize(("xs", "k"), [((1, 7, 7, 8), (5, 5)), ((1, 20, 8), (10,))],
                         ids=["5x5", "1d-k10"])
def test_more_taps_than_max_taps_go_to_data_py_only(xs, k) -> None:
    """Past MAX_TAPS taps the unrolled kernels serve no pass; data.py's (nothing
    unrolled) serves backward-data."""
    problem = _problem("forward", xs, k, np.float32, padding=2)
    assert forward.forward_plan(problem) is None
    assert forward.backward_data_plan(problem.with_pass("backward_data")) is None
    assert weight.backward_weight_plan(problem.with_pass("backward_weight")) is None
    assert data.backward_data_plan(problem.with_pass("backward_data")) is not None
