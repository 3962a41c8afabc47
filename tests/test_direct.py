"""The ``direct`` algorithm against the float64 reference, all passes, odd shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import convengine as ce
from convengine import api

# max |got - ref| / (1 + max |ref|) allowed per input dtype
TOLERANCE = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-2}

# (id, x shape NCHW, w shape, conv args)
CASES = [
    ("dense-3x3-pad1", (2, 5, 9, 11), (6, 5, 3, 3), dict(padding=1)),
    ("groups3-stride-dil-asym", (2, 6, 9, 11), (6, 2, 3, 2),
     dict(stride=(2, 1), padding=((1, 0), (2, 1)), dilation=(1, 2), groups=3)),
    ("depthwise-mult2-stride2", (2, 6, 9, 11), (12, 1, 3, 3), dict(stride=2, padding=1, groups=6)),
    ("depthwise-3x3", (2, 16, 9, 11), (16, 1, 3, 3), dict(padding=1, groups=16)),
    ("depthwise-5x5-dil2", (1, 8, 12, 10), (8, 1, 5, 5), dict(padding=4, dilation=2, groups=8)),
    ("depthwise-big-pad", (1, 4, 3, 4), (4, 1, 3, 3), dict(padding=3, groups=4)),
    ("1d-groups-stride3", (1, 4, 13), (4, 2, 5), dict(stride=3, padding=2, dilation=2, groups=2)),
    ("1d-depthwise-k31", (2, 8, 40), (8, 1, 31), dict(padding=15, groups=8)),
    ("1d-depthwise-k3", (2, 8, 20), (8, 1, 3), dict(padding=1, groups=8)),
    ("depthwise-3x3-dil2-asym", (1, 16, 10, 9), (16, 1, 3, 3),
     dict(padding=((2, 1), (0, 2)), dilation=2, groups=16)),
    ("3d-dense", (1, 3, 5, 6, 7), (4, 3, 3, 2, 3), dict(stride=(1, 2, 2), padding=1)),
    ("3d-depthwise-mult2", (1, 4, 5, 6, 7), (8, 1, 3, 3, 3),
     dict(stride=(1, 2, 1), padding=1, groups=4)),
    ("1x1-stride2", (2, 7, 6, 5), (3, 7, 1, 1), dict(stride=2)),
    ("kernel-equals-input", (3, 2, 4, 4), (5, 2, 4, 4), {}),
    ("single-channel", (2, 1, 8, 8), (1, 1, 3, 3), dict(padding=1)),
]


def assert_close(got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    """Fail unless got matches ref (float64) to the dtype's tolerance."""
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == np.dtype(dtype), got.dtype
    err = np.max(np.abs(got.astype(np.float64) - ref), initial=0.0)
    bound = TOLERANCE[dtype] * (1.0 + np.max(np.abs(ref), initial=0.0))
    assert err <= bound, f"max error {err:.3g} > {bound:.3g} ({dtype})"


def test_assert_close_can_fail() -> None:
    ref = np.ones((2, 2))
    with pytest.raises(AssertionError):
        assert_close((ref + 1e-3).astype(np.float32), ref, "float32")


