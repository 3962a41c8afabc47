"""What the int8 dense kernels compute, in numpy int64: the reference of the dense
family (portable, AVX2, VNNI, AMX), the general grouped convolution, for their tests.

Channels-last throughout: x ``(N, *S, C)``, w ``(O, *K, C // groups)``, y ``(N,
*S_out, O)``, 1-3 spatial dims. :func:`accumulate` is every kernel's exact sum
``acc = sum (x - xzp)(w - wzp[o])`` over the window (padding reads as ``xzp``) and the
group's channels, wrapped to int32 as the kernels' sums wrap; :func:`conv` finishes it
as the plan's :class:`~convengine.epilogue_codes.Epilogue` says: REQUANT_FLOAT and
REQUANT_INT32 by :func:`~convengine.quant.numerics.apply_requant` (the requantization's
reference, with ReLU as its clamp), RAW as ``acc + bias`` in int32. The depthwise
family's own reference (``quant.depthwise.reference``) is the per-channel case, written
apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from ...epilogue_codes import Epilogue
from ..numerics import Requant, apply_requant


def _wrap32(v: np.ndarray) -> np.ndarray:
    return (v + 2**31) % 2**32 - 2**31


def accumulate(x: np.ndarray, x_zp: int, w: np.ndarray, w_zp: np.ndarray,
               stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
               groups: int) -> np.ndarray:
    """The int32 accumulator (as int64 values) of x and w, zero points subtracted;
    ``padding`` one (symmetric) amount per spatial dim."""
    nd = x.ndim - 2
    xd = x.astype(np.int64) - int(x_zp)
    xd = np.pad(xd, ((0, 0), *[(p, p) for p in padding], (0, 0)))
    wd = w.astype(np.int64) - np.asarray(w_zp, np.int64).reshape(-1, *(1,) * (nd + 1))
    o, cg = w.shape[0], w.shape[-1]
    og = o // groups
    out = [(xd.shape[1 + i] - dilation[i] * (w.shape[1 + i] - 1) - 1) // stride[i] + 1
           for i in range(nd)]
    acc = np.zeros((x.shape[0], *out, groups, og), np.int64)
    wg = wd.reshape(groups, og, *w.shape[1:])
    for tap in itertools.product(*(range(k) for k in w.shape[1:-1])):
        window = tuple(slice(k * d, k * d + s * (m - 1) + 1, s)
                       for k, d, s, m in zip(tap, dilation, stride, out, strict=True))
        patch = xd[(slice(None), *window)].reshape(x.shape[0], *out, groups, cg)
        taps: tuple[slice | int, ...] = (slice(None), slice(None), *tap)
        acc += np.einsum("...gc,goc->...go", patch, wg[taps])
    return _wrap32(acc.reshape(x.shape[0], *out, o))


def conv(x: np.ndarray, x_zp: int, w: np.ndarray, w_zp: np.ndarray, rq: Requant,
         mode: Epilogue, out_dtype: np.dtype, stride: Sequence[int], padding: Sequence[int],
         dilation: Sequence[int], groups: int) -> np.ndarray:
    """y as the int8 kernels store it: :func:`accumulate` finished by ``mode`` with the
    plan's :class:`~convengine.quant.numerics.Requant` ``rq`` (RAW: ``rq.bias`` int32)."""
    acc = accumulate(x, x_zp, w, w_zp, stride, padding, dilation, groups)
    if mode == Epilogue.RAW:
        return _wrap32(acc + rq.bias.astype(np.int64)).astype(np.int32)
    return apply_requant(acc.astype(np.int32), rq, out_dtype)
