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


@pytest.mark.parametrize("scales", ["power_of_two", "random"])
@pytest.mark.parametrize("kind", ["1x1", "3x3", "depthwise"])
def test_qlinearconv_kernels_round_ties_and_near_ties_as_float64(kind, scales):
    """The vector kernels requantize in float32 and recompute in float64 any vector
    with a lane near a tie: with power-of-two multipliers many values are exact ties
    (k + 1/2, rounded to even), with random ones some fall within float32's error of
    one; every value equals onnx.reference's float64 rounding."""
    rng = np.random.default_rng(len(kind) * 7 + len(scales))
    c, o, k, g = {"1x1": (32, 80, 1, 1), "3x3": (16, 64, 3, 1),
                  "depthwise": (64, 64, 3, 64)}[kind]
    x = rng.integers(0, 256, (2, c, 12, 12)).astype(np.uint8)
    w = rng.integers(-128, 128, (o, c // g, k, k)).astype(np.int8)
    if scales == "power_of_two":
        ws = (2.0 ** -rng.integers(6, 11, o)).astype(np.float32)
        xs, ys = np.array(0.5, np.float32), np.array(1.0, np.float32)
    else:
        ws = rng.uniform(1e-3, 2e-2, o).astype(np.float32)
        xs, ys = np.array(0.05, np.float32), np.array(rng.uniform(0.5, 2.0), np.float32)
    xzp, wzp, yzp = np.array(3, np.uint8), np.zeros(o, np.int8), np.array(128, np.uint8)
    bias = rng.integers(-2000, 2000, o).astype(np.int32)
    attrs = dict(pads=[k // 2] * 4, group=g)
    want = _run("QLinearConv", [x, xs, xzp, w, ws, wzp, ys, yzp, bias], attrs,
                TensorProto.UINT8)
    got = qconv(x, xs, xzp, w, ws, wzp, bias, out_scale=ys, out_zero_point=yzp,
                bias_mode="int32", padding=k // 2, groups=g)
    assert_equal_q(got, want, f"{kind} {scales}")
    if scales == "power_of_two":  # the test holds ties to round
        acc = qconv(x, xs, xzp, w, ws, wzp, bias, out_dtype=np.int32, bias_mode="int32",
                    padding=k // 2, groups=g).astype(np.float64)
        mult = (np.float32(xs) * ws / np.float32(ys)).astype(np.float64).reshape(1, -1, 1, 1)
        scaled = acc * mult
        assert np.count_nonzero(scaled - np.floor(scaled) == 0.5) > 20


def _near_ties(count, rng):
    """``count`` (multiplier float32, int32 bias, uint8 x) with ``(x + bias) * mult``
    within 2**-18 of a half-integer in [1, 254] but not on it: float32 (ulp 2**-16
    there) rounds such a value onto the tie, float64 keeps its side."""
    found = []
    while len(found) < count:
        m = rng.uniform(1e-3, 4e-3, 4096).astype(np.float32)
        b = np.rint(rng.uniform(1.0, 250.0, 4096) / m).astype(np.int32)
        x = np.arange(256)
        v = (x[:, None] + b[None].astype(np.float64)) * m[None].astype(np.float64)
        off = np.abs(v - np.floor(v) - 0.5)
        i, j = np.nonzero((off > 0) & (off < 2.0 ** -18) & (v > 1) & (v < 254))
        found += [(m[jj], b[jj], x[ii]) for ii, jj in zip(i, j, strict=True)]
    return found[:count]


@pytest.mark.parametrize("kind", ["1x1", "depthwise"])
def test_qlinearconv_kernels_keep_float64s_side_of_near_ties(kind):
    """Values that float32 would round onto a tie and then to even, where float64's
    value lies on one side of it: every one as onnx.reference rounds it."""
    rng = np.random.default_rng(5)
    o = 32
    mult, bias, xs_ = (np.array(v) for v in zip(*_near_ties(o, rng), strict=True))
    one = np.array(1.0, np.float32)
    if kind == "1x1":  # output channel i reads channel 0 of pixel i
        x = rng.integers(0, 256, (1, 4, 1, o)).astype(np.uint8)
        x[0, 0, 0] = xs_
        w = np.zeros((o, 4, 1, 1), np.int8)
        w[:, 0] = 1
        g = 1
    else:  # the centre tap of channel i
        x = rng.integers(0, 256, (1, o, 3, 3)).astype(np.uint8)
        x[0, :, 1, 1] = xs_
        w = np.zeros((o, 1, 3, 3), np.int8)
        w[:, 0, 1, 1] = 1
        g = o
    k = w.shape[-1]
    xzp, wzp, yzp = np.array(0, np.uint8), np.zeros(o, np.int8), np.array(0, np.uint8)
    want = _run("QLinearConv", [x, one, xzp, w, mult, wzp, one, yzp, bias],
                dict(pads=[k // 2] * 4, group=g), TensorProto.UINT8)
    got = qconv(x, one, xzp, w, mult, wzp, bias, out_scale=one, out_zero_point=yzp,
                bias_mode="int32", padding=k // 2, groups=g)
    assert_equal_q(got, want, kind)
    exact = (xs_ + bias.astype(np.float64)) * mult.astype(np.float64)
    to_even = np.rint(np.float32(exact))  # what float32 alone would give
    assert np.count_nonzero(to_even != np.rint(exact)) > 5  # cases that tell them apart


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}d-g{c[9]}-pc{int(c[13])}")
def test_convinteger_matches_onnx_reference(case):
    rng = np.random.default_rng(case[4] * 17 + case[3])
    x, xzp, w, wzp, ws, attrs, geo = _sample(case, rng)
    want = _run("ConvInteger", [x, w, xzp, wzp], attrs, TensorProto.INT32)
    got = qconv(x, 1.0, xzp, w, 1.0, wzp, out_dtype=np.int32, **geo)
    assert got.dtype == np.int32
    assert_equal_q(got, want, "ConvInteger")
