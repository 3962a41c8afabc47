"""The int8 dense family (``quant/dense/``) against its references, bit for bit.

- Drivers: each path (portable, AVX2, VNNI where the level has them) x epilogue
  (REQUANT_FLOAT, REQUANT_INT32, RAW) x ReLU through ``qconv`` against
  :mod:`convengine.quant.dense.reference`, on a grouped shape whose tiles are whole
  and partial (72 channels: a 64-column block and a narrow one; rows not a multiple
  of the tile's).
- The reference against the test suite's independent formula (tests/test_quant_conv's
  ``ref_acc``, ``ref_requant``).
- Micro-kernels, each alone through a jitted harness against an int64 formula of its
  documented contract: VNNI's tiles (2x64, 4x64, 6x64, 8x32, 12x16) in the int32-store
  and requantizing forms and the taps form (2x64, 4x64, 6x64), AVX2's int16 tile
  (store, requantizing) and u8s8 tile, and the heavy-pair search; whole and partial
  rows and columns. VNNI's skip where the ISA level lacks it (CONVENGINE_ISA=avx2).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import pytest
from numba import njit

import convengine as ce
from convengine import qconv
from convengine._host import ISA
from convengine.epilogue_codes import Epilogue
from convengine.quant import HAS_VNNI
from convengine.quant.cpu import HAS_AVX2
from convengine.quant.dense import avx2, reference, vnni
from convengine.quant.numerics import Requant, apply_requant, requant_params
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


# -------------------------------------------------------------- micro-kernels
# Each micro-kernel of vnni.py and avx2.py called alone by a jitted harness on small
# arrays (offsets, strides and gaps nonzero), against an int64 numpy formula of the
# contract in those modules' docstrings: rows r < mr and columns j < ncol hold the
# formula; what the contract leaves alone (gaps, rows >= mr of a store, columns >=
# ncol) keeps its sentinel. The requantization is numerics.apply_requant (the
# requantization's reference) of the int64 sum wrapped to int32, on two regimes of
# values: "wide" (full byte ranges, results spread over the clamp and past it) and
# "ties" (small values, multipliers 0.5 and 0.25: many results exactly half-way).

VNNI_TILES = [(2, 64), (4, 64), (6, 64), (8, 32), (12, 16)]
needs_vnni = pytest.mark.skipif(not HAS_VNNI, reason=f"no AVX512-VNNI at ISA level {ISA}")
needs_avx2 = pytest.mark.skipif(not HAS_AVX2, reason=f"no AVX2 at ISA level {ISA}")
SENTINEL = 0x5A


@functools.cache
def harness(ukernel: Any) -> Any:
    """A jitted call of the intrinsic ``ukernel`` (callable only from jitted code)."""

    @njit
    def run(*args):
        return ukernel(*args)

    return run


def wrap32(v: np.ndarray) -> np.ndarray:
    return (v + 2**31) % 2**32 - 2**31


def packed(b: np.ndarray, b_off: int, steps: int, width: int, depth: int) -> np.ndarray:
    """The (steps * depth, width) int64 matrix of weights packed as
    ``b[b_off + (k * width + col) * depth + i]`` (layout (steps, width, depth))."""
    block = b[b_off:b_off + steps * width * depth].astype(np.int64)
    return block.reshape(steps, width, depth).transpose(0, 2, 1).reshape(steps * depth, width)


def rows_of(a: np.ndarray, starts: np.ndarray, k: int) -> np.ndarray:
    """The int64 rows ``a[s:s + k]`` for each start ``s``."""
    return a[np.asarray(starts)[:, None] + np.arange(k)].astype(np.int64)


class Epi(NamedTuple):
    """A micro-kernel epilogue's per-column parameters (``o0 + j``) and clamp."""

    col_term: np.ndarray  # int32
    wzp: np.ndarray  # int32
    bias: np.ndarray  # float32 (PyTorch's requantization) or int32 (ONNX's)
    mult: np.ndarray  # float32
    o0: int
    lo: int
    hi: int
    zp: int


