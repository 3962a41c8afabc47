"""What the Winograd family computes, in numpy float64 from the textbook definitions
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016), for its tests.

F(m, r) computes ``m`` outputs of an ``r``-tap correlation from a tile of ``alpha = m +
r - 1`` inputs: ``y = A^T [(G g) . (B^T d)]`` (``.``: elementwise), and in 2-D ``Y =
A^T [(G g G^T) . (B^T d B)] A``. :func:`matrices` derives the three matrices by the
Cook-Toom construction from interpolation points (not copied from the kernels):
correlation is the transpose of linear convolution, which Toom-Cook computes as
``s = E_alpha^{-1} [(E_r g) . (E_m h)]`` (``E_k``: evaluation of a polynomial of ``k``
coefficients at the points and at infinity), so ``A^T = E_m^T``, ``G = E_r`` and ``B^T =
E_alpha^{-T}``, here with row ``i`` of ``G`` divided and of ``B^T`` multiplied by ``f_i =
prod_{j != i} (a_i - a_j)``, which makes ``B^T`` integer.

Channels-last like the kernels: x ``(N, *S, C)``, w ``(O, *(3,) * ndim, C)``, y ``(N,
*S_out, O)``, ``ndim`` 1 or 2.
"""

from __future__ import annotations

import math

import numpy as np

POINTS = (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5)  # the finite points in order; then infinity


def points(m: int, r: int = 3) -> tuple[float, ...]:
    """The ``m + r - 2`` finite interpolation points of F(m, r) (infinity is the last)."""
    if m + r - 2 > len(POINTS):
        raise ValueError(f"F({m}, {r}) needs {m + r - 2} points, {len(POINTS)} are listed")
    return POINTS[:m + r - 2]


def _evaluation(pts: tuple[float, ...], k: int) -> np.ndarray:
    """E_k ``(len(pts) + 1, k)``: row ``i`` evaluates the polynomial of coefficients
    ``c_0..c_{k-1}`` at ``pts[i]``; the last row at infinity (its leading coefficient)."""
    e = np.zeros((len(pts) + 1, k))
    e[:-1] = np.power.outer(np.array(pts), np.arange(k))
    e[-1, -1] = 1.0
    return e


