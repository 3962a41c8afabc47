"""Depthwise 1-D/2-D convolution backward-weight (one output channel per input
channel), channels-last.

For x ``(N, H, W, C)`` and dy ``(N, OH, OW, C)``, the result dw ``(C, KH, KW, 1)``::

    dw[c, i, j] = sum_{n, oh, ow} dy[n, oh, ow, c] * x[n, oh*sh - ph + i*dh, ow*sw - pw + j*dw, c]

with out-of-range input pixels read as zero (1-D problems are the KH = 1 case).

Kernels are generated per (KH, KW, width stride, width dilation). The inner loop is
an ``@intrinsic`` (``llvm.fma`` on the host's vectors, masked loads for the last
channels, as in ``depthwise.py``) that keeps the KH*KW accumulators of NVEC vectors
of channels in registers while it walks every output pixel of a band of rows: each
dy vector is loaded once and multiplied with the shifted x vectors of all taps
(``UNROLL`` adjacent pixels at a time, each x column loaded once for all the taps and
pixels that read it). Pixels whose taps all fall inside x read x unchecked; the
others (first and last columns, rows near the top and bottom) mask each tap's load
by whether its row and column lie inside x. The channel blocks run in turn over a
band of output rows whose dy and x take about BAND_BYTES (so that the later blocks
find the band's cache lines in L2: one block at a time over all rows streamed the
channels-last data with a stride and ran 1.2-1.7x slower at batch 8). The work is one
task per thread, a block of output rows (over n and oh) each adding into its own
partial dw, summed at the end; small problems (SERIAL_MACS, SERIAL_BYTES) all on the
calling thread.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._host import ACCUMULATORS
from ..._kernel_cache import instantiate
from ...params import Params
from ...problem import ConvProblem
from ...threads import get_num_threads
from ..fma import prefetch, splat, vector_ops
from .forward import MAX_TAPS, _as2d, _served, serial_param

# vectors of channels per register block: its KH*KW x NVEC accumulators stay in
# registers (2 with AVX-512, 1 with AVX2)
NVEC = max(1, ACCUMULATORS // MAX_TAPS)
UNROLL = 4  # adjacent output pixels per step of the unchecked loop
# Problems under both limits run on the calling thread (starting the parallel region
# costs more than the second thread saves). MobileNetV2's batch-1 layers under 2M
# multiply-adds, data from L3: 7x7 (376 KB of x and dy) and 14x14 stride 2 (564 KB)
# ran 1.1-1.5x faster serially, 14x14 (602 KB and more) and stride-2 layers with
# more data 1.05-1.5x faster on two threads.
SERIAL_MACS = 2_000_000
SERIAL_BYTES = 576 << 10
# dy and x bytes per band of output rows. MobileNetV2 at batch 8, geometric mean vs
# PyTorch over 6 runs (medians): 128 KiB 1.05, 256 KiB 1.035, 512 KiB-1 MiB 0.96-1.0.
BAND_BYTES = 128 << 10
# A block of channels walks the pixels of a band with the stride of a whole pixel
# (C values), a pattern the hardware prefetchers left waiting on memory: unchecked
# steps prefetch dy and the x rows new to the output row this many pixels ahead.
# MobileNetV2's layers at batch 8, 2 threads, inputs not in cache: 56x56x144
# 2.2 -> 1.05 ms (PyTorch 1.28), 14x14x576 0.79 -> 0.39 (0.24-0.30), 28x28x192 0.88
# -> 0.34 (0.37), stride 2 0.76 -> 0.72 (8, 16 and 32 pixels within 10% of each other)
PREFETCH_PIXELS = 16


def _rows_intrinsic(kh_: int, kw_: int, sw: int, dw: int) -> Any:  # noqa: C901
    """An ``@intrinsic`` ``rows(acc, x, dy, info, c0, rs, cs, r0, r1, ow_, lo, hi,
    col0, w_, valid)`` adding, for the first ``valid`` channels from ``c0`` (at most
    NVEC vectors), into ``acc.flat[t*cs + c0 + l]`` (tap t = i*KW + j):

        sum_{r0 <= r < r1, p < ow_} dy.flat[dyo_r + p*cs + c0 + l]
                                 * x.flat[xo_r + i*rs + (col0 + p*sw + j*dw)*cs + c0 + l]

    with ``xo_r, dyo_r, bits_r = info[r]``: tap row i counts only where bit i of
    ``bits_r`` is set, tap column j only where ``0 <= col0 + p*sw + j*dw < w_``.
    Pixels ``lo <= p < hi`` of rows with every bit set are taken to have every tap
    inside x and are read unchecked."""
    taps = [(i, j) for i in range(kh_) for j in range(kw_)]
    full = (1 << kh_) - 1

    @intrinsic
    def rows(typingctx, acc, x, dy, info, c0, rs, cs, r0, r1, ow_, lo, hi, col0, w_,  # noqa: PLR0913
             valid):
        intp = types.intp
        sig = types.void(acc, x, dy, info, *(intp,) * 11)

        def codegen(context, builder, signature, args):  # noqa: PLR0915
            vec, mask_t, align, load, store, fma = vector_ops(
                context, builder, signature.args[0].dtype)
            lanes = vec.count
            acc_a, x_a, dy_a, info_a = args[:4]
            c0_v, rs_v, cs_v, r0_v, r1_v, ow_v, lo_v, hi_v, col0_v, w_v, valid_v = args[4:]
            it = c0_v.type

            def data(k):
                return context.make_array(signature.args[k])(context, builder, args[k]).data

            acc_p, x_p, dy_p, info_p = data(0), data(1), data(2), data(3)

            def const(v):
                return ir.Constant(it, v)

            lane_ids = ir.Constant(ir.VectorType(it, lanes), list(range(lanes)))
            masks = [
                builder.icmp_signed("<", builder.add(lane_ids, ir.Constant(
                    lane_ids.type, [v * lanes] * lanes)), splat(builder, valid_v, lane_ids.type))
                for v in range(NVEC)
            ]
            zero = ir.Constant(vec, None)
            no_lanes = ir.Constant(mask_t, None)

            def read(base, offset, v, mask=None):
                ptr = builder.gep(base, [builder.add(offset, const(v * lanes))])
                ptr = builder.bitcast(ptr, vec.as_pointer())
                return builder.call(load, [ptr, align, masks[v] if mask is None else mask, zero])

            def vptr(base, offset, v):
                ptr = builder.gep(base, [builder.add(offset, const(v * lanes))])
                return builder.bitcast(ptr, vec.as_pointer())

            # the accumulators live in allocas (promoted to registers by LLVM)
            slots = [[cgutils.alloca_once(builder, vec) for _ in range(NVEC)] for _ in taps]
            for t in range(len(taps)):
                for v in range(NVEC):
                    off = builder.add(builder.mul(const(t), cs_v), c0_v)
                    builder.store(read(acc_p, off, v), slots[t][v])

            def fetch_ahead(xo, dyo, p, width):
                """Prefetch dy and the new tap rows of x for pixels p..p+width-1, each
                PREFETCH_PIXELS ahead (the last ``sw`` tap rows: new when the height
                stride is the width stride)."""
                for u in range(width):
                    q = builder.add(p, const(u + PREFETCH_PIXELS))
                    for v in range(NVEC):
                        prefetch(builder, vptr(dy_p, builder.add(dyo, builder.mul(q, cs_v)), v),
                                 False)
                    col = builder.add(col0_v, builder.mul(q, const(sw)))
                    for i in range(max(0, kh_ - sw), kh_):
                        row = builder.add(xo, builder.mul(const(i), rs_v))
                        for k in range(sw):
                            off = builder.add(row, builder.mul(builder.add(col, const(k)), cs_v))
                            for v in range(NVEC):
                                prefetch(builder, vptr(x_p, off, v), False)

            def step(xo, dyo, p, width, bits=None):
                """Pixels p..p+width-1 of one row, every tap; ``bits`` given: check
                each tap's row and column (width 1 only). Unchecked steps prefetch dy and
                the tap rows new to this output row PREFETCH_PIXELS pixels ahead."""
                if bits is None:
                    fetch_ahead(xo, dyo, p, width)
                dys = [[read(dy_p, builder.add(dyo, builder.mul(builder.add(p, const(u)), cs_v)),
                             v) for v in range(NVEC)] for u in range(width)]
                col = builder.add(col0_v, builder.mul(p, const(sw)))
                base = builder.add(xo, builder.mul(col, cs_v))
                # each x column of a tap row loaded once, used by every (tap, pixel) that
                # reads it, then dead: few registers live besides the accumulators
                for i in range(kh_):
                    row_off = builder.add(base, builder.mul(const(i), rs_v))
                    uses = {}  # column offset -> [(tap, pixel)]
                    for j in range(kw_):
                        for u in range(width):
                            uses.setdefault(u * sw + j * dw, []).append((i * kw_ + j, u))
                    for k in sorted(uses):
                        tap_masks = masks
                        off = builder.add(row_off, builder.mul(const(k), cs_v))
                        if bits is not None:  # width 1: column k is tap k // dw
                            c = builder.add(col, const(k))
                            inside = builder.and_(
                                builder.and_(builder.icmp_signed(">=", c, const(0)),
                                             builder.icmp_signed("<", c, w_v)),
                                builder.icmp_signed("!=", builder.and_(bits, const(1 << i)),
                                                    const(0)))
                            tap_masks = [builder.select(inside, masks[v], no_lanes)
                                         for v in range(NVEC)]
                            # a tap outside x is read, masked off, at x's start: see
                            # depthwise.py (a masked load outside x can fault into a
                            # microcode assist)
                            off = builder.select(inside, off, const(0))
                        xs = [read(x_p, off, v, tap_masks[v]) for v in range(NVEC)]
                        for t, u in uses[k]:
                            for v in range(NVEC):
                                a = builder.load(slots[t][v])
                                builder.store(builder.call(fma, [xs[v], dys[u][v], a]),
                                              slots[t][v])

            with cgutils.for_range(builder, r1_v, start=r0_v) as row_loop:
                r3 = builder.mul(row_loop.index, const(3))
                xo, dyo, bits = (builder.load(builder.gep(info_p, [builder.add(r3, const(k))]))
                                 for k in range(3))
                xo, dyo = builder.add(xo, c0_v), builder.add(dyo, c0_v)
                every = builder.icmp_signed("==", bits, const(full))
                lo_r = builder.select(every, lo_v, const(0))
                hi_r = builder.select(every, hi_v, const(0))
                inner = builder.sub(hi_r, lo_r)
                blocks = builder.sdiv(inner, const(UNROLL))
                with cgutils.for_range(builder, blocks) as loop:
                    step(xo, dyo, builder.add(lo_r, builder.mul(loop.index, const(UNROLL))),
                         UNROLL)
                start = builder.add(lo_r, builder.mul(blocks, const(UNROLL)))
                with cgutils.for_range(builder, hi_r, start=start) as loop:
                    step(xo, dyo, loop.index, 1)
                with cgutils.for_range(builder, builder.sub(ow_v, inner)) as loop:
                    k = loop.index
                    p = builder.select(builder.icmp_signed("<", k, lo_r), k,
                                       builder.add(k, inner))
                    step(xo, dyo, p, 1, bits)
            for t in range(len(taps)):
                for v in range(NVEC):
                    off = builder.add(builder.mul(const(t), cs_v), c0_v)
                    builder.call(store, [builder.load(slots[t][v]), vptr(acc_p, off, v), align,
                                         masks[v]])
            return context.get_dummy_value()

        return sig, codegen

    return rows


_KERNELS: dict[tuple[int, ...], tuple[Callable[..., None], Callable[..., None]]] = {}


def weight_kernel(
    kh_: int, kw_: int, sw_: int, dw_: int
) -> tuple[Callable[..., None], Callable[..., None]]:
    """The kernels (parallel, serial) for one (KH, KW) kernel shape, width stride and
    width dilation: ``kernel(x (N,H,W,C), dy (N,OH,OW,C), dw (C, KH*KW), sh, ph, pw,
    dh, parts)`` overwrites dw; ``parts`` tasks each sum a block of output rows into
    their own partial. The serial one runs its tasks in turn on the calling thread."""
    key = (kh_, kw_, sw_, dw_)
    if key not in _KERNELS:
        module = instantiate(__name__, "weight_template.py",
                             f"depthwise_weight_{kh_}x{kw_}_s{sw_}_d{dw_}",
                             KH=kh_, KW=kw_, SW=sw_, DW=dw_)
        _KERNELS[key] = module.parallel, module.serial
    return _KERNELS[key]


class DepthwiseWeightPlan(NamedTuple):
    """A depthwise 2-D (or 1-D) backward-weight, ready to run: ``plan(x, dy) -> dw``."""

    kernel: Callable[..., None]
    key: tuple[int, ...]  # KH, KW, width stride, width dilation
    x4: tuple[int, ...]  # x seen as (N, H, W, C)
    dy4: tuple[int, ...]  # dy seen as (N, OH, OW, C)
    w_shape: tuple[int, ...]  # dw as returned, (C, *K, 1)
    args: tuple[int, ...]  # sh, ph, pw, dh, band, parts

    def workspace_bytes(self, itemsize: int) -> int:
        """The partial sums: one (KH*KW, C) block per task."""
        return self.args[5] * self.key[0] * self.key[1] * self.x4[3] * itemsize

    def __call__(self, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """x (N, *S, C), dy (N, *S_out, C), both C-contiguous -> dw (C, *K, 1)."""
        dw = np.empty(self.w_shape, dtype=x.dtype)
        self.kernel(x.reshape(self.x4), dy.reshape(self.dy4), dw.reshape(self.x4[3], -1),
                    *self.args)
        return dw


@functools.lru_cache(maxsize=256)
def _backward_weight_plan(problem: ConvProblem, threads: int,
                          force_serial: int | None) -> DepthwiseWeightPlan | None:
    if not _served(problem):
        return None
    n, c = problem.batch, problem.in_channels
    kh_, kw_ = _as2d(problem.kernel, 1)
    sh, sw = _as2d(problem.stride, 1)
    dh, dw = _as2d(problem.dilation, 1)
    ph, pw = _as2d(tuple(lo for lo, _ in problem.padding), 0)
    x4 = (n, *_as2d(problem.in_size, 1), c)
    dy4 = (n, *_as2d(problem.out_size, 1), c)
    parallel, serial = weight_kernel(kh_, kw_, sw, dw)
    rows = dy4[0] * dy4[1]
    # output rows per band: the dy rows and the x rows they read, about BAND_BYTES
    band = max(1, BAND_BYTES // ((dy4[2] + sh * x4[2]) * c * problem.compute_dtype.itemsize))
    small = (math.prod(dy4) * kh_ * kw_ < SERIAL_MACS
             and (math.prod(x4) + math.prod(dy4)) * problem.compute_dtype.itemsize < SERIAL_BYTES)
    if threads == 1 or rows == 1 or (small if force_serial is None else force_serial):
        kernel, parts = serial, 1
    else:
        kernel, parts = parallel, min(threads, rows)
    return DepthwiseWeightPlan(kernel, (kh_, kw_, sw, dw), x4, dy4, problem.w_shape("NHWC"),
                (sh, ph, pw, dh, band, parts))


def backward_weight_plan(problem: ConvProblem,
                         params: Params | None = None) -> DepthwiseWeightPlan | None:
    """The plan computing dw from (x, dy) for a depthwise problem, or None if these
    kernels do not serve it; ``params``: :func:`.forward.serial_param`."""
    return _backward_weight_plan(problem, get_num_threads(), serial_param(params))