def epilogue_params(o0: int, width: int, bias_kind: str, out_dtype: type, regime: str,
                    relu: bool) -> Epi:
    """Random :class:`Epi` for columns ``o0 .. o0 + width`` (the arrays start at 0)."""
    n = o0 + width
    ties = regime == "ties"
    col_term = RNG.integers(-20, 21, n) if ties else RNG.integers(-60000, 60001, n)
    if bias_kind == "float":
        bias = (RNG.integers(-9, 10, n) if ties else RNG.uniform(-3000, 3000, n)).astype(np.float32)
    else:
        bias = (RNG.integers(-9, 10, n) if ties else RNG.integers(-60000, 60001, n)).astype(np.int32)
    mult = (RNG.choice([0.5, 0.25], n) if ties else RNG.uniform(1 / 900, 1 / 200, n))
    info = np.iinfo(out_dtype)
    lo, hi = int(info.min), int(info.max)
    zp = 5 if out_dtype == np.uint8 else -3
    return Epi(col_term.astype(np.int32), RNG.integers(-3, 4, n).astype(np.int32), bias,
               mult.astype(np.float32), o0, max(lo, zp) if relu else lo, hi, zp)


def requantized(acc: np.ndarray, rsum: np.ndarray, e: Epi, out_dtype: type) -> np.ndarray:
    """The epilogue's contract on the int64 sums ``acc (rows, ncol)`` with row sums
    ``rsum (rows,)``: ``requant(acc + col_term[o] - wzp[o] * rsum[r])``, o = o0 + j,
    the sum an int32 one."""
    o = e.o0 + np.arange(acc.shape[1])
    total = wrap32(acc + e.col_term[o] - e.wzp[o].astype(np.int64) * rsum[:, None])
    mode = "float" if e.bias.dtype == np.float32 else "int32"
    rq = Requant(mode, e.mult[o], e.bias[o], e.zp, e.lo, e.hi)
    return apply_requant(total.astype(np.int32), rq, out_dtype)


def operands(regime: str, a_len: int, b_len: int, a_dtype: type = np.uint8,
             b_dtype: type = np.int8) -> tuple[np.ndarray, np.ndarray]:
    """Random A and B bytes (int16 values for the AVX2 int16 form): full ranges for
    ``"wide"``, a few small values for ``"ties"``."""
    if regime == "ties":
        return (RNG.integers(0, 4, a_len).astype(a_dtype),
                RNG.integers(-2, 3, b_len).astype(b_dtype))
    if a_dtype == np.int16:  # differences of 8-bit values less their zero points
        return (RNG.integers(-255, 256, a_len).astype(np.int16),
                RNG.integers(-255, 256, b_len).astype(np.int16))
    return (RNG.integers(0, 256, a_len).astype(a_dtype),
            RNG.integers(-128, 128, b_len).astype(b_dtype))


def assert_only(got: np.ndarray, before: np.ndarray, written: np.ndarray, want: np.ndarray,
                what: str, free: np.ndarray | None = None) -> None:
    """``got[written] == want`` and every element outside ``written`` (and the
    contract's ``free`` ones) as ``before``."""
    assert_equal_q(got[written], want.ravel(), what)
    keep = ~written if free is None else ~(written | free)
    assert_equal_q(got[keep], before[keep], f"{what}: outside the tile")


