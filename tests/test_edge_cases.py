"""Odd shapes, empty batches, IEEE specials, strided inputs, layouts and workspace."""

import tracemalloc

import numpy as np
import pytest

import convengine as ce
from convengine import registry
from convengine.algorithms import im2col
from oracle import assert_close, reference

# weird shapes: (x, w, kwargs), NCHW
WEIRD = {
    "kernel-equals-input": ((2, 3, 5, 4), (2, 3, 5, 4), {}),
    "single-output-pixel-stride-bigger-than-input": ((1, 2, 3, 3), (4, 2, 2, 2), dict(stride=5)),
    "stride-bigger-than-kernel": ((2, 3, 11, 9), (4, 3, 2, 2), dict(stride=(4, 3))),
    "padding-bigger-than-kernel": ((1, 2, 4, 3), (3, 2, 2, 2), dict(padding=((3, 0), (0, 4)))),
    "one-channel-one-pixel-1d": ((3, 1, 1), (1, 1, 1), {}),
    "depthwise-multiplier-3": ((2, 4, 7, 6), (12, 1, 3, 3), dict(groups=4, padding=1)),
    "prime-sizes-3d": ((1, 3, 7, 5, 3), (5, 3, 3, 2, 1), dict(stride=(2, 1, 3), dilation=(2, 3, 1))),
    "wide-1d-dilated": ((2, 5, 97), (3, 5, 7), dict(dilation=13, padding="same")),
    "pointwise-strided": ((2, 6, 9, 9), (4, 6, 1, 1), dict(stride=2)),
}


@pytest.mark.parametrize("name", WEIRD)
def test_weird_shapes_every_algorithm(name):
    x_shape, w_shape, kw = WEIRD[name]
    rng = np.random.default_rng(17)
    x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
    expected = reference("forward", x, w, **kw)
    dy = rng.standard_normal(expected.shape).astype(np.float32)
    served = 0
    for algo in ce.list_algorithms("forward"):
        if ce.explain(x, w, **kw).refused.get(algo):
            continue
        assert_close(ce.conv(x, w, **kw, algo=algo), expected, "float32", algo)
        served += 1
    expected_dw = reference("backward_weight", x, dy, w.shape, **kw)
    for algo in ce.list_algorithms("backward_weight"):
        if not ce.explain(x, dy, w.shape, pass_="backward_weight", **kw).refused.get(algo):
            assert_close(ce.conv_backward_weight(x, dy, w.shape, **kw, algo=algo), expected_dw,
                         "float32", algo)
    assert served >= 2


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_zero_batch_gives_empty_results_of_the_right_shape(layout):
    x = np.zeros((0, 3, 6, 6) if layout == "NCHW" else (0, 6, 6, 3), np.float32)
    w = np.ones((4, 3, 3, 3) if layout == "NCHW" else (4, 3, 3, 3), np.float32)
    y_shape = (0, 4, 6, 6) if layout == "NCHW" else (0, 6, 6, 4)
    y = np.zeros(y_shape, np.float32)
    kw = dict(layout=layout, padding=1)
    calls = {
        "forward": (lambda algo: ce.conv(x, w, **kw, algo=algo), y_shape, (x, w)),
        "backward_data": (lambda algo: ce.conv_backward_data(y, w, x.shape, **kw, algo=algo),
                          x.shape, (y, w, x.shape)),
        "backward_weight": (lambda algo: ce.conv_backward_weight(x, y, w.shape, **kw, algo=algo),
                            w.shape, (x, y, w.shape)),
    }
    for pass_, (call, shape, args) in calls.items():
        refused = ce.explain(*args, pass_=pass_, **kw).refused
        for algo in ["auto", *ce.list_algorithms(pass_)]:
            if algo not in refused:
                out = call(algo)
                assert out.shape == shape and out.dtype == np.float32 and not out.any()


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
@pytest.mark.slow
def test_nan_and_inf_propagate_as_ieee_says(special):
    rng = np.random.default_rng(19)
    x = rng.standard_normal((1, 2, 7, 7)).astype(np.float32)
    w = np.abs(rng.standard_normal((3, 2, 3, 3))).astype(np.float32)
    x[0, 1, 3, 3] = special
    expected = reference("forward", x, w, padding=1)
    assert np.isnan(expected).any() or np.isinf(expected).any()
    for algo in ce.list_algorithms("forward"):
        if not ce.explain(x, w, padding=1).refused.get(algo):
            assert_close(ce.conv(x, w, padding=1, algo=algo), expected, "float32", algo)