def _operands(xs, ws, args, dtype, rng):
    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws)
    y_shape = ce.conv(x[:1], w, algo="reference", **args).shape
    dy = rng.standard_normal((xs[0], *y_shape[1:]))
    return x, w, dy, [a.astype(dtype) for a in (x, w, dy)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(("xs", "ws", "args"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_direct_all_passes(xs, ws, args, layout, dtype) -> None:
    rng = np.random.default_rng(abs(hash((xs, ws))) % 2**32)
    x, w, dy, (xd, wd, dyd) = _operands(xs, ws, args, dtype, rng)
    # the reference runs in float64 on the same (rounded) operands
    x64, w64, dy64 = (a.astype(np.float64) for a in (xd, wd, dyd))
    if layout == "NHWC":
        move = lambda a: np.moveaxis(a, 1, -1)  # noqa: E731
        x64, w64, dy64, xd, wd, dyd = map(move, (x64, w64, dy64, xd, wd, dyd))
    kw = dict(args, layout=layout)
    ref = ce.conv(x64, w64, algo="reference", **kw)
    assert_close(ce.conv(xd, wd, algo="direct", **kw), ref, dtype)
    ref = ce.conv_backward_data(dy64, w64, x64.shape, algo="reference", **kw)
    assert_close(ce.conv_backward_data(dyd, wd, xd.shape, algo="direct", **kw), ref, dtype)
    ref = ce.conv_backward_weight(x64, dy64, w64.shape, algo="reference", **kw)
    assert_close(ce.conv_backward_weight(xd, dyd, wd.shape, algo="direct", **kw), ref, dtype)


def test_direct_float16_accumulates_in_float32() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 32, 7, 7)).astype(np.float16)
    w = (rng.standard_normal((8, 32, 3, 3)) / 16).astype(np.float16)
    ref = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1, algo="reference")
    assert_close(ce.conv(x, w, padding=1, algo="direct"), ref, "float16")


def test_adjoint_identity() -> None:
    """<conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)> for a strided grouped conv."""
    rng = np.random.default_rng(7)
    args = dict(stride=2, padding=((2, 1), (0, 1)), dilation=(2, 1), groups=2)
    x = rng.standard_normal((2, 4, 11, 9))
    w = rng.standard_normal((6, 2, 3, 3))
    y = ce.conv(x, w, algo="direct", **args)
    dy = rng.standard_normal(y.shape)
    dx = ce.conv_backward_data(dy, w, x.shape, algo="direct", **args)
    dw = ce.conv_backward_weight(x, dy, w.shape, algo="direct", **args)
    lhs = np.vdot(y, dy)
    assert np.isclose(lhs, np.vdot(x, dx), rtol=1e-12)
    assert np.isclose(lhs, np.vdot(w, dw), rtol=1e-12)


def test_direct_reports_workspace() -> None:
    x = np.zeros((1, 8, 6, 6), np.float32)
    w = np.zeros((4, 8, 3, 3), np.float32)
    explanation = ce.explain(x, w, padding=1)
    assert explanation.workspace_bytes["direct"] == 4 * 8 * 9 * 4


# ------------------------------------------------ depthwise kernels (depthwise.py)

# (id, x shape NCHW, kernel, conv args): every one is served by depthwise.forward_plan
DEPTHWISE = [
    ("c16-3x3", (2, 16, 9, 11), (3, 3), dict(padding=1)),
    ("c1-3x3", (1, 1, 5, 6), (3, 3), dict(padding=1)),
    ("c3-stride2", (3, 3, 13, 8), (3, 3), dict(stride=2, padding=1)),
    ("c17-stride2", (2, 17, 9, 11), (3, 3), dict(stride=2, padding=1)),
    ("c33-dil2-asym", (1, 33, 10, 9), (3, 3), dict(padding=((2, 0), (1, 2)), dilation=2)),
    ("c48-stride21-dil12", (2, 48, 14, 15), (3, 3),
     dict(stride=(2, 1), padding=((0, 1), (1, 0)), dilation=(1, 2))),
    ("c40-unpadded-w13", (1, 40, 6, 13), (3, 3), {}),
    ("c20-2x2", (1, 20, 4, 4), (2, 2), {}),
    ("c4-pad-beyond-kernel", (1, 4, 3, 4), (3, 3), dict(padding=3)),
    ("c8-3x1", (2, 8, 7, 5), (3, 1), dict(padding=(1, 0))),
    ("c20-1x3-rows-beyond", (1, 20, 5, 9), (1, 3), dict(padding=(2, 1))),  # no tap row
    ("c64-w1", (1, 64, 6, 1), (3, 3), dict(padding=1)),
    ("c96-5x1-stride3-row", (1, 96, 1, 23), (1, 5), dict(stride=3, padding=(0, 2))),
    ("1d-c24-k9", (2, 24, 30), (9,), dict(padding=4)),
    ("1d-c7-k3-stride2", (1, 7, 19), (3,), dict(stride=2, padding=((0, 2),), dilation=3)),
]


