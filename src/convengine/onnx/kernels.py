"""Compiled, parallel kernels for the session's non-conv steps on channels-last
memory: one pass each instead of numpy's several (temporaries included).

- :func:`quantize_last`: QuantizeLinear (per tensor) of NCHW float32 into
  channels-last ``(N, *S, C)`` 8-bit, ``saturate(rint(x / s) + zp)``;
- :func:`qlinear_add`: com.microsoft QLinearAdd of two equally shaped 8-bit arrays
  as :func:`convengine.onnx.qops._qlinear_add` computes it
  (:func:`convengine.quant.dense.kernels.qadd_value`);
- :func:`max_pool_last`: MaxPool of channels-last ``(N, H, W, C)`` with (lo, hi)
  padding, stride and dilation, tap by tap over whole output rows (ResNet-50's 3x3/2
  pool on 112x112x64 uint8: 65 -> 30 us); padded taps never win;
- :func:`channel_means` and :func:`qlinear_channel_means`: GlobalAveragePool and
  QLinearGlobalAveragePool of channels-last ``(N, P, C)``, summed in one pass along
  memory (numpy's sum over the middle axis took 37-58 us for MobileNetV2's 7x7x1280
  head; this pass 2-5 us), averaged and rounded in the same call.

Outputs come from :func:`convengine.memory.empty` (a reused block: a fresh one
page-faults on its first write), but for the pools' small ``(N, C)`` means.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import memory
from .._kernel_cache import kernel
from ..quant.dense.kernels import qadd_value


@njit(inline="always")
def _quantized(v, scale, zp, lo, hi):  # pragma: no cover - compiled
    """One float32 value quantized: clamped first (NaN to lo), then rounded to nearest
    even by adding and subtracting 1.5 * 2**23 (exact below 2**22): no libm call, so
    loops of it vectorize."""
    one, magic = np.float32(1), np.float32(12582912.0)
    v = min(max(v / scale, lo - zp - one), hi - zp + one)
    return min(max((v + magic) - magic + zp, lo), hi)


@kernel(parallel=True, nogil=True)
def _quantize_last(x, scale, zp, lo, hi, y):  # pragma: no cover - compiled
    n_, c_, h_, w_ = x.shape
    yf = y.reshape(-1)
    cu, wu = np.uintp(c_), np.uintp(w_)  # unsigned indices: no wraparound tests
    for t in prange(n_ * h_):
        n, h = t // h_, t % h_
        base = np.uintp(t) * wu * cu
        if c_ == 3:  # an RGB image: interleaved with the channel count a constant
            r0, r1, r2 = x[n, 0, h], x[n, 1, h], x[n, 2, h]
            out = yf[base:base + 3 * wu]
            for w in range(w_):
                out[3 * w] = _quantized(r0[w], scale, zp, lo, hi)
                out[3 * w + 1] = _quantized(r1[w], scale, zp, lo, hi)
                out[3 * w + 2] = _quantized(r2[w], scale, zp, lo, hi)
            continue
        row = np.empty(c_ * w_, y.dtype)  # one image row, quantized along memory
        for c in range(c_):
            for w in range(w_):
                row[np.uintp(c) * wu + np.uintp(w)] = _quantized(x[n, c, h, w], scale, zp,
                                                                 lo, hi)
        for c in range(c_):  # then interleaved into channels-last
            for w in range(w_):
                yf[base + np.uintp(w) * cu + np.uintp(c)] = row[np.uintp(c) * wu + np.uintp(w)]


def quantize_last(x: np.ndarray, scale: np.float32, zp: int, dtype: np.dtype) -> np.ndarray:
    """x (N, C, H, W) float32, C-contiguous -> (N, H, W, C) of ``dtype`` (8-bit)."""
    info = np.iinfo(dtype)
    y = memory.empty((x.shape[0], *x.shape[2:], x.shape[1]), dtype)
    _quantize_last(x, np.float32(scale), np.float32(zp), np.float32(info.min),
                   np.float32(info.max), y)
    return y


@kernel(parallel=True, nogil=True)
def _qlinear_add(a, b, ra, rb, fixed, lo, hi, y):  # pragma: no cover - compiled
    n = a.size
    chunk = 16384
    for t in prange((n + chunk - 1) // chunk):
        for k in range(t * chunk, min(n, (t + 1) * chunk)):
            i = np.uintp(k)  # unsigned: no wraparound test, so the loop vectorizes (5x)
            y[i] = qadd_value(a[i], b[i], ra, rb, fixed, lo, hi)


def qlinear_add(a: np.ndarray, b: np.ndarray, ra: np.float32, rb: np.float32,
                fixed: np.float32, dtype: np.dtype) -> np.ndarray:
    """``saturate(rint(fma(a, ra, fma(b, rb, fixed))))`` elementwise; a and b 1-D
    contiguous 8-bit of one length; float32 ``ra``, ``rb``, ``fixed``."""
    info = np.iinfo(dtype)
    y = memory.empty(a.shape, dtype)
    _qlinear_add(a, b, np.float32(ra), np.float32(rb), np.float32(fixed),
                 np.float32(info.min), np.float32(info.max), y)
    return y


@kernel(parallel=True, nogil=True)
def _max_pool_last(x, kh, kw, sh, sw, dh, dw, ph, pw, lowest, y):  # pragma: no cover
    n_, h_, w_, c_ = x.shape
    _, oh_, ow_, _ = y.shape
    xf, yf = x.reshape(-1), y.reshape(-1)
    cu = np.uintp(c_)  # unsigned indices: no wraparound tests, the channel loops vectorize
    row = np.uintp(ow_) * cu
    for t in prange(n_ * oh_):
        n, oh = t // oh_, t % oh_
        out = np.uintp(t) * row
        for k in range(row):
            yf[out + k] = lowest
        # tap by tap, over the output columns whose tap falls inside x (padded taps
        # never take part); NaN wins. np.maximum compiles to vector selects, where
        # ``v if (v > cur or v != v) else cur`` compiled to branches on float data (a
        # 112x112x64 float32 3x3/2 pool on random data: 1.0 -> 0.41 ms single-threaded,
        # 0.96 -> 0.22 on two threads; Zen 3)
        for a in range(kh):
            ih = oh * sh - ph + a * dh
            if ih < 0 or ih >= h_:
                continue
            for b in range(kw):
                first = max(0, (pw - b * dw + sw - 1) // sw)
                last = min(ow_, (w_ - 1 + pw - b * dw) // sw + 1)
                for ow in range(first, last):
                    tap = np.uintp(((n * h_ + ih) * w_ + ow * sw - pw + b * dw) * c_)
                    o = out + np.uintp(ow) * cu
                    for c in range(cu):
                        yf[o + c] = np.maximum(xf[tap + c], yf[o + c])


def max_pool_last(x: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int],
                  dilation: tuple[int, int], pads: tuple[int, int],
                  out: tuple[int, int]) -> np.ndarray:
    """x (N, H, W, C) C-contiguous -> (N, *out, C); every window must meet x (the
    caller checks)."""
    y = memory.empty((x.shape[0], *out, x.shape[-1]), x.dtype)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    _max_pool_last(x, *kernel, *stride, *dilation, *pads, x.dtype.type(lowest), y)
    return y


@kernel(nogil=True)
def _pixel_sums(x, n, acc):  # pragma: no cover - compiled
    """acc[c] = sum over p of x[n, p, c] (x (N, P, C)), along memory."""
    acc[:] = 0
    for p in range(x.shape[1]):
        for c in range(x.shape[2]):
            acc[c] += x[n, p, c]


@kernel(nogil=True)
def _channel_means(x, y):  # pragma: no cover - compiled
    acc = np.zeros(x.shape[2])
    for n in range(x.shape[0]):
        _pixel_sums(x, n, acc)
        for c in range(x.shape[2]):
            y[n, c] = acc[c] / x.shape[1]


def channel_means(x: np.ndarray) -> np.ndarray:
    """x (N, P, C) C-contiguous float -> (N, C) means over P in x's dtype: summed in
    float64, divided, then rounded once. One compiled call: inside a network, the numpy
    steps this replaced (a product of the shape, a division, a cast) cost 80-100 us
    right after MobileNetV2's last conv, against 3 us hot."""
    y = np.empty((x.shape[0], x.shape[2]), x.dtype)
    _channel_means(x, y)
    return y


