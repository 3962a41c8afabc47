"""The tests' oracle: convengine's float64 reference algorithm, plus comparison helpers.

Every helper here raises on mismatch (shapes, NaN pattern or values).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import convengine as ce
from convengine._host import FEATURES

DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}

# max |actual - expected| / max(1, max |expected|), per input dtype, with float32
# accumulation for the three narrow types (inputs rounded to the dtype first, so the
# tolerance covers accumulation and the final rounding of the output).
TOLERANCE = {"float64": 1e-11, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


# Where the CPU lacks AVX512-VNNI, PyTorch's fbgemm and ONNX Runtime's MLAS multiply
# uint8 x int8 with vpmaddubsw, which saturates each pair's sum to int16: on full-range
# weights they depart from exact integer arithmetic (convengine does not; the tests
# against onnx.reference and the int64 reference cover full range). Tests comparing
# bytes with them draw int8 weights from INT8_WEIGHTS there: |w| <= 64 keeps every pair
# sum (255 * 64 * 2) inside int16.
PEERS_SATURATE = not FEATURES.get("avx512vnni")
INT8_WEIGHTS = (-64, 65) if PEERS_SATURATE else (-128, 128)  # [low, high) of rng.integers


def random(rng: np.random.Generator, shape, dtype: str = "float64") -> np.ndarray:
    return rng.standard_normal(shape).astype(DTYPES[dtype])


def as_f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def assert_close(actual, expected, dtype: str, what: str = "") -> None:
    """Raise unless actual matches the float64 expectation within dtype's tolerance."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape} != expected {expected.shape}")
    a, e = as_f64(actual), as_f64(expected)
    if not np.array_equal(np.isnan(a), np.isnan(e)):
        raise AssertionError(f"{what}: NaN pattern differs from the reference")
    finite = np.isfinite(e)
    if not np.array_equal(a[~finite], e[~finite], equal_nan=True):
        raise AssertionError(f"{what}: non-finite values differ from the reference")
    if not finite.any():
        return
    scale = max(1.0, float(np.abs(e[finite]).max()))
    err = float(np.abs(a[finite] - e[finite]).max()) / scale
    if not err <= TOLERANCE[dtype]:
        raise AssertionError(f"{what}: relative error {err:.3g} > {TOLERANCE[dtype]:.3g} ({dtype})")


def reference(pass_: str, a, b, shape_or_bias=None, **kw) -> np.ndarray:
    """The pass computed by the reference algorithm from float64 copies of a, b."""
    kw = {**kw, "algo": "reference"}
    if pass_ == "forward":
        bias = None if shape_or_bias is None else as_f64(shape_or_bias)
        return ce.conv(as_f64(a), as_f64(b), bias, **kw)
    if pass_ == "backward_data":
        return ce.conv_backward_data(as_f64(a), as_f64(b), shape_or_bias, **kw)
    if pass_ == "backward_weight":
        return ce.conv_backward_weight(as_f64(a), as_f64(b), shape_or_bias, **kw)
    if pass_ == "transpose":
        bias = kw.pop("bias", None)
        return ce.conv_transpose(as_f64(a), as_f64(b), bias, **kw)
    raise ValueError(pass_)
