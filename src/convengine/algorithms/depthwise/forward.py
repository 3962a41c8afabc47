"""Depthwise 1-D/2-D convolution (one output channel per input channel), channels-last.

For x ``(N, H, W, C)``, w ``(C, KH, KW, 1)`` and y ``(N, OH, OW, C)``::

    y[n, oh, ow, c] = sum_{i, j} x[n, oh*sh - ph + i*dh, ow*sw - pw + j*dw, c] * w[c, i, j]

with out-of-range input pixels read as zero (1-D problems are the KH = 1 case).
Backward-data at stride 1 is the same conv of dy with the taps reversed.

Kernels are generated per (KH, KW, width stride, dilations). The register block is an
``@intrinsic`` that emits ``llvm.fma`` on the host's widest vectors (512-bit with
AVX-512, where LLVM's default through numba is 256-bit; 256-bit with AVX2):
``OW_BLOCK`` adjacent output pixels times ``NVEC`` vectors of channels, every tap
unrolled, with masked loads and stores for the last channels. Every row reads x in
place: its first and last columns through variants of the block restricted to the tap
columns inside x, and near the top and bottom with the tap rows outside x masked off
in the loads. Only where some pixel has no tap column inside x (padding wider than the
kernel's reach) do the rows read zero-padded copies of their input rows. The work is
one task per thread, a block of output rows (a slice of channels when there are fewer
rows than threads), or all on the calling thread below SERIAL_MACS multiply-adds.

y starts on a 64-byte cache line (outputs of 32 MiB and more in a buffer numpy
allocates, with huge pages); outputs of STREAMING_BYTES or more at width stride
1 whose channels fill whole register blocks are written with non-temporal stores (no read of
each line before it is written, no eviction of x from the caches), through kernels
generated for that too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cpu, options
from numba.extending import intrinsic

from ... import host_params, memory
from ..._kernel_cache import Source, instantiate, load
from ...checked import CHECKED, within  # noqa: F401  (CHECKED: read by the generated span/edge)
from ...epilogue_codes import Activation
from ...params import Params
from ...problem import ConvProblem
from ...threads import get_num_threads
from ..fma import (  # VECTOR_BYTES: 16 float32 or 8 float64 (AVX2: 8, 4)
    VECTOR_BYTES,
    prefetch,
    splat,
    vector_ops,
)

# numba's compiler has a ``noalias`` flag (LLVM ``noalias`` on every array argument)
# but no public njit option for it; map one, so that kernels whose arrays never
# overlap vectorise without LLVM's runtime overlap checks (too many to emit here).
if not hasattr(cpu.CPUTargetOptions, "noalias"):
    cpu.CPUTargetOptions.noalias = options._mapping("noalias")
NOALIAS: dict[str, Any] = {"nogil": True, "noalias": True, "fastmath": {"contract"}}

OW_BLOCK = 4  # output pixels per register block
# vectors of channels per register block: with AVX2's 16 registers two spilled (Zen 3,
# batch-8 56x56x144 stride 1 on 2 threads, caches flushed: 1.08 ms at one, 1.49 at two)
NVEC = 2 if VECTOR_BYTES == 64 else 1
GRAIN = 16  # channel slices of a split start at multiples of this
MAX_TAPS = 9
# Outputs of at least this many bytes are written with non-temporal stores where every
# vector of y starts a cache line, at width stride 1: they bypass the caches and skip
# reading each line before writing it. Measured (b8 MobileNetV2 depthwise, 2 threads,
# PyTorch's convs run in between): 1.3-1.5x faster on the 12-14 MiB stride-1 outputs,
# also followed by a 1x1 conv reading y back; mixed (0.92-1.19x) on the 1.5-4.6 MiB
# ones, which the caches hold for the next reader; 0.8-0.95x on the 9 MiB output of the
# stride-2 layer, which reads four times as much x as it writes.
# Only where every register block's channels are whole (C a multiple of NVEC vectors):
# with the software prefetch below, batch-8 56x56x144 (9 vectors, its last block
# half masked and stored through the cache) took 1.72-1.78 ms streamed and 1.14-1.23
# not, while 112x112x32 took 0.67-0.90 streamed and 0.97-1.14 not (2 threads).
# A quarter of L3: 8 MiB on Zen 4's 32 MiB (see host_params.streaming_bytes).
STREAMING_BYTES = host_params.streaming_bytes()
# Each register block prefetches the x lines this far ahead along the tap rows new to
# its output row, and the y lines this far ahead (not with non-temporal stores, which
# bypass the cache: batch-8 112x112x32 1.0-1.1 ms with, 0.7-0.8 without): once x and y
# outgrow L2, the hardware prefetchers alone left the kernel waiting on memory.
# Measured single-threaded on an
# input not in cache (as in a network), 56x56x144 stride 1: 0.42 -> 0.13 ms (PyTorch:
# 0.24); 112x112x32: 0.33 -> 0.11; 28x28x192: 0.10 -> 0.04; stride 2 gains less
# (112x112x96: 0.39 -> 0.30-0.36), its input is four times its output.
PREFETCH_X_BYTES = 8192
PREFETCH_Y_BYTES = 4096
# Below this many multiply-adds the calling thread does it all: starting the parallel
# region costs more than the second thread saves. Measured 2026-12-02 (Zen 4, 2
# threads, interleaved in one process, once the border rows no longer took the
# masked-load assist): 0.25-0.42M serial 1.0-1.4x faster, 0.68-1.35M parallel 1.5-1.7x
# faster; MobileNetV2 batch 1 against the earlier 2M: an ONNX session 8.39 -> 8.07 ms,
# replace_convs inference 23.4 -> 20.8 ms, a training step 86.5 -> 81.7 ms (medians of
# 6-8 alternations).
SERIAL_MACS = 500_000


def _block_intrinsic(  # noqa: PLR0913
    kh_: int, kw_: int, sw: int, dw: int, width: int, j0: int = 0, j1: int | None = None,
    streaming: bool = False, epilogue: bool = False,
) -> Any:
    """An ``@intrinsic`` computing ``width`` adjacent output pixels for NVEC vectors of
    channels (the first ``valid`` lanes; the rest are neither read nor written):

        y.flat[yo + b*C + v*L + l] = sum_{i, j} a.flat[ao + i*rs + (b*sw + j*dw)*cs + v*L + l]
                                              * wk.flat[(wo + v*L)*KH*KW + (i*KW + j)*L + l]

    over taps ``j0 <= j < j1`` (default all), in order, in registers (``llvm.fma`` on
    ``VECTOR_BYTES`` vectors of L lanes; ``wo`` a multiple of L, wk as :meth:`DepthwisePlan.taps`
    lays it out).
    ``streaming``: full vectors go to memory with non-temporal stores, which need
    every full vector of y on a 64-byte boundary (y aligned, C a multiple of a vector).
    ``epilogue``: the block takes two more arguments, ``bias`` (C,) and ``act`` (an
    :class:`~convengine.epilogue_codes.Activation` of ``CPU_STORE``) and stores
    ``act(sum + bias.flat[wo + l])``, as :mod:`convengine.fused_epilogue` computes it
    (NaN passes both activations)."""
    taps = [(i, j) for i in range(kh_) for j in range(j0, kw_ if j1 is None else j1)]

    intp = types.intp

    def block(typingctx, y, yo, a, ao, rs, cs, wk, wo, c_, valid, rows):  # noqa: PLR0913
        return types.void(y, intp, a, intp, intp, intp, wk, intp, intp, intp, intp), codegen

    def block_epilogue(typingctx, y, yo, a, ao, rs, cs, wk, wo, c_, valid, rows,  # noqa: PLR0913
                       bias, act):
        return types.void(y, intp, a, intp, intp, intp, wk, intp, intp, intp, intp, bias,
                          intp), codegen

    def codegen(context, builder, signature, args):
        vec, mask_t, align, load, store, fma = vector_ops(
            context, builder, signature.args[0].dtype)
        lanes = vec.count
        y_a, yo_v, a_a, ao_v, rs_v, cs_v, wk_a, wo_v, c_v, valid_v, rows_v = args[:11]
        it = yo_v.type
        y_ptr = context.make_array(signature.args[0])(context, builder, y_a).data
        a_ptr = context.make_array(signature.args[2])(context, builder, a_a).data
        w_ptr = context.make_array(signature.args[6])(context, builder, wk_a).data
        lane_ids = ir.Constant(ir.VectorType(it, lanes), list(range(lanes)))
        valid_lanes = splat(builder, valid_v, lane_ids.type)
        masks = [
            builder.icmp_signed("<", builder.add(lane_ids, ir.Constant(lane_ids.type, [
                v * lanes] * lanes)), valid_lanes)
            for v in range(NVEC)
        ]
        zero = ir.Constant(vec, None)
        # tap row i is read only if bit i of ``rows`` is set (rows outside x are
        # masked off: their loads read nothing and give zeros)
        row_masks, inside = [], []
        for i in range(kh_):
            bit = builder.and_(rows_v, ir.Constant(it, 1 << i))
            inside.append(builder.icmp_unsigned("!=", bit, ir.Constant(it, 0)))
            row_masks.append([builder.and_(m, builder.select(
                inside[i], ir.Constant(mask_t, [1] * lanes), ir.Constant(mask_t, None)))
                for m in masks])

        def at(base, offset, v):
            """Vector v at ``base + offset`` (offset: a value or None)."""
            if offset is not None:
                base = builder.gep(base, [offset])
            ptr = builder.gep(base, [ir.Constant(it, v * lanes)])
            return builder.bitcast(ptr, vec.as_pointer())

        def read(base, offset, v, mask=None):
            mask = masks[v] if mask is None else mask
            return builder.call(load, [at(base, offset, v), align, mask, zero])

        # a tap row outside x is read, masked off, at the first row inside x: a masked
        # load from an address outside x (unmapped memory, past a pooled block's ends)
        # faulted lane by lane into a microcode assist, 130 us for the top row of
        # 56x56x144 against 3 for a row inside (Zen 4). ``rows`` must not be 0.
        cttz = builder.module.declare_intrinsic("llvm.cttz", [it, ir.IntType(1)])
        first_inside = builder.add(ao_v, builder.mul(
            builder.call(cttz, [rows_v, ir.Constant(ir.IntType(1), 0)]), rs_v))
        # addresses as a row's pointer plus a multiple of the column stride shared by
        # all rows, and weights at constant offsets: x86 addressing then takes them as
        # they are (one index per tap and column had LLVM spill ~60 GPRs per block)
        rows_at = [
            builder.gep(a_ptr, [builder.select(
                inside[i], builder.add(ao_v, builder.mul(ir.Constant(it, i), rs_v)),
                first_inside)])
            for i in range(kh_)
        ]
        columns = [builder.mul(ir.Constant(it, k), cs_v)  # taps read, columns prefetched
                   for k in range(max((width - 1) * sw + (kw_ - 1) * dw + 1, width * sw))]
        y_at = builder.gep(y_ptr, [yo_v])
        pixels = [builder.mul(ir.Constant(it, b), c_v) for b in range(width)]
        # the weights of vector v, tap t at w_at + (v * KH * KW + t) * lanes (DepthwisePlan.taps)
        w_at = builder.gep(w_ptr, [builder.mul(wo_v, ir.Constant(it, kh_ * kw_))])
        if epilogue:
            b_ptr = context.make_array(signature.args[11])(context, builder, args[11]).data
            act_v = args[12]
            # the activation as bounds: [0, inf) for ReLU, [0, 6] for ReLU6, else
            # (-inf, inf) (a mask per activation made AVX2 code pack i1 vectors)
            inf = float("inf")
            relu6 = builder.icmp_signed("==", act_v, ir.Constant(it, int(Activation.RELU6)))
            relu = builder.or_(builder.icmp_signed("==", act_v,
                                                   ir.Constant(it, int(Activation.RELU))), relu6)
            low_bound = builder.select(relu, zero, ir.Constant(vec, [-inf] * lanes))
            high_bound = builder.select(relu6,
                                        ir.Constant(vec, [6.0] * lanes),
                                        ir.Constant(vec, [inf] * lanes))

            def finish(acc, bias):
                """act(acc + bias) (ordered compares: NaN stays NaN)."""
                acc = builder.fadd(acc, bias)
                acc = builder.select(builder.fcmp_ordered("<", acc, low_bound), low_bound, acc)
                return builder.select(builder.fcmp_ordered(">", acc, high_bound), high_bound,
                                      acc)
        # software prefetch ahead along the rows: the tap rows new to this output row
        # (the last ``sw``) and y; see PREFETCH_X_BYTES
        x_ahead = PREFETCH_X_BYTES // (VECTOR_BYTES // lanes)
        y_ahead = PREFETCH_Y_BYTES // (VECTOR_BYTES // lanes)

        def fetch(base, offset, ahead, v, write):
            ptr = builder.gep(builder.gep(base, [offset]), [ir.Constant(it, ahead)])
            prefetch(builder, at(ptr, None, v), write)

        for v in range(NVEC):
            for b in range(width * sw):
                for i in range(max(0, kh_ - sw), kh_):
                    fetch(rows_at[i], columns[b], x_ahead, v, False)
            for b in range(0 if streaming else width):  # non-temporal y: not cached
                fetch(y_at, pixels[b], y_ahead, v, True)
        def compute(whole: bool) -> None:
            """The block's sums and stores; ``whole``: every lane and tap row is read
            (plain loads and stores, which fold into the multiply-adds, where a masked
            load cannot)."""
            def operand(base, offset, v, mask=None):
                if whole:
                    return builder.load(at(base, offset, v), align=align.constant)
                return read(base, offset, v, mask)

            for v in range(NVEC):
                # wk is zero-padded to whole vectors (lanes past the last channel need no
                # mask), but not to whole blocks of NVEC: vector v >= 1 of a block whose
                # channels end before it may lie past wk's end (C = 144 float32 with
                # AVX-512: the last block's second vector, 576 bytes past wk). Such a
                # vector is loaded only if it holds a valid lane (a mask of all lanes or
                # none); vector 0 always holds one, as do all of a whole block's.
                held = None
                if not whole and v > 0:
                    held = builder.select(
                        builder.icmp_signed(">", valid_v, ir.Constant(it, v * lanes)),
                        ir.Constant(mask_t, [1] * lanes), ir.Constant(mask_t, None))
                weights = [
                    builder.load(at(w_at, None, v * kh_ * kw_ + i * kw_ + j),
                                 align=align.constant) if held is None
                    else read(w_at, None, v * kh_ * kw_ + i * kw_ + j, held)
                    for i, j in taps
                ]
                # each x vector is loaded once and used by every pixel it reaches, the
                # taps of each pixel still summed in order (fewer values live at once)
                accs: list[Any] = [None] * width
                uses: dict[tuple[int, int], list[tuple[int, Any]]] = {}
                for (i, j), w in zip(taps, weights):
                    for b in range(width):
                        uses.setdefault((i, b * sw + j * dw), []).append((b, w))
                for (i, col), pixel_taps in sorted(uses.items()):
                    x = operand(rows_at[i], columns[col], v, row_masks[i][v])
                    for b, w in pixel_taps:
                        accs[b] = (builder.fmul(x, w) if accs[b] is None
                                   else builder.call(fma, [x, w, accs[b]]))
                for b, acc in enumerate(accs):
                    ptr = at(y_at, pixels[b], v)
                    if epilogue:
                        acc = finish(acc, operand(b_ptr, wo_v, v))
                    # masked stores only for a partial vector: AMD's vmaskmovps store is
                    # microcoded (Zen 3, 56x56x144 single-threaded: 0.60 -> 0.44 ms)
                    full = ir.Constant(ir.IntType(1), 1) if whole else builder.icmp_signed(
                        ">=", valid_v, ir.Constant(it, (v + 1) * lanes))
                    with builder.if_else(full, likely=True) as (whole_vector, part):
                        with whole_vector:
                            if streaming:
                                builder.store(acc, ptr, align=VECTOR_BYTES).set_metadata(
                                    "nontemporal", builder.module.add_metadata([
                                        ir.Constant(ir.IntType(32), 1)]))
                            else:
                                builder.store(acc, ptr, align=align.constant)
                        with part:
                            builder.call(store, [acc, ptr, align, masks[v]])

        if width < OW_BLOCK or len(taps) < kh_ * kw_:  # the rarer blocks: masked only
            compute(False)
            return context.get_dummy_value()
        # AVX2's masked loads (vmaskmovps) take a load port for longer and fold into
        # nothing: whole blocks with all their channels and tap rows take plain loads
        # (Zen 3, MobileNetV2's 3x3 layers with bias and ReLU6, alternated in one
        # process against masked loads throughout: 1.05-1.18x on one thread, 1.00-1.14x
        # on two)
        every_row = ir.Constant(it, (1 << kh_) - 1)
        whole_block = builder.and_(
            builder.icmp_signed(">=", valid_v, ir.Constant(it, NVEC * lanes)),
            builder.icmp_unsigned("==", builder.and_(rows_v, every_row), every_row))
        with builder.if_else(whole_block, likely=True) as (plain, masked):
            with plain:
                compute(True)
            with masked:
                compute(False)
        return context.get_dummy_value()

    return intrinsic(block_epilogue if epilogue else block)


@njit(inline="always")
def row_reach(bits, kh_, rs):  # noqa: ANN001, ANN201
    """(lowest, highest, any) of the offsets ``i*rs`` of the tap rows ``i < kh_`` whose
    bit is set in ``bits`` (checked mode's footprints)."""
    row_lo, row_hi, any_row = 0, 0, False
    for i in range(kh_):
        if bits >> i & 1:
            row_lo = i * rs if not any_row else min(row_lo, i * rs)
            row_hi = i * rs if not any_row else max(row_hi, i * rs)
            any_row = True
    return row_lo, row_hi, any_row


@njit(inline="always")
def _block_inside(bad, y, yo, a, ao, rs, cs, wk, wo, c_, valid, rows, bias,  # noqa: ANN001, ANN201, PLR0913
                  kh_, kw_, sw, dw, width, j0, j1, epilogue):
    """Whether one call of ``_block_intrinsic(kh_, kw_, sw, dw, width, j0, j1, ...)`` with
    these arguments stays inside its buffers (checked mode; sites 1 y, 2 x or 3 buf,
    4 wk, 5 bias). Its exact footprint, from the block's code (prefetches, which never
    fault, aside), with ``used = min(valid, NVEC*L)`` the lanes its masks let through:

    - y: pixels ``b < width`` at ``yo + b*c_``, lanes ``[0, used)`` of each (masked
      stores for a partial vector: no lane at or past ``valid`` is written);
    - a (x, or a task's zero-padded rows buf): tap rows ``i`` with bit i of ``rows``
      only (a row outside is read at the first row inside under an all-false mask,
      which touches nothing), columns ``b*sw + j*dw`` for ``b < width``, ``j0 <= j <
      j1``, ``cs`` apart, lanes ``[0, used)`` (masked, or plain where every lane is
      valid);
    - wk: per vector ``v`` of channels that is loaded, taps ``(i, j)`` for every row
      ``i`` (rows outside x still load their weights) and ``j0 <= j < j1`` at
      ``(wo + v*L)*KH*KW + (i*KW + j)*L``, whole vectors (wk is zero-padded to whole
      vectors); vector 0 always, vector ``v >= 1`` only if it holds a valid lane
      (``valid > v*L``);
    - bias (``epilogue``): ``[wo, wo + used)`` (plain loads only when every lane is
      valid, masked otherwise).
    """
    lanes = VECTOR_BYTES // y.itemsize
    used = max(0, min(valid, NVEC * lanes))
    if used > 0:  # else every lane is masked off: only wk's vector 0 is loaded
        pix_lo, pix_hi = min(0, (width - 1) * c_), max(0, (width - 1) * c_)
        if not within(bad, 1, y.size, yo + pix_lo, yo + pix_hi + used):
            return False
        row_lo, row_hi, any_row = row_reach(rows, kh_, rs)
        if any_row:
            first_col, last_col = j0 * dw * cs, ((width - 1) * sw + (j1 - 1) * dw) * cs
            col_lo, col_hi = min(first_col, last_col), max(first_col, last_col)
            if not within(bad, 2 if a.ndim == 4 else 3, a.size, ao + row_lo + col_lo,
                          ao + row_hi + col_hi + used):
                return False
    taps = kh_ * kw_
    last_vector = 0
    for v in range(1, NVEC):
        if valid > v * lanes:
            last_vector = v
    if not within(bad, 4, wk.size, wo * taps + j0 * lanes,
                  (wo + last_vector * lanes) * taps + ((kh_ - 1) * kw_ + j1) * lanes):
        return False
    return not epilogue or used == 0 or within(bad, 5, bias.size, wo, wo + used)


def _block_call(name: str, block_args: str, shape: str, epilogue: bool,
                indent: str) -> list[str]:
    """Source lines calling the register block ``name(block_args)``, checked first in
    checked mode (:func:`_block_inside` with the same argument text; ``shape``: its
    constant arguments kh_, kw_, sw, dw, width, j0, j1): a block reaching outside a
    buffer is skipped and recorded in ``bad``."""
    extra = ", bias, act" if epilogue else ""
    return [
        f"{indent}if CHECKED and not _block_inside(bad, {block_args}, bias, {shape}, "
        f"{epilogue}):",
        f"{indent}    continue",
        f"{indent}{name}({block_args}{extra})",
    ]


def _span_source(kh_: int, kw_: int, sw: int, dw: int, epilogue: bool) -> str:
    """Source of ``span(y, yo, a, ao, rs, cs, wk, c0, cb, p0, p1, col0, rows, bias, act,
    bad)`` (bias and act passed on to the blocks with ``epilogue``): output
    pixels ``p0:p1`` of one row (``y.flat[yo + ow*C + c]``, channels ``c0 + c``, c < cb)
    from array ``a``: tap row i starts at ``a.flat[ao + i*rs]`` (read as zeros unless
    bit i of ``rows`` is set), columns ``cs`` elements apart, pixel ``ow`` at column
    ``col0 + (ow - p0) * sw``. Blocks of OW_BLOCK pixels (the last narrower), each over
    all channels in vectors. ``bad``: checked mode's record (:func:`_block_inside`
    before each block), else None."""

    def call(width: int, indent: str) -> list[str]:
        args = ("y, yo + ob * c_ + cc, a, col + cc, rs, cs, wk, c0 + cc, c_, "
                "min(lanes, cb - cc), rows")
        return [
            f"{indent}col = ao + (col0 + (ob - p0) * {sw}) * cs",
            f"{indent}for cc in range(0, cb, lanes):",
            *_block_call(f"block{width}", args, f"{kh_}, {kw_}, {sw}, {dw}, {width}, 0, {kw_}",
                         epilogue, indent + "    "),
        ]

    body = [
        "def span(y, yo, a, ao, rs, cs, wk, c0, cb, p0, p1, col0, rows, bias, act, bad):",
        "    c_ = y.shape[3]",
        "    lanes = NVEC * VECTOR_BYTES // y.itemsize",
        "    ob = p0",
        "    while ob + OW_BLOCK <= p1:",
        *call(OW_BLOCK, "        "),
        "        ob += OW_BLOCK",
    ]
    for width in range(1, OW_BLOCK):
        body.append(f"    {'if' if width == 1 else 'elif'} p1 - ob == {width}:")
        body += call(width, "        ")
    return "\n".join(body) + "\n"


def _edge_source(kh_: int, kw_: int, sw: int, dw: int, epilogue: bool) -> str:
    """Source of ``edge(y, yo, a, ao, rs, cs, wk, c0, cb, j0, j1, rows, bias, act, bad)``:
    one output pixel over the taps ``j0 <= j < j1`` of each row only (the others fall
    outside x), all channels in vectors; ``ao`` addresses tap column 0 (which may lie
    before x), ``rows`` and ``bad`` as in span."""
    body = [
        "def edge(y, yo, a, ao, rs, cs, wk, c0, cb, j0, j1, rows, bias, act, bad):",
        "    c_ = y.shape[3]",
        "    lanes = NVEC * VECTOR_BYTES // y.itemsize",
    ]
    args = "y, yo + cc, a, ao + cc, rs, cs, wk, c0 + cc, c_, min(lanes, cb - cc), rows"
    windows = [(lo, hi) for lo in range(kw_) for hi in range(lo + 1, kw_ + 1)]
    for k, (lo, hi) in enumerate(windows):
        body += [
            f"    {'if' if k == 0 else 'elif'} j0 == {lo} and j1 == {hi}:",
            "        for cc in range(0, cb, lanes):",
            *_block_call(f"edge_{lo}_{hi}", args, f"{kh_}, {kw_}, {sw}, {dw}, 1, {lo}, {hi}",
                         epilogue, "            "),
        ]
    return "\n".join(body) + "\n"


@njit(**NOALIAS)
def _fill(buf, i, x, n, ih, col0, width, c0):
    """buf[i, k, :] <- x[n, ih, col0 + k, c0:c0+cb] for k < width; zero where the
    column or the row ``ih`` falls outside x."""
    cb = buf.shape[2]
    h_, w_ = x.shape[1], x.shape[2]
    c0u = np.uint64(c0)  # unsigned channel indices: no wraparound checks, vector loads
    for k in range(width):
        col = col0 + k
        if 0 <= ih < h_ and 0 <= col < w_:
            src = x[n, ih, col]
            for c in range(cb):
                buf[i, k, c] = src[c0u + np.uint64(c)]
        else:
            for c in range(cb):
                buf[i, k, c] = 0


@njit(nogil=True)
def _cache_line_aligned(raw, n, h, w, c):
    """An uninitialised (n, h, w, c) array starting on a 64-byte cache line
    (``memory.ALIGN``, a whole number of vectors; numpy's own arrays start 16 bytes
    into one: vector stores then straddle two lines, measured 3-5% slower on the
    MobileNetV2 depthwise layers; the streaming stores need the alignment): a view of
    ``raw`` if it is long enough (an :func:`output_buffer`), else of a buffer allocated
    here."""
    total = n * h * w * c
    spare = memory.ALIGN // raw.itemsize
    if raw.shape[0] < total + spare:
        raw = np.empty(total + spare, raw.dtype)
    start = (-raw.ctypes.data % memory.ALIGN) // raw.itemsize
    return raw[start:start + total].reshape((n, h, w, c))


def output_buffer(count: int, dtype: np.dtype) -> np.ndarray:
    """The ``raw`` buffer for :func:`_cache_line_aligned` to hold ``count`` values:
    from :mod:`convengine.memory`'s pool for outputs of ``memory.MIN_BYTES`` or more
    (a fresh 38.5 MB output took 9,409 page faults to fill, 16.5 ms single-threaded),
    else empty (the kernel allocates y)."""
    if count * dtype.itemsize >= memory.MIN_BYTES:
        return memory.empty(count + memory.ALIGN // dtype.itemsize, dtype)
    empty = _NO_BUFFER.get(dtype)
    if empty is None:  # one shared empty array per dtype: the kernels only read its length
        empty = _NO_BUFFER[dtype] = np.empty(0, dtype)
    return empty


_NO_BUFFER: dict[np.dtype, np.ndarray] = {}


_KERNELS: dict[tuple[int, ...], tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]] = {}


def depthwise2d_kernel(  # noqa: PLR0913
    kh_: int, kw_: int, sw_: int, dh_: int, dw_: int, streaming: bool = False,
    epilogue: bool = False,
) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]:
    """The kernels (parallel, serial) for one (KH, KW) kernel shape, width stride and
    dilations: ``kernel(x (N,H,W,C), wk (:meth:`DepthwisePlan.taps`), OH, OW, sh,
    ph, pw, row_parts, channel_parts, raw, bias, act) -> y (N,OH,OW,C)``, in ``raw``
    (an :func:`output_buffer`) if that is long enough. The
    serial one runs its tasks in turn on the calling thread. ``streaming``: full
    vectors of y are stored non-temporally (C must be a multiple of a vector).
    ``epilogue``: y is ``act(conv + bias)`` (bias (C,), act an :class:`Activation` of
    ``CPU_STORE``); else bias and act are not read."""
    key = (kh_, kw_, sw_, dh_, dw_, streaming, epilogue)
    if key not in _KERNELS:
        module = instantiate(__name__, "forward_template.py",
                             f"depthwise_{kh_}x{kw_}_s{sw_}_d{dh_}x{dw_}"
                             f"{'_streaming' if streaming else ''}"
                             f"{'_epilogue' if epilogue else ''}",
                             KH=kh_, KW=kw_, SW=sw_, DH=dh_, DW=dw_, STREAMING=streaming,
                             EPILOGUE=epilogue)
        _KERNELS[key] = module.parallel, module.serial
    return _KERNELS[key]