@kernel(nogil=True)
def _qlinear_channel_means(x, x_zp, mult, y_zp, lo, hi, y):  # pragma: no cover - compiled
    acc = np.zeros(x.shape[2], np.int64)
    for n in range(x.shape[0]):
        _pixel_sums(x, n, acc)
        for c in range(x.shape[2]):
            v = np.rint(np.float32(acc[c] - x.shape[1] * x_zp) * mult) + y_zp
            y[n, c] = min(max(v, lo), hi)


def qlinear_channel_means(x: np.ndarray, x_zp: int, mult: np.float32, y_zp: np.float32,
                          dtype: np.dtype) -> np.ndarray:
    """QLinearGlobalAveragePool of x (N, P, C) C-contiguous integers -> (N, C) of
    ``dtype``: ``saturate(rint(f32(sum_p x - P * x_zp) * mult) + y_zp)``, ``mult`` =
    ``x_s / (y_s * P)`` in float32, every step as numpy rounds it, in one compiled
    call (the numpy steps it replaces cost 80 us inside MobileNetV2 at batch 1)."""
    info = np.iinfo(dtype)
    y = np.empty((x.shape[0], x.shape[2]), dtype)
    _qlinear_channel_means(x, x_zp, mult, y_zp, np.float32(info.min), np.float32(info.max), y)
    return y
