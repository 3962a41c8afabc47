"""numpy, float64: exactly what one call of a ``blocked`` micro-kernel stores, and the
weight layouts its drivers walk, written from the definitions in :mod:`.forward` and
:mod:`.weight` (for the tests; nothing imports it).

The micro-kernels' functions take the kernels' flat arguments and return a float64
copy of the flat output ``y`` with the call's stores applied; what the call does not
store keeps its value.
"""

from __future__ import annotations

import numpy as np

from ...epilogue_codes import Activation


def activation(v: np.ndarray, act: int) -> np.ndarray:
    """``act(v)`` for the CPU store's codes (:data:`~convengine.epilogue_codes.CPU_STORE`),
    by ordered compares: NaN passes ReLU and ReLU6."""
    if act not in (Activation.NONE, Activation.RELU, Activation.RELU6):
        raise ValueError(f"not an activation of the CPU store: {act}")
    if act != Activation.NONE:
        v = np.where(v < 0, 0.0, v)  # max(v, 0)
    if act == Activation.RELU6:
        v = np.where(v > 6, 6.0, v)  # min(max(v, 0), 6)
    return v


def walked(w: np.ndarray, first: int, row: int, col: int, step: int, kh: int, kw: int,
           c: int, lanes: int) -> np.ndarray:
    """(kh, kw, c, lanes): ``w[first + a*row + b*col + k*step + j]`` of the flat w, the
    weight a micro-kernel reads for tap (a, b), reduction index k and lane j (one
    output-channel block of a :class:`~.forward.WeightWalk`: ``first + ob * block``)."""
    a, b, k, j = np.ogrid[:kh, :kw, :c, :lanes]
    return w[first + a * row + b * col + k * step + j].astype(np.float64)


def tile(x: np.ndarray, offsets: np.ndarray, hs: int, ws: int, kh: int, kw: int, c: int,
         w: np.ndarray, w_off: int, was: int, wbs: int, wks: int, y: np.ndarray, y_off: int,
         ys: int, lanes: int, bias: np.ndarray | None = None, b_off: int = 0,
         res: np.ndarray | None = None, act: int = Activation.NONE) -> np.ndarray:
    """The gathered forward micro-kernel on ``m = len(offsets)`` stored pixels: for
    ``r < m``, ``j < lanes``, ``y[y_off + r*ys + j] = act(sum_{a<kh, b<kw, k<c}
    x[offsets[r] + a*hs + b*ws + k] * w[w_off + a*was + b*wbs + k*wks + j]
    + bias[b_off + j] (+ res[y_off + r*ys + j]))``; no bias: 0, no res: none added."""
    a, b, k = np.ogrid[:kh, :kw, :c]
    taps = (a * hs + b * ws + k).reshape(-1)
    xs = x[np.asarray(offsets)[:, None] + taps].astype(np.float64)  # (m, kh*kw*c)
    v = xs @ walked(w, w_off, was, wbs, wks, kh, kw, c, lanes).reshape(-1, lanes)
    if bias is not None:
        v = v + bias[b_off:b_off + lanes]
    at = y_off + ys * np.arange(len(offsets))[:, None] + np.arange(lanes)  # (m, lanes)
    if res is not None:
        v = v + res[at]
    out = y.astype(np.float64)
    out[at] = activation(v, act)
    return out


def strided_tile(x: np.ndarray, x_off: int, ps: int, hs: int, ws: int, kh: int, kw: int,
                 c: int, w: np.ndarray, w_off: int, m: int, y: np.ndarray, y_off: int,
                 ys: int, nr: int) -> np.ndarray:
    """The contiguous forward micro-kernel, ``m`` stored pixels of ``nr`` lanes:
    ``y[y_off + r*ys + j] = sum x[x_off + r*ps + a*hs + b*ws + k] * w[w_off + ((a*kw + b)
    * c + k) * nr + j]`` (:func:`tile` at offsets ``x_off + r*ps``, the packed walk)."""
    offsets = x_off + ps * np.arange(m)
    return tile(x, offsets, hs, ws, kh, kw, c, w, w_off, kw * c * nr, c * nr, nr, y, y_off,
                ys, nr)


def weight_tile(d: np.ndarray, d_off: int, dn: int, dh: int, dw: int, nn: int, nh: int,
                nw: int, x: np.ndarray, x_off: int, xn: int, xh: int, xw: int, m: int,
                nr: int, y: np.ndarray, y_off: int, ys: int, add: bool) -> np.ndarray:
    """The backward-weight micro-kernel, ``m`` stored rows of ``nr`` lanes:
    ``y[y_off + r*ys + j] = (y[...] if add else 0) + sum_{n<nn, h<nh, w<nw}
    d[d_off + n*dn + h*dh + w*dw + r] * x[x_off + n*xn + h*xh + w*xw + j]``."""
    n, h, v = np.ogrid[:nn, :nh, :nw]
    ds = d[d_off + (n * dn + h * dh + v * dw).reshape(-1) + np.arange(m)[:, None]]  # (m, P)
    xs = x[x_off + (n * xn + h * xh + v * xw).reshape(-1)[:, None] + np.arange(nr)]  # (P, nr)
    at = y_off + ys * np.arange(m)[:, None] + np.arange(nr)
    out = y.astype(np.float64)
    out[at] = (out[at] if add else 0.0) + ds.astype(np.float64) @ xs.astype(np.float64)
    return out


def packed(w: np.ndarray, nr: int) -> np.ndarray:
    """w (O, KH, KW, C) in panels (ceil(O / nr), KH, KW, C, nr): ``[ob, a, b, k, j] =
    w[ob*nr + j, a, b, k]``, zero where ``ob*nr + j >= O``."""
    o, kh, kw, c = w.shape
    ob, a, b, k, j = np.ogrid[:-(-o // nr), :kh, :kw, :c, :nr]
    lane = ob * nr + j
    return np.where(lane < o, w[np.minimum(lane, o - 1), a, b, k], 0).astype(w.dtype)


def flipped(w: np.ndarray) -> np.ndarray:
    """The weights of backward-data as a forward conv: w (O, KH, KW, C) ->
    (C, KH, KW, O), ``[k, a, b, o] = w[o, KH-1-a, KW-1-b, k]``."""
    o, kh, kw, c = w.shape
    k, a, b, oo = np.ogrid[:c, :kh, :kw, :o]
    return w[oo, kh - 1 - a, kw - 1 - b, k]
