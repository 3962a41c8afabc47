"""Hostile input (issue 19): sizes refused before anything is allocated, ``auto`` serving
every valid problem, shape arguments checked, not coerced, and qconv's scales checked in
the float32 the kernels compute in. Each case of the issue is a regression test here;
the seeded property test over malformed arguments is in test_hardening_property.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

import convengine as ce

RNG = np.random.default_rng(19)
X = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
W = RNG.standard_normal((16, 2, 2, 2)).astype(np.float32)


def _f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def _fast(call, *args, **kwargs):
    """Run ``call``; the error it raises, within a second."""
    start = time.perf_counter()
    with pytest.raises((ce.ConvSetupError, TypeError, ValueError)) as info:
        call(*args, **kwargs)
    assert time.perf_counter() - start < 1.0
    return str(info.value)


# ------------------------------------------------------------------ 1. sizes


@pytest.mark.parametrize("tuning", ["off", "on"])
def test_gigantic_padding_refused_before_allocating(tuning, tmp_path, monkeypatch):
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    previous = ce.set_tuning(tuning)
    try:
        message = _fast(ce.conv, X, W, padding=10**6)
        assert "padding" in message and "MAX_ELEMENTS" in message and "elements" in message
        message = _fast(ce.conv, X, W, padding=2**62)
        assert "padding" in message and "MAX_ELEMENTS" in message
        wt = RNG.standard_normal((2, 3, 2, 2)).astype(np.float32)
        message = _fast(ce.conv_transpose, X, wt, stride=10**6)
        assert "stride" in message and "MAX_ELEMENTS" in message
    finally:
        ce.set_tuning(previous)


def test_huge_stride_and_dilation_values_refused():
    assert "stride" in _fast(ce.conv, X, W, stride=2**40)
    assert "dilation" in _fast(ce.conv, X, W, dilation=2**40, padding=2**30)


def test_limit_is_configurable(monkeypatch):
    x = RNG.standard_normal((1, 2, 9, 9)).astype(np.float32)  # y (1, 16, 8, 8): 1,024 values
    with ce.config.override(max_elements=100):
        assert "the output y" in _fast(ce.conv, x, W, padding=0, stride=1, algo="reference")
    monkeypatch.setenv("CONVENGINE_MAX_ELEMENTS", "100")
    assert "the output y" in _fast(ce.conv, x, W, padding=0, stride=1, algo="reference")


# ------------------------------------------------------------------ 2. no hang


def test_huge_weight_shape_refused_without_walking_its_taps():
    dy = np.zeros((1, 1, 3, 3), np.float32)
    message = _fast(ce.conv_backward_weight, X, dy, (1, 2, 10**6, 10**6), padding=500000,
                    algo="flat_gemm")
    assert "weight_shape" in message and "MAX_ELEMENTS" in message


# ------------------------------------------------------------------ 3. auto serves


def _every_algorithm_serves_or_refuses(pass_: str, call, a, b, extra, expected, **kwargs):
    """Every registered algorithm either refuses (ConvSetupError naming the limit or its
    rule) or returns ``expected`` (float64 reference); auto returns it too."""
    served = []
    for name in ce.list_algorithms(pass_):
        try:
            got = call(a, b, *extra, algo=name, **kwargs)
        except ce.ConvSetupError:
            continue
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=name)
        served.append(name)
    assert "reference" in served and len(served) >= 2
    np.testing.assert_allclose(call(a, b, *extra, **kwargs), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tuning", ["off", "on"])
def test_auto_serves_huge_padding_with_huge_stride(tuning, tmp_path, monkeypatch):
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    previous = ce.set_tuning(tuning)
    try:
        args = dict(padding=10**6, stride=10**6)
        y_ref = ce.conv(_f64(X), _f64(W), algo="reference", **args)
        assert y_ref.shape == (1, 16, 3, 3)
        _every_algorithm_serves_or_refuses("forward", ce.conv, X, W, (), y_ref, **args)
        dy = RNG.standard_normal(y_ref.shape).astype(np.float32)
        dx_ref = ce.conv_backward_data(_f64(dy), _f64(W), X.shape, algo="reference", **args)
        _every_algorithm_serves_or_refuses("backward_data", ce.conv_backward_data, dy, W,
                                           (X.shape,), dx_ref, **args)
        dw_ref = ce.conv_backward_weight(_f64(X), _f64(dy), W.shape, algo="reference", **args)
        _every_algorithm_serves_or_refuses("backward_weight", ce.conv_backward_weight, X, dy,
                                           (W.shape,), dw_ref, **args)
    finally:
        ce.set_tuning(previous)


def test_blocked_refuses_a_padded_copy_over_the_limit():
    explanation = ce.explain(X, W, padding=10**6, stride=10**6)
    assert "MAX_ELEMENTS" in explanation.refused["blocked"]
    assert explanation.chosen != "blocked"


def test_reference_does_not_materialise_padding():
    """Padding 10**8 around a 4x4 input: a padded copy would need 1.6e17 values."""
    y = ce.conv(X, W, padding=10**8, stride=10**8, algo="reference")
    expected = np.zeros((1, 16, 3, 3))
    # only the centre output meets x: taps (k, l) read x at (k*1 - 0 ...) - check by hand
    for o in range(16):
        expected[0, o, 1, 1] = 0.0  # window starts at 10**8 - 10**8 = 0: taps x[:, 0:2, 0:2]
        expected[0, o, 1, 1] = np.sum(_f64(X[0, :, 0:2, 0:2]) * _f64(W[o]))
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ 4. shape arguments

DY = np.zeros((1, 16, 3, 3), np.float32)


@pytest.mark.parametrize("shape", [
    "1399", b"1244", (1.7, 3.2, 9.9, 9.5), ("1", "3", "9", "9"), {1: 2, 3: 4},
    (1, 3, float("nan"), 9), (1, 2, True, 4), 1244, None, np.array([[1, 2], [4, 4]]),
])
def test_input_shape_must_be_a_sequence_of_ints(shape):
    message = _fast(ce.conv_backward_data, DY, W, shape)
    assert "input_shape" in message
    message = _fast(ce.conv_backward_weight, X, DY, shape)
    assert "weight_shape" in message


def test_numpy_integer_shapes_are_accepted():
    shape = (np.int64(1), np.int32(2), np.uint8(4), np.int16(4))
    dx = ce.conv_backward_data(DY + 1, W, shape)
    expected = ce.conv_backward_data(_f64(DY + 1), _f64(W), (1, 2, 4, 4), algo="reference")
    np.testing.assert_allclose(dx, expected, rtol=1e-5, atol=1e-5)
    dw = ce.conv_backward_weight(X, DY + 1, np.array(W.shape))
    expected = ce.conv_backward_weight(_f64(X), _f64(DY + 1), W.shape, algo="reference")
    np.testing.assert_allclose(dw, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ 5. string arrays


@pytest.mark.parametrize("bad", [
    np.full((1, 2, 4, 4), "a"), np.zeros((1, 2, 4, 4), object), np.zeros((1, 2, 4, 4), "S3"),
    [[["a", "b"]]],
])
def test_string_and_object_arrays_name_the_argument_and_the_dtypes(bad):
    message = _fast(ce.conv, bad, W)
    assert "x.dtype" in message and "float32" in message
    message = _fast(ce.conv, X, bad)
    assert "w.dtype" in message and "float32" in message
    message = _fast(ce.conv_backward_data, bad, W, X.shape)
    assert "dy.dtype" in message


# ------------------------------------------------------------------ 6. qconv scales

XQ = RNG.integers(0, 255, (1, 4, 5, 5)).astype(np.uint8)
WQ = RNG.integers(-100, 100, (8, 4, 3, 3)).astype(np.int8)
QARGS = dict(x_scale=0.02, x_zero_point=3, w_scale=0.01, w_zero_point=0, bias=None,
             out_scale=0.5, out_zero_point=10)


def _qconv(**changes):
    a = {**QARGS, **changes}
    return ce.qconv(XQ, a["x_scale"], a["x_zero_point"], WQ, a["w_scale"], a["w_zero_point"],
                    a["bias"], out_scale=a["out_scale"], out_zero_point=a["out_zero_point"])


@pytest.mark.parametrize(("changes", "names"), [
    ({"x_scale": 1e-50}, ["x_scale", "1e-50"]),
    ({"w_scale": 1e39}, ["w_scale", "1e+39"]),
    ({"out_scale": 1e-50}, ["out_scale", "1e-50"]),
    ({"out_scale": 1e-44}, ["out_scale", "1e-44"]),
    ({"x_scale": 1e-20, "w_scale": 1e-20}, ["x_scale * w_scale", "1e-20"]),
    ({"w_scale": np.full(8, 1e-39)}, ["w_scale"]),
    ({"bias": np.full(8, np.nan, np.float32)}, ["bias", "nan"]),
    ({"bias": np.full(8, np.inf, np.float32)}, ["bias", "inf"]),
    ({"x_zero_point": float("inf")}, ["x_zero_point", "inf"]),
    ({"x_zero_point": float("nan")}, ["x_zero_point", "nan"]),
    ({"x_zero_point": 300}, ["x_zero_point", "300"]),
    ({"w_zero_point": np.full(8, 200)}, ["w_zero_point", "200"]),
])
def test_qconv_scales_checked_in_float32_and_messages_show_the_value(changes, names):
    message = _fast(_qconv, **changes)
    for name in names:
        assert name in message, (name, message)


def test_qconv_valid_scales_match_the_float64_reference():
    """A float-mode requantized qconv against the exact accumulator of the float64
    reference conv, requantized by the formula in quant.numerics."""
    got = _qconv(bias=np.linspace(-1, 1, 8).astype(np.float32))
    acc = ce.conv(XQ.astype(np.float64) - 3, WQ.astype(np.float64), algo="reference")
    s = np.float32(np.float32(0.02) * np.float32(0.01))
    m = np.float32(s / np.float32(0.5))
    bias = (np.linspace(-1, 1, 8).astype(np.float32) / s).astype(np.float32)
    v = np.rint((acc.astype(np.float32) + bias[None, :, None, None]) * m) + np.float32(10)
    np.testing.assert_array_equal(got, np.clip(v, 0, 255).astype(np.uint8))


def test_tuner_records_failures_when_every_candidate_fails():
    """Issue 19: with every candidate failing, tuning ended in ``max() arg is an empty
    sequence``; now each failure is recorded and nothing is chosen."""
    from convengine.registry import Algorithm
    from convengine.tune import bench

    def fails(problem, a, b):
        raise MemoryError("Unable to allocate 14.6 TiB")

    problem = ce.explain(X, W).problem
    candidates = [Algorithm(name, "forward", fails, lambda p: None) for name in ("a", "b")]
    results = bench.benchmark(problem, candidates)
    assert set(results) == {"a", "b"}
    assert all("MemoryError" in r["error"] or "14.6 TiB" in r["error"] for r in results.values())


def test_qconv_depthwise_with_padding_far_wider_than_x_goes_dense():
    """The depthwise kernels fill a row buffer as wide as the padded input (10**8
    columns took 144 s); such problems take the dense path, with the same result."""
    x = RNG.integers(0, 255, (1, 16, 4, 4)).astype(np.uint8)
    w = RNG.integers(-50, 50, (16, 1, 3, 3)).astype(np.int8)
    args = dict(stride=10**8, padding=10**8, groups=16)
    ce.qconv(x, 0.02, 3, w, 0.01, 0, None, out_scale=0.5, out_zero_point=10, **args)  # compiled
    start = time.perf_counter()
    got = ce.qconv(x, 0.02, 3, w, 0.01, 0, None, out_scale=0.5, out_zero_point=10, **args)
    assert time.perf_counter() - start < 5.0
    acc = ce.conv(x.astype(np.float64) - 3, w.astype(np.float64), algo="reference", **args)
    m = np.float32(np.float32(0.02) * np.float32(0.01)) / np.float32(0.5)
    expected = np.clip(np.rint(acc.astype(np.float32) * m) + np.float32(10), 0, 255)
    np.testing.assert_array_equal(got, expected.astype(np.uint8))
    assert "row buffer" in _fast(ce.qconv, x, 0.02, 3, w, 0.01, 0, None, out_scale=0.5,
                                 out_zero_point=10, algo="depthwise", **args)


def test_depthwise_padding_far_wider_than_x_leaves_direct():
    """direct's depthwise buffers span the padded width an output row reads (padding
    10**7: 5.5 s a call); such problems go elsewhere, with the reference's result."""
    x = RNG.standard_normal((1, 16, 4, 4)).astype(np.float32)
    w = RNG.standard_normal((16, 1, 3, 3)).astype(np.float32)
    args = dict(padding=10**7, stride=10**7, groups=16)
    explanation = ce.explain(x, w, **args)
    assert "DEPTHWISE_MAX_WORKSPACE" in explanation.refused["direct"]
    ce.conv(x, w, **args)  # compiled
    start = time.perf_counter()
    got = ce.conv(x, w, **args)
    assert time.perf_counter() - start < 1.0
    expected = ce.conv(_f64(x), _f64(w), algo="reference", **args)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
