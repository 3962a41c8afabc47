"""What the depthwise family's kernels compute, in numpy with float64 accumulation.

Channels-last, 2-D (a 1-D problem is the KH = 1 case): x ``(N, H, W, C)``,
w ``(C, KH, KW)``, y and dy ``(N, OH, OW, C)``. Tap ``(i, j)`` of output pixel
``(oh, ow)`` reads input pixel ``(oh*sh - ph + i*dh, ow*sw - pw + j*dw)``, zero where
that lies outside x. Padding is the low side's only (``ph, pw``): the output size is
an argument, as it is the kernels'. Written from these definitions, for the tests
(tests/kernels/test_depthwise_family.py); nothing here calls the kernels.
"""

from __future__ import annotations

import numpy as np

from ...epilogue_codes import CPU_STORE, Activation

Pair = tuple[int, int]


def _reads(out: int, size: int, tap: int, stride: int, pad: int, dilation: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """Along one axis, for ``out`` output positions and one tap: the input position
    each reads (clipped into ``[0, size)``) and whether it lies inside, both (out,)."""
    at = np.arange(out) * stride - pad + tap * dilation
    inside = (at >= 0) & (at < size)
    return np.clip(at, 0, size - 1), inside


def _tap(x: np.ndarray, i: int, j: int, out_size: Pair, stride: Pair, padding: Pair,
         dilation: Pair) -> np.ndarray:
    """x (N, H, W, C) as tap (i, j) reads it for each output pixel: (N, OH, OW, C)
    float64, zero where the pixel read lies outside x."""
    rows, row_in = _reads(out_size[0], x.shape[1], i, stride[0], padding[0], dilation[0])
    cols, col_in = _reads(out_size[1], x.shape[2], j, stride[1], padding[1], dilation[1])
    inside = (row_in[:, None] & col_in[None, :])[None, :, :, None]
    return np.where(inside, x[:, rows][:, :, cols].astype(np.float64), 0.0)


def activation(v: np.ndarray, act: int) -> np.ndarray:
    """``act(v)`` for the codes of :data:`~convengine.epilogue_codes.CPU_STORE` (the
    forward kernels' store): NaN passes ReLU and ReLU6."""
    if act == Activation.NONE:
        return v
    if act == Activation.RELU:
        return np.maximum(v, 0.0)  # np.maximum and np.minimum propagate NaN
    if act == Activation.RELU6:
        return np.minimum(np.maximum(v, 0.0), 6.0)
    raise ValueError(f"act must be one of {[int(a) for a in CPU_STORE]}, got {act}")


def forward(x: np.ndarray, w: np.ndarray, out_size: Pair, stride: Pair = (1, 1),  # noqa: PLR0913
            padding: Pair = (0, 0), dilation: Pair = (1, 1), bias: np.ndarray | None = None,
            act: int = Activation.NONE) -> np.ndarray:
    """x (N, H, W, C), w (C, KH, KW) -> y (N, OH, OW, C) float64, ``out_size`` (OH, OW)::

        y[n, oh, ow, c] = act(sum_{i, j} x[n, oh*sh - ph + i*dh, ow*sw - pw + j*dw, c]
                                         * w[c, i, j] + bias[c])

    (no bias: 0; ``act`` a code of CPU_STORE)."""
    y = np.zeros((x.shape[0], *out_size, x.shape[3]))
    for i in range(w.shape[1]):
        for j in range(w.shape[2]):
            y += _tap(x, i, j, out_size, stride, padding, dilation) * w[:, i, j]
    if bias is not None:
        y += bias
    return activation(y, act)


def backward_data(dy: np.ndarray, w: np.ndarray, in_size: Pair, stride: Pair = (1, 1),
                  padding: Pair = (0, 0), dilation: Pair = (1, 1)) -> np.ndarray:
    """dy (N, OH, OW, C), w (C, KH, KW) -> dx (N, H, W, C) float64, ``in_size`` (H, W):
    the adjoint of :func:`forward` (no bias or activation) in x::

        dx[n, ih, iw, c] = sum dy[n, oh, ow, c] * w[c, i, j]
            over (oh, ow, i, j) with ih = oh*sh - ph + i*dh, iw = ow*sw - pw + j*dw
    """
    n, oh, ow, c = dy.shape
    dx = np.zeros((n, *in_size, c))
    for i in range(w.shape[1]):
        rows, row_in = _reads(oh, in_size[0], i, stride[0], padding[0], dilation[0])
        for j in range(w.shape[2]):
            cols, col_in = _reads(ow, in_size[1], j, stride[1], padding[1], dilation[1])
            # within one tap distinct output pixels read distinct input pixels
            reached = dy[:, row_in][:, :, col_in].astype(np.float64) * w[:, i, j]
            dx[:, rows[row_in][:, None], cols[col_in][None, :]] += reached
    return dx


def backward_weight(x: np.ndarray, dy: np.ndarray, kernel: Pair, stride: Pair = (1, 1),
                    padding: Pair = (0, 0), dilation: Pair = (1, 1)) -> np.ndarray:
    """x (N, H, W, C), dy (N, OH, OW, C) -> dw (C, KH, KW) float64, ``kernel`` (KH, KW):
    the adjoint of :func:`forward` (no bias or activation) in w::

        dw[c, i, j] = sum_{n, oh, ow} dy[n, oh, ow, c]
                                      * x[n, oh*sh - ph + i*dh, ow*sw - pw + j*dw, c]
    """
    dw = np.zeros((x.shape[3], *kernel))
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            taps = _tap(x, i, j, dy.shape[1:3], stride, padding, dilation)
            dw[:, i, j] = np.einsum("nhwc,nhwc->c", taps, dy.astype(np.float64))
    return dw
