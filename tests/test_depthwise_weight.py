"""Depthwise backward-weight kernels (``algorithms/depthwise_weight.py``) against the
float64 reference, through ``direct`` (which uses their plan when there is one).

Compilation dominates the runtime: the cases share a few kernel shapes (KH, KW, width
stride, width dilation), each compiled once per dtype and serial/parallel variant."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import convengine as ce
from convengine import api
from convengine.algorithms.depthwise import weight as depthwise_weight
from oracle import assert_close

# (id, x shape NHWC, kernel, conv args, dtype, threads)
CASES = [
    ("3x3-pad1", (3, 9, 11, 17), (3, 3), dict(padding=1), "float32", 1),
    ("3x3-pad1-threads", (3, 9, 11, 17), (3, 3), dict(padding=1), "float32", 2),
    ("3x3-pad1-f64", (1, 12, 9, 33), (3, 3), dict(padding=1), "float64", 2),
    ("3x3-nopad-144", (1, 6, 7, 144), (3, 3), dict(padding=0), "float32", 2),
    ("3x3-s2-asym", (3, 7, 8, 33), (3, 3), dict(stride=2, padding=((1, 0), (2, 1))),
     "float32", 2),
    ("3x3-s2-asym-f64", (1, 9, 10, 17), (3, 3), dict(stride=2, padding=((0, 1), (1, 0))),
     "float64", 1),
    ("3x3-dil2-asym", (1, 10, 9, 16), (3, 3), dict(padding=((2, 1), (0, 2)), dilation=2),
     "float32", 1),
    ("3x3-dil2-f64-threads", (3, 8, 12, 7), (3, 3), dict(padding=2, dilation=2), "float64",
     2),
    ("1x1", (3, 6, 5, 144), (1, 1), {}, "float64", 2),
    ("1x1-single-channel", (1, 4, 4, 1), (1, 1), {}, "float64", 1),
    ("3x1", (1, 8, 6, 7), (3, 1), dict(padding=((1, 0), (0, 0))), "float32", 2),
    ("1x3-s2", (3, 5, 9, 16), (1, 3), dict(stride=2, padding=(0, 1)), "float64", 1),
    ("tiny-1x1-image", (1, 1, 1, 1), (3, 3), dict(padding=1), "float32", 2),
    ("tiny-2x3-image-pad-beyond-reach", (3, 2, 3, 7), (3, 3), dict(padding=4), "float64", 1),
    ("pad-beyond-reach-s2", (1, 2, 3, 144), (3, 3), dict(stride=2, padding=3), "float32", 2),
    ("1d-k3", (3, 20, 33), (3,), dict(padding=1), "float32", 2),
    ("1d-k3-s2-pad-beyond-reach", (1, 6, 17), (3,), dict(stride=2, padding=((4, 2),)),
     "float64", 1),
    ("1d-k1-tiny", (3, 1, 7), (1,), {}, "float64", 2),
]


@pytest.fixture
def threads(request, monkeypatch):
    """Run with request.param numba threads, the parallel kernel from 2 threads on
    (SERIAL_MACS 0) and bands of a few rows (so tasks take several); restored after."""
    previous = ce.get_num_threads()
    monkeypatch.setattr(depthwise_weight, "SERIAL_MACS", 0)
    monkeypatch.setattr(depthwise_weight, "BAND_BYTES", 4096)
    depthwise_weight._backward_weight_plan.cache_clear()
    api._CALLS.clear()  # remembered calls hold their plans
    ce.set_num_threads(request.param)
    yield request.param
    ce.set_num_threads(previous)
    depthwise_weight._backward_weight_plan.cache_clear()
    api._CALLS.clear()  # remembered calls hold their plans


def _problem(xs, k, args):
    w = np.zeros((xs[-1], *k, 1), np.float32)
    problem = ce.explain(np.zeros(xs, np.float32), w, layout="NHWC", groups=xs[-1],
                         **args).problem
    return dataclasses.replace(problem, pass_="backward_weight")


@pytest.mark.parametrize(
    ("xs", "k", "args", "dtype", "threads"), [c[1:] for c in CASES],
    ids=[c[0] for c in CASES], indirect=["threads"])
def test_depthwise_backward_weight(xs, k, args, dtype, threads) -> None:
    rng = np.random.default_rng(len(xs) * 1000 + xs[-1] * 10 + threads)
    problem = _problem(xs, k, args)
    x = rng.standard_normal(xs).astype(dtype)
    dy = rng.standard_normal(problem.y_shape("NHWC")).astype(dtype)
    w_shape = problem.w_shape("NHWC")
    plan = depthwise_weight.backward_weight_plan(problem)
    assert plan is not None, "not served by depthwise_weight.py"
    rows = problem.batch * (problem.out_size[0] if len(k) == 2 else 1)
    assert plan.args[-1] == min(threads, rows)  # partial sums: one per task
    kw = dict(args, layout="NHWC", groups=xs[-1])
    got = ce.conv_backward_weight(x, dy, w_shape, algo="direct", **kw)
    ref = ce.conv_backward_weight(x.astype(np.float64), dy.astype(np.float64), w_shape,
                                  algo="reference", **kw)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, ref, dtype, "dw")
    # the plan itself, and direct's reported workspace (the partial sums)
    assert_close(plan(x, dy), ref, dtype, "plan")
    workspace = plan.args[-1] * int(np.prod(k)) * xs[-1] * x.itemsize
    assert plan.workspace_bytes(x.itemsize) == workspace
    explanation = ce.explain(x, dy, w_shape, pass_="backward_weight", **kw)
    assert explanation.workspace_bytes["direct"] == workspace


def test_depthwise_backward_weight_nchw_and_nonfinite() -> None:
    """NCHW input goes through the same kernels; NaN and inf in dy propagate (as
    through the reference: out-of-range x reads as 0, and 0 * inf is NaN)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 17, 9, 11)).astype(np.float32)  # NCHW
    dy = rng.standard_normal((3, 17, 9, 11)).astype(np.float32)
    kw = dict(padding=1, groups=17)
    ref = ce.conv_backward_weight(x.astype(np.float64), dy.astype(np.float64), (17, 1, 3, 3),
                                  algo="reference", **kw)
    assert_close(ce.conv_backward_weight(x, dy, (17, 1, 3, 3), algo="direct", **kw), ref,
                 "float32", "nchw")
    dy[1, 5, 4, 4] = np.nan
    dy[2, 9, 0, 0] = np.inf
    got = ce.conv_backward_weight(x, dy, (17, 1, 3, 3), algo="direct", **kw)
    ref = ce.conv_backward_weight(x.astype(np.float64), dy.astype(np.float64), (17, 1, 3, 3),
                                  algo="reference", **kw)
    assert np.isnan(got[5]).all()
    assert np.isinf(got[9, 0, 1, 1])
    assert np.isfinite(np.delete(got, [5, 9], axis=0)).all()
    assert_close(got, ref, "float32", "non-finite")


