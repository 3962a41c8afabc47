"""Bit-exactness against ONNX's reference implementation (onnx extra):
QLinearConv (int32 bias, ``bias_mode="int32"``) and ConvInteger (``out_dtype=int32``).

onnx.reference applies per-channel scales and zero points with 2-D broadcasting,
so per-channel cases are 2-D; per-tensor cases cover 1-D and 3-D.
"""

from __future__ import annotations

import numpy as np
import pytest

from convengine import qconv

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

NP_TO_ONNX = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def _run(op, inputs, attrs, out_type):
    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    node = helper.make_node(op, [n for n in names], ["y"], **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in zip(names, inputs, strict=True) if v is not None
    ]
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_tensor_value_info("y", out_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {n: v for n, v in zip(names, inputs, strict=True) if v is not None}
    return ReferenceEvaluator(model).run(None, feeds)[0]


def assert_equal_q(got, want, what=""):
    got, want = np.asarray(got).astype(np.int64), np.asarray(want).astype(np.int64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{what}: {len(bad)} of {got.size} differ; first at "
                           f"{tuple(bad[0])}: {got[tuple(bad[0])]} != {want[tuple(bad[0])]}")


CASES = [
    # ndim, N, C, O, size, K, stride, pad, dil, groups, x dtype, w dtype, y dtype, per_channel
    (2, 2, 8, 16, 7, 3, 1, 1, 1, 1, np.uint8, np.int8, np.uint8, True),
    (2, 1, 6, 12, 8, 3, 2, 0, 2, 2, np.int8, np.int8, np.int8, True),
    (2, 1, 8, 8, 6, 3, 1, 1, 1, 8, np.uint8, np.uint8, np.uint8, False),
    (1, 2, 4, 6, 12, 3, 2, 1, 1, 1, np.uint8, np.int8, np.int8, False),
    (3, 1, 4, 6, 5, 2, 1, 1, 1, 2, np.int8, np.uint8, np.uint8, False),
]


def _sample(case, rng):
    nd, n, c, o, size, k, s, p, d, g, xdt, wdt, ydt, per_channel = case
    xi, wi = np.iinfo(xdt), np.iinfo(wdt)
    x = rng.integers(xi.min, xi.max + 1, (n, c, *(size,) * nd)).astype(xdt)
    w = rng.integers(wi.min, wi.max + 1, (o, c // g, *(k,) * nd)).astype(wdt)
    shape = (o,) if per_channel else ()
    wzp = rng.integers(wi.min // 8 + (wi.max // 2 if wi.min == 0 else 0),
                       wi.max // 8 + (wi.max // 2 if wi.min == 0 else 0), shape).astype(wdt)
    ws = rng.uniform(1e-3, 2e-2, shape).astype(np.float32)
    xzp = np.array(rng.integers(xi.min, xi.max + 1), xdt)
    attrs = dict(strides=[s] * nd, pads=[p] * (2 * nd), dilations=[d] * nd, group=g)
    geo = dict(stride=s, padding=p, dilation=d, groups=g)
    return x, xzp, w, wzp, ws, attrs, geo


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}d-g{c[9]}-pc{int(c[13])}")
def test_qlinearconv_matches_onnx_reference(case):
    rng = np.random.default_rng(case[4] * 31 + case[2])
    x, xzp, w, wzp, ws, attrs, geo = _sample(case, rng)
    ydt = case[12]
    xs = np.array(0.05, np.float32)
    ys = np.array(rng.uniform(0.05, 0.5), np.float32)
    yzp = np.array(rng.integers(np.iinfo(ydt).min, np.iinfo(ydt).max + 1), ydt)
    bias = rng.integers(-20000, 20000, w.shape[0]).astype(np.int32)
    for b in (bias, None):
        want = _run("QLinearConv", [x, xs, xzp, w, ws, wzp, ys, yzp, b], attrs,
                    NP_TO_ONNX[ydt])
        got = qconv(x, xs, xzp, w, ws, wzp, b, out_scale=ys, out_zero_point=yzp,
                    out_dtype=ydt, bias_mode="int32", **geo)
        assert_equal_q(got, want, f"QLinearConv bias={b is not None}")


def test_qlinearconv_ties():
    """acc * multiplier exactly k + 1/2 (multiplier 0.5): both round half to even."""
    x = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    w = np.ones((1, 1, 1, 1), np.int8)
    args = [x, np.array(0.5, np.float32), np.array(128, np.uint8), w, np.array(1.0, np.float32),
            np.array(0, np.int8), np.array(1.0, np.float32), np.array(128, np.uint8), None]
    want = _run("QLinearConv", args, {}, TensorProto.UINT8)
    got = qconv(*args[:6], out_scale=1.0, out_zero_point=128, bias_mode="int32")
    assert_equal_q(got, want, "ties")
    assert got[0, 0, 0, 1] == np.rint(-127 * 0.5) + 128  # -63.5 -> -64


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}d-g{c[9]}-pc{int(c[13])}")
def test_convinteger_matches_onnx_reference(case):
    rng = np.random.default_rng(case[4] * 17 + case[3])
    x, xzp, w, wzp, ws, attrs, geo = _sample(case, rng)
    want = _run("ConvInteger", [x, w, xzp, wzp], attrs, TensorProto.INT32)
    got = qconv(x, 1.0, xzp, w, 1.0, wzp, out_dtype=np.int32, **geo)
    assert got.dtype == np.int32
    assert_equal_q(got, want, "ConvInteger")
