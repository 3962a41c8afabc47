"""convengine.onnx against onnx's own reference implementation (ReferenceEvaluator)
over the attribute space the backend node tests leave thin: every auto_pad, asymmetric
pads, output_shape larger and smaller than the natural size, groups, 1-D and 3-D, the
quantized operators per channel, and a model through run_model."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import convengine.onnx as ceo  # noqa: E402

OPSET = [helper.make_opsetid("", 21)]


def _reference(node, inputs):
    """onnx.reference's outputs for one node."""
    names = [n for n in node.input if n]
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs, strict=True)],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in node.output],
    )
    model = helper.make_model(graph, opset_imports=OPSET)
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs, strict=True)))


def assert_same(actual, expected, rtol=1e-5, atol=1e-5):
    """Raise unless shapes, dtypes and values agree (exactly for integers)."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
        if np.issubdtype(e.dtype, np.integer):
            np.testing.assert_array_equal(a, e)
        else:
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


def test_assert_same_can_fail():
    with pytest.raises(AssertionError):
        assert_same([np.zeros(3, np.float32)], [np.array([0, 0, 1e-3], np.float32)])
    with pytest.raises(AssertionError):
        assert_same([np.zeros(3, np.int32)], [np.array([0, 0, 1], np.int32)])


def _rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CONV = [
    pytest.param((1, 2, 7, 6), (3, 2, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
                 id="same_upper-stride2"),
    pytest.param((1, 2, 7, 6), (3, 2, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 1]},
                 id="same_lower"),
    pytest.param((2, 2, 6, 6), (2, 2, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]},
                 id="valid"),
    pytest.param((1, 4, 6, 7), (4, 2, 3, 3),
                 {"pads": [2, 0, 1, 3], "group": 2, "dilations": [2, 1], "kernel_shape": [3, 3]},
                 id="asym-pads-groups-dilation"),
    pytest.param((1, 3, 9), (2, 3, 4), {"auto_pad": "SAME_UPPER", "dilations": [2]},
                 id="1d-same-dilated"),
    pytest.param((1, 2, 4, 5, 4), (2, 1, 2, 3, 2), {"pads": [1, 0, 0, 0, 2, 1], "group": 2},
                 id="3d-asym"),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV)
def test_conv_attributes(x_shape, w_shape, attrs):
    rng = np.random.default_rng(0)
    inputs = [_rand(rng, x_shape), _rand(rng, w_shape), _rand(rng, (w_shape[0],))]
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    assert_same(ceo.run_node(node, inputs), _reference(node, inputs))


def naive_conv_transpose(x, w, b, stride, dilation, groups, begin, length):
    """ConvTranspose by definition: x[i] * w[k] lands at i * stride + k * dilation - begin,
    kept when inside the output of spatial size ``length``. float64, loops."""
    cig, cog = x.shape[1] // groups, w.shape[1]
    y = np.zeros((x.shape[0], cog * groups, *length))
    for i in np.ndindex(*x.shape[2:]):
        for k in np.ndindex(*w.shape[2:]):
            j = tuple(a * s + c * d - bg for a, c, s, d, bg in
                      zip(i, k, stride, dilation, begin, strict=True))
            if not all(0 <= jj < n for jj, n in zip(j, length, strict=True)):
                continue
            for g in range(groups):
                xs = x[(slice(None), slice(g * cig, (g + 1) * cig), *i)].astype(np.float64)
                ws = w[(slice(g * cig, (g + 1) * cig), slice(None), *k)].astype(np.float64)
                y[(slice(None), slice(g * cog, (g + 1) * cog), *j)] += xs @ ws
    return (y + b.reshape(-1, *(1,) * len(length))).astype(x.dtype)


# x shape, w shape, attributes, (begin, length) of the output window worked out by hand
# from the spec and onnx.reference, whether onnx.reference itself can run the case
CONV_T = [
    pytest.param((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]},
                 ([0, 0], [10, 8]), True, id="output_shape-larger"),
    pytest.param((1, 2, 4, 4), (2, 1, 3, 3), {"strides": [2, 2], "output_shape": [6, 7]},
                 ([0, 0], [6, 7]), False, id="output_shape-smaller"),
    pytest.param((1, 2, 3, 4), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
                 ([0, 0], [6, 8]), True, id="same_upper"),
    pytest.param((1, 2, 3, 4), (2, 3, 2, 4), {"strides": [2, 3], "auto_pad": "SAME_LOWER"},
                 ([0, 1], [6, 12]), True, id="same_lower"),
    pytest.param((1, 4, 3, 3), (4, 1, 3, 2),
                 {"strides": [2, 3], "pads": [1, 0, 2, 1], "output_padding": [1, 2], "group": 2},
                 ([1, 0], [5, 9]), False, id="asym-pads-output_padding-groups"),
    pytest.param((1, 2, 4, 3), (2, 2, 2, 2), {"dilations": [2, 3], "pads": [0, 1, 1, 0]},
                 ([0, 1], [5, 5]), True, id="dilated"),
    pytest.param((2, 1, 5), (1, 2, 3), {"strides": [2], "output_shape": [12], "pads": [1, 0]},
                 ([1], [12]), False, id="1d-output_shape-with-pads"),
    pytest.param((1, 2, 2, 3, 2), (2, 1, 2, 2, 2), {"strides": [2, 1, 2], "auto_pad": "VALID"},
                 ([0, 0, 0], [4, 4, 4]), True, id="3d-valid"),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs,window,reference_runs", CONV_T)
def test_conv_transpose_attributes(x_shape, w_shape, attrs, window, reference_runs):
    rng = np.random.default_rng(1)
    groups = attrs.get("group", 1)
    inputs = [_rand(rng, x_shape), _rand(rng, w_shape), _rand(rng, (w_shape[1] * groups,))]
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    actual = ceo.run_node(node, inputs)
    ndim = len(x_shape) - 2
    stride, dilation = attrs.get("strides", [1] * ndim), attrs.get("dilations", [1] * ndim)
    assert_same(actual, [naive_conv_transpose(*inputs, stride, dilation, groups, *window)])
    if reference_runs:  # onnx.reference's col2im and group split fail on the others
        assert_same(actual, _reference(node, inputs))


def _quantized_or_skip():
    pytest.importorskip("convengine.quant", reason="convengine.quant (qconv) not available")


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_conv_integer_per_channel(x_dtype):
    _quantized_or_skip()
    rng = np.random.default_rng(2)
    info = np.iinfo(x_dtype)
    x = rng.integers(info.min, info.max + 1, (1, 4, 6, 5)).astype(x_dtype)
    w = rng.integers(-128, 128, (6, 2, 3, 3)).astype(np.int8)
    xzp = np.array(7 if x_dtype == np.uint8 else -3, x_dtype)
    wzp = rng.integers(-5, 5, 6).astype(np.int8)
    node = helper.make_node("ConvInteger", ["x", "w", "xzp", "wzp"], ["y"], group=2,
                            pads=[1, 0, 0, 2], strides=[1, 2])
    assert_same(ceo.run_node(node, [x, w, xzp, wzp]), _reference(node, [x, w, xzp, wzp]))


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.slow
def test_qlinear_conv_per_channel(x_dtype):
    _quantized_or_skip()
    rng = np.random.default_rng(3)
    info = np.iinfo(x_dtype)
    x = rng.integers(info.min, info.max + 1, (2, 3, 7, 6)).astype(x_dtype)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    inputs = [
        x, np.array(0.02, np.float32), np.array(info.min + 100, x_dtype),
        w, rng.uniform(0.005, 0.02, 4).astype(np.float32), np.zeros(4, np.int8),
        np.array(0.15, np.float32), np.array(info.min + 120, x_dtype),
        rng.integers(-2000, 2000, 4).astype(np.int32),
    ]
    names = ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "b"]
    node = helper.make_node("QLinearConv", names, ["y"], auto_pad="SAME_UPPER", strides=[2, 2])
    assert_same(ceo.run_node(node, inputs), _reference(node, inputs))


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 1]},
    {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "dilations": [2, 1], "auto_pad": "SAME_UPPER", "strides": [2, 1]},
    {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"},
], ids=["pads", "ceil_mode", "same_upper-dilated", "same_lower"])
def test_max_pool(attrs):
    x = _rand(np.random.default_rng(4), (2, 3, 7, 8))
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    assert_same(ceo.run_node(node, [x]), _reference(node, [x]))


def _small_cnn(rng):
    """Conv-BN-Relu-MaxPool, a SAME conv with a residual Add, Mul, pooling and a Gemm."""
    init = {
        "w1": _rand(rng, (4, 3, 3, 3)), "b1": _rand(rng, (4,)),
        "scale": rng.uniform(0.5, 1.5, 4).astype(np.float32), "shift": _rand(rng, (4,)),
        "mean": _rand(rng, (4,)), "var": rng.uniform(0.5, 2, 4).astype(np.float32),
        "w2": _rand(rng, (4, 4, 2, 2)), "half": np.array(0.5, np.float32),
        "wt": _rand(rng, (4, 8, 2, 2)),
        "gw": _rand(rng, (5, 8)), "gb": _rand(rng, (5,)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], ["bn"],
                         epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], auto_pad="SAME_LOWER"),
        helper.make_node("Add", ["c2", "p1"], ["s"]),
        helper.make_node("Mul", ["s", "half"], ["m"]),
        helper.make_node("ConvTranspose", ["m", "wt"], ["t"], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["t"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1, alpha=0.5, beta=2.0),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(v, k) for k, v in init.items()],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def test_run_model_small_cnn(tmp_path):
    rng = np.random.default_rng(5)
    model = _small_cnn(rng)
    onnx.checker.check_model(model)
    path = tmp_path / "small_cnn.onnx"
    onnx.save(model, path)
    x = _rand(rng, (2, 3, 8, 8))
    expected = ReferenceEvaluator(model).run(None, {"x": x})
    assert_same(ceo.run_model(path, [x]), expected, rtol=1e-4, atol=1e-5)
    assert_same(ceo.run_model(model, {"x": x}), expected, rtol=1e-4, atol=1e-5)


def test_unsupported_operators_say_so():
    node = helper.make_node("LSTM", ["x"], ["y"])
    with pytest.raises(NotImplementedError, match="LSTM .* not supported"):
        ceo.run_node(node, [np.zeros((1, 3), np.float32)])
    bn = helper.make_node("BatchNormalization", list("xsbmv"), ["y"], training_mode=1)
    with pytest.raises(NotImplementedError, match="training_mode"):
        ceo.run_node(bn, [np.zeros((1, 2, 2), np.float32)] + [np.ones(2, np.float32)] * 4)


def test_attribute_errors_name_the_attribute():
    x, w = np.zeros((1, 2, 5, 5), np.float32), np.zeros((3, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match="kernel_shape"):
        ceo.run_node(helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[2, 2]), [x, w])
    with pytest.raises(ValueError, match="pads"):
        ceo.run_node(helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1]), [x, w])
    with pytest.raises(ValueError, match="auto_pad"):
        ceo.run_node(helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME"), [x, w])