@functools.cache
def row_kernels(kh_: int, kw_: int, sw_: int, dw_: int, streaming: bool,
                epilogue: bool) -> Any:
    """The generated row kernels of one kernel shape (a module of :class:`Source`:
    the register blocks, ``span`` (:func:`_span_source`) and ``edge``
    (:func:`_edge_source`) over them), compiled once, cached on disk."""
    src = Source(__name__, f"depthwise_rows_{kh_}x{kw_}_s{sw_}_d{dw_}"
                 f"{'_streaming' if streaming else ''}{'_epilogue' if epilogue else ''}")
    for width in range(1, OW_BLOCK + 1):
        src.expr(f"block{width}", f"_block_intrinsic({kh_}, {kw_}, {sw_}, {dw_}, {width}, "
                 f"streaming={streaming}, epilogue={epilogue})")
    for j0 in range(kw_):
        for j1 in range(j0 + 1, kw_ + 1):
            src.expr(f"edge_{j0}_{j1}", f"_block_intrinsic({kh_}, {kw_}, {sw_}, {dw_}, 1, "
                     f"{j0}, {j1}, {streaming}, {epilogue})")
    src.code(_span_source(kh_, kw_, sw_, dw_, epilogue), "span")
    src.code(_edge_source(kh_, kw_, sw_, dw_, epilogue), "edge")
    src.jit("span", **NOALIAS)
    src.jit("edge", **NOALIAS)
    return load(src)