def block(size: int, off: int, ld: int, nrows: int, ncols: int) -> np.ndarray:
    """The mask of a flat array's elements ``off + r * ld + j``, r < nrows, j < ncols."""
    rel = np.arange(size) - off
    return (rel >= 0) & (rel // ld < nrows) & (rel % ld < ncols)


def requant_cases(rows: int, width: int) -> list[tuple[int, int, int, str, bool]]:
    """(mr, ncol, acc_in, regime, relu): the whole tile, then partial rows and columns
    (a vector cut, whole vectors left out, one column)."""
    return [(rows, width, 0, "wide", False), (rows - 1, width - 5, 1, "wide", True),
            (1, min(17, width - 7), 1, "ties", False), (rows, 1, 0, "ties", True)]


@needs_vnni
@pytest.mark.parametrize("rows,width", VNNI_TILES)
def test_vnni_store(rows: int, width: int) -> None:
    """``ukernel_{rows}x{width}``: ``c = (c if acc_in else 0) + A @ B`` (int32, wrapping),
    rows of 64 in ``c`` whatever the width."""
    run = harness(getattr(vnni, f"ukernel_{rows}x{width}"))
    kc4, lda, a_off, b_off, c_off = 3, 15, 5, 7, 64 + 9
    for mr, acc_in in ((rows, 0), (rows - 1, 1), (1, 1)):
        a, b = operands("wide", a_off + rows * lda, b_off + kc4 * 256)
        c = RNG.integers(-2**31, 2**31, c_off + (rows + 1) * 64).astype(np.int32)
        before = c.copy()
        run((a, a_off, lda, mr), (b, b_off, kc4), (c, c_off, acc_in))
        acc = rows_of(a, a_off + np.arange(mr) * lda, 4 * kc4) @ packed(b, b_off, kc4, 64, 4)
        start = before[c_off:c_off + rows * 64].reshape(rows, 64)[:mr] if acc_in else 0
        want = wrap32(acc + start)[:, :width]
        # rows mr .. rows - 1 repeat row mr - 1: stored, but free (the caller ignores them)
        assert_only(c, before, block(c.size, c_off, 64, mr, width), want,
                    f"{rows}x{width} mr={mr} acc_in={acc_in}", block(c.size, c_off, 64, rows, width))


@needs_vnni
@pytest.mark.parametrize("bias_kind,out_dtype", [("float", np.uint8), ("int32", np.int8)])
@pytest.mark.parametrize("rows,width", VNNI_TILES)
def test_vnni_requant(rows: int, width: int, bias_kind: str, out_dtype: type) -> None:
    """``ukernel_requant_{rows}x{width}``: the tile as :func:`test_vnni_store` computes
    it, requantized into 8-bit rows ``r < mr``, columns ``j < ncol``."""
    run = harness(getattr(vnni, f"ukernel_requant_{rows}x{width}"))
    kc4, lda, a_off, b_off, c_off, out_off, ldo, r_off = 2, 11, 3, 5, 17, 6, width + 7, 2
    for mr, ncol, acc_in, regime, relu in requant_cases(rows, width):
        a, b = operands(regime, a_off + rows * lda, b_off + kc4 * 256)
        small = regime == "ties"
        c = RNG.integers(-20 if small else -99999, 21 if small else 100000,
                         c_off + rows * 64).astype(np.int32)
        rsum = RNG.integers(0, 30 if small else 4000, r_off + rows).astype(np.int32)
        rsum[r_off] = 0  # (the kernel skips wzp * 0)
        e = epilogue_params(5, width, bias_kind, out_dtype, regime, relu)
        out = np.full(out_off + rows * ldo, SENTINEL, out_dtype)
        before = out.copy()
        run((a, a_off, lda, mr), (b, b_off, kc4), (c, c_off, acc_in), (out, out_off, ldo, ncol),
            (rsum, r_off), (e.col_term, e.wzp, e.bias, e.mult, e.o0, np.float32(e.lo - e.zp),
                            np.float32(e.hi - e.zp), e.zp))
        acc = rows_of(a, a_off + np.arange(mr) * lda, 4 * kc4) @ packed(b, b_off, kc4, 64, 4)
        if acc_in:
            acc += c[c_off:c_off + rows * 64].reshape(rows, 64)[:mr]
        want = requantized(acc[:, :ncol], rsum[r_off:r_off + mr].astype(np.int64), e, out_dtype)
        assert_only(out, before, block(out.size, out_off, ldo, mr, ncol), want,
                    f"{rows}x{width} mr={mr} ncol={ncol} acc_in={acc_in} {regime} relu={relu}")


@needs_vnni
@pytest.mark.parametrize("bias_kind,out_dtype", [("float", np.uint8), ("int32", np.int8)])
@pytest.mark.parametrize("rows", [2, 4, 6])
def test_vnni_taps(rows: int, bias_kind: str, out_dtype: type) -> None:
    """``ukernel_taps_{rows}x64``: for tap t, the row's bytes at ``tapoff[t]`` against
    the tap's block of B (``kc4`` quads each), summed from zero, then requantized as
    :func:`test_vnni_requant`."""
    run = harness(getattr(vnni, f"ukernel_taps_{rows}x64"))
    kc4, lda, a_off, b_off, out_off, ldo, r_off = 2, 6, 3, 5, 6, 71, 1
    tapoff = np.array([0, 13, 42], np.int64)
    for mr, ncol, _, regime, relu in requant_cases(rows, 64):
        a, b = operands(regime, a_off + rows * lda + 42 + 4 * kc4, b_off + 3 * kc4 * 256)
        rsum = RNG.integers(0, 30 if regime == "ties" else 4000, r_off + rows).astype(np.int32)
        e = epilogue_params(3, 64, bias_kind, out_dtype, regime, relu)
        out = np.full(out_off + rows * ldo, SENTINEL, out_dtype)
        before = out.copy()
        run((a, a_off, lda, mr), (b, b_off, kc4), (tapoff, 3), (out, out_off, ldo, ncol),
            (rsum, r_off), (e.col_term, e.wzp, e.bias, e.mult, e.o0, np.float32(e.lo - e.zp),
                            np.float32(e.hi - e.zp), e.zp))
        acc = sum(rows_of(a, a_off + np.arange(mr) * lda + tapoff[t], 4 * kc4)
                  @ packed(b, b_off + t * kc4 * 256, kc4, 64, 4) for t in range(3))
        want = requantized(acc[:, :ncol], rsum[r_off:r_off + mr].astype(np.int64), e, out_dtype)
        assert_only(out, before, block(out.size, out_off, ldo, mr, ncol), want,
                    f"taps {rows}x64 mr={mr} ncol={ncol} {regime} relu={relu}")


@needs_avx2
def test_avx2_store() -> None:
    """``ukernel_6x16``: ``c = A @ B`` over int16 pairs (exact), rows ``r < mr`` stored
    ``ldc`` apart, the others not."""
    run = harness(avx2.ukernel_6x16)
    kc2, lda, a_off, b_off, c_off, ldc = 5, 13, 3, 5, 7, 21
    for mr in (6, 5, 1):
        a, b = operands("wide", a_off + 6 * lda, b_off + kc2 * 32, np.int16, np.int16)
        c = RNG.integers(-2**31, 2**31, c_off + 6 * ldc).astype(np.int32)
        before = c.copy()
        run((a, a_off, lda, mr), (b, b_off, kc2), (c, c_off, ldc))
        want = rows_of(a, a_off + np.arange(mr) * lda, 2 * kc2) @ packed(b, b_off, kc2, 16, 2)
        assert_only(c, before, block(c.size, c_off, ldc, mr, 16), want, f"6x16 mr={mr}")


def avx2_requant_args(e: Epi) -> tuple:
    """The requantization record of avx2.py's requantizing kernels."""
    return e.bias, e.mult, e.o0, float(e.lo), float(e.hi), float(e.zp)


@needs_avx2
@pytest.mark.parametrize("out_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("bias_kind", ["float", "int32"])
def test_avx2_requant(bias_kind: str, out_dtype: type) -> None:
    """``ukernel_requant_6x16``: the tile of :func:`test_avx2_store` requantized into
    8-bit rows ``r < mr`` (16 whole columns)."""
    run = harness(avx2.ukernel_requant_6x16)
    kc2, lda, a_off, b_off, out_off, ldo = 5, 13, 3, 5, 6, 23
    for mr, _, _, regime, relu in requant_cases(6, 16):
        a, b = operands(regime, a_off + 6 * lda, b_off + kc2 * 32, np.int16, np.int16)
        e = epilogue_params(5, 16, bias_kind, out_dtype, regime, relu)
        e = e._replace(col_term=np.zeros_like(e.col_term), wzp=np.zeros_like(e.wzp))
        out = np.full(out_off + 6 * ldo, SENTINEL, out_dtype)
        before = out.copy()
        run((a, a_off, lda, mr), (b, b_off, kc2), (out, out_off, ldo), avx2_requant_args(e))
        acc = rows_of(a, a_off + np.arange(mr) * lda, 2 * kc2) @ packed(b, b_off, kc2, 16, 2)
        want = requantized(acc, np.zeros(mr, np.int64), e, out_dtype)
        assert_only(out, before, block(out.size, out_off, ldo, mr, 16), want,
                    f"requant 6x16 mr={mr} {regime} relu={relu}")


@needs_avx2
@pytest.mark.parametrize("bias_kind,out_dtype", [("float", np.uint8), ("int32", np.int8)])
def test_avx2_requant_u8s8(bias_kind: str, out_dtype: type) -> None:
    """``ukernel_requant_u8s8_6x16``: uint8 A against int8 B packed (Kc/4, 16, 4), each
    pair of products saturated to int16 (``vpmaddubsw``), from the int32 tile
    ``start`` (rows ``start_ld`` apart; 0: one row for all), requantized as
    :func:`test_avx2_requant`. The wide regime's full byte ranges saturate pairs."""
    run = harness(avx2.ukernel_requant_u8s8_6x16)
    kc4, lda, a_off, b_off, out_off, ldo, s_off = 3, 14, 3, 5, 6, 23, 4
    for (mr, _, _, regime, relu), start_ld in zip(requant_cases(6, 16), (16, 0, 19, 0)):
        a, b = operands(regime, a_off + 6 * lda, b_off + kc4 * 64)
        small = regime == "ties"
        start = RNG.integers(-20 if small else -99999, 21 if small else 100000,
                             s_off + 6 * 19 + 16).astype(np.int32)
        e = epilogue_params(5, 16, bias_kind, out_dtype, regime, relu)
        e = e._replace(col_term=np.zeros_like(e.col_term), wzp=np.zeros_like(e.wzp))
        out = np.full(out_off + 6 * ldo, SENTINEL, out_dtype)
        before = out.copy()
        run((a, a_off, lda, mr), (b, b_off, kc4), (out, out_off, ldo), avx2_requant_args(e),
            (start, s_off, start_ld))
        x = rows_of(a, a_off + np.arange(mr) * lda, 4 * kc4).reshape(mr, 2 * kc4, 1, 2)
        w = packed(b, b_off, kc4, 16, 4).reshape(2 * kc4, 2, 16).transpose(0, 2, 1)
        pairs = np.clip((x * w).sum(axis=-1), -2**15, 2**15 - 1)  # (mr, pair, column)
        acc = pairs.sum(axis=1) + start[s_off + np.arange(mr)[:, None] * start_ld + np.arange(16)]
        want = requantized(acc, np.zeros(mr, np.int64), e, out_dtype)
        assert_only(out, before, block(out.size, out_off, ldo, mr, 16), want,
                    f"u8s8 mr={mr} start_ld={start_ld} {regime} relu={relu}")


@needs_avx2
def test_avx2_heavy_pairs() -> None:
    """``heavy_pair_mask`` (bit i: bytes 2i and 2i + 1 add up to 257 or more),
    ``any_heavy_pair`` (over 32-byte chunks) and ``trailing_zeros`` (lowest set bit)."""
    mask, anyone, tzcnt = (harness(f) for f in (avx2.heavy_pair_mask, avx2.any_heavy_pair,
                                                avx2.trailing_zeros))
    a = RNG.integers(0, 256, 3 + 4 * 32).astype(np.uint8)
    a[3:11] = (1, 255, 2, 255, 128, 128, 128, 129)  # 256, 257, 256, 257
    for at in range(3, 3 + 4 * 32, 32):
        sums = a[at:at + 32:2].astype(np.int64) + a[at + 1:at + 32:2]
        assert mask(a, at) == sum(1 << i for i in range(16) if sums[i] >= 257), at
    light = RNG.integers(0, 129, 3 + 4 * 32).astype(np.uint8)  # pairs of 256 at most
    light[3 + 64 + 20:][:2] = (128, 128)
    assert not anyone(light, 3, 4)
    light[3 + 64 + 20:][:2] = (128, 129)  # chunk 2
    assert not anyone(light, 3, 2) and anyone(light, 3, 3)
    for i in range(32):
        bits = (int(RNG.integers(0, 2**32)) | 1) << i & 0xFFFFFFFF
        assert tzcnt(np.uint32(bits)) == i, hex(bits)
