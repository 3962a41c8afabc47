"""The comparison helper must be able to fail, and the oracle must be right on
hand-computed cases."""

import numpy as np
import pytest

import convengine as ce
from oracle import assert_close


def test_assert_close_fails_on_value_shape_and_nan_differences():
    e = np.array([1.0, 2.0, 3.0])
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(e + 1e-3, e, "float32")
    with pytest.raises(AssertionError, match="shape"):
        assert_close(e[:2], e, "float64")
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(np.array([1.0, np.nan, 3.0]), e, "float64")
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(np.array([1.0, np.inf]), np.array([1.0, -np.inf]), "float64")
    assert_close(e + 1e-7, e, "float32")


def test_reference_matches_hand_computed_1d():
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    w = np.array([[[1.0, 10.0]]])
    y = ce.conv(x, w, padding=((1, 0),), algo="reference")
    np.testing.assert_array_equal(y, [[[10.0, 21.0, 32.0, 43.0]]])
    dx = ce.conv_backward_data(np.ones((1, 1, 2)), w, (1, 1, 4), stride=2, algo="reference")
    np.testing.assert_array_equal(dx, [[[1.0, 10.0, 1.0, 10.0]]])
    dw = ce.conv_backward_weight(x, np.ones((1, 1, 3)), (1, 1, 2), algo="reference")
    np.testing.assert_array_equal(dw, [[[6.0, 9.0]]])


def test_reference_matches_hand_computed_grouped_2d():
    x = np.arange(2 * 3 * 3, dtype=np.float64).reshape(1, 2, 3, 3)
    w = np.stack([np.ones((1, 2, 2)), 2 * np.ones((1, 2, 2))])  # depthwise, 2 groups
    y = ce.conv(x, w, groups=2, algo="reference")
    expected = np.array([[[[8.0, 12.0], [20.0, 24.0]], [[2 * 44.0, 2 * 48.0], [2 * 56.0, 2 * 60.0]]]])
    np.testing.assert_array_equal(y, expected)