def matrices(m: int, r: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T ``(alpha, alpha)``, G ``(alpha, r)``, A^T ``(m, alpha)``) of F(m, r): row ``i <
    alpha - 1`` of B^T holds the coefficients (constant first) of ``prod_{j != i} (x -
    a_j)``, its last row those of ``prod_j (x - a_j)``; G is E_r with row ``i`` divided
    by ``f_i``; A^T is E_m^T."""
    pts = points(m, r)
    alpha = m + r - 1
    f = np.array([math.prod(p - q for q in pts if q != p) for p in pts] + [1.0])
    bt = np.zeros((alpha, alpha))
    for i, p in enumerate(pts):  # np.poly: monic polynomial from roots, highest first
        bt[i, :alpha - 1] = np.poly([q for q in pts if q != p])[::-1]
    bt[-1] = np.poly(pts)[::-1]
    return bt, _evaluation(pts, r) / f[:, None], _evaluation(pts, m).T


def _apply(mat: np.ndarray, t: np.ndarray, ndim: int) -> np.ndarray:
    """``mat`` applied along each of the last ``ndim`` axes of ``t``: ``mat @ t`` in 1-D,
    ``mat @ t @ mat^T`` in 2-D (over any leading axes)."""
    for axis in range(t.ndim - ndim, t.ndim):
        t = np.moveaxis(np.tensordot(mat, t, axes=([1], [axis])), 0, axis)
    return t


def weight_transform(g: np.ndarray, m: int, ndim: int) -> np.ndarray:
    """U = G g G^T: g ``(..., *(3,) * ndim)`` -> ``(..., *(alpha,) * ndim)``."""
    return _apply(matrices(m)[1], np.asarray(g, np.float64), ndim)


def input_transform(d: np.ndarray, m: int, ndim: int) -> np.ndarray:
    """V = B^T d B: d ``(..., *(alpha,) * ndim)`` -> same shape."""
    return _apply(matrices(m)[0], np.asarray(d, np.float64), ndim)


def output_transform(p: np.ndarray, m: int, ndim: int) -> np.ndarray:
    """Y = A^T P A: P ``(..., *(alpha,) * ndim)`` -> ``(..., *(m,) * ndim)``."""
    return _apply(matrices(m)[2], np.asarray(p, np.float64), ndim)


def tile(d: np.ndarray, g: np.ndarray, m: int) -> np.ndarray:
    """F(m, 3) of one tile and one channel pair: d ``(alpha,) * ndim``, g ``(3,) * ndim``
    -> Y = A^T [U . V] A ``(m,) * ndim`` (the valid correlation of d by g)."""
    ndim = d.ndim
    return output_transform(weight_transform(g, m, ndim) * input_transform(d, m, ndim), m, ndim)


def conv(x: np.ndarray, w: np.ndarray, m: int,
         padding: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The 3x3 stride-1 conv as the kernels compute it, tile by tile: x ``(N, *S, C)``
    zero-padded by ``padding`` (``(lo, hi)`` per spatial dim) and on the far side to
    whole tiles, cut into tiles of ``alpha`` inputs every ``m``, ``M = sum_c U[o, c] .
    V[t, c]`` per tile, ``Y = A^T M A`` cropped: w ``(O, *(3,) * ndim, C)`` -> y ``(N,
    *S_out, O)``, ``S_out = S + lo + hi - 2``."""
    ndim, alpha = x.ndim - 2, m + 2
    out = [x.shape[1 + i] + sum(padding[i]) - 2 for i in range(ndim)]
    tiles = [-(-n // m) for n in out]
    pads = [(lo, t * m + 2 - n - lo) for (lo, _), t, n in zip(padding, tiles, x.shape[1:-1])]
    xp = np.pad(x.astype(np.float64), [(0, 0), *pads, (0, 0)])
    spatial = tuple(range(1, ndim + 1))
    d = np.lib.stride_tricks.sliding_window_view(xp, (alpha,) * ndim, axis=spatial)
    d = d[(slice(None), *(slice(None, None, m),) * ndim)]  # (N, *T, C, *(alpha,) * ndim)
    v = input_transform(d, m, ndim).reshape(*d.shape[:ndim + 2], -1)
    u = weight_transform(np.moveaxis(w, -1, 1), m, ndim).reshape(w.shape[0], w.shape[-1], -1)
    p = np.einsum("...ca,oca->...oa", v, u).reshape(*v.shape[:ndim + 1], -1, *(alpha,) * ndim)
    y = output_transform(p, m, ndim)  # (N, *T, O, *(m,) * ndim)
    order = [0, *(k for i in range(ndim) for k in (1 + i, ndim + 2 + i)), ndim + 1]
    y = y.transpose(order).reshape(x.shape[0], *(t * m for t in tiles), w.shape[0])
    return y[(slice(None), *(slice(0, n) for n in out))]


def gemm_6xnr(a: np.ndarray, a_off: int, lda: int, b: np.ndarray, b_off: int, kc: int,
              mr: int, c: np.ndarray, c_off: int, ldc: int, add: bool, nr: int) -> np.ndarray:
    """The micro-kernel's contract on flat a, b, c: a float64 copy of c with, for rows
    ``r < mr``, ``c[c_off + r * ldc + col] = (c[...] if add else 0) + sum_{k < kc} a[a_off +
    r * lda + k] * b[b_off + k * nr + col]`` for ``col < nr`` (b: ``kc`` packed rows of
    ``nr``); nothing else changes."""
    out = np.asarray(c, np.float64).ravel().copy()
    panel = np.asarray(b, np.float64).ravel()[b_off:b_off + kc * nr].reshape(kc, nr)
    flat = np.asarray(a, np.float64).ravel()
    for r in range(mr):
        at = c_off + r * ldc
        total = flat[a_off + r * lda:a_off + r * lda + kc] @ panel
        out[at:at + nr] = (out[at:at + nr] if add else 0.0) + total
    return out
