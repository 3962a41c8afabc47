"""The int8 depthwise family (``quant/depthwise/``) against its reference, bit for bit.

- Drivers: each path (portable, AVX2, VNNI where the level has them) x epilogue
  (REQUANT_FLOAT, REQUANT_INT32, RAW) x ReLU through ``qconv(algo="depthwise")``
  against :mod:`convengine.quant.depthwise.reference`, on 40 channels (16-lane
  vectors whole and half; AVX2's 8-lane ones whole) and rows of 11 pixels (blocks of
  four and single pixels, edges padded).
- The reference, written per channel, against the test suite's independent formula
  (tests/test_quant_conv's ``ref_acc``, ``ref_requant``) and against the dense
  family's grouped reference at groups == C.
- Micro-kernels: each AVX2 register block (4 or 1 pixels x 16 or 8 channels, general
  or shared-column at stride 1 or 2) alone through a jitted harness, against an int64
  formula of its documented contract.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_int8_dense_family import (
    MODES,
    PATHS,
    SENTINEL,
    VARIANTS,
    assert_only,
    block,
    epilogue_params,
    formula,
    harness,
    needs_avx2,
    requantized,
    run_qconv,
)

from convengine.epilogue_codes import Epilogue
from convengine.quant.dense import reference as dense_reference
from convengine.quant.depthwise import avx2 as depthwise_avx2
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


# -------------------------------------------------------------- micro-kernels
# avx2.py's register blocks, each called alone by a jitted harness, against the
# contract of its docstring (``_block``) in int64, requantized by numerics.apply_requant
# (as the dense family's micro-kernel tests): width pixels x 8 * nvec channels,
#   out[oo + b * ldo + l] = requant(wterm[c0 + l] + sum_{r, j} row_r[col + b * pix
#                                   + j * tap + l] * wf[(r * kw + j) * C + c0 + l])
# with row r at src[offsets[r]:], or the zero-point row where offsets[r] < 0.

BLOCKS = [(4, 2, 0), (4, 1, 0), (1, 2, 0), (1, 1, 0), (4, 2, 1), (4, 1, 1), (4, 2, 2), (4, 1, 2)]


@needs_avx2
@pytest.mark.parametrize("bias_kind,out_dtype", [("float", np.uint8), ("int32", np.int8)])
@pytest.mark.parametrize("width,nvec,stride", BLOCKS)
def test_avx2_block(width: int, nvec: int, stride: int, bias_kind: str, out_dtype: type) -> None:
    """``_block{width}_{8 * nvec}[_s{stride}]``: three kernel rows (the middle one
    outside the input) of three taps; the shared-column forms at ``pix == stride *
    tap``, the general one at column stride 3 and dilation 2."""
    suffix = f"_s{stride}" if stride else ""
    run = harness(getattr(depthwise_avx2, f"_block{width}_{8 * nvec}{suffix}"))
    chans, c0, kw, oo, ldo = 40, 8, 3, 5, 47
    tap = chans if stride else 2 * chans
    pix = stride * tap if stride else 3 * chans
    reach = 9 + (width - 1) * pix + (kw - 1) * tap + chans
    offsets = np.array([3, -1, 3 + reach], np.int64)
    for regime, relu in (("wide", False), ("ties", True)):
        ties = regime == "ties"
        src = RNG.integers(0, 4 if ties else 256, 3 + 2 * reach).astype(np.uint8)
        zero = RNG.integers(0, 4 if ties else 256, reach).astype(np.uint8)
        wf = RNG.integers(-2 if ties else -255, 3 if ties else 256, 3 * kw * chans)
        wterm = RNG.integers(-20 if ties else -200000, 21 if ties else 200001, chans)
        e = epilogue_params(0, chans, bias_kind, out_dtype, regime, relu)
        e = e._replace(col_term=np.zeros_like(e.col_term), wzp=np.zeros_like(e.wzp))
        out = np.full(oo + width * ldo, SENTINEL, out_dtype)
        before = out.copy()
        run(out, oo, ldo, src, zero, offsets, 9, pix, tap, kw, wf.astype(np.float32), chans, c0,
            wterm.astype(np.float32), e.bias, e.mult, float(e.lo), float(e.hi), float(e.zp))
        lanes = np.arange(8 * nvec)
        acc = np.zeros((width, 8 * nvec), np.int64) + wterm[c0 + lanes]
        for r, offset in enumerate(offsets):
            row = src[offset:] if offset >= 0 else zero
            for b in range(width):
                for j in range(kw):
                    acc[b] += (row[9 + b * pix + j * tap + lanes]
                               * wf[(r * kw + j) * chans + c0 + lanes])
        e = e._replace(o0=c0)
        want = requantized(acc, np.zeros(width, np.int64), e, out_dtype)
        assert_only(out, before, block(out.size, oo, ldo, width, 8 * nvec), want,
                    f"{width}x{8 * nvec} stride={stride} {regime} relu={relu}")
