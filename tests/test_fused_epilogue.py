"""convengine.fused_epilogue against the same steps in float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from convengine import fused_epilogue


def _expected(y, bias, residual, activation):
    v = y.astype(np.float64) + bias
    if residual is not None:
        v = v + residual
    if activation == "relu":
        v = np.where(v < 0, 0.0, v)
    elif activation == "relu6":
        v = np.clip(v, 0.0, 6.0)
    elif activation == "silu":
        v = v / (1.0 + np.exp(-v))
    return v


@pytest.mark.parametrize("activation", fused_epilogue.ACTIVATIONS)
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_float64(activation, with_residual):
    rng = np.random.default_rng(5)
    y = (rng.standard_normal((37, 24)) * 4).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    residual = rng.standard_normal((37, 24)).astype(np.float32) if with_residual else None
    expected = _expected(y, bias, residual, activation)
    fused_epilogue.apply(y, bias, residual, activation)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)


def test_nan_propagates_through_relu():
    y = np.array([[np.nan, -1.0, 2.0]], np.float32)
    fused_epilogue.apply(y, np.zeros(3, np.float32), None, "relu")
    assert np.isnan(y[0, 0]) and y[0, 1] == 0 and y[0, 2] == 2


@pytest.mark.parametrize(("y", "bias", "residual", "activation", "match"), [
    (np.zeros((2, 3), np.float32), np.zeros(3, np.float32), None, "gelu", "activation"),
    (np.zeros((2, 3), np.float64), np.zeros(3, np.float32), None, "relu", "float32"),
    (np.zeros((2, 3), np.float32)[:, ::2], np.zeros(2, np.float32), None, "relu", "C-contiguous"),
    (np.zeros((2, 3), np.float32), np.zeros(4, np.float32), None, "relu", "bias"),
    (np.zeros((2, 3), np.float32), np.zeros(3, np.float32), np.zeros((3, 3), np.float32),
     "relu", "residual"),
])
def test_bad_arguments_are_named(y, bias, residual, activation, match):
    with pytest.raises(ValueError, match=match):
        fused_epilogue.apply(y, bias, residual, activation)