def test_depthwise_backward_weight_declines() -> None:
    """Kernels over MAX_TAPS taps, channel multipliers, grouped convs and 3-D problems
    go to the generic loops, which still give the right answer."""
    assert depthwise_weight.backward_weight_plan(_problem((1, 6, 6, 4), (5, 5), {})) is None
    grouped = ce.explain(np.zeros((1, 6, 6, 4), np.float32), np.zeros((4, 3, 3, 2), np.float32),
                         layout="NHWC", groups=2).problem
    multiplier = ce.explain(np.zeros((1, 6, 6, 4), np.float32),
                            np.zeros((8, 3, 3, 1), np.float32), layout="NHWC", groups=4).problem
    volume = ce.explain(np.zeros((1, 4, 4, 4, 4), np.float32),
                        np.zeros((4, 3, 3, 3, 1), np.float32), layout="NHWC", groups=4).problem
    for problem in (grouped, multiplier, volume):
        problem = dataclasses.replace(problem, pass_="backward_weight")
        assert depthwise_weight.backward_weight_plan(problem) is None
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 6, 5)).astype(np.float32)
    dy = rng.standard_normal((2, 5, 4, 5)).astype(np.float32)
    kw = dict(padding=1, groups=5, layout="NHWC")
    ref = ce.conv_backward_weight(x.astype(np.float64), dy.astype(np.float64), (5, 5, 5, 1),
                                  algo="reference", **kw)
    assert_close(ce.conv_backward_weight(x, dy, (5, 5, 5, 1), algo="direct", **kw), ref,
                 "float32", "5x5")


def test_depthwise_backward_weight_runs_small_problems_serially() -> None:
    previous = ce.get_num_threads()
    depthwise_weight._backward_weight_plan.cache_clear()
    try:
        ce.set_num_threads(2)
        small = _problem((1, 7, 7, 960), (3, 3), dict(padding=1))  # 0.42M multiply-adds
        large = _problem((8, 14, 14, 576), (3, 3), dict(padding=1))  # 8.1M
        strided = _problem((1, 56, 56, 144), (3, 3), dict(stride=2, padding=1))  # 1.8 MB of x
        assert depthwise_weight.backward_weight_plan(small).args[-1] == 1
        assert depthwise_weight.backward_weight_plan(large).args[-1] == 2
        assert depthwise_weight.backward_weight_plan(strided).args[-1] == 2
    finally:
        ce.set_num_threads(previous)
        depthwise_weight._backward_weight_plan.cache_clear()
