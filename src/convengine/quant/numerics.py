"""Quantization numerics, bit for bit as PyTorch (fbgemm) and ONNX compute them.

- :func:`quantize`: ``q = clamp(rint(fma(x, 1/scale, zp)))`` in float32 with the
  reciprocal taken in float32 (torch.quantize_per_tensor, fbgemm's AVX2 path);
  :func:`quantize_per_channel` rounds the product and the sum apart
  (``rint(f32(f32(x * inv) + zp))``, torch.quantize_per_channel).
- :func:`dequantize`: ``(float32(q) - zp) * float32(scale)``.
- :func:`requantize`: an int32 accumulator ``acc = sum (x_q - x_zp)(w_q - w_zp)``
  to 8 bits. ``bias_mode="float"`` (PyTorch CPU: fbgemm, and x86 where it uses fbgemm)::

      s = f32(x_scale) * f32(w_scale[c])              # float32 product
      m = s / f32(out_scale)                          # float32 quotient
      y = rint((f32(acc) + f32(bias[c]) / s) * m) + out_zp    # all float32

  ``bias_mode="int32"`` (ONNX QLinearConv, reference implementation)::

      y = rint(clip(f64(acc + bias_i32[c]) * f64(m) + out_zp))

  then ReLU clamps at ``out_zp`` and the result saturates to the output dtype.
  ``rint`` rounds half to even.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConvSetupError

INT_DTYPES = ("uint8", "int8", "int32")
BIAS_MODES = ("float", "int32")


_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127),
           np.dtype(np.int32): (-(2**31), 2**31 - 1)}


def dtype_range(dtype: Any) -> tuple[int, int]:
    """(min, max) of an integer dtype."""
    dt = np.dtype(dtype)
    if dt in _RANGES:
        return _RANGES[dt]
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def check_int_dtype(dtype: Any, name: str, allowed: tuple[str, ...] = INT_DTYPES) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ConvSetupError(f"{name} must be one of {allowed}, got {dtype!r}") from None
    if dt not in _RANGES or dt.name not in allowed:
        raise ConvSetupError(f"{name} must be one of {allowed}, got {dt.name}")
    return dt


def _as_float32(values: Any) -> np.ndarray:
    """``values`` rounded to float32, out-of-range values to inf or 0, without warnings."""
    with np.errstate(over="ignore", under="ignore"):
        return np.asarray(values, dtype=np.float64).astype(np.float32)


def check_scale(scale: Any, name: str, length: int | None = None) -> np.ndarray:
    """Scales as float32, 0-d (per-tensor) or (length,) (per-channel); finite and > 0
    once rounded to float32 (the precision the kernels compute in)."""
    if isinstance(scale, (float, np.floating)) and not isinstance(scale, np.float16):
        s32 = _as_float32(scale)
        if not math.isfinite(s32) or s32 <= 0:
            raise ConvSetupError(
                f"{name} must be finite and > 0 in float32, got {float(scale)!r} "
                f"(float32: {float(s32)!r})")
        return s32
    s = np.asarray(scale)
    if not (np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)):
        raise ConvSetupError(f"{name} must be a float or floats, got dtype {s.dtype}")
    if s.ndim > 1 or (s.ndim == 1 and length is not None and s.shape[0] not in (1, length)):
        want = "a scalar" if length is None else f"a scalar or {length} values (one per channel)"
        raise ConvSetupError(f"{name} must be {want}, got shape {s.shape}")
    if s.ndim == 1 and length is None:
        raise ConvSetupError(f"{name} must be a scalar, got shape {s.shape}")
    s32 = _as_float32(s)
    if not np.all(np.isfinite(s32)) or not np.all(s32 > 0):
        raise ConvSetupError(
            f"{name} must be finite and > 0 in float32, got {s.ravel()[:8].tolist()} "
            f"(float32: {s32.ravel()[:8].tolist()})")
    return s32.reshape(()) if s32.ndim == 1 and s32.shape[0] == 1 else s32


def check_zero_point(
    zero_point: Any, name: str, dtype: Any, length: int | None = None
) -> np.ndarray:
    """Zero points as int64, 0-d or (length,); integers inside the dtype's range."""
    if isinstance(zero_point, (int, np.integer)) and not isinstance(zero_point, bool):
        lo, hi = dtype_range(dtype)
        if not lo <= zero_point <= hi:
            raise ConvSetupError(
                f"{name} must lie in [{lo}, {hi}] for dtype {np.dtype(dtype).name}, "
                f"got {zero_point!r}"
            )
        return np.array(zero_point, np.int64)
    z = np.asarray(zero_point)
    if not (np.issubdtype(z.dtype, np.integer) or z.dtype == np.bool_):
        if not (np.issubdtype(z.dtype, np.floating) and np.all(np.isfinite(z))
                and np.all(z == np.round(z))):
            raise ConvSetupError(f"{name} must be an integer or integers, got {zero_point!r}")
    if z.ndim > 1 or (z.ndim == 1 and (length is None or z.shape[0] not in (1, length))):
        want = "a scalar" if length is None else f"a scalar or {length} values (one per channel)"
        raise ConvSetupError(f"{name} must be {want}, got shape {z.shape}")
    lo, hi = dtype_range(dtype)
    if np.any(z < lo) or np.any(z > hi):
        raise ConvSetupError(
            f"{name} must lie in [{lo}, {hi}] for dtype {np.dtype(dtype).name}, "
            f"got {z.ravel()[:8].tolist()}"
        )
    z64 = z.astype(np.int64)
    return z64.reshape(()) if z64.ndim == 1 and z64.shape[0] == 1 else z64


