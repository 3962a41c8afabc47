"""convengine.onnx's compiled one-pass kernels (QuantizeLinear into channels-last,
QLinearAdd, channels-last MaxPool) against onnx.reference and the numpy forms they
replace, through the operators that use them."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import convengine.onnx as ceo  # noqa: E402
from convengine.onnx import qops  # noqa: E402
from convengine.onnx.ops import is_channels_last, to_first  # noqa: E402

RNG = np.random.default_rng(7)


def _reference(op, inputs, **attrs):
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    return ReferenceEvaluator(node).run(None, dict(zip(names, inputs)))[0]


@pytest.mark.parametrize("channels", [5, 3])  # 3: an RGB image's interleaving loop
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_linear_into_channels_last(dtype, channels):
    scale = np.float32(0.05)
    zp = np.array(3 if dtype == np.uint8 else -2, dtype)
    x = (RNG.standard_normal((2, channels, 6, 7)) * 4).astype(np.float32)
    x[0, 0, 0, :4] = np.array([0.5, 1.5, -2.5, 100.0], np.float32) * scale  # ties, saturation
    (y,) = ceo.run_node(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]),
                        [x, scale, zp])
    assert is_channels_last(y)  # what the next QLinearConv reads without a copy
    np.testing.assert_array_equal(y, _reference("QuantizeLinear", [x, scale, zp]))


@pytest.mark.parametrize("scales", [(0.02, 0.03, 0.04), (0.02, 0.04, 0.04)],
                         ids=["general", "ties"])  # ties: a * 0.5 lands on halves
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("dtypes", [(np.uint8, np.uint8), (np.int8, np.uint8)])
def test_qlinear_add_one_pass_matches_the_numpy_form(layout, dtypes, scales):
    shape = (2, 6, 5, 4)
    a = RNG.integers(0, 256, shape).astype(dtypes[0]) if dtypes[0] == np.uint8 else \
        RNG.integers(-128, 128, shape).astype(dtypes[0])
    b = RNG.integers(0, 256, shape).astype(dtypes[1])
    if layout == "channels_last":
        a, b = (to_first(np.ascontiguousarray(np.moveaxis(v, 1, -1))) for v in (a, b))
    params = [np.float32(scales[0]), np.array(5, a.dtype), np.float32(scales[1]),
              np.array(120, b.dtype), np.float32(scales[2]), np.array(128, np.uint8)]
    a_s, a_zp, b_s, b_zp, c_s, c_zp = params
    (y,) = ceo.run_node(helper.make_node("QLinearAdd", [f"i{k}" for k in range(8)], ["y"],
                                         domain="com.microsoft"),
                        [a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp])
    ra, rb = np.float32(a_s) / np.float32(c_s), np.float32(b_s) / np.float32(c_s)
    fixed = np.float32(c_zp) - (ra * np.float32(a_zp) + rb * np.float32(b_zp))
    expected = qops.saturate(qops._fma32(a, ra, qops._fma32(b, rb, fixed)), np.uint8)
    assert y.shape == shape and is_channels_last(y) == (layout == "channels_last")
    np.testing.assert_array_equal(y, expected)


POOLS = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
]


@pytest.mark.parametrize("attrs", POOLS, ids=range(len(POOLS)))
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_channels_last_max_pool_matches_onnx_reference(attrs, dtype):
    x = (RNG.standard_normal((2, 7, 9, 8)) * 50).astype(np.float32)
    if dtype == np.uint8:
        x = np.clip(x + 128, 0, 255).astype(dtype)
    elif dtype == np.int8:  # the lowest values too: padded taps must not win
        x = np.clip(x, -128, 127).astype(dtype)
        x[0, :, 0, 0] = -128
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    x_last = to_first(np.ascontiguousarray(np.moveaxis(x, 1, -1)))  # as convs leave it
    (y,) = ceo.run_node(node, [x_last])
    assert is_channels_last(y)
    np.testing.assert_array_equal(y, _reference("MaxPool", [x], **attrs))
    if dtype == np.float32:  # NaN propagates, as on the numpy path (NCHW input)
        x[0, 1, 2, 3] = x[1, 0, 0, 0] = np.nan
        x_last = to_first(np.ascontiguousarray(np.moveaxis(x, 1, -1)))
        np.testing.assert_array_equal(ceo.run_node(node, [x_last])[0], ceo.run_node(node, [x])[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_global_average_pool_matches_the_reference(layout, dtype):
    x = RNG.standard_normal((2, 37, 7, 7)).astype(dtype)
    if layout == "channels_last":  # the session's activations: the compiled pass
        x = to_first(np.ascontiguousarray(np.moveaxis(x, 1, -1)))
    (y,) = ceo.run_node(helper.make_node("GlobalAveragePool", ["x"], ["y"]), [x])
    expected = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    assert y.dtype == dtype and y.shape == (2, 37, 1, 1)
    np.testing.assert_allclose(y, expected, rtol=2e-7 if dtype == np.float32 else 1e-15,
                               atol=1e-7 if dtype == np.float32 else 1e-16)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_qlinear_global_average_pool_integer_sums(layout):
    x = RNG.integers(0, 256, (2, 1280, 7, 7)).astype(np.uint8)
    if layout == "channels_last":
        x = to_first(np.ascontiguousarray(np.moveaxis(x, 1, -1)))
    params = [np.float32(0.05), np.array(7, np.uint8), np.float32(0.03), np.array(120, np.uint8)]
    (y,) = ceo.run_node(helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"],
                                         ["y"], domain="com.microsoft"), [x, *params])
    total = x.astype(np.int64).sum(axis=(2, 3), keepdims=True) - 49 * 7
    mult = np.float32(0.05) / (np.float32(0.03) * np.float32(49))
    expected = qops.saturate(total.astype(np.float32) * mult, np.uint8, np.float32(120))
    np.testing.assert_array_equal(y, expected)
