"""Each int8 micro-kernel variant against :mod:`convengine.quant.reference`, bit for
bit: dense path (portable, AVX2, VNNI where the CPU has it) and depthwise (portable,
AVX2, VNNI) x epilogue (REQUANT_FLOAT, REQUANT_INT32, RAW) x ReLU, on shapes whose
tiles are whole and partial (72 channels: a 64-column block and a narrow one; rows
not a multiple of the tile's). The reference itself is checked against the test
suite's independent formula (tests/test_quant_conv's ``ref_acc``, ``ref_requant``)."""

from __future__ import annotations

import numpy as np
import pytest

import convengine as ce
from convengine import qconv
from convengine.epilogue_codes import Epilogue
from convengine.quant import HAS_VNNI, reference
from convengine.quant.cpu import HAS_AVX2
from convengine.quant.numerics import Requant, requant_params
from test_quant_conv import assert_equal_q, ref_acc, ref_requant

RNG = np.random.default_rng(42)
PATHS = ["portable"] + (["avx2"] if HAS_AVX2 else []) + (["vnni"] if HAS_VNNI else [])
MODES = {Epilogue.REQUANT_FLOAT: "float", Epilogue.REQUANT_INT32: "int32",
         Epilogue.RAW: "int32"}
VARIANTS = [(m, relu) for m in MODES for relu in (False, True) if not (relu and m == Epilogue.RAW)]

# (x NHWC, w (O, KH, KW, C // g), stride, padding, groups)
DENSE = ((2, 7, 9, 24), (72, 3, 3, 12), (1, 1), (1, 1), 2)
DEPTHWISE = ((2, 9, 11, 40), (40, 3, 3, 1), (2, 1), (1, 1), 40)


def _operands(shape: tuple, x_dtype: type) -> tuple:
    xs, ws, stride, padding, groups = shape
    info = np.iinfo(x_dtype)
    x = RNG.integers(info.min, info.max + 1, xs).astype(x_dtype)
    w = RNG.integers(-128, 128, ws).astype(np.int8)
    o = ws[0]
    return x, w, RNG.integers(-3, 4, o), RNG.uniform(0.004, 0.02, o), stride, padding, groups


def _case(shape: tuple, path: str, mode: Epilogue, relu: bool, x_dtype: type) -> None:
    x, w, wzp, ws, stride, padding, groups = _operands(shape, x_dtype)
    o = w.shape[0]
    xzp = 7 if x_dtype == np.uint8 else -3
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
                    layout="NHWC", algo="depthwise" if groups == x.shape[-1] else path)
    if raw:
        rq = Requant("raw", np.ones(o, np.float32), bias, 0, 0, 0)
    else:
        rq = requant_params(0.05, ws, 0.9, 5, o, bias, out_dtype=out_dtype, relu=relu,
                            bias_mode=MODES[mode])
    want = reference.conv(x, xzp, w, wzp, rq, mode, out_dtype, stride, padding, (1, 1), groups)
    assert_equal_q(got, want, f"{path} {mode.name} relu={relu}")


@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("mode,relu", VARIANTS, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("path", PATHS)
def test_dense_kernel_equals_reference(path: str, mode: Epilogue, relu: bool,
                                       x_dtype: type) -> None:
    _case(DENSE, path, mode, relu, x_dtype)


@pytest.mark.parametrize("mode,relu", VARIANTS, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("path", PATHS)  # depthwise's portable, AVX2 and VNNI kernels
def test_depthwise_kernel_equals_reference(path: str, mode: Epilogue, relu: bool) -> None:
    _case(DEPTHWISE, path, mode, relu, np.uint8)


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
        o = w.shape[0]
        wzp, wsc = RNG.integers(-3, 4, o), RNG.uniform(0.004, 0.02, o)
        last = np.moveaxis(x, 1, -1)
        acc = ref_acc(x, 9, np.moveaxis(w, -1, 1), wzp, stride, padding, dilation, groups)
        acc = np.moveaxis(acc, 1, -1)
        if mode == Epilogue.RAW:
            bias = RNG.integers(-2**31, 2**31, o).astype(np.int32)
            rq = Requant("raw", np.ones(o, np.float32), bias, 0, 0, 0)
            want = ((acc + bias + 2**31) % 2**32 - 2**31).astype(np.int32)
            out_dtype = np.dtype(np.int32)
        else:
            bias = (RNG.standard_normal(o).astype(np.float32) if mode == Epilogue.REQUANT_FLOAT
                    else RNG.integers(-30000, 30000, o).astype(np.int32))
            rq = requant_params(0.05, wsc, 0.9, 5, o, bias, bias_mode=MODES[mode])
            want = ref_requant(acc, 0.05, wsc, 0.9, 5, bias, bias_mode=MODES[mode])
            out_dtype = np.dtype(np.uint8)
        got = reference.conv(last, 9, w, wzp, rq, mode, out_dtype, stride, padding, dilation,
                             groups)
        assert_equal_q(got, want, f"{mode.name} {xs}")
