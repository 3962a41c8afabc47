"""Depthwise 1-D/2-D convolution backward-data at any stride (one output channel per
input channel), channels-last.

For dy ``(N, OH, OW, C)`` and w ``(C, KH, KW, 1)``, the result dx ``(N, H, W, C)``::

    dx[n, ih, iw, c] = sum dy[n, oh, ow, c] * w[c, i, j]
        over the taps with ih = oh*sh - ph + i*dh and iw = ow*sw - pw + j*dw

(1-D problems are the KH = 1 case). At stride 1, with at most 9 taps, ``depthwise.py``
serves this as a forward conv with the taps reversed; the other problems come here.
At larger strides a dx pixel is reached by only some taps, which depend on its row
and column modulo the stride (3x3 stride 2: one, two or four of the nine). So each
dx pixel gathers: the taps reaching each column (and the dy column each reads) are
listed once per call, those reaching each row likewise, and the pixel writes its
first tap's product and adds the others, over all channels in vectorised loops with
no division or bounds check in them (the generic direct loops spend most of their
time on the ``%`` and ``//`` deciding whether a tap reaches a pixel); a pixel no tap
reaches is zeroed. The work is one task per thread, a block of dx rows, or all on
the calling thread below SERIAL_MACS multiply-adds. dx starts on a cache line (from
32 MiB in a numpy buffer, with huge pages: ``depthwise.output_buffer``). Everything is
cached on disk (the kernels in a kernel module, see ``_kernel_cache``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numba import prange

from ..._kernel_cache import kernel
from ...params import Params
from ...problem import ConvProblem
from ...threads import get_num_threads
from .forward import (
    NOALIAS,
    _as2d,
    _cache_line_aligned,
    one_per_channel,
    output_buffer,
    serial_param,
)

# Below this many multiply-adds the calling thread does it all (the threshold the
# forward kernels had before their border rows stopped taking the masked-load assist;
# this gather kernel has no masked loads and was not measured again)
SERIAL_MACS = 2_000_000


@kernel(nogil=True)
def _reaching(size, out_size, taps, stride, pad, dilation):
    """For each of ``size`` dx coordinates, the taps that reach it along one axis:
    ``count[p]`` of them, tap ``index[p, k]`` reading dy coordinate ``source[p, k]``."""
    count = np.zeros(size, dtype=np.intp)
    index = np.zeros((size, taps), dtype=np.intp)
    source = np.zeros((size, taps), dtype=np.intp)
    for p in range(size):
        for t in range(taps):
            q = p + pad - t * dilation
            if q >= 0 and q % stride == 0 and q // stride < out_size:
                index[p, count[p]] = t
                source[p, count[p]] = q // stride
                count[p] += 1
    return count, index, source


@kernel(**NOALIAS)
def _task(dy, wk, dx, r0, r1, rows, cols):  # noqa: PLR0913
    """dx (N,H,W,C) rows r0:r1 (over n and ih), all channels, from dy (N,OH,OW,C) and
    wk (KH,KW,C); rows and cols the ``_reaching`` lists of each axis."""
    row_count, row_tap, row_source = rows
    col_count, col_tap, col_source = cols
    h_, w_, c_ = dx.shape[1], dx.shape[2], dx.shape[3]
    oh_, ow_ = dy.shape[1], dy.shape[2]
    kw_ = wk.shape[1]
    g = dy.reshape(-1)
    f = wk.reshape(-1)
    d = dx.reshape(-1)
    cu = np.uint64(c_)
    for r in range(r0, r1):
        n, ih = r // h_, r % h_
        for iw in range(w_):
            o = np.uint64(((n * h_ + ih) * w_ + iw) * c_)
            first = True
            for a in range(row_count[ih]):
                dy_row = (n * oh_ + row_source[ih, a]) * ow_
                w_row = row_tap[ih, a] * kw_
                for b in range(col_count[iw]):
                    s = np.uint64((dy_row + col_source[iw, b]) * c_)
                    t = np.uint64((w_row + col_tap[iw, b]) * c_)
                    if first:
                        for c in range(cu):
                            d[o + c] = g[s + c] * f[t + c]
                        first = False
                    else:
                        for c in range(cu):
                            d[o + c] += g[s + c] * f[t + c]
            if first:
                for c in range(cu):
                    d[o + c] = 0


def _kernel(dy, w, h_, w_, sh, sw, ph, pw, dh, dw, parts, raw):  # noqa: PLR0913
    """dy (N,OH,OW,C), w (C,KH,KW) -> dx (N,H,W,C) starting on a cache line (in
    ``raw``, an ``output_buffer``, if that is long enough); ``parts`` tasks of whole
    dx rows."""
    n_, oh_, ow_, c_ = dy.shape
    kh_, kw_ = w.shape[1], w.shape[2]
    dx = _cache_line_aligned(raw, n_, h_, w_, c_)
    wk = np.empty((kh_, kw_, c_), dtype=dy.dtype)  # taps outermost, channels innermost
    for i in range(kh_):
        for j in range(kw_):
            for c in range(c_):
                wk[i, j, c] = w[c, i, j]
    rows = _reaching(h_, oh_, kh_, sh, ph, dh)
    cols = _reaching(w_, ow_, kw_, sw, pw, dw)
    total = n_ * h_
    for p in prange(parts):
        _task(dy, wk, dx, p * total // parts, (p + 1) * total // parts, rows, cols)
    return dx


_parallel = kernel("parallel", parallel=True, nogil=True)(_kernel)
_serial = kernel("serial", nogil=True)(_kernel)


class DepthwiseDataPlan(NamedTuple):
    """A depthwise 2-D (or 1-D) backward-data, ready to run: ``plan(dy, w) -> dx``."""

    kernel: Callable[..., np.ndarray]
    dy4: tuple[int, ...]  # dy seen as (N, OH, OW, C)
    w3: tuple[int, ...]  # w seen as (C, KH, KW)
    x_shape: tuple[int, ...]  # dx as returned, channels-last
    args: tuple[int, ...]  # H, W, sh, sw, ph, pw, dh, dw, parts
    size: int  # values in dx

    def workspace_bytes(self, itemsize: int) -> int:
        """The transposed weights, and each axis' list of the taps reaching it."""
        c, kh_, kw_ = self.w3
        h_, w_ = self.args[:2]
        lists = (h_ * (1 + 2 * kh_) + w_ * (1 + 2 * kw_)) * np.dtype(np.intp).itemsize
        return kh_ * kw_ * c * itemsize + lists

    def __call__(self, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
        """dy (N, *S_out, C), w (C, *K, 1), both C-contiguous -> dx (N, *S, C),
        starting on a cache line."""
        dx = self.kernel(dy.reshape(self.dy4), w.reshape(self.w3), *self.args,
                         output_buffer(self.size, dy.dtype))
        return dx.reshape(self.x_shape)


@functools.lru_cache(maxsize=256)
def _backward_data_plan(problem: ConvProblem, threads: int,
                        force_serial: int | None) -> DepthwiseDataPlan | None:
    if not one_per_channel(problem):  # any kernel size: nothing is unrolled per tap
        return None
    n, c = problem.batch, problem.in_channels
    kh_, kw_ = _as2d(problem.kernel, 1)
    h_, w_ = _as2d(problem.in_size, 1)
    dy4 = (n, *_as2d(problem.out_size, 1), c)
    geometry = (*_as2d(problem.stride, 1), *_as2d(tuple(lo for lo, _ in problem.padding), 0),
                *_as2d(problem.dilation, 1))
    rows = n * h_
    if threads == 1 or rows == 1 or (math.prod(dy4) * kh_ * kw_ < SERIAL_MACS
                                     if force_serial is None else force_serial):
        kernel, parts = _serial, 1
    else:
        kernel, parts = _parallel, min(threads, rows)
    return DepthwiseDataPlan(kernel, dy4, (c, kh_, kw_), problem.x_shape("NHWC"),
                (h_, w_, *geometry, parts), n * h_ * w_ * c)


def backward_data_plan(problem: ConvProblem,
                       params: Params | None = None) -> DepthwiseDataPlan | None:
    """The plan computing dx from (dy, w) for a depthwise problem at any stride, or
    None if this kernel does not serve it; ``params``: :func:`.forward.serial_param`."""
    return _backward_data_plan(problem, get_num_threads(), serial_param(params))