def _depthwise_case(xs, k, args, dtype, rng):
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((xs[1], 1, *k)).astype(dtype)
    return x, w, dict(args, groups=xs[1])


def _nhwc(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


@pytest.fixture
def depthwise_threads(request, monkeypatch):
    """1: the serial kernel; 2: the parallel kernel with two tasks (however small)."""
    from convengine.algorithms.depthwise import forward as depthwise

    monkeypatch.setattr(depthwise, "SERIAL_MACS", 0)
    previous = ce.get_num_threads()
    ce.set_num_threads(request.param)
    for cached in (depthwise._forward_plan, depthwise._backward_data_plan):
        cached.cache_clear()
    api._CALLS.clear()  # remembered calls hold their plans
    yield request.param
    ce.set_num_threads(previous)
    for cached in (depthwise._forward_plan, depthwise._backward_data_plan):
        cached.cache_clear()
    api._CALLS.clear()  # remembered calls hold their plans


DEPTHWISE_FAST = ("c16-3x3", "c17-stride2", "c40-unpadded-w13", "c64-w1")  # in the fast tier


@pytest.mark.parametrize("depthwise_threads", [1, 2], indirect=True)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("xs", "k", "args"), [
    pytest.param(*c[1:], id=c[0], marks=() if c[0] in DEPTHWISE_FAST else pytest.mark.slow)
    for c in DEPTHWISE])
def test_depthwise_kernels_forward_and_backward_data(xs, k, args, dtype,
                                                      depthwise_threads) -> None:
    from convengine.algorithms.depthwise import forward as depthwise

    rng = np.random.default_rng(abs(hash((xs, k))) % 2**32)
    x, w, kw = _depthwise_case(xs, k, args, dtype, rng)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    problem = ce.explain(_nhwc(x), _nhwc(w), layout="NHWC", **kw).problem
    plan = depthwise.forward_plan(problem)
    assert plan is not None, "not served by depthwise.py"
    rows, channels = plan.y4[0] * plan.y4[1], plan.y4[3]
    parts = (1, 1) if depthwise_threads == 1 else depthwise._split(rows, channels, 2)
    assert plan.args[3:] == parts
    y = ce.conv(x, w, algo="direct", **kw)
    assert_close(y, ce.conv(x64, w64, algo="reference", **kw), dtype)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = ce.conv_backward_data(dy, w, x.shape, algo="direct", **kw)
    ref = ce.conv_backward_data(dy.astype(np.float64), w64, x.shape, algo="reference", **kw)
    assert_close(dx, ref, dtype)


STREAMED = [("c16-3x3", "float32"), ("c48-stride21-dil12", "float32"),
            ("c64-w1", "float32"), ("c40-unpadded-w13", "float64"),
            ("c17-stride2", "float32"), ("c96-5x1-stride3-row", "float32")]


@pytest.mark.parametrize("depthwise_threads", [2], indirect=True)
@pytest.mark.parametrize(("name", "dtype"), STREAMED, ids=[f"{n}-{d}" for n, d in STREAMED])
@pytest.mark.slow
def test_depthwise_streaming_stores_match_the_reference(name, dtype, depthwise_threads,
                                                        monkeypatch) -> None:
    """Every output large enough to stream (threshold 0): y is written with non-temporal
    stores where C fills whole register blocks (NVEC vectors: 64 float32 channels, not
    16, 48 or 17, nor 40 float64, with AVX-512; 16-multiples with AVX2) and the width
    stride is 1 (not stride 3), same results."""
    from convengine.algorithms.depthwise import forward as depthwise

    monkeypatch.setattr(depthwise, "STREAMING_BYTES", 0)
    xs, k, args = next(c[1:] for c in DEPTHWISE if c[0] == name)
    rng = np.random.default_rng(7)
    x, w, kw = _depthwise_case(xs, k, args, dtype, rng)
    problem = ce.explain(_nhwc(x), _nhwc(w), layout="NHWC", **kw).problem
    assert depthwise.forward_plan(problem).streaming == (
        xs[1] * x.itemsize % (depthwise.NVEC * depthwise.VECTOR_BYTES) == 0
        and problem.stride[-1] == 1)
    y = ce.conv(x, w, algo="direct", **kw)
    assert_close(y, ce.conv(x.astype(np.float64), w.astype(np.float64), algo="reference",
                            **kw), dtype)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = ce.conv_backward_data(dy, w, x.shape, algo="direct", **kw)
    ref = ce.conv_backward_data(dy.astype(np.float64), w.astype(np.float64), x.shape,
                                algo="reference", **kw)
    assert_close(dx, ref, dtype)


