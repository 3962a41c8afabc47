"""The int8 dense family (``quant/dense/``) against its reference, bit for bit.

- Drivers: each path (portable, AVX2, VNNI where the level has them) x epilogue
  (REQUANT_FLOAT, REQUANT_INT32, RAW) x ReLU through ``qconv`` against
  :mod:`convengine.quant.dense.reference`, on a grouped shape whose tiles are whole
  and partial (72 channels: a 64-column block and a narrow one; rows not a multiple
  of the tile's).
- The reference against the test suite's independent formula (tests/test_quant_conv's
  ``ref_acc``, ``ref_requant``).
"""

from __future__ import annotations

import numpy as np
import pytest

import convengine as ce
from convengine import qconv
from convengine.epilogue_codes import Epilogue
from convengine.quant import HAS_VNNI
from convengine.quant.cpu import HAS_AVX2
from convengine.quant.dense import reference
from convengine.quant.numerics import Requant, requant_params
from test_quant_conv import assert_equal_q, ref_acc, ref_requant

RNG = np.random.default_rng(42)
PATHS = ["portable"] + (["avx2"] if HAS_AVX2 else []) + (["vnni"] if HAS_VNNI else [])
MODES = {Epilogue.REQUANT_FLOAT: "float", Epilogue.REQUANT_INT32: "int32",
         Epilogue.RAW: "int32"}
VARIANTS = [(m, relu) for m in MODES for relu in (False, True) if not (relu and m == Epilogue.RAW)]


def run_qconv(x: np.ndarray, xzp: int, w: np.ndarray, stride: tuple, padding: tuple,
              groups: int, path: str, mode: Epilogue, relu: bool,
              algo: str) -> tuple[np.ndarray, np.ndarray, Requant, np.dtype]:
    """``qconv`` of x ``(N, H, W, C)`` and w ``(O, KH, KW, C // groups)`` on ``path``
    (``algo``: the path, or ``"depthwise"``), random per-channel weight zero points,
    scales and bias for ``mode``; returns y, the weight zero points, the plan's
    :class:`Requant` and y's dtype (uint8, or int32 for RAW)."""
    o = w.shape[0]
    wzp, ws = RNG.integers(-3, 4, o), RNG.uniform(0.004, 0.02, o)
    if mode == Epilogue.REQUANT_FLOAT:
        bias = RNG.standard_normal(o).astype(np.float32)
    else:
        bias = RNG.integers(-30000, 30000, o).astype(np.int32)
    raw = mode == Epilogue.RAW
    out_dtype = np.dtype(np.int32 if raw else np.uint8)
    with ce.config.override(int8_path=path):
        got = qconv(x, 0.05, xzp, w, ws, wzp, bias, out_scale=None if raw else 0.9,
                    out_zero_point=None if raw else 5, out_dtype=out_dtype, relu=relu,
                    bias_mode=MODES[mode], stride=stride, padding=padding, groups=groups,
                    layout="NHWC", algo=algo)
    if raw:
        rq = Requant("raw", np.ones(o, np.float32), bias, 0, 0, 0)
    else:
        rq = requant_params(0.05, ws, 0.9, 5, o, bias, out_dtype=out_dtype, relu=relu,
                            bias_mode=MODES[mode])
    return got, wzp, rq, out_dtype


# ------------------------------------------------------------------------ drivers


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("mode,relu", VARIANTS, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("path", PATHS)
def test_driver_equals_reference(path: str, mode: Epilogue, relu: bool, x_dtype: type) -> None:
    info = np.iinfo(x_dtype)
    x = RNG.integers(info.min, info.max + 1, (2, 7, 9, 24)).astype(x_dtype)
    w = RNG.integers(-128, 128, (72, 3, 3, 12)).astype(np.int8)
    xzp = 7 if x_dtype == np.uint8 else -3
    got, wzp, rq, out_dtype = run_qconv(x, xzp, w, (1, 1), (1, 1), 2, path, mode, relu, path)
    want = reference.conv(x, xzp, w, wzp, rq, mode, out_dtype, (1, 1), (1, 1), (1, 1), 2)
    assert_equal_q(got, want, f"{path} {mode.name} relu={relu}")


# ---------------------------------------------------------------------- reference


def formula(acc: np.ndarray, mode: Epilogue) -> tuple[Requant, np.ndarray, np.dtype]:
    """A random :class:`Requant` for ``mode`` over the int64 sums ``acc (..., O)`` and
    what test_quant_conv's formula makes of them: (rq, y, y's dtype)."""
    o = acc.shape[-1]
    if mode == Epilogue.RAW:
        bias = RNG.integers(-2**31, 2**31, o).astype(np.int32)
        rq = Requant("raw", np.ones(o, np.float32), bias, 0, 0, 0)
        return rq, ((acc + bias + 2**31) % 2**32 - 2**31).astype(np.int32), np.dtype(np.int32)
    wsc = RNG.uniform(0.004, 0.02, o)
    bias = (RNG.standard_normal(o).astype(np.float32) if mode == Epilogue.REQUANT_FLOAT
            else RNG.integers(-30000, 30000, o).astype(np.int32))
    rq = requant_params(0.05, wsc, 0.9, 5, o, bias, bias_mode=MODES[mode])
    return rq, ref_requant(acc, 0.05, wsc, 0.9, 5, bias, bias_mode=MODES[mode]), np.dtype(np.uint8)


@pytest.mark.parametrize("mode", list(MODES), ids=lambda m: m.name)
def test_reference_is_the_formula(mode: Epilogue) -> None:
    """The reference against test_quant_conv's independent int64 sum and requantization
    (NCHW there): grouped, strided, padded, dilated, 1-D to 3-D."""
    for xs, ws, stride, padding, dilation, groups in (
            ((2, 6, 7, 5), (6, 2, 3, 2), (2, 1), (1, 0), (1, 2), 3),
            ((1, 2, 11), (5, 2, 4), (3,), (2,), (1,), 1),
            ((1, 4, 5, 3, 6), (8, 4, 2, 3, 1), (1, 2, 1), (0, 1, 1), (2, 1, 1), 1)):
        x = RNG.integers(0, 256, xs).astype(np.uint8)
        w = RNG.integers(-128, 128, (ws[0], *ws[2:], ws[1])).astype(np.int8)
        wzp = RNG.integers(-3, 4, w.shape[0])
        acc = ref_acc(x, 9, np.moveaxis(w, -1, 1), wzp, stride, padding, dilation, groups)
        rq, want, out_dtype = formula(np.moveaxis(acc, 1, -1), mode)
        got = reference.conv(np.moveaxis(x, 1, -1), 9, w, wzp, rq, mode, out_dtype, stride,
                             padding, dilation, groups)
        assert_equal_q(got, want, f"{mode.name} {xs}")
