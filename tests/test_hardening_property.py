"""Seeded property test (issue 19): one or two malformed arguments at a time, drawn for
every public call (conv, both gradients, conv_transpose, qconv). Each call either
returns the float64 reference's result or raises ConvSetupError / TypeError /
ValueError whose message names one of those arguments, within a second."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import convengine as ce

RNG = np.random.default_rng(1919)
X = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
W = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
DY = RNG.standard_normal((1, 8, 3, 3)).astype(np.float32)  # conv(X, W) output
WT = RNG.standard_normal((4, 2, 3, 3)).astype(np.float32)  # conv_transpose weight
XQ = RNG.integers(0, 255, (1, 4, 5, 5)).astype(np.uint8)
WQ = RNG.integers(-60, 60, (8, 4, 3, 3)).astype(np.int8)

INTS = [0, -1, 10**6, 2**40, 2**62, 1.5, float("nan"), "2", None, True, [1], [1, 2, 3],
        (1, "a"), {}, np.int64(2), (2, 1), np.array([1, 1])]
PADDINGS = [*INTS, "bogus", "same", "valid", "same_lower", ((1, 2), (0, 1)),
            ((1, 2, 3), (0, 1)), [[-1, 0], [0, 0]]]
LAYOUTS = ["NHWC", "nchw", "NCWH", 3, None, ""]
ALGOS = ["bogus", None, 3, "", "AUTO", "1x1", "blocked"]  # none can serve these calls
SHAPES = ["1455", (1.7, 4.2, 5.9, 5.5), ("1", "4", "5", "5"), {1: 2}, (1, 4, float("nan"), 5),
          (1, 4, 5), (1, 4, 5, 5, 5), (0, 4, 5, 5), (1, -4, 5, 5), (1, 3, 5, 5), (1, 4, 5, 6),
          (1, 4, 10**6, 10**6), (np.int64(1), 4, 5, 5), None, 5, (1, 4, 6, 6)]


def _arrays(good: np.ndarray) -> list[Any]:
    """Hostile stand-ins for one float operand (some valid: NaN inside, a zero batch)."""
    nan = good.copy()
    nan.flat[0] = np.nan
    return [good.astype(str), good.astype(object), good.astype(np.int32),
            good.astype(np.complex64), good > 0, good[0], good[..., :0], good[:0],
            good.astype(np.float64), good.tolist(), np.float32(1), None, nan, "x"]


FLOAT_CALLS: dict[str, tuple[Any, tuple[Any, ...], dict[str, list[Any]]]] = {
    "conv": (ce.conv, (X, W), {
        "x": _arrays(X), "w": _arrays(W), "stride": INTS, "padding": PADDINGS,
        "dilation": INTS, "groups": INTS, "layout": LAYOUTS, "algo": ALGOS,
        "bias": [np.zeros(7, np.float32), np.zeros(8, str), np.zeros(8, int), "b",
                 np.full(8, np.nan, np.float32), [0.5] * 8]}),
    "conv_backward_data": (ce.conv_backward_data, (DY, W, X.shape), {
        "dy": _arrays(DY), "w": _arrays(W), "input_shape": SHAPES, "stride": INTS,
        "padding": PADDINGS, "dilation": INTS, "groups": INTS, "layout": LAYOUTS,
        "algo": ALGOS}),
    "conv_backward_weight": (ce.conv_backward_weight, (X, DY, W.shape), {
        "x": _arrays(X), "dy": _arrays(DY), "weight_shape": [(8, *s[1:]) for s in SHAPES
                                                            if isinstance(s, tuple)] + SHAPES,
        "stride": INTS, "padding": PADDINGS, "dilation": INTS, "groups": INTS,
        "layout": LAYOUTS, "algo": ALGOS}),
    "conv_transpose": (ce.conv_transpose, (X, WT), {
        "x": _arrays(X), "w": _arrays(WT), "stride": INTS, "padding": PADDINGS,
        "output_padding": [*INTS, 1], "dilation": INTS, "groups": INTS, "layout": LAYOUTS,
        "algo": ALGOS}),
}
POSITIONAL = {"conv": ("x", "w"), "conv_backward_data": ("dy", "w", "input_shape"),
              "conv_backward_weight": ("x", "dy", "weight_shape"),
              "conv_transpose": ("x", "w")}
# what a message may call an argument by: its name, or the layout it was read in
NAMES = {"layout": ("layout", "NHWC", "NCHW"), "input_shape": ("input_shape", "dy"),
         "weight_shape": ("weight_shape", "dy")}
SCALES = [1e-50, 1e39, 0, -1, float("nan"), float("inf"), "a", None, [0.1, 0.2], 0.05,
          np.float32(0.03), 1e-44]
QCALL = {
    "x_scale": SCALES, "w_scale": [*SCALES, np.full(8, 0.01), np.full(9, 0.01)],
    "out_scale": [*SCALES, 2.0], "x_zero_point": [float("inf"), float("nan"), 300, -1, 2.5,
                                                   "3", None, 3.0, np.int64(7)],
    "w_zero_point": [200, 1.5, np.zeros(9, int), 0, np.full(8, 2)],
    "out_zero_point": [256, -1, None, float("nan"), 5],
    "bias": [np.full(8, np.nan, np.float32), np.full(8, np.inf, np.float32),
             np.zeros(7, np.float32), np.zeros(8, str), np.linspace(-3, 3, 8)],
    "out_dtype": ["float32", np.float64, "int16", np.int8], "x_q": [X, XQ.astype(np.int16),
                                                                    XQ.astype(str), None],
    "w_q": [W, WQ.astype(np.int16), WQ.astype(str)], "stride": INTS, "padding": PADDINGS,
    "dilation": INTS, "groups": INTS, "layout": LAYOUTS,
}
QGOOD: dict[str, Any] = dict(x_q=XQ, x_scale=0.02, x_zero_point=3, w_q=WQ, w_scale=0.01,
                             w_zero_point=0, bias=None, out_scale=0.5, out_zero_point=10,
                             out_dtype=np.uint8)


def _f64(value: Any) -> Any:
    return value.astype(np.float64) if isinstance(value, np.ndarray) and value.dtype == np.float32 else value


def _names_argument(message: str, arg: str) -> bool:
    return any(re.search(rf"(?<![A-Za-z_]){re.escape(n)}(?![A-Za-z_])", message)
               for n in NAMES.get(arg, (arg,)))


def _timed(fn: Any, limit: float | None) -> tuple[Any, BaseException | None]:
    """fn's result or error, and within ``limit`` seconds; a slow first call (numba
    compiling a new specialisation) gets one timed retry."""
    for _attempt in range(2):
        start = time.perf_counter()
        try:
            result, error = fn(), None
        except (ce.ConvSetupError, TypeError, ValueError) as exc:
            result, error = None, exc
        if limit is None or time.perf_counter() - start < limit:
            return result, error
    raise AssertionError(f"took {limit} s or more, twice")


def _float_case(call: str, changes: dict[str, Any], algo: str,
                limit: float | None = 1.0) -> None:
    fn, positional, _ = FLOAT_CALLS[call]
    args = dict(zip(POSITIONAL[call], positional))
    for arg, value in changes.items():
        if arg == "algo":
            algo = value
        else:
            args[arg] = value
    pos = [args.pop(n) for n in POSITIONAL[call]]
    got, error = _timed(lambda: fn(*pos, algo=algo, **args), limit)
    if error is not None:
        assert any(_names_argument(str(error), arg) for arg in changes), (changes, str(error))
        return
    expected = fn(*map(_f64, pos), algo="reference", **{k: _f64(v) for k, v in args.items()})
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def _qexpected(a: dict[str, Any], conv_args: dict[str, Any]) -> np.ndarray:
    """qconv by the float64 reference conv of (x_q - x_zp) and (w_q - w_zp), requantized
    by quant.numerics' float-bias formula."""
    o = a["w_q"].shape[0]
    wzp = np.broadcast_to(np.asarray(a["w_zero_point"], np.float64), (o,))
    w = a["w_q"].astype(np.float64) - wzp.reshape(-1, *(1,) * (a["w_q"].ndim - 1))
    acc = ce.conv(a["x_q"].astype(np.float64) - float(a["x_zero_point"]), w, algo="reference",
                  **conv_args)
    axis = 1 if str(conv_args.get("layout", "NCHW")).upper() == "NCHW" else -1
    shape = [1] * acc.ndim
    shape[axis] = o
    s = (np.float32(a["x_scale"]) * np.broadcast_to(np.asarray(a["w_scale"], np.float32), (o,))
         ).astype(np.float32)
    m = (s / np.float32(a["out_scale"])).astype(np.float32)
    bias = np.zeros(o, np.float32) if a["bias"] is None else np.asarray(a["bias"], np.float32)
    term = (bias / s).astype(np.float32)
    v = np.rint((acc.astype(np.float32) + term.reshape(shape)) * m.reshape(shape))
    lo, hi = (0, 255) if np.dtype(a["out_dtype"]) == np.uint8 else (-128, 127)
    return np.clip(v + np.float32(a["out_zero_point"]), lo, hi).astype(a["out_dtype"])