def _split(rows: int, channels: int, threads: int) -> tuple[int, int]:
    """(row_parts, channel_parts): split the rows, or the channels into slices of whole
    GRAIN-channel chunks when there are fewer rows than threads (two threads writing
    neighbouring channels of the same pixels measured 1.2-3x slower than rows)."""
    chunks = -(-channels // GRAIN)
    if rows < threads:
        return 1, min(threads, chunks)
    return threads, 1


def _whole_vectors(channels: int, itemsize: int) -> int:
    """``channels`` rounded up to whole vectors of ``itemsize``-byte values."""
    lanes = VECTOR_BYTES // itemsize
    return -(-channels // lanes) * lanes


class DepthwisePlan(NamedTuple):
    """A depthwise 2-D (or 1-D) conv, ready to run: ``plan(x, w, bias=None, act=0) -> y``."""

    kernel: Callable[..., np.ndarray]
    key: tuple[int, ...]  # KH, KW, width stride, width dilation, height dilation
    x4: tuple[int, ...]  # x seen as (N, H, W, C)
    y_shape: tuple[int, ...]  # y as returned, channels-last
    y4: tuple[int, ...]  # y seen as (N, OH, OW, C)
    flip: bool  # taps reversed (backward-data as a forward conv)
    args: tuple[int, ...]  # sh, ph, pw, row_parts, channel_parts
    streaming: bool  # y written with non-temporal stores
    size: int  # values in y
    serial: bool  # the kernel runs on the calling thread

    def workspace_bytes(self, itemsize: int) -> int:
        """The laid-out weights (:meth:`taps`) plus each task's buffer for padded input
        columns."""
        n, oh, ow, c = self.y4
        kh_, kw_, sw, dw = self.key[:4]
        buffers = self.args[3] * self.args[4] * kh_ * ((ow - 1) * sw + (kw_ - 1) * dw + 1) * c
        return (kh_ * kw_ * _whole_vectors(c, itemsize) + buffers) * itemsize

    def taps(self, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """The kernels' weights: w (C, *K, 1) as (ceil(C / L), KH * KW, L) of ``dtype``
        (L the lanes of a vector; channels past C zero): per vector of channels its
        taps in the order applied (reversed where the plan flips them)."""
        kh_, kw_ = self.key[:2]
        c, itemsize = w.shape[0], np.dtype(dtype).itemsize
        wk = w.reshape(c, kh_ * kw_)
        if self.flip:
            wk = wk[:, ::-1]
        blocks = np.zeros((_whole_vectors(c, itemsize), kh_ * kw_), dtype)
        blocks[:c] = wk
        lanes = VECTOR_BYTES // itemsize
        return np.ascontiguousarray(blocks.reshape(-1, lanes, kh_ * kw_).transpose(0, 2, 1))

    def __call__(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
                 act: int = 0, taps: np.ndarray | None = None) -> np.ndarray:
        """x (N, *S, C), w (C, *K, 1), both C-contiguous -> y (N, *S_out, C), starting
        on a cache line; with bias (C,) of x's dtype or act (RELU, RELU6) y is
        ``act(conv + bias)``, computed in the kernel's store. ``taps``: w laid out by
        :meth:`taps` already (constant weights: once)."""
        kernel, b = self.kernel, _NO_BIAS
        if bias is not None or act:
            kh_, kw_, sw, dw, dh = self.key
            kernels = depthwise2d_kernel(kh_, kw_, sw, dh, dw, self.streaming, epilogue=True)
            kernel = kernels[1] if self.serial else kernels[0]
            b = np.zeros(self.y4[-1], x.dtype) if bias is None else bias
        wk = self.taps(w, x.dtype) if taps is None else taps
        y = kernel(x.reshape(self.x4), wk, *self.y4[1:3], *self.args,
                   output_buffer(self.size, x.dtype), b, act)
        return y.reshape(self.y_shape)


_NO_BIAS = np.zeros(0)  # the bias operand of kernels without the epilogue (never read)


def one_per_channel(problem: ConvProblem) -> bool:
    """1-D or 2-D, one output channel per input channel, not empty."""
    return (
        problem.ndim <= 2
        and problem.in_per_group == 1
        and problem.out_per_group == 1
        and problem.in_channels > 0
        and math.prod(problem.out_size) > 0
    )


def _served(problem: ConvProblem) -> bool:
    """:func:`one_per_channel`, with at most MAX_TAPS taps (compile time grows with
    the unrolled taps)."""
    return one_per_channel(problem) and math.prod(problem.kernel) <= MAX_TAPS


def _as2d(values: tuple[int, ...], lead: int) -> tuple[int, int]:
    """A 1-D problem's (v,) -> (lead, v); 2-D values unchanged."""
    return (lead, values[0]) if len(values) == 1 else (values[0], values[1])


def _plan(problem: ConvProblem, x_size: tuple[int, ...], y_size: tuple[int, ...],
          pad: tuple[int, ...], flip: bool, stride: tuple[int, ...],
          force_serial: int | None) -> DepthwisePlan:
    n, c = problem.batch, problem.in_channels
    kh_, kw_ = _as2d(problem.kernel, 1)
    sh, sw = _as2d(stride, 1)
    dh, dw = _as2d(problem.dilation, 1)
    ph, pw = _as2d(pad, 0)
    x4 = (n, *_as2d(x_size, 1), c)
    y4 = (n, *_as2d(y_size, 1), c)
    itemsize = problem.compute_dtype.itemsize
    streaming = (math.prod(y4) * itemsize >= STREAMING_BYTES and sw == 1
                 and c * itemsize % (NVEC * VECTOR_BYTES) == 0)
    parallel, serial = depthwise2d_kernel(kh_, kw_, sw, dh, dw, streaming)
    threads = get_num_threads()
    alone = threads == 1 or (math.prod(y4) * kh_ * kw_ < SERIAL_MACS if force_serial is None
                             else bool(force_serial))
    if alone:
        kernel, parts = serial, (1, 1)
    else:
        kernel, parts = parallel, _split(y4[0] * y4[1], c, threads)
    return DepthwisePlan(kernel, (kh_, kw_, sw, dw, dh), x4, (n, *y_size, c), y4, flip,
                (sh, ph, pw, *parts), streaming, math.prod(y4), alone)


@functools.lru_cache(maxsize=256)
def _forward_plan(problem: ConvProblem, threads: int,
                  force_serial: int | None) -> DepthwisePlan | None:
    if not _served(problem):
        return None
    pad = tuple(lo for lo, _ in problem.padding)
    return _plan(problem, problem.in_size, problem.out_size, pad, False, problem.stride,
                 force_serial)


@functools.lru_cache(maxsize=256)
def _backward_data_plan(problem: ConvProblem, threads: int,
                        force_serial: int | None) -> DepthwisePlan | None:
    # at stride 1, dx is the forward conv of dy with the flipped kernel, padded by
    # extent - 1 - pad on the low side (needs every pad below the kernel's extent)
    extents = problem.effective_kernel
    if not (_served(problem) and all(s == 1 for s in problem.stride)
            and all(max(p) < e for p, e in zip(problem.padding, extents))):
        return None
    pad = tuple(e - 1 - lo for e, (lo, _) in zip(extents, problem.padding))
    return _plan(problem, problem.out_size, problem.in_size, pad, True, problem.stride,
                 force_serial)


def serial_param(params: Params | None) -> int | None:
    """The ``serial`` parameter of the depthwise plans: 1 all on the calling thread, 0
    shared out among the threads, None (absent) by the multiply-add count
    (``SERIAL_MACS``: below it, starting the threads costs more than they save)."""
    return None if not params or "serial" not in params else int(params["serial"])


def forward_plan(problem: ConvProblem, params: Params | None = None) -> DepthwisePlan | None:
    """The plan for a depthwise forward pass, or None if these kernels do not serve
    it; ``params``: :func:`serial_param`."""
    return _forward_plan(problem, get_num_threads(), serial_param(params))


def backward_data_plan(problem: ConvProblem,
                       params: Params | None = None) -> DepthwisePlan | None:
    """The plan computing dx from (dy, w) at stride 1, or None."""
    return _backward_data_plan(problem, get_num_threads(), serial_param(params))
