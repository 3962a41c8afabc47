"""Depthwise backward-data at strides above 1 (``algorithms/depthwise_data.py``)
against the float64 reference, through ``direct`` (which uses its plan there)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import convengine as ce
from convengine import api, memory
from convengine.algorithms import direct
from convengine.algorithms.depthwise import data as depthwise_data
from convengine.algorithms.depthwise import forward as depthwise
from oracle import assert_close

# (id, x shape NHWC, kernel, conv args, dtype, threads)
CASES = [
    ("3x3-s2-pad1", (3, 9, 11, 17), (3, 3), dict(stride=2, padding=1), "float32", 1),
    ("3x3-s2-pad1-threads", (3, 9, 11, 17), (3, 3), dict(stride=2, padding=1), "float32", 2),
    ("3x3-s2-144-f64", (2, 8, 8, 144), (3, 3), dict(stride=2, padding=1), "float64", 2),
    ("3x3-s2-asym", (3, 7, 8, 33), (3, 3), dict(stride=2, padding=((1, 0), (2, 1))),
     "float32", 2),
    ("3x3-s21-unpadded", (1, 9, 10, 16), (3, 3), dict(stride=(2, 1)), "float64", 1),
    ("3x3-s3-dil2", (2, 13, 12, 7), (3, 3), dict(stride=3, padding=2, dilation=2),
     "float32", 2),
    ("5x5-s2-pad2", (2, 11, 13, 24), (5, 5), dict(stride=2, padding=2), "float32", 2),
    ("2x2-s3-gaps", (1, 8, 9, 5), (2, 2), dict(stride=3), "float64", 1),
    ("1x3-s2", (3, 5, 9, 16), (1, 3), dict(stride=2, padding=(0, 1)), "float64", 2),
    ("pad-beyond-reach-s2", (1, 2, 3, 144), (3, 3), dict(stride=2, padding=3), "float32", 2),
    ("stride-1-pad-beyond-extent", (2, 4, 5, 8), (3, 3), dict(padding=3), "float32", 2),
    ("1d-k31-stride-1", (2, 40, 24), (31,), dict(padding=15), "float32", 2),
    ("tiny-1x1-image-s2", (1, 1, 1, 1), (3, 3), dict(stride=2, padding=1), "float32", 2),
    ("1d-k3-s2", (3, 20, 33), (3,), dict(stride=2, padding=1), "float32", 2),
    ("1d-k3-s2-pad-beyond-reach", (1, 6, 17), (3,), dict(stride=2, padding=((4, 2),)),
     "float64", 1),
]


@pytest.fixture
def threads(request, monkeypatch):
    """Run with request.param numba threads, the parallel kernel from 2 threads on
    (SERIAL_MACS 0); restored after."""
    previous = ce.get_num_threads()
    monkeypatch.setattr(depthwise_data, "SERIAL_MACS", 0)
    depthwise_data._backward_data_plan.cache_clear()
    api._CALLS.clear()  # remembered calls hold their plans
    ce.set_num_threads(request.param)
    yield request.param
    ce.set_num_threads(previous)
    depthwise_data._backward_data_plan.cache_clear()
    api._CALLS.clear()  # remembered calls hold their plans


def _problem(xs, k, args):
    w = np.zeros((xs[-1], *k, 1), np.float32)
    problem = ce.explain(np.zeros(xs, np.float32), w, layout="NHWC", groups=xs[-1],
                         **args).problem
    return dataclasses.replace(problem, pass_="backward_data")


@pytest.mark.parametrize(
    ("xs", "k", "args", "dtype", "threads"), [c[1:] for c in CASES],
    ids=[c[0] for c in CASES], indirect=["threads"])
def test_depthwise_backward_data_gathers(xs, k, args, dtype, threads) -> None:
    rng = np.random.default_rng(len(xs) * 1000 + xs[-1] * 10 + threads)
    problem = _problem(xs, k, args)
    plan = direct.backward_data_plan(problem)
    assert isinstance(plan, depthwise_data.DepthwiseDataPlan), "not served by depthwise_data.py"
    rows = xs[0] * (xs[1] if len(xs) == 4 else 1)
    assert plan.args[-1] == min(threads, rows)
    dy = rng.standard_normal(problem.y_shape("NHWC")).astype(dtype)
    w = rng.standard_normal(problem.w_shape("NHWC")).astype(dtype)
    kw = dict(args, groups=xs[-1], layout="NHWC", algo="direct")
    dx = ce.conv_backward_data(dy, w, xs, **kw)
    assert dx.dtype == dtype and dx.shape == xs
    ref = ce.conv_backward_data(dy.astype(np.float64), w.astype(np.float64), xs,
                                **dict(kw, algo="reference"))
    assert_close(dx, ref, dtype)
    assert dx.ctypes.data % 64 == 0  # starts on a cache line


def test_stride_1_keeps_the_flipped_forward_kernels() -> None:
    problem = _problem((1, 6, 6, 16), (3, 3), dict(padding=1))
    assert isinstance(direct.backward_data_plan(problem), depthwise.DepthwisePlan)


def test_a_pixel_no_tap_reaches_is_zero() -> None:
    """Stride 3 with a 2-tap kernel: every third row and column of dx gets no gradient
    (and must be 0, not whatever the fresh buffer held)."""
    xs, args = (1, 9, 9, 16), dict(stride=3)
    problem = _problem(xs, (2, 2), args)
    dy = np.ones(problem.y_shape("NHWC"), np.float32)
    w = np.ones(problem.w_shape("NHWC"), np.float32)
    for _ in range(3):  # fresh buffers may reuse memory a previous dx filled
        dx = ce.conv_backward_data(dy, w, xs, groups=16, layout="NHWC", algo="direct", **args)
        assert (dx[:, 2::3] == 0).all() and (dx[:, :, 2::3] == 0).all()
        assert (dx[:, ::3, ::3] == 1).all()


def test_workspace_is_reported() -> None:
    problem = _problem((2, 8, 8, 32), (3, 3), dict(stride=2, padding=1))
    explained = ce.explain(np.zeros((2, 4, 4, 32), np.float32),
                           np.zeros((32, 3, 3, 1), np.float32), (2, 8, 8, 32),
                           pass_="backward_data", stride=2, padding=1, groups=32,
                           layout="NHWC", algo="direct")
    plan = direct.backward_data_plan(problem)
    assert plan is not None
    assert explained.workspace_bytes["direct"] == plan.workspace_bytes(4) >= 9 * 32 * 4


@pytest.mark.parametrize("pass_", ["forward", "backward_data_stride_1", "backward_data_stride_2"])
def test_large_outputs_are_written_into_pooled_buffers(pass_, monkeypatch) -> None:
    """Outputs of memory.MIN_BYTES or more (threshold 0 here) are views of a buffer
    from convengine's pool, still on a cache line, same results."""
    given, allocate = [], depthwise.output_buffer

    def spy(count, dtype):
        given.append(allocate(count, dtype))
        return given[-1]

    monkeypatch.setattr(memory, "MIN_BYTES", 0)
    for module in (depthwise_data, depthwise):
        monkeypatch.setattr(module, "output_buffer", spy, raising=True)
    rng = np.random.default_rng(3)
    stride = 2 if pass_.endswith("2") else 1
    xs, args = (2, 9, 10, 48), dict(stride=stride, padding=1, groups=48, layout="NHWC")
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((48, 3, 3, 1)).astype(np.float32)
    if pass_ == "forward":
        out = ce.conv(x, w, algo="direct", **args)
        ref = ce.conv(x.astype(np.float64), w.astype(np.float64), algo="reference", **args)
    else:
        dy = rng.standard_normal(_problem(xs, (3, 3), dict(stride=stride, padding=1))
                                 .y_shape("NHWC")).astype(np.float32)
        out = ce.conv_backward_data(dy, w, xs, algo="direct", **args)
        ref = ce.conv_backward_data(dy.astype(np.float64), w.astype(np.float64), xs,
                                    algo="reference", **args)
    assert_close(out, ref, "float32")
    assert out.ctypes.data % 64 == 0
    raw = given[-1]
    assert raw.size == out.size + 64 // out.itemsize
    assert raw.ctypes.data <= out.ctypes.data < raw.ctypes.data + raw.nbytes