def test_non_contiguous_and_negatively_strided_inputs():
    rng = np.random.default_rng(23)
    big = rng.standard_normal((4, 6, 20, 18))
    x = big[::2, 1::2, ::-2, 3:]  # strided, negative stride in H
    w = rng.standard_normal((6, 1, 3, 3, 2))[..., 0]  # non-contiguous weight
    assert not x.flags.c_contiguous and not w.flags.c_contiguous
    expected = reference("forward", np.ascontiguousarray(x), np.ascontiguousarray(w), groups=3, padding=1)
    for algo in ce.list_algorithms("forward"):
        if not ce.explain(x, w, groups=3, padding=1).refused.get(algo):
            assert_close(ce.conv(x, w, groups=3, padding=1, algo=algo), expected, "float64", algo)


def test_array_likes_are_accepted():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(29)
    x, w = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    expected = reference("forward", x, w)
    assert_close(ce.conv(torch.tensor(x), torch.tensor(w)), expected, "float64", "torch tensors")
    assert_close(ce.conv(x.tolist(), w.tolist()), expected, "float64", "nested lists")


def test_channels_last_input_reaches_the_kernel_without_a_copy():
    """Contiguous NHWC float32 x is handed to the algorithm as is: no transposes."""
    seen = {}

    def spy_supports(problem):
        return None

    def spy_run(problem, x, w):
        seen["x"], seen["w"] = x, w
        return np.zeros(problem.y_shape("NHWC"), x.dtype)

    registry.register("spy", "forward", supports=spy_supports)(spy_run)
    try:
        x = np.ones((2, 5, 5, 3), np.float32)
        w = np.ones((4, 3, 3, 3), np.float32)
        ce.conv(x, w, layout="NHWC", algo="spy")
        assert seen["x"] is x and seen["w"] is w
        ce.conv(np.moveaxis(x, -1, 1), np.moveaxis(w, -1, 1), layout="NCHW", algo="spy")
        assert seen["x"].flags.c_contiguous and seen["x"].shape == x.shape
    finally:
        registry.unregister("spy", "forward")
    assert "spy" not in ce.list_algorithms("forward")


def test_im2col_workspace_stays_within_its_stated_bound_whatever_the_batch(monkeypatch):
    monkeypatch.setattr(im2col, "WORKSPACE_LIMIT", 256 * 1024)
    rng = np.random.default_rng(31)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    peaks = []
    for batch in (4, 32):
        x = rng.standard_normal((batch, 20, 20, 8)).astype(np.float32)
        problem = ce.explain(x, w.transpose(0, 2, 3, 1), layout="NHWC", padding=1).problem
        bound = im2col._workspace(problem)
        wc = np.ascontiguousarray(w.transpose(0, 2, 3, 1))
        ce.conv(x, wc, layout="NHWC", padding=1, algo="im2col")  # compiles: not workspace
        im2col.release_workspace()  # the call must allocate its column buffer again
        tracemalloc.start()
        y = ce.conv(x, wc, layout="NHWC", padding=1, algo="im2col")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak - y.nbytes <= bound * 1.05, (batch, peak - y.nbytes, bound)
        peaks.append(peak - y.nbytes)
        assert_close(y, reference("forward", x, wc, layout="NHWC", padding=1), "float32", "im2col")
    assert bound < 256 * 1024 + 40 * 1024  # columns + GEMM result of one tile
    assert peaks[1] < 1.5 * peaks[0]  # 8x the batch, about the same workspace


def test_explain_lists_every_algorithm_with_a_verdict_and_workspace():
    x, w = np.zeros((1, 4, 8, 8), np.float32), np.zeros((4, 2, 3, 3), np.float32)
    e = ce.explain(x, w, groups=2, padding=1)
    assert set(e.supported) | set(e.refused) == set(ce.list_algorithms("forward"))
    assert "implicit_gemm" in e.refused and "groups=2" in e.refused["implicit_gemm"]
    assert e.chosen in e.supported and "CHOSEN" in str(e)
    dy = np.zeros((1, 4, 4, 4), np.float32)
    bd = ce.explain(dy, w, (1, 4, 8, 8), pass_="backward_data", stride=2, padding=1, groups=2)
    assert bd.problem.pass_ == "backward_data" and bd.chosen in bd.supported
    t = ce.explain(np.zeros((1, 4, 3, 3), np.float32), np.zeros((4, 2, 3, 3), np.float32),
                   pass_="transpose", stride=2)
    assert t.problem.out_size == (3, 3) and t.problem.in_size == (7, 7)
    assert ce.explain(e.problem).chosen == e.chosen