def _quantize(
    x: np.ndarray, scale: np.ndarray, zp: np.ndarray, dtype: np.dtype, fused: bool
) -> np.ndarray:
    inv = np.float32(1) / scale  # float32 reciprocal, as fbgemm
    if fused:  # fma(x, inv, zp) rounded once to float32: the float64 product is exact
        t = (x.astype(np.float64) * inv.astype(np.float64) + zp).astype(np.float32)
    else:  # float32 product, then float32 sum
        t = (x * inv).astype(np.float32) + zp.astype(np.float32)
    lo, hi = dtype_range(dtype)
    return np.rint(np.clip(t, lo, hi)).astype(dtype)


def _float32_input(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        raise ConvSetupError(f"{name} must be a float array, got dtype {a.dtype}")
    return a.astype(np.float32, copy=False)


def quantize(x: Any, scale: float, zero_point: int, dtype: Any = np.uint8) -> np.ndarray:
    """Per-tensor affine quantization of float ``x`` to ``dtype`` (uint8, int8, int32).

    Bit-exact with ``torch.quantize_per_tensor`` for uint8/int8: float32
    ``x * (1/scale) + zp`` fused, rounded half to even, clamped. (torch's qint32
    quantize rounds differently on some ties; int32 here uses the same formula.)
    """
    dt = check_int_dtype(dtype, "dtype")
    s = check_scale(scale, "scale")
    z = check_zero_point(zero_point, "zero_point", dt)
    return _quantize(_float32_input(x, "x"), s, z, dt, fused=True)


def quantize_per_channel(
    x: Any, scales: Any, zero_points: Any, axis: int = 0, dtype: Any = np.int8
) -> np.ndarray:
    """Per-channel quantization along ``axis``, bit-exact with ``torch.quantize_per_channel``
    (float32 ``x * (1/scale[c])``, then ``+ zp[c]`` in float32, half to even, clamp)."""
    a = _float32_input(x, "x")
    if not -a.ndim <= axis < a.ndim:
        raise ConvSetupError(f"axis must be in [-{a.ndim}, {a.ndim}), got {axis}")
    dt = check_int_dtype(dtype, "dtype")
    n = a.shape[axis]
    s = np.broadcast_to(check_scale(scales, "scales", n), (n,))
    z = np.broadcast_to(check_zero_point(zero_points, "zero_points", dt, n), (n,))
    shape = [1] * a.ndim
    shape[axis] = n
    return _quantize(a, s.reshape(shape), z.reshape(shape), dt, fused=False)


def dequantize(q: Any, scale: Any, zero_point: Any, axis: int | None = None) -> np.ndarray:
    """Dequantize as torch does: per-tensor ``(float32(q) - zp) * float32(scale)`` in
    float32; per-channel along ``axis`` ``(q - zp[c]) * scale[c]`` in float64, rounded
    to float32 (``scale`` kept in float64 there, as torch stores it)."""
    a = np.asarray(q)
    if not np.issubdtype(a.dtype, np.integer):
        raise ConvSetupError(f"q must be an integer array, got dtype {a.dtype}")
    if axis is None:
        s = check_scale(scale, "scale")
        z = check_zero_point(zero_point, "zero_point", a.dtype)
    else:
        n = a.shape[axis]
        shape = [1] * a.ndim
        shape[axis] = n
        s = np.broadcast_to(check_scale(scale, "scale", n), (n,)).reshape(shape)
        z = np.broadcast_to(check_zero_point(zero_point, "zero_point", a.dtype, n), (n,))
        z = z.reshape(shape)
        s64 = np.broadcast_to(np.asarray(scale, np.float64), (n,)).reshape(shape)
        return ((a.astype(np.float64) - z) * s64).astype(np.float32)
    return (a.astype(np.float32) - z.astype(np.float32)) * s


@dataclass(frozen=True)
class Requant:
    """Per-output-channel requantization constants, as the fused kernels consume them.

    ``multiplier`` (O,) float32 ``f32(x_scale * w_scale) / f32(out_scale)``;
    ``bias`` (O,): float32 ``bias / (x_scale * w_scale)`` in float mode, int32 in
    int32 mode (zeros without bias); ``lo``/``hi`` the clamp (ReLU moves ``lo``).
    """

    mode: str
    multiplier: np.ndarray
    bias: np.ndarray
    zero_point: int
    lo: int
    hi: int


def requant_params(
    x_scale: Any,
    w_scale: Any,
    out_scale: Any,
    out_zero_point: Any,
    out_channels: int,
    bias: Any = None,
    *,
    out_dtype: Any = np.uint8,
    relu: bool = False,
    bias_mode: str = "float",
) -> Requant:
    """Validate and fold the scales, bias and clamp into a :class:`Requant`."""
    if bias_mode not in BIAS_MODES:
        raise ConvSetupError(f"bias_mode must be one of {BIAS_MODES}, got {bias_mode!r}")
    dt = check_int_dtype(out_dtype, "out_dtype", ("uint8", "int8"))
    xs = check_scale(x_scale, "x_scale")
    ws = np.broadcast_to(check_scale(w_scale, "w_scale", out_channels), (out_channels,))
    ys = check_scale(out_scale, "out_scale")
    zp = int(check_zero_point(out_zero_point, "out_zero_point", dt))
    with np.errstate(over="ignore", under="ignore"):
        s = (xs * ws).astype(np.float32)
        multiplier = np.ascontiguousarray(s / ys, dtype=np.float32)
    if not np.all(np.isfinite(s)) or np.any(s < np.finfo(np.float32).tiny):
        raise ConvSetupError(
            f"x_scale * w_scale must be a normal float32 (finite, >= "
            f"{np.finfo(np.float32).tiny:.3g}), got x_scale={x_scale!r}, w_scale={w_scale!r}"
        )
    if not np.all(np.isfinite(multiplier)) or not np.all(multiplier > 0):
        raise ConvSetupError(
            f"x_scale * w_scale / out_scale must be finite and > 0 in float32, got "
            f"x_scale={x_scale!r}, w_scale={w_scale!r}, out_scale={out_scale!r}"
        )
    if bias_mode == "float":
        term = np.zeros(out_channels, np.float32)
        if bias is not None:
            b = np.asarray(bias)
            if not np.issubdtype(b.dtype, np.floating):
                raise ConvSetupError(
                    f"bias must be a float array with bias_mode='float', got dtype {b.dtype} "
                    f"(pass bias_mode='int32' for an int32 bias)"
                )
            _check_bias_shape(b, out_channels)
            with np.errstate(over="ignore", invalid="ignore"):
                term = (b.astype(np.float32) / s).astype(np.float32)
            if not np.all(np.isfinite(term)):
                raise ConvSetupError(
                    f"bias must be finite, and bias / (x_scale * w_scale) finite in float32, "
                    f"got bias={b.ravel()[:8].tolist()}"
                )
    else:
        term = np.zeros(out_channels, np.int32)
        if bias is not None:
            term = check_int32_bias(bias, out_channels)
    lo, hi = dtype_range(dt)
    return Requant(bias_mode, multiplier, np.ascontiguousarray(term), zp,
                   max(lo, zp) if relu else lo, hi)


def _check_bias_shape(b: np.ndarray, out_channels: int) -> None:
    if b.shape != (out_channels,):
        raise ConvSetupError(
            f"bias has shape {b.shape}, expected ({out_channels},) (one per output channel)"
        )


def check_int32_bias(bias: Any, out_channels: int) -> np.ndarray:
    b = np.asarray(bias)
    if not np.issubdtype(b.dtype, np.integer):
        raise ConvSetupError(
            f"bias must be an int32 array with bias_mode='int32', got dtype {b.dtype}"
        )
    _check_bias_shape(b, out_channels)
    lo, hi = dtype_range(np.int32)
    if b.size and (b.min() < lo or b.max() > hi):
        raise ConvSetupError("bias values must fit int32 with bias_mode='int32'")
    return b.astype(np.int32)


def apply_requant(acc: np.ndarray, rq: Requant, out_dtype: Any) -> np.ndarray:
    """Requantize an int32 accumulator ``(..., O)`` (channels last) with ``rq``."""
    if rq.mode == "float":
        v = (acc.astype(np.float32) + rq.bias) * rq.multiplier
        v = np.rint(v) + np.float32(rq.zero_point)
    else:
        v = (acc + rq.bias).astype(np.float64) * rq.multiplier.astype(np.float64)
        v = np.rint(np.clip(v + rq.zero_point, rq.lo, rq.hi))
    return np.clip(v, rq.lo, rq.hi).astype(out_dtype)


def requantize(
    acc: Any,
    x_scale: Any,
    w_scale: Any,
    out_scale: Any,
    out_zero_point: Any,
    bias: Any = None,
    *,
    out_dtype: Any = np.uint8,
    relu: bool = False,
    bias_mode: str = "float",
) -> np.ndarray:
    """int32 accumulator ``acc (N, *S, O)`` (zero points already subtracted) -> 8 bits.

    ``w_scale`` is a scalar or one per output channel (the last axis of ``acc``);
    ``bias`` (O,) float32 (``bias_mode="float"``, PyTorch) or int32 (``"int32"``, ONNX).
    """
    a = np.asarray(acc)
    if a.dtype != np.int32:
        raise ConvSetupError(f"acc must be an int32 array, got dtype {a.dtype}")
    if a.ndim < 1:
        raise ConvSetupError("acc must have a channel axis (the last one)")
    rq = requant_params(x_scale, w_scale, out_scale, out_zero_point, a.shape[-1], bias,
                        out_dtype=out_dtype, relu=relu, bias_mode=bias_mode)
    return apply_requant(a, rq, out_dtype)
