"""What the int8 depthwise kernels compute, in numpy int64: the reference of the
depthwise family (portable, AVX2, VNNI), for their tests.

Depthwise only (groups == C == O), channels last: x ``(N, *S, C)``, w ``(C, *K, 1)``,
y ``(N, *S_out, C)``, 1-3 spatial dims. Written per channel, apart from the dense
family's grouped reference (``quant.dense.reference``) so that each checks the other:
:func:`accumulate` is the kernels' exact sum for channel ``c`` at output position ``p``,

    acc[n, p, c] = sum_t (x[n, p * stride + t * dilation - padding, c] - xzp)
                         * (w[c, t] - wzp[c])

over the kernel taps ``t``, a position outside x adding nothing (it reads ``xzp``),
wrapped to int32; :func:`conv` finishes it as the plan's
:class:`~convengine.epilogue_codes.Epilogue` says: REQUANT_FLOAT and REQUANT_INT32 by
:func:`~convengine.quant.numerics.apply_requant`, RAW as ``acc + bias`` in int32.
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
               stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int]) -> np.ndarray:
    """The int32 accumulator ``(N, *S_out, C)`` (as int64 values) of x ``(N, *S, C)``
    and w ``(C, *K, 1)``; ``padding`` one (symmetric) amount per spatial dim."""
    nd, chans = x.ndim - 2, x.shape[-1]
    if w.shape[0] != chans or w.shape[-1] != 1 or w.ndim != nd + 2:
        raise ValueError(f"depthwise needs w of shape ({chans}, *K, 1), got {w.shape}")
    size, kernel = x.shape[1:-1], w.shape[1:-1]
    out = [(size[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
           for i in range(nd)]
    xd = x.astype(np.int64) - int(x_zp)
    # (*K, C): each tap's weights less the channel's zero point
    wd = np.moveaxis(w[..., 0], 0, -1).astype(np.int64) - np.asarray(w_zp, np.int64)
    acc: np.ndarray = np.zeros((x.shape[0], *out, chans), np.int64)
    for tap in itertools.product(*(range(k) for k in kernel)):
        # the input coordinate each output coordinate reads at this tap, per dim
        at = [np.arange(out[i]) * stride[i] + tap[i] * dilation[i] - padding[i]
              for i in range(nd)]
        inside = np.ones(out, bool)
        for i in range(nd):
            inside &= ((at[i] >= 0) & (at[i] < size[i])).reshape(
                [-1 if j == i else 1 for j in range(nd)])
        read = xd[np.ix_(range(x.shape[0]), *(np.clip(a, 0, s - 1) for a, s in zip(at, size)),
                         range(chans))]
        acc += np.where(inside[None, ..., None], read, 0) * wd[tap]
    return _wrap32(acc)


def conv(x: np.ndarray, x_zp: int, w: np.ndarray, w_zp: np.ndarray, rq: Requant,
         mode: Epilogue, out_dtype: np.dtype, stride: Sequence[int], padding: Sequence[int],
         dilation: Sequence[int]) -> np.ndarray:
    """y ``(N, *S_out, C)`` as the int8 depthwise kernels store it: :func:`accumulate`
    finished by ``mode`` with the plan's :class:`~convengine.quant.numerics.Requant`
    ``rq`` (RAW: ``rq.bias`` int32)."""
    acc = accumulate(x, x_zp, w, w_zp, stride, padding, dilation)
    if mode == Epilogue.RAW:
        return _wrap32(acc + rq.bias.astype(np.int64)).astype(np.int32)
    return apply_requant(acc.astype(np.int32), rq, out_dtype)