def test_depthwise_backward_data_uses_the_kernels_at_stride_1_only() -> None:
    from convengine.algorithms.depthwise import forward as depthwise

    x, w = np.zeros((1, 5, 5, 8), np.float32), np.zeros((8, 3, 3, 1), np.float32)
    unit = ce.explain(x, w, padding=1, groups=8, layout="NHWC").problem
    strided = ce.explain(x, w, stride=2, padding=1, groups=8, layout="NHWC").problem
    grouped = ce.explain(x, np.zeros((4, 3, 3, 2), np.float32), padding=1, groups=4,
                         layout="NHWC").problem
    assert depthwise.backward_data_plan(dataclasses.replace(unit, pass_="backward_data"))
    assert depthwise.backward_data_plan(dataclasses.replace(strided, pass_="backward_data")) is None
    assert depthwise.forward_plan(grouped) is None


@pytest.mark.parametrize(("xs", "k", "args"), [c[1:] for c in DEPTHWISE if len(c[1]) == 4],
                         ids=[c[0] for c in DEPTHWISE if len(c[1]) == 4])
def test_depthwise_kernels_match_torch(xs, k, args) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, w, kw = _depthwise_case(xs, k, args, "float32", rng)
    pad = kw.pop("padding", 0)
    if isinstance(pad, tuple) and isinstance(pad[0], tuple):  # torch pads symmetrically
        x = np.pad(x, ((0, 0), (0, 0), *pad))
        pad = 0
    y = ce.conv(_nhwc(x), _nhwc(w), algo="direct", layout="NHWC", padding=pad, **kw)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                          padding=pad, **kw).numpy()
    np.testing.assert_allclose(np.moveaxis(y, -1, 1), expected, rtol=0, atol=2e-5 * (
        1 + np.abs(expected).max()))


@pytest.mark.parametrize("depthwise_threads", [1, 2], indirect=True)
def test_depthwise_reports_its_workspace(depthwise_threads) -> None:
    """The laid-out weights (9 taps x 8 channels, zero-padded to a whole vector: 16
    channels with AVX-512) and one buffer of padded input columns (3 rows x (6 - 1 + 3)
    columns x 8 channels) per task, float32."""
    from convengine.algorithms.depthwise import forward as depthwise

    x = np.zeros((1, 6, 6, 8), np.float32)
    w = np.zeros((8, 3, 3, 1), np.float32)
    explanation = ce.explain(x, w, padding=1, groups=8, layout="NHWC")
    padded = max(8, depthwise.VECTOR_BYTES // 4)
    assert explanation.workspace_bytes["direct"] == (9 * padded
                                                     + depthwise_threads * 3 * 8 * 8) * 4


def test_depthwise_runs_small_problems_on_the_calling_thread() -> None:
    from convengine.algorithms.depthwise import forward as depthwise

    previous = ce.get_num_threads()
    ce.set_num_threads(2)
    try:
        w = np.zeros((144, 3, 3, 1), np.float32)
        for size, parts in ((8, (1, 1)), (56, (2, 1))):  # 0.08M and 4.1M multiply-adds
            x = np.zeros((1, size, size, 144), np.float32)
            problem = ce.explain(x, w, padding=1, groups=144, layout="NHWC").problem
            assert depthwise.forward_plan(problem).args[3:] == parts
    finally:
        ce.set_num_threads(previous)
