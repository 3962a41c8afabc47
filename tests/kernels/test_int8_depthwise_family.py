"""The int8 depthwise family (``quant/depthwise/``) against its reference, bit for bit.

- Drivers: each path (portable, AVX2, VNNI where the level has them) x epilogue
  (REQUANT_FLOAT, REQUANT_INT32, RAW) x ReLU through ``qconv(algo="depthwise")``
  against :mod:`convengine.quant.depthwise.reference`, on 40 channels (16-lane
  vectors whole and half; AVX2's 8-lane ones whole) and rows of 11 pixels (blocks of
  four and single pixels, edges padded).
- The reference, written per channel, against the test suite's independent formula
  (tests/test_quant_conv's ``ref_acc``, ``ref_requant``) and against the dense
  family's grouped reference at groups == C.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_int8_dense_family import MODES, PATHS, VARIANTS, formula, run_qconv

from convengine.epilogue_codes import Epilogue
from convengine.quant.dense import reference as dense_reference
from convengine.quant.depthwise import reference
from test_quant_conv import assert_equal_q, ref_acc

RNG = np.random.default_rng(43)


@pytest.mark.parametrize("mode,relu", VARIANTS, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("path", PATHS)  # depthwise's portable, AVX2 and VNNI kernels
def test_driver_equals_reference(path: str, mode: Epilogue, relu: bool) -> None:
    x = RNG.integers(0, 256, (2, 9, 11, 40)).astype(np.uint8)
    w = RNG.integers(-128, 128, (40, 3, 3, 1)).astype(np.int8)
    got, wzp, rq, out_dtype = run_qconv(x, 7, w, (2, 1), (1, 1), 40, path, mode, relu,
                                        "depthwise")
    want = reference.conv(x, 7, w, wzp, rq, mode, out_dtype, (2, 1), (1, 1), (1, 1))
    assert_equal_q(got, want, f"{path} {mode.name} relu={relu}")


@pytest.mark.parametrize("mode", list(MODES), ids=lambda m: m.name)
def test_reference_is_the_formula(mode: Epilogue) -> None:
    """The reference against test_quant_conv's int64 sum and requantization (NCHW
    there) and the dense reference: strided, padded (past the kernel's reach too),
    dilated, 1-D to 3-D."""
    for xs, ks, stride, padding, dilation in (
            ((2, 6, 7, 5), (2, 3), (2, 1), (1, 3), (1, 2)),
            ((1, 3, 11), (4,), (3,), (2,), (1,)),
            ((1, 4, 5, 3, 6), (2, 2, 3), (1, 2, 1), (0, 1, 1), (2, 1, 1))):
        x = RNG.integers(0, 256, xs).astype(np.uint8)
        c = xs[1]
        w = RNG.integers(-128, 128, (c, *ks, 1)).astype(np.int8)
        wzp = RNG.integers(-3, 4, c)
        acc = ref_acc(x, 9, np.moveaxis(w, -1, 1), wzp, stride, padding, dilation, c)
        rq, want, out_dtype = formula(np.moveaxis(acc, 1, -1), mode)
        last = np.moveaxis(x, 1, -1)
        got = reference.conv(last, 9, w, wzp, rq, mode, out_dtype, stride, padding, dilation)
        assert_equal_q(got, want, f"{mode.name} {xs}")
        dense = dense_reference.conv(last, 9, w, wzp, rq, mode, out_dtype, stride, padding,
                                     dilation, c)
        assert_equal_q(got, dense, f"{mode.name} {xs} against the dense reference")
