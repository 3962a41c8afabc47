"""ONNX int8 operators: QuantizeLinear, DequantizeLinear, QLinearConv, ConvInteger,
QLinearMatMul, and the ``com.microsoft`` QLinearAdd, QLinearGlobalAveragePool,
QLinearConcat and QGemm that ONNX Runtime's ``quantize_static`` emits.

Integer accumulators are exact; requantization rounds half to even in float32
(``saturate(rint(v) + zero_point)``), as ``onnx.reference`` and ONNX Runtime do.
Convs run channels-last through :func:`convengine.qconv`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConvSetupError
from . import kernels, proto
from .ops import Array, Op, check_rank, conv_args, matmul_quiet, operands, to_first, to_last


def _along(v: Array, axis: int, ndim: int) -> Array:
    """A scalar, or a 1-D per-axis parameter shaped to broadcast along ``axis``."""
    v = np.asarray(v)
    if v.ndim == 0 or v.size == 1 and ndim == 0:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return v.reshape(shape)


def _per_axis(op: str, x: Array, axis: int, **params: Array | None) -> None:
    """ConvSetupError unless each parameter is one value or one per index of ``axis``."""
    for name, v in params.items():
        if v is None or v.size == 1:
            continue
        if v.ndim != 1 or not -x.ndim <= axis < x.ndim or v.size != x.shape[axis]:
            raise ConvSetupError(
                f"{op} {name} has shape {list(v.shape)}; expected 1 value (per tensor) or 1-D "
                f"with one per index of axis {axis} of x (shape {list(x.shape)})")


def per_tensor(op: str, **params: Any) -> None:
    """ConvSetupError unless each given parameter is a single value."""
    for name, v in params.items():
        if v is not None and np.size(v) != 1:
            raise ConvSetupError(f"{op} {name} must be per tensor (1 value), got shape "
                                 f"{list(np.shape(v))}")


def saturate(v: Array, dtype: Any, zero_point: Any = 0) -> Array:
    """``rint(v) + zero_point`` (half to even; the zero point added after rounding, as
    ONNX Runtime's kernels do) clipped to ``dtype``'s range."""
    info = np.iinfo(dtype)
    return np.clip(np.rint(v) + zero_point, info.min, info.max).astype(dtype)


def _quantize(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, scale, zp = operands(inputs, "QuantizeLinear", 2, 3)
    if "block_size" in attrs and int(attrs["block_size"]):
        raise NotImplementedError("QuantizeLinear with block_size is not supported")
    dtype = np.dtype(np.uint8) if zp is None else zp.dtype
    if "output_dtype" in attrs and int(attrs["output_dtype"]):
        dtype = proto.np_dtype(int(attrs["output_dtype"]))
    if dtype.kind not in "iu":
        raise NotImplementedError(f"QuantizeLinear to {dtype} is not supported (integers only)")
    axis = int(attrs.get("axis", 1))
    _per_axis("QuantizeLinear", x, axis, y_scale=scale, y_zero_point=zp)
    if x.ndim == 4 and x.dtype == np.float32 and x.flags.c_contiguous and scale.size == 1 \
            and (zp is None or zp.size == 1) and dtype.itemsize == 1:
        zero = 0 if zp is None else int(zp.reshape(()))
        return [to_first(kernels.quantize_last(x, np.float32(scale.reshape(())), zero, dtype))]
    s = _along(scale, axis, x.ndim).astype(np.float32)
    z = 0 if zp is None else _along(zp, axis, x.ndim).astype(np.float32)
    return [saturate(x.astype(np.float32) / s, dtype, z)]


def _dequantize(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, scale, zp = operands(inputs, "DequantizeLinear", 2, 3)
    axis = int(attrs.get("axis", 1))
    _per_axis("DequantizeLinear", x, axis, x_scale=scale, x_zero_point=zp)
    s = _along(scale, axis, x.ndim)
    z = 0 if zp is None else _along(zp, axis, x.ndim).astype(np.float32)
    return [((x.astype(np.float32) - z) * s).astype(s.dtype)]


def qlinear_conv_last(x: Array, xs: Array, xzp: Array, w_last: Array, ws: Array, wzp: Array,
                      ys: Array, yzp: Array, b: Array | None, args: Mapping[str, Any]) -> Array:
    """QLinearConv of NCHW-shaped ``x`` with a channels-last weight; NCHW view out."""
    from ..quant import qconv

    y = qconv(to_last(x), xs, xzp, w_last, ws, wzp, b, out_scale=ys, out_zero_point=yzp,
              out_dtype=yzp.dtype, bias_mode="int32", layout="NHWC", **args)
    return to_first(y)


def _qlinear_conv(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    x, xs, xzp, w, ws, wzp, ys, yzp, b = operands(inputs, "QLinearConv", 8, 9)
    check_rank(x, w.shape)
    return [qlinear_conv_last(x, xs, xzp, np.moveaxis(w, 1, -1), ws, wzp, ys, yzp, b,
                              conv_args(attrs, w.shape))]


def _conv_integer(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    from ..quant import qconv

    x, w, x_zp, w_zp = operands(inputs, "ConvInteger", 2, 4)
    check_rank(x, w.shape)
    x_zp = np.zeros((), x.dtype) if x_zp is None else x_zp
    w_zp = np.zeros((), w.dtype) if w_zp is None else w_zp
    y = qconv(to_last(x), 1.0, x_zp, np.moveaxis(w, 1, -1), 1.0, w_zp, out_dtype=np.int32,
              layout="NHWC", **conv_args(attrs, w.shape))
    return [to_first(y)]


def _centered(q: Array, zp: Array | None, axis: int | None = None) -> Array:
    """``q - zp`` in int32 (``zp`` scalar, or one per index of ``axis``)."""
    if zp is None:
        return q.astype(np.int32)
    z = np.asarray(zp).astype(np.int32)
    if z.ndim and axis is not None:
        z = _along(z, axis, q.ndim)
    return q.astype(np.int32) - z


def _qlinear_matmul(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = operands(inputs, "QLinearMatMul", 8, 8)
    acc = np.matmul(_centered(a, a_zp), _centered(b, b_zp, -1))
    mult = (a_s.astype(np.float32) * b_s.astype(np.float32)) / y_s.astype(np.float32)
    return [saturate(acc.astype(np.float32) * mult, y_zp.dtype, y_zp.astype(np.float32))]


def qgemm_weight(b: Array, b_zp: Array | None, trans_b: bool) -> Array:
    """QGemm's ``B - b_zp`` as float64 ``(K, N)``: integer products and sums stay exact
    in float64 (below 2**53), so BLAS's dgemm gives the int32 accumulator."""
    b = b.T if trans_b else b
    return _centered(b, b_zp, -1).astype(np.float64)


def qgemm(a: Array, a_s: Array, a_zp: Array | None, b_centered: Array, b_s: Array,
          c: Array | None, y_s: Array | None, y_zp: Array | None,
          attrs: Mapping[str, Any]) -> Array:
    """com.microsoft QGemm with B given as :func:`qgemm_weight`."""
    a = a.T if int(attrs.get("transA", 0)) else a
    acc = matmul_quiet(_centered(a, a_zp).astype(np.float64), b_centered).astype(np.int32)
    return qgemm_output(acc, a_s, b_s, c, y_s, y_zp, attrs)


def qgemm_output(acc: Array, a_s: Array, b_s: Array, c: Array | None, y_s: Array | None,
                 y_zp: Array | None, attrs: Mapping[str, Any]) -> Array:
    """QGemm from its exact int32 accumulator ``(A - a_zp)(B - b_zp)``: ``+ C``, then
    scaled by ``alpha * a_s * b_s`` in float32, requantized when ``y_s`` is given."""
    if c is not None:
        acc = acc + c.astype(np.int32)
    scale = np.float32(attrs.get("alpha", 1.0)) * a_s.astype(np.float32) \
        * np.asarray(b_s, np.float32).reshape(-1)
    if y_s is None:
        return acc.astype(np.float32) * scale
    zp = np.zeros((), np.uint8) if y_zp is None else y_zp
    return saturate(acc.astype(np.float32) * (scale / y_s.astype(np.float32)), zp.dtype,
                    np.float32(zp))


def _qgemm(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """com.microsoft QGemm: int32 ``(A - a_zp)(B - b_zp) + C``, scaled by ``alpha *
    a_scale * b_scale``; requantized when ``y_scale`` is given, else float."""
    a, a_s, a_zp, b, b_s, b_zp, c, y_s, y_zp = operands(inputs, "QGemm", 6, 9)
    bc = qgemm_weight(b, b_zp, bool(int(attrs.get("transB", 0))))
    return [qgemm(a, a_s, a_zp, bc, b_s, c, y_s, y_zp, attrs)]


def _fma32(a: Array, b: Any, c: Any) -> Array:
    """float32 fused multiply-add through float64: one rounding wherever the exact
    ``a * b + c`` fits float64's 53 bits (QLinearAdd's 8-bit ``a`` at usual scales),
    else two, where the compiled :func:`convengine.quant.dense.kernels.qadd_value` (the
    hardware fma, as ONNX Runtime) rounds once."""
    return (np.asarray(a, np.float64) * np.float64(b) + np.asarray(c, np.float64)
            ).astype(np.float32)


def qlinear_add_params(a_s: Array, a_zp: Array | None, b_s: Array, b_zp: Array | None,
                       c_s: Array, zp: Array) -> tuple[np.float32, np.float32, np.float32]:
    """QLinearAdd's float32 ``(r_a, r_b, fixed)``: ``r_a = a_s / c_s``, ``r_b = b_s /
    c_s``, ``fixed = c_zp - (r_a a_zp + r_b b_zp)``."""
    per_tensor("QLinearAdd", A_scale=a_s, A_zero_point=a_zp, B_scale=b_s, B_zero_point=b_zp,
               C_scale=c_s, C_zero_point=zp)
    ra, rb = np.float32(a_s) / np.float32(c_s), np.float32(b_s) / np.float32(c_s)
    za = np.float32(0 if a_zp is None else a_zp)
    zb = np.float32(0 if b_zp is None else b_zp)
    return ra, rb, np.float32(np.float32(zp) - (ra * za + rb * zb))


def _qlinear_add(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """com.microsoft QLinearAdd as ONNX Runtime's x86 kernel computes it: with
    ``r_a = a_s / c_s``, ``r_b = b_s / c_s`` in float32,
    ``rint(fma(a, r_a, fma(b, r_b, c_zp - (r_a a_zp + r_b b_zp))))``, saturated."""
    a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp = operands(inputs, "QLinearAdd", 7, 8)
    zp = np.zeros((), a.dtype) if c_zp is None else c_zp
    ra, rb, fixed = qlinear_add_params(a_s, a_zp, b_s, b_zp, c_s, zp)
    if a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize == zp.dtype.itemsize == 1:
        views = [(a, b)] + ([(to_last(a), to_last(b))] if a.ndim >= 3 else [])
        for i, (am, bm) in enumerate(views):  # one compiled pass over alike memory
            if am.flags.c_contiguous and bm.flags.c_contiguous:
                y = kernels.qlinear_add(am.reshape(-1), bm.reshape(-1), ra, rb, fixed,
                                        zp.dtype).reshape(am.shape)
                return [to_first(y) if i else y]
    v = _fma32(a, ra, _fma32(b, rb, fixed))
    return [saturate(v, zp.dtype)]


def _qlinear_global_average_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any]
                                 ) -> list[Array]:
    """com.microsoft QLinearGlobalAveragePool: the integer sum of each channel scaled by
    ``x_s / (y_s * count)``; ``channels_last=1`` reads (N, *S, C)."""
    x, x_s, x_zp, y_s, y_zp = operands(inputs, "QLinearGlobalAveragePool", 5, 5)
    per_tensor("QLinearGlobalAveragePool", x_scale=x_s, x_zero_point=x_zp, y_scale=y_s,
               y_zero_point=y_zp)
    if x.ndim < 3:
        raise ConvSetupError(f"QLinearGlobalAveragePool needs X of at least 3 dims (N, C, "
                             f"spatial), got shape {list(x.shape)}")
    last = int(attrs.get("channels_last", 0))
    xl = x if last else to_last(x)
    spatial = tuple(range(1, x.ndim - 1))
    count = math.prod(xl.shape[1:-1])
    mult = np.float32(x_s) / (np.float32(y_s) * np.float32(count))
    if xl.flags.c_contiguous and np.isfinite(mult):
        y = kernels.qlinear_channel_means(xl.reshape(xl.shape[0], count, xl.shape[-1]),
                                          int(x_zp), mult, np.float32(y_zp), y_zp.dtype)
    else:
        total = xl.sum(axis=spatial, dtype=np.int64) - count * np.int64(x_zp)
        y = saturate(total.astype(np.float32) * mult, y_zp.dtype, np.float32(y_zp))
    y = y.reshape(y.shape[0], *(1,) * len(spatial), y.shape[-1])
    return [y if last else to_first(y)]


def _qlinear_concat(inputs: Sequence[Array | None], attrs: Mapping[str, Any]) -> list[Array]:
    """com.microsoft QLinearConcat(y_scale, y_zp, (x, x_scale, x_zp)...): each input
    requantized to the output's parameters, then concatenated along ``axis``."""
    if len(inputs) < 5 or (len(inputs) - 2) % 3:
        raise ConvSetupError(f"QLinearConcat takes Y_scale, Y_zero_point and triples "
                             f"(X, X_scale, X_zero_point), got {len(inputs)} inputs")
    y_s, y_zp = np.float32(inputs[0]), np.asarray(inputs[1])
    parts = []
    for i in range(2, len(inputs), 3):
        x, x_s, x_zp = (np.asarray(v) for v in inputs[i:i + 3])
        if np.float32(x_s) == y_s and x_zp == y_zp:
            parts.append(x)
            continue
        v = (x.astype(np.float32) - np.float32(x_zp)) * np.float32(x_s)
        parts.append(saturate(v / y_s, y_zp.dtype, np.float32(y_zp)))
    return [np.concatenate(parts, axis=int(attrs["axis"]))]


QOPS: dict[str, Op] = {
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _dequantize,
    "QLinearConv": _qlinear_conv,
    "ConvInteger": _conv_integer,
    "QLinearMatMul": _qlinear_matmul,
}
MICROSOFT_OPS: dict[str, Op] = {
    "QLinearAdd": _qlinear_add,
    "QLinearGlobalAveragePool": _qlinear_global_average_pool,
    "QLinearConcat": _qlinear_concat,
    "QGemm": _qgemm,
}