def _qconv_case(changes: dict[str, Any], limit: float | None = 1.0) -> None:
    a = {**QGOOD}
    conv_args: dict[str, Any] = {}
    for arg, value in changes.items():
        if arg in ("stride", "padding", "dilation", "groups", "layout"):
            conv_args[arg] = value
        else:
            a[arg] = value
    got, error = _timed(lambda: ce.qconv(
        a["x_q"], a["x_scale"], a["x_zero_point"], a["w_q"], a["w_scale"], a["w_zero_point"],
        a["bias"], out_scale=a["out_scale"], out_zero_point=a["out_zero_point"],
        out_dtype=a["out_dtype"], **conv_args), limit)
    if error is not None:
        assert any(_names_argument(str(error), arg) for arg in changes), (changes, str(error))
        return
    np.testing.assert_array_equal(got, _qexpected(a, conv_args))


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    """First calls compile; the property test times the calls after them."""
    for algo in ("reference", "im2col"):
        for call in FLOAT_CALLS:
            _float_case(call, {"stride": 1}, algo, limit=None)
    _qconv_case({"stride": 1}, limit=None)
    _qconv_case({"out_dtype": np.int8}, limit=None)


@seed(19)
@settings(max_examples=800, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_malformed_arguments_give_the_reference_or_a_named_error(data):
    call = data.draw(st.sampled_from([*FLOAT_CALLS, "qconv"]), label="call")
    table = QCALL if call == "qconv" else FLOAT_CALLS[call][2]
    names = data.draw(st.lists(st.sampled_from(sorted(table)), min_size=1, max_size=2,
                               unique=True), label="arguments")
    changes = {arg: data.draw(st.sampled_from(table[arg]), label=arg) for arg in names}
    if call == "qconv":
        _qconv_case(changes)
    else:
        _float_case(call, changes, data.draw(st.sampled_from(["reference", "im2col"])))
