"""``blocked``: direct convolution with a register-blocked vector micro-kernel (fp32).

The conv with the fewest moving parts that still runs near the FMA peak: x is
zero-padded once (channels-last), the weights are packed as ``(O / NR, *K, C, NR)``,
and a micro-kernel computes adjacent output pixels of one row times ``NR``
output channels with every accumulator in a vector register, walking the reduction
(kernel rows x kernel columns x input channels) straight through the padded input:
no column matrix, no transforms. It suits layers whose reduction is short or whose
im2col GEMM is thin, above all the 3-channel stems (7x7 and 3x3 stride 2).

Serves forward, float32, dense (groups 1), 1-D and 2-D (output channels that are not
a multiple of VEC padded with zero weights, the padded lanes not stored); backward-data:
at stride 1 as the forward conv of dy with the flipped kernel (the stride-1 transpose
rule), at larger strides (dilation 1, input channels a multiple of VEC) as one such
conv per phase of the stride (:mod:`.strided`), with fewer than 8 input channels (the
stems) as a GEMM of dy's rows by the weights whose tiles are added into dx
(:mod:`.narrow`). The micro-kernel
spells out its vectors in the host's width (``VEC`` float32 lanes: 16 with AVX-512,
``llvm.fma.v16f32``, where LLVM's own choice would be 256-bit vectors; 8 with AVX2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ... import host_params, memory
from ..._host import ACCUMULATORS, VECTOR_BYTES, VECTOR_REGISTERS
from ..._kernel_cache import instantiate, kernel
from ...epilogue_codes import CPU_STORE, Activation, names
from ...params import Params, Space, value
from ...problem import ConvProblem
from ...registry import register
from ...threads import get_num_threads
from .._common import too_large
from .._transforms import (
    backward_data_as_forward,
    backward_data_as_forward_reason,
    flipped_view,
)
from ..fma import WEIGHT_AHEAD, prefetch, prefetch_ahead, row_pointers, splat, store_rows, vector_ops
from ..weight_cache import WeightCache, is_transient
from . import narrow, strided

TASKS_PER_THREAD = 8  # parallel tasks per thread, at least (a balanced share)
TASK_CHOICES = (2, 4, 8, 16)  # ... the values the tuner may try instead
# packed weights of recent calls (matched bit-exactly on w): packing is a strided copy
# of every weight, about as long as a batch-1 layer's kernel. Each entry holds the
# packed panels and a copy of w; a whole ResNet-50 takes 190 MB (380 MB with its
# backward-data panels), and a network that does not fit cycles through the LRU
# missing every call (measured: ResNet-50 b1 in network order 52 ms at 128 MiB)
PACKED = WeightCache(512 * 2**20)
VEC = VECTOR_BYTES // 4  # float32 lanes of a vector register
# vectors per micro-tile whose panel loads and broadcast fit in the registers beside the
# accumulators: 4-1 with AVX-512; 3-1 with AVX2, where 4 (3 pixels) spilled: 1x1 conv
# 56x56 64 -> 64 single-threaded 0.75 ms against 0.44 at 2 vectors (EPYC Zen 3)
NVECS = tuple(v for v in (4, 3, 2, 1) if ACCUMULATORS + v + 1 <= VECTOR_REGISTERS)
# Each gathered micro-tile prefetches its pixels' input (the last tap row) and its
# output this far ahead: a network's layer reads an input and writes an output no
# cache holds yet, and the hardware prefetchers alone left the kernel waiting on memory
PREFETCH_BYTES = 4096
# ... where a pixel's reduction is this short (kernel rows x the run of one row): the
# 1x1 expansions and projections of MobileNetV2 at 112x112 and 56x56, 0.55 -> 0.23 ms
# and 0.30 -> 0.13 single-threaded; a stem 0.32 -> 0.21. Longer ones compute long
# enough for the hardware prefetchers (prefetching cost 28x28x192 -> 32 8%)
PREFETCH_MAX_REDUCTION = 96
EPILOGUE_ACTIVATIONS = names(CPU_STORE)  # what the forward's store applies
# the piece of a reduction a gathered micro-kernel call computes (its ``part``)
WHOLE, FIRST, MIDDLE, LAST = range(4)
# packed weights up to this size (L1d, see host_params.blocks_inside_bytes): a forward
# task computes every output-channel block of its tiles (each pixel's channels written
# at once: MobileNetV2's 16 -> 96 expansion at batch 8, 7.1 -> 5.2 ms single-threaded);
# larger ones go block by block, whose weights then stay in L1 across tiles (at 256 KiB
# ResNet-50's 256 -> 128 1x1 at 56x56 read 0.87x PyTorch per layer, 1.08x at 32 KiB)
BLOCKS_INSIDE_BYTES = host_params.blocks_inside_bytes()
# weights a forward task may reuse across its tiles (the tunable ``chunk``, see
# tunables and host_params.reduction_chunk_bytes)
REDUCTION_CHUNK_BYTES = host_params.reduction_chunk_bytes()
# pixels per gathered micro-tile of one vector of output channels (16 or fewer), not
# the 24 its accumulators allow: each pixel's input row is a pointer the tile keeps,
# and 24 of them spill from the general registers. MobileNetV2's 32 -> 16 1x1 at
# 8x112x112, alternated in one process (Zen 4): 1.68x as fast on one thread, 1.44x on
# two; the same layer at batch 1 and the 144 -> 16 one at 28x28 within +-7%
ONE_VECTOR_ROWS = 8
# outputs from this size are stored non-temporally where every panel covers whole
# cache lines (see _streams): their lines bypass the caches and are not read before
# being written. Alternated in one process (Zen 4, 2 threads, ONNX sessions at batch
# 8): MobileNetV2 1.033x as fast, ResNet-50 1.049x (rounds 1.00-1.09 and 0.95-1.08);
# no batch-1 layer of either is this large. A quarter of L3 (8 MiB on Zen 4's 32 MiB,
# see host_params.streaming_bytes), as depthwise.STREAMING_BYTES
STREAMING_BYTES = host_params.streaming_bytes()
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, VEC)


def _make_ukernel(mr_rows: int, nvec: int, gather: bool = False,
                  streaming: bool = False) -> Any:
    """Micro-kernel of ``mr_rows`` output pixels x ``VEC * nvec`` output channels:

    ``ukernel(x, x_off, ps, hs, ws, kh, kw, c, w, w_off, mr, y, y_off, ys)`` sets, for
    pixels ``r < mr`` and lanes ``j < VEC * nvec``,
    ``y[y_off + r * ys + j] = sum_{a<kh, b<kw, k<c} x[x_off + r*ps + a*hs + b*ws + k]
    * w[w_off + ((a * kw + b) * c + k) * VEC * nvec + j]``.
    Pixels ``r >= mr`` recompute pixel ``mr - 1`` and are not stored.

    With ``gather`` the pixels' input offsets come from an array instead, the weights
    are addressed by strides, and the store is the inference epilogue: ``ukernel(x,
    offsets, x0, hs, ws, kh, kw, c, w, w_off, was, wbs, wks, mr, y, y_off, ys, bias,
    b_off, res, has_res, act, valid, part, ahead)`` reads ``x[x0 + offsets[r] + a*hs +
    b*ws + k]`` (pixels of several output rows) times ``w[w_off + a*was + b*wbs +
    k*wks + j]`` (packed panels, or the VEC * nvec contiguous channels of a weight
    read in place) and stores
    lanes ``j < valid`` only, as ``act(sum + bias[b_off + j] [+ res[y_off + r*ys +
    j]])`` (the residual where ``has_res``; ``act`` an :class:`Activation` of
    ``CPU_STORE``; NaN passes both), the order and roundings of :mod:`convengine.fused_epilogue`; with
    ``streaming`` whole panels non-temporally (:func:`_store_epilogue`). ``part`` says
    which piece of a reduction split in chunks the call computes (:data:`WHOLE`,
    :data:`FIRST`, :data:`MIDDLE`, :data:`LAST`): a first or middle piece stores its
    partial sums in y as they are (no epilogue), a middle or last one starts from the
    sums y holds; summed in the same order, a split reduction gives the same bits as
    a whole one where kh and kw are 1. Each reduction step prefetches the weights
    ``ahead`` steps on (``ahead * wks`` values: :data:`WEIGHT_AHEAD`; 0: none).
    """
    nr = VEC * nvec
    i = types.intp

    def codegen(context, builder, signature, args):
        names = (("x", "offsets", "x0", "hs", "ws", "kh", "kw", "c", "w", "w_off", "was",
                  "wbs", "wks", "mr", "y", "y_off", "ys", "bias", "b_off", "res", "has_res",
                  "act", "valid", "part", "ahead")
                 if gather else ("x", "x_off", "ps", "hs", "ws", "kh", "kw", "c", "w",
                                 "w_off", "mr", "y", "y_off", "ys"))
        arg = dict(zip(names, args, strict=True))
        ty = dict(zip(names, signature.args, strict=True))

        def data(name):
            return context.make_array(ty[name])(context, builder, arg[name]).data

        x_data, w_data, y_data = data("x"), data("w"), data("y")
        mr_v = arg["mr"]
        intp = mr_v.type
        if gather:
            offsets = data("offsets")
            last = builder.sub(mr_v, ir.Constant(intp, 1))
            rows = []
            for r in range(mr_rows):
                rr = ir.Constant(intp, r)
                use = builder.select(builder.icmp_signed("<", rr, mr_v), rr, last)
                at = builder.add(arg["x0"], builder.load(builder.gep(offsets, [use])))
                rows.append(builder.gep(x_data, [at]))
        else:
            rows = row_pointers(builder, builder.gep(x_data, [arg["x_off"]]), mr_rows, mr_v,
                                arg["ps"])
        if gather:  # short whole reductions: prefetch input and output (PREFETCH_BYTES)
            short = builder.and_(
                builder.icmp_signed("<=", builder.mul(arg["kh"], arg["c"]),
                                    ir.Constant(intp, PREFETCH_MAX_REDUCTION)),
                builder.icmp_signed("==", arg["part"], ir.Constant(intp, WHOLE)))
            with builder.if_then(short):
                _prefetch_tile(builder, rows, y_data, arg, nvec)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), f"llvm.fma.v{VEC}f32")
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(_VF, None))
                 for _ in range(nvec)] for _ in range(mr_rows)]
        y0 = builder.gep(y_data, [arg["y_off"]])
        if gather:
            _load_partials(context, builder, accs, y0, arg)
        w0 = builder.gep(w_data, [arg["w_off"]])
        w_pos = cgutils.alloca_once_value(builder, w0)
        if gather:
            ahead = builder.mul(arg["wks"], arg["ahead"])
        with cgutils.for_range(builder, arg["kh"]) as a_loop:
            off_a = builder.mul(a_loop.index, arg["hs"])
            with cgutils.for_range(builder, arg["kw"]) as b_loop:
                off_ab = builder.add(off_a, builder.mul(b_loop.index, arg["ws"]))
                if gather:  # this tap's weights: w_off + a*was + b*wbs, then k*wks
                    tap = builder.add(builder.mul(a_loop.index, arg["was"]),
                                      builder.mul(b_loop.index, arg["wbs"]))
                    builder.store(builder.gep(w0, [tap]), w_pos)
                step = arg["wks"] if gather else ir.Constant(intp, nr)
                with cgutils.for_range(builder, arg["c"]) as k_loop:
                    off = builder.add(off_ab, k_loop.index)
                    wp = builder.load(w_pos)
                    wv = [builder.load(builder.bitcast(
                        builder.gep(wp, [ir.Constant(intp, VEC * j)]), _VF.as_pointer()),
                        align=4) for j in range(nvec)]
                    builder.store(builder.gep(wp, [step]), w_pos)
                    if gather:  # the weights ``ahead`` reduction steps on (WEIGHT_AHEAD)
                        prefetch_ahead(builder, wp, ahead, VEC, nvec)
                    for r in range(mr_rows):
                        xs = builder.load(builder.gep(rows[r], [off]))
                        xv = splat(builder, xs, _VF)
                        for j in range(nvec):
                            acc = accs[r][j]
                            builder.store(builder.call(fma, [xv, wv[j], builder.load(acc)]), acc)
        if gather:
            _store_epilogue(context, builder, accs, y0, arg, data("bias"), data("res"),
                            streaming)
        else:
            store_rows(builder, accs, y0, mr_v, arg["ys"], 4)
        return context.get_dummy_value()

    def gathered(typingctx, x, offsets, x0, hs, ws, kh, kw, c, w, w_off, was, wbs, wks, mr,
                 y, y_off, ys, bias, b_off, res, has_res, act, valid, part, ahead):
        return types.void(x, offsets, i, i, i, i, i, i, w, i, i, i, i, i, y, i, i, bias, i,
                          res, types.boolean, i, i, i, i), codegen

    def strided(typingctx, x, x_off, ps, hs, ws, kh, kw, c, w, w_off, mr, y, y_off, ys):
        return types.void(x, i, i, i, i, i, i, i, w, i, i, y, i, i), codegen

    ukernel = gathered if gather else strided
    ukernel.__name__ = f"ukernel_{mr_rows}x{nr}{'_gather' if gather else ''}"
    return intrinsic(ukernel)


def _prefetch_tile(builder, rows, y_data, arg, nvec) -> None:
    """Prefetch, for each pixel of a gathered micro-tile, its last tap row's input
    (``c`` values) ``PREFETCH_BYTES`` ahead, and its output lines that far ahead."""
    intp = arg["mr"].type
    ahead = ir.Constant(intp, PREFETCH_BYTES // 4)
    last_row = builder.add(ahead, builder.mul(builder.sub(arg["kh"], ir.Constant(intp, 1)),
                                              arg["hs"]))
    with cgutils.for_range_slice(builder, ir.Constant(intp, 0), arg["c"],
                                 ir.Constant(intp, VEC)) as (line, _):
        for row in rows:
            prefetch(builder, builder.gep(row, [builder.add(last_row, line)]), False)
    for r in range(len(rows)):
        y_row = builder.add(builder.add(arg["y_off"], ahead),
                            builder.mul(ir.Constant(intp, r), arg["ys"]))
        for j in range(nvec):
            prefetch(builder, builder.gep(y_data, [builder.add(y_row, ir.Constant(intp, VEC * j))]),
                     True)


def _lane_masks(builder, arg, nvec: int) -> tuple[list[ir.Value], ir.Value]:
    """Per vector of a gathered micro-tile, the mask of its lanes below ``valid``; and
    whether every lane of the panel is valid (an i1)."""
    i32 = ir.IntType(32)
    lane_ids = ir.Constant(ir.VectorType(i32, VEC), list(range(VEC)))
    valid = builder.trunc(arg["valid"], i32)
    masks = [builder.icmp_signed("<", lane_ids, splat(builder, builder.sub(
        valid, ir.Constant(i32, VEC * j)), ir.VectorType(i32, VEC))) for j in range(nvec)]
    return masks, builder.icmp_signed(">=", valid, ir.Constant(i32, VEC * nvec))


def _load_partials(context, builder, accs, y0, arg) -> None:
    """Start the accumulators of rows ``r < mr`` from the partial sums y holds (lanes
    below ``valid``, the others zero) where ``part`` is MIDDLE or LAST."""
    intp = arg["mr"].type
    resume = builder.icmp_signed(">=", arg["part"], ir.Constant(intp, MIDDLE))
    with builder.if_then(resume, likely=False):
        ops = vector_ops(context, builder, types.float32)
        masks, _ = _lane_masks(builder, arg, len(accs[0]))
        zero = ir.Constant(_VF, None)
        for r, row in enumerate(accs):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(intp, r), arg["mr"]),
                                 likely=True):
                step = builder.mul(ir.Constant(intp, r), arg["ys"])
                for j, acc_ptr in enumerate(row):
                    at = builder.gep(y0, [builder.add(step, ir.Constant(intp, VEC * j))])
                    ptr = builder.bitcast(at, _VF.as_pointer())
                    builder.store(builder.call(ops.load, [ptr, ops.align, masks[j], zero]),
                                  acc_ptr)


def _store_epilogue(context, builder, accs, y0, arg, bias_data, res_data,
                    streaming: bool = False) -> None:
    """The epilogue store of :func:`_make_ukernel`'s gathered kernel: rows ``r < mr``
    of the register block ``accs``, lanes below ``valid``; one straight-line copy of
    the stores per (whole panel or not, residual, activation), chosen once per tile;
    the sums as they are where ``part`` is FIRST or MIDDLE (a partial sum).
    ``streaming``: whole panels' vectors are stored non-temporally (each must start a
    cache line)."""
    ops = vector_ops(context, builder, types.float32)
    intp = arg["mr"].type
    zero, six = ir.Constant(_VF, None), ir.Constant(_VF, [6.0] * VEC)
    masks, whole = _lane_masks(builder, arg, len(accs[0]))
    biases = []
    for j in range(len(accs[0])):
        at = builder.gep(bias_data, [builder.add(arg["b_off"], ir.Constant(intp, VEC * j))])
        biases.append(builder.load(builder.bitcast(at, _VF.as_pointer()), align=4))
    res0 = builder.gep(res_data, [arg["y_off"]])

    def stores(residual: bool, act: Activation, masked: bool, raw: bool = False) -> None:
        for r, row in enumerate(accs):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(intp, r), arg["mr"]),
                                 likely=True):
                step = builder.mul(ir.Constant(intp, r), arg["ys"])
                for j, acc_ptr in enumerate(row):
                    at = builder.add(step, ir.Constant(intp, VEC * j))
                    v = builder.load(acc_ptr)
                    if not raw:  # a partial sum is stored as it is
                        v = builder.fadd(v, biases[j])
                    if residual:
                        r_ptr = builder.bitcast(builder.gep(res0, [at]), _VF.as_pointer())
                        v = builder.fadd(v, builder.call(ops.load, [r_ptr, ops.align, masks[j],
                                                                    zero])
                                         if masked else builder.load(r_ptr, align=4))
                    if act in (Activation.RELU, Activation.RELU6):  # NaN stays NaN
                        v = builder.select(builder.fcmp_ordered("<", v, zero), zero, v)
                    if act == Activation.RELU6:
                        v = builder.select(builder.fcmp_ordered(">", v, six), six, v)
                    y_ptr = builder.bitcast(builder.gep(y0, [at]), _VF.as_pointer())
                    if masked:
                        builder.call(ops.store, [v, y_ptr, ops.align, masks[j]])
                    elif streaming and not raw:
                        builder.store(v, y_ptr, align=VECTOR_BYTES).set_metadata(
                            "nontemporal", builder.module.add_metadata([
                                ir.Constant(ir.IntType(32), 1)]))
                    else:
                        builder.store(v, y_ptr, align=4)

    # masked stores only where the panel has lanes beyond O: AMD's vmaskmovps store
    # is microcoded (Zen 3, 56x56 24 -> 144 1x1 single-threaded: 0.56 ms with masked
    # stores throughout, PyTorch 0.32)
    has_res = builder.icmp_unsigned("!=", arg["has_res"], ir.Constant(arg["has_res"].type, 0))
    keep = builder.icmp_unsigned("<", builder.sub(arg["part"], ir.Constant(intp, FIRST)),
                                 ir.Constant(intp, 2))  # FIRST or MIDDLE
    with builder.if_else(whole, likely=True) as (plain, partial):
        for masked, lanes in ((False, plain), (True, partial)):
            with lanes, builder.if_else(keep) as (partial_sums, finished):
                with partial_sums:
                    stores(False, Activation.NONE, masked, raw=True)
                with finished, builder.if_else(has_res) as (with_res, without_res):
                    for residual, branch in ((True, with_res), (False, without_res)):
                        with branch:
                            done = builder.append_basic_block("epilogue_done")
                            switch = builder.switch(arg["act"], done)
                            for act in CPU_STORE:
                                block = builder.append_basic_block(f"act_{act.label}")
                                switch.add_case(ir.Constant(intp, int(act)), block)
                                builder.position_at_end(block)
                                stores(residual, act, masked)
                                builder.branch(done)
                            builder.position_at_end(done)


@cache
def _driver(nvec: int) -> Any:
    """The compiled forward for ``NR = VEC * nvec`` output channels per micro-tile
    (``ACCUMULATORS / nvec`` pixels each):
    ``run(xp (N,Hp,Wp,C), h0, w0, wp (O/NR,KH,KW,C,NR), y, y0, yn, yh, yw, oh, ow,
    sh, sw, dh, dw)`` reads the input window of ``xp`` from row ``h0``, column ``w0``
    and writes output ``(n, i, j, o)`` at ``y[y0 + n*yn + i*yh + j*yw + o]`` of the
    flat ``y`` (a strided slice of a larger array, or a whole contiguous one)."""
    mr = ACCUMULATORS // nvec  # the same accumulators whatever NR is
    return instantiate(__name__, "rows_template.py", f"blocked_nr{VEC * nvec}", MR=mr,
                       NVEC=nvec, NR=VEC * nvec).run


class WeightWalk(NamedTuple):
    """Where the forward kernel finds its weights in a flat array: output-channel block
    ``ob``'s weight for tap (a, b), reduction index k and lane j at ``first + ob *
    block + a * row + b * col + k * step + j``; ``fused``: a kernel row's taps are one
    run of KW * C (packed panels at unit column dilation)."""

    kh: int
    kw: int
    first: int
    block: int
    row: int
    col: int
    step: int
    fused: bool


def packed_walk(wp: np.ndarray, dilation_w: int) -> WeightWalk:
    """Packed panels wp (O'/NR, KH, KW, C, NR) (:func:`pack_weight`)."""
    _, kh, kw, c, nr = wp.shape
    return WeightWalk(kh, kw, 0, kh * kw * c * nr, kw * c * nr, c * nr, nr, dilation_w == 1)


def flipped_walk(w: np.ndarray, nr: int, taps: Sequence[int] | None = None,
                 first: Sequence[int] = (0, 0), stride: Sequence[int] = (1, 1)) -> WeightWalk:
    """The weights w (O, KH, KW, C) of a conv read in place for its backward-data as a
    forward conv (taps reversed, O the reduction, C the output channels, ``nr`` per
    block): no packing. The output channels of every block must lie inside C (C a
    multiple of ``nr``). ``taps``, ``first``, ``stride``: only the taps ``first +
    stride * k``, ``k < taps`` per dim (one phase of a strided backward-data)."""
    o, kh, kw, c = w.shape
    (th, tw), (ah, aw), (sh, sw) = taps or (kh, kw), first, stride
    return WeightWalk(th, tw, ((ah + sh * (th - 1)) * kw + aw + sw * (tw - 1)) * c, nr,
                      -sh * kw * c, -sw * c, kh * kw * c, False)


def gather_rows(nvec: int) -> int:
    """Pixels per gathered micro-tile of ``nvec`` vectors: ``ACCUMULATORS / nvec``,
    except ``ONE_VECTOR_ROWS`` for one vector (see there)."""
    return ACCUMULATORS // nvec if nvec > 1 else min(ACCUMULATORS, ONE_VECTOR_ROWS)


@cache
def _gather_driver(nvec: int, streaming: bool = False) -> Any:
    """The compiled forward over all ``N x OH x OW`` output pixels in micro-tiles of
    ``mr`` (:func:`gather_rows`) consecutive pixels, which may run over the end of an
    output row (their input offsets gathered per tile), so that short rows fill them:
    ``run(xp (N,Hp,Wp,C), wf, y (N,OH,OW,O), bias (O',), res, has_res, act, sh, sw,
    dh, dw, per_task, blocks_inside, chunk, ahead, *walk)`` with the weights found in the
    flat ``wf`` as the :class:`WeightWalk` ``walk`` says, the epilogue of the gathered
    :func:`_make_ukernel` (``res`` y's shape, read where ``has_res``; O <= O' (O'
    a multiple of VEC * nvec), lanes beyond O not stored), each task ``per_task``
    tiles of one output-channel block, or of all (``blocks_inside``), the reduction's
    run (as :func:`reduction_chunk` says) in pieces of ``chunk`` values over all the task's tiles
    in turn (0: whole), the weights prefetched ``ahead`` reduction steps on. ``streaming``:
    whole panels stored non-temporally (y 64-byte aligned, O a multiple of VEC; see
    ``STREAMING_BYTES``), fenced at the end of each task."""
    mr, nr = gather_rows(nvec), VEC * nvec
    return instantiate(__name__, "gather_template.py",
                       f"blocked_gather_nr{nr}_mr{mr}{'_streaming' if streaming else ''}",
                       MR=mr, NVEC=nvec, NR=nr, STREAMING=streaming).run


@njit(inline="always")
def _zero_border(xf, t, xp_shape, top, left, h_, w_):
    """Zero the padding of padded row ``t`` (over n and row) of the flat xp (N, Hp, Wp,
    C): the interior's first index in xf, or -1 when the whole row is padding."""
    hp, wp, c_ = xp_shape[1], xp_shape[2], xp_shape[3]
    i, base, end = t % hp, t * wp * c_, (t + 1) * wp * c_
    if i < top or i >= top + h_:
        xf[base:end] = 0
        return -1
    start = base + left * c_
    xf[base:start] = 0
    xf[start + w_ * c_:end] = 0
    return start


@kernel(parallel=True, nogil=True)
def _pad_rows(x3, xp, top, left):
    """Copy x3 (N, H, W*C), C-contiguous, into xp (N, Hp, Wp, C) at offset (top, left),
    zeroing the rest: each row one contiguous run (a copy at memory speed; a row of
    (W, C) slices assigned as 2-D took 3-7x longer, 41 us against 6 for the 224x224x3
    stem input on Zen 5)."""
    n_, h_, wc = x3.shape
    hp, c_ = xp.shape[1], xp.shape[3]
    xf = xp.reshape(-1)
    for t in prange(n_ * hp):
        start = _zero_border(xf, t, xp.shape, top, left, h_, wc // c_)
        if start >= 0:
            xf[start:start + wc] = x3[t // hp, t % hp - top]


@kernel(parallel=True, nogil=True)
def _pad_rows_strided(x, xp, top, left):
    """:func:`_pad_rows` for x (N, H, W, C) of any strides (an NCHW array seen as
    NHWC), read along its axis of the smaller stride."""
    n_, h_, w_, c_ = x.shape
    hp = xp.shape[1]
    xf = xp.reshape(-1)
    channels_inner = x.strides[3] <= x.strides[2]
    for t in prange(n_ * hp):
        start = _zero_border(xf, t, xp.shape, top, left, h_, w_)
        if start < 0:
            continue
        src = x[t // hp, t % hp - top]
        if channels_inner:
            for j in range(w_):
                for ch in range(c_):
                    xf[start + j * c_ + ch] = src[j, ch]
        else:
            for ch in range(c_):
                for j in range(w_):
                    xf[start + j * c_ + ch] = src[j, ch]


@kernel(parallel=True, nogil=True)
def _pad_rgb_planes(xn, xp, top, left):
    """:func:`_pad_rows` for three-channel x given as its C-contiguous NCHW planes xn
    (N, 3, H, W), interleaved with the channel count a constant (vectorized stores:
    an ONNX session's 224x224 RGB input 28 -> 6.5 us, Zen 5, 2 threads)."""
    n_, _, h_, w_ = xn.shape
    hp = xp.shape[1]
    xf = xp.reshape(-1)
    for t in prange(n_ * hp):
        start = _zero_border(xf, t, xp.shape, top, left, h_, w_)
        if start < 0:
            continue
        n, i = t // hp, t % hp - top
        r0, r1, r2 = xn[n, 0, i], xn[n, 1, i], xn[n, 2, i]
        out = xf[start:start + w_ * 3]
        for j in range(w_):
            out[3 * j] = r0[j]
            out[3 * j + 1] = r1[j]
            out[3 * j + 2] = r2[j]


def padded_input(x: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """x (N, *S, C) zero-padded as the problem says, as (N, Hp, Wp, C) (a view if unpadded)."""
    return pad(x, problem.ndim, problem.padding)


def pad(x: np.ndarray, ndim: int, padding: tuple[tuple[int, int], ...]) -> np.ndarray:
    """x (N, *S, C) (any strides) zero-padded by ``padding`` ((lo, hi) per spatial dim)
    as C-contiguous (N, Hp, Wp, C); x itself (as a view) when unpadded and contiguous."""
    x4 = _as2d(x, ndim)
    if all(p == (0, 0) for p in padding):
        return np.ascontiguousarray(x4)
    pads = ((0, 0),) * (2 - ndim) + padding
    (top, bottom), (left, right) = pads
    n, h, w, c = x4.shape
    xp = memory.empty((n, h + top + bottom, w + left + right, c), x.dtype)
    if x4.flags.c_contiguous:
        _pad_rows(x4.reshape(n, h, w * c), xp, top, left)
    elif c == 3 and (planes := x4.transpose(0, 3, 1, 2)).flags.c_contiguous:
        _pad_rgb_planes(planes, xp, top, left)
    else:
        _pad_rows_strided(x4, xp, top, left)
    return xp


def panel_vectors(out_channels: int) -> int:
    """Vectors per micro-tile (4, 3, 2 or 1; :func:`gather_rows` pixels), by a cost
    model: the panels' channels (O rounded up to ``VEC * nvec``) times one plus the
    loads per multiply-add (``mr`` broadcasts of x and ``nvec`` panel loads per
    ``mr * nvec`` multiply-adds). With AVX-512: 96 and 144 channels take
    48-channel panels, 24 and 160 take 32, 64-multiples 64; with AVX2 (8 lanes, at most
    3 vectors): 64 channels take 16-channel panels (6 pixels), 144 24-channel ones.
    Measured 2026-12-01 (AVX-512) on MobileNetV2's 24 -> 144 1x1 at 8x56x56:
    64-channel panels (192) 2.1 ms, 16-channel ones (a load per multiply-add) 7.9 ms."""
    def cost(nvec: int) -> float:
        mr = gather_rows(nvec)
        return -(-out_channels // (VEC * nvec)) * VEC * nvec * (1 + (mr + nvec) / (mr * nvec))
    return min(NVECS, key=cost)


def dense_float32_2d(problem: ConvProblem) -> str | None:
    """Why ``blocked``'s kernels cannot serve a problem of any pass: float32 compute,
    groups 1, 1-D or 2-D."""
    if problem.compute_dtype != np.float32:
        return f"float32 only (compute dtype {problem.compute_dtype})"
    if problem.groups != 1:
        return f"dense convs only (groups={problem.groups})"
    if problem.ndim > 2:
        return f"1-D and 2-D only (got {problem.ndim}-D)"
    return None


def _supports(problem: ConvProblem, padded_channels: bool = True) -> str | None:
    """Forward problems; output channels that are not a multiple of VEC only where
    ``padded_channels`` (the forward pads its panels and stores the real lanes;
    backward-data's phases write their slices of dx in place)."""
    reason = dense_float32_2d(problem)
    if reason is not None:
        return reason
    if problem.out_channels % VEC and not padded_channels:
        return f"channels must be a multiple of {VEC} (got {problem.out_channels})"
    return too_large(problem, _workspace(problem), "the padded copy of x and packed weights")


def _as2d(a: np.ndarray, ndim: int) -> np.ndarray:
    """(N, *S, C) with 1 or 2 spatial dims -> (N, H, W, C) view."""
    return a.reshape(a.shape[0], *(1,) * (2 - ndim), *a.shape[1:])


def pack_weight(w: np.ndarray, ndim: int, nr: int, out: np.ndarray | None = None
                ) -> np.ndarray:
    """w (O, *K, C), any strides (a flipped view too) -> (O / nr, KH, KW, C, nr),
    contiguous (into ``out`` if given), by a compiled parallel copy (numpy's strided
    copy took several times as long, on every call of a training step)."""
    w4 = w[:, None] if ndim == 1 else w
    o, kh, kw, c = w4.shape
    packed = np.empty((-(-o // nr), kh, kw, c, nr), w.dtype) if out is None else out
    _pack_into(w4, packed, abs(w4.strides[0]) < abs(w4.strides[3]))
    return packed


def unpack_weight(packed: np.ndarray, w_shape: tuple[int, ...]) -> np.ndarray:
    """:func:`pack_weight` undone: (blocks, KH, KW, C, nr) -> w of ``w_shape`` (O, *K, C)."""
    blocks, kh, kw, c, nr = packed.shape
    w4 = packed.transpose(0, 4, 1, 2, 3).reshape(blocks * nr, kh, kw, c)[:w_shape[0]]
    return np.ascontiguousarray(w4).reshape(w_shape)


@kernel(parallel=True, nogil=True)
def _pack_into(w, packed, lanes_inner):
    """packed[o // nr, a, b, k, o % nr] = w[o, a, b, k], reading along w's contiguous
    axis: k innermost, or with ``lanes_inner`` (a flipped view of w, contiguous in o)
    the nr output channels innermost, where reads and writes both run contiguously."""
    blocks, kh_, kw_, c_, nr = packed.shape
    o_ = w.shape[0]
    for t in prange(blocks * kh_):
        ob, a = t // kh_, t % kh_
        lanes = min(nr, o_ - ob * nr)  # the last panel's lanes beyond O are zero
        for b in range(kw_):
            if lanes_inner:
                for k in range(c_):
                    for lane in range(nr):
                        packed[ob, a, b, k, lane] = w[ob * nr + lane, a, b, k] if lane < lanes else 0
            else:
                for lane in range(nr):
                    if lane >= lanes:
                        packed[ob, a, b, :, lane] = 0
                        continue
                    row = w[ob * nr + lane, a, b]
                    for k in range(c_):
                        packed[ob, a, b, k, lane] = row[k]


def _workspace(problem: ConvProblem) -> int:
    """The padded copy of x (none when unpadded) plus the packed weights."""
    padded = 0
    if any(p != (0, 0) for p in problem.padding):
        sizes = [n + lo + hi for n, (lo, hi) in zip(problem.in_size, problem.padding)]
        padded = problem.batch * math.prod(sizes) * problem.in_channels
    weights = problem.out_channels * math.prod(problem.kernel) * problem.in_channels
    return 4 * (padded + weights)


def bind_forward(problem: ConvProblem, wp: np.ndarray, bias: np.ndarray | None = None,
                 *, nr: int | None = None, walk: WeightWalk | None = None,
                 params: Params | None = None
                 ) -> Callable[[np.ndarray, np.ndarray | None, str], np.ndarray]:
    """``run(x, residual, activation) -> y``: the forward conv of x (N, *S, C) by
    packed weights wp (:func:`pack_weight`), or by weights wp laid out as ``walk``
    says in panels of ``nr`` channels, over all output pixels in tiles
    (:func:`_gather_driver`, its task split fixed for the current thread count), with
    the inference epilogue in its store: ``act(conv + bias [+ residual])``, bias (O',)
    float32 zero-padded to the panels' channels O' (None: no bias), residual (N,
    *S_out, O) float32 C-contiguous or None, activation one of
    ``EPILOGUE_ACTIVATIONS``. ``params``: the task split's tunable parameters
    (``tasks``, ``inside``: :func:`tunables`; the panel width is ``wp``'s). Everything
    but the call itself is worked out here, once: a batch-1 network calls each conv
    for tens of microseconds."""
    if walk is None:
        nr, walk = wp.shape[-1], packed_walk(wp, problem.dilation[-1])
    assert nr is not None
    run, wf = _binding(problem, nr, walk, wp.nbytes, bias, params), wp.reshape(-1)
    return lambda x, residual, activation: run(x, wf, residual, activation)


def _binding(problem: ConvProblem, nr: int, walk: WeightWalk, weight_bytes: int,
             bias: np.ndarray | None, params: Params | None
             ) -> Callable[[np.ndarray, np.ndarray, np.ndarray | None, str], np.ndarray]:
    """:func:`bind_forward`'s work, for any weights of ``weight_bytes`` bytes that
    ``walk`` reads (panels of ``nr`` channels): ``run(x, wf, residual, activation)``
    with the weights ``wf`` flat. It holds no weights: a binding kept across calls
    does not keep the weights of an earlier call alive."""
    shape = tuple(problem.y_shape("NHWC"))
    lead = 2 - problem.ndim
    shape4 = (shape[0], *(1,) * lead, *shape[1:])  # y as (N, OH, OW, O)
    strides = (1,) * lead + problem.stride + (1,) * lead + problem.dilation  # sh sw dh dw
    nvec, blocks = nr // VEC, -(-shape[-1] // nr)
    if bias is None:
        bias = np.zeros(blocks * nr, np.float32)
    tiles = -(-problem.batch * math.prod(problem.out_size) // gather_rows(nvec))
    chosen = params or {}
    inside = bool(chosen.get("inside", weight_bytes <= BLOCKS_INSIDE_BYTES))
    tasks = chosen.get("tasks", TASKS_PER_THREAD)
    by_block = not inside and bool(chosen.get("by_block", 0))  # see tunables
    per_task = tiles if by_block else _per_task(tiles, 1 if inside else blocks, tasks)
    chunk = 0 if inside or per_task == 1 else chosen.get("chunk", 0)  # see tunables
    split = (per_task, inside, chunk, chosen.get("ahead", WEIGHT_AHEAD), *walk)
    driver = _gather_driver(nvec, not chunk and _streams(shape, nr, inside))
    ndim, padding = problem.ndim, problem.padding
    padded = any(p != (0, 0) for p in padding)
    x4_shape = (problem.batch, *(1,) * lead, *problem.in_size, problem.in_channels)
    alloc = memory.allocator(shape4, np.float32)

    def run(x: np.ndarray, wf: np.ndarray, residual: np.ndarray | None,
            activation: str) -> np.ndarray:
        y4 = alloc()
        xp = pad(x, ndim, padding) if padded else np.ascontiguousarray(x).reshape(x4_shape)
        driver(xp, wf, y4, bias, y4 if residual is None else residual,
               residual is not None, int(Activation.of(activation, CPU_STORE)), *strides,
               *split)
        return y4.reshape(shape)
    return run


def _packed_runner(problem: ConvProblem, kind: tuple[Any, ...],
                   pack: Callable[[np.ndarray], np.ndarray], params: Params | None
                   ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``fn(x, w)``: the forward conv ``problem`` of x by the weights ``pack(w)``,
    found in :data:`PACKED` under ``kind`` on every call (weights changed in place
    miss), bound on the first call only (:func:`_binding`: the packed shape, all the
    binding depends on, is the problem's). An algorithm's ``prepare``: a call the API
    remembers skips the binding, 6-10 us of Python a call (Emerald Rapids)."""
    bound: list[Callable[..., np.ndarray]] = []

    def fn(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        wp, _ = PACKED.get(w, kind, pack)
        if not bound:
            walk = packed_walk(wp, problem.dilation[-1])
            bound.append(_binding(problem, wp.shape[-1], walk, wp.nbytes, None, params))
        return bound[0](x, wp.reshape(-1), None, "none")
    return fn


def _streams(y_shape: tuple[int, ...], nr: int, blocks_inside: bool) -> bool:
    """Whether the forward stores y ``(..., O)`` non-temporally, in panels of ``nr``
    channels (``blocks_inside``: a task writes all of a pixel's panels at once): y of
    STREAMING_BYTES or more whose every pixel starts a 64-byte line, and whose lines
    are each written within a short time: each panel covers whole lines, or the
    panels of a pixel follow one another. A line that two panels share (AVX2's
    24-channel panels: 96 bytes) written panel by panel over the whole output was
    written in halves far apart in time, each half leaving the write-combining buffers
    alone: ResNet-50's 64 -> 256 1x1 at batch 8 56x56 ran 9.9 ms streamed and 5.8 not
    (Zen 3, 2 threads, caches flushed; 42 against 71 GMAC/s)."""
    line = memory.ALIGN // 4
    return (y_shape[-1] % line == 0 and (nr % line == 0 or blocks_inside)
            and 4 * math.prod(y_shape) >= STREAMING_BYTES)


def _forward(problem: ConvProblem, x: np.ndarray, wp: np.ndarray,
             bias: np.ndarray | None = None, residual: np.ndarray | None = None,
             activation: str = "none", *, nr: int | None = None,
             walk: WeightWalk | None = None, params: Params | None = None) -> np.ndarray:
    """:func:`bind_forward`'s conv, bound and run once."""
    return bind_forward(problem, wp, bias, nr=nr, walk=walk, params=params)(
        x, residual, activation)


def reduction_chunk(problem: ConvProblem, nr: int,
                    chunk_bytes: int = REDUCTION_CHUNK_BYTES) -> int:
    """The piece of the run the micro-kernel walks per kernel tap (a kernel row's taps
    times the channels where packed panels fuse them, at unit column dilation: see
    :func:`packed_walk`; else the channels) a task's tiles take in turn, so that its
    weights (the runs x piece x ``nr`` float32) fit ``chunk_bytes``; 0 (the whole run
    at once) where the run is not two pieces long at least (a 7x7 stem's 21 values a
    kernel row), so too where its weights fit whole. Pieces are whole vectors of the
    run (VEC values), one at least."""
    kh, kw = (1, *problem.kernel)[-2:]
    fused = problem.dilation[-1] == 1
    runs, run_len = (kh, kw * problem.in_channels) if fused else (kh * kw, problem.in_channels)
    chunk = max(VEC, chunk_bytes // (runs * nr * 4) // VEC * VEC)
    return chunk if run_len >= 2 * chunk else 0


def _per_task(tiles: int, blocks: int, tasks_per_thread: int = TASKS_PER_THREAD) -> int:
    """Micro-tiles per parallel task: enough tasks (``tasks_per_thread`` per thread,
    each of one output-channel block) for a balanced share."""
    groups = min(tiles, -(-tasks_per_thread * get_num_threads() // blocks))
    return -(-tiles // max(1, groups))


def tunables(problem: ConvProblem) -> Space:
    """The forward's parameters, the cost-model default first: ``nvec``, vectors per
    micro-tile (:func:`panel_vectors`); ``tasks``, parallel tasks per thread (at
    least: ``TASKS_PER_THREAD``, small enough to balance a thread's share, large
    enough that each task's panel stays in cache); ``inside``, whether a task writes
    every output-channel block of its tiles (weights within ``BLOCKS_INSIDE_BYTES``,
    L1d) or one block across tiles; ``by_block`` (where not ``inside``, with more
    than one block), whether a task is one block across all the tiles, the threads
    then sharing out the weights and each reading all of x (rather than all the
    weights and its share of x). Per thread that reads ``x + w / threads`` bytes
    against ``w + x / threads``, but the rule "where w > 2 x" measured 1.005x in
    geometric mean over the 34 layers it picked (ResNet-50 and MobileNetV2, batch 1
    and 8, forward and backward-data; 0.86-1.16, Emerald Rapids, 2 threads), so it is
    off by default, left to the tuner. ``chunk`` (where a block's weights exceed
    ``REDUCTION_CHUNK_BYTES`` and the run is two such pieces long: :func:`reduction_chunk`),
    the reduction split in pieces of that many weight bytes, each walked over all the
    task's tiles (the partial sums kept in y), so that a piece is read from L1 rather
    than from L2 at every tile, as ONNX Runtime's NCHWc pointwise kernel takes 128
    input channels at a time; 0, the default, walks the whole reduction per tile.
    Whole ONNX sessions, two in one process alternated (Emerald Rapids, 2 threads,
    whose 2 MiB L2 feeds the panels fast enough): ResNet-50 1.009x with it at batch 1
    and 0.947x at batch 8, MobileNetV2 batch 1 0.995x, so the tuner decides per
    layer. Not ``STREAMING_BYTES`` (whether y bypasses the
    caches): that depends on the layer that reads y next, which timing one layer alone
    cannot see (alone, streaming looked 1.1-1.2x faster on MobileNetV2's 1x1 layers at
    batch 8 whose outputs the default keeps in L3 for the next layer)."""
    nvec = panel_vectors(problem.out_channels)
    nr = VEC * nvec
    weights = -(-problem.out_channels // nr) * nr * math.prod(problem.kernel) * problem.in_channels
    inside = int(4 * weights <= BLOCKS_INSIDE_BYTES)
    space: Space = {
        "nvec": (nvec, *(v for v in NVECS if v != nvec)),
        "tasks": (TASKS_PER_THREAD, *(t for t in TASK_CHOICES if t != TASKS_PER_THREAD)),
        "ahead": (WEIGHT_AHEAD, 0, 2 * WEIGHT_AHEAD)}
    # by_block and chunk (which inside=1 leaves inert) before inside: the tuner goes
    # one parameter at a time in this order, so each of their values is timed while
    # it takes effect, and inside=1 is timed once, not once per value of theirs
    if not inside and problem.out_channels > nr:
        space["by_block"] = (0, 1)
    chunk = reduction_chunk(problem, nr)
    if chunk and not inside:
        space["chunk"] = (0, chunk)
    space["inside"] = (inside, 1 - inside)
    return space


def run_into(out: np.ndarray, first: tuple[int, ...], step: tuple[int, ...],
             problem: ConvProblem, xp: np.ndarray, origin: tuple[int, ...],
             wp: np.ndarray) -> None:
    """The forward conv of ``problem`` written into ``out`` (N, *S, O), C-contiguous:
    output pixel ``(i, j)`` to ``out[:, first[0] + i*step[0], first[1] + j*step[1]]``
    (as (row, column) of the 2-D view); the padded input ``xp`` (N, Hp, Wp, C) is read
    from (row, column) ``origin``. Output rows are shared out among the threads, split
    into groups of micro-tiles when they are too few (:func:`_per_task`)."""
    lead = 2 - problem.ndim
    sh, sw = (1,) * lead + problem.stride
    dh, dw = (1,) * lead + problem.dilation
    oh, ow = (1,) * lead + problem.out_size
    _, hh, ww, o = _as2d(out, problem.ndim).shape
    y0 = (first[0] * ww + first[1]) * o
    nvec = wp.shape[-1] // VEC
    per_task = _per_task(-(-ow // (ACCUMULATORS // nvec)), problem.batch * oh * wp.shape[0])
    _driver(nvec)(xp, origin[0], origin[1], wp, out.reshape(-1), y0, hh * ww * o,
                  step[0] * ww * o, step[1] * o, oh, ow, sh, sw, dh, dw, per_task)


def _prepare_fwd(problem: ConvProblem, params: Params | None = None
                 ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``fn(x, w)``: :func:`blocked_fwd`, bound once (:func:`_packed_runner`)."""
    nr = VEC * (params or {}).get("nvec", panel_vectors(problem.out_channels))
    return _packed_runner(problem, ("forward", problem.ndim, nr),
                          lambda w: pack_weight(w, problem.ndim, nr), params)


@register("blocked", "forward", supports=_supports, workspace_bytes=_workspace, accuracy=2,
          numpy_math=False, prepare=_prepare_fwd, tunables=tunables)
def blocked_fwd(problem: ConvProblem, x: np.ndarray, w: np.ndarray,
                params: Params | None = None) -> np.ndarray:
    return _prepare_fwd(problem, params)(x, w)


def _narrow(problem: ConvProblem) -> bool:
    """Strided backward-data with few input channels: :mod:`.narrow`'s."""
    return any(s != 1 for s in problem.stride) and narrow.reason(problem) is None


def _supports_bwd_data(problem: ConvProblem) -> str | None:
    if all(s == 1 for s in problem.stride):
        reason = backward_data_as_forward_reason(problem)
        if reason is not None:
            return f"{reason} (served via the stride-1 transpose rule)"
        return _supports(backward_data_as_forward(problem))
    if _narrow(problem):
        return dense_float32_2d(problem) or too_large(problem, narrow.workspace(problem),
                                                      "the transposed weights")
    reason = strided.reason(problem)
    if reason is None:
        reason = _supports(backward_data_as_forward(problem), padded_channels=False) or \
            too_large(problem, strided.workspace(problem), "the phases' dy copies and weights")
    else:
        reason = f"{reason} (strided backward-data runs by phases)"
    if reason is not None and problem.in_channels < narrow.MAX_CHANNELS:
        reason = f"{reason}; {narrow.reason(problem)}"
    return reason


def _workspace_bwd_data(problem: ConvProblem) -> int:
    if all(s == 1 for s in problem.stride):
        return _workspace(backward_data_as_forward(problem))
    if _narrow(problem):
        return narrow.workspace(problem)
    return strided.workspace(problem)


def _tunables_bwd_data(problem: ConvProblem) -> Space:
    """At stride 1 the forward's parameters (:func:`tunables`) of the forward conv it
    runs; by phases ``gather``, whether a phase's micro-tiles are gathered across its
    output rows (:func:`.strided.gathers`, the default); none for the narrow path."""
    if all(s == 1 for s in problem.stride):
        return tunables(backward_data_as_forward(problem))
    if _narrow(problem) or strided.reason(problem) is not None:
        return {}
    nvec = panel_vectors(problem.in_channels)
    gather = int(strided.gathers(problem, ACCUMULATORS // nvec))
    return {"gather": (gather, 1 - gather)}


def _flipped_runner(problem: ConvProblem, nr: int, params: Params | None
                    ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``fn(dy, w)``: stride-1 backward-data as the forward conv of dy by the flipped
    weights, packed (:func:`_packed_runner`)."""
    return _packed_runner(backward_data_as_forward(problem), ("flipped", problem.ndim, nr),
                          lambda w: pack_weight(flipped_view(w), problem.ndim, nr), params)


def _prepare_bwd_data(problem: ConvProblem, params: Params | None = None
                      ) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """``fn(dy, w)``: stride-1 :func:`blocked_bwd_data` with weights that stay, bound
    once (:func:`_flipped_runner`); None (run as is) for the strided paths. Transient
    weights are part of the API's remembered settings: fn is never kept across a
    change of them."""
    nr = VEC * (params or {}).get("nvec", panel_vectors(problem.in_channels))
    if any(s != 1 for s in problem.stride) or _reads_in_place(problem, nr):
        return None
    return _flipped_runner(problem, nr, params)


def _reads_in_place(problem: ConvProblem, nr: int) -> bool:
    """Whether backward-data reads the weights in place, unpacked: weights that change
    every call (training, ``transient``) whose input channels fill whole panels of
    ``nr``."""
    return is_transient() and problem.in_channels % nr == 0


@register("blocked", "backward_data", supports=_supports_bwd_data,
          workspace_bytes=_workspace_bwd_data, accuracy=2, numpy_math=False,
          prepare=_prepare_bwd_data, tunables=_tunables_bwd_data)
def blocked_bwd_data(problem: ConvProblem, dy: np.ndarray, w: np.ndarray,
                     params: Params | None = None) -> np.ndarray:
    """Stride 1: the forward conv of dy with the flipped kernel; few input channels:
    :mod:`.narrow`; else by phases (:mod:`.strided`)."""
    nr = VEC * (params or {}).get("nvec", panel_vectors(problem.in_channels))
    if all(s == 1 for s in problem.stride):
        if _reads_in_place(problem, nr):
            w4 = _as2d(w, problem.ndim)
            return _forward(backward_data_as_forward(problem), dy, w4, nr=nr,
                            walk=flipped_walk(w4, nr), params=params)
        return _flipped_runner(problem, nr, params)(dy, w)
    if _narrow(problem):
        return narrow.backward_data(problem, dy, w)
    steps, dy_pads = strided.plan(problem)
    gather = value(_tunables_bwd_data(problem), params, "gather")
    dx = (memory.empty if len(steps) == math.prod(problem.stride) else memory.zeros)(
        problem.x_shape("NHWC"), np.float32)
    dyp = pad(dy, problem.ndim, dy_pads)  # (N, H, W, O)
    dx4, w4, lead = _as2d(dx, problem.ndim), _as2d(w, problem.ndim), 2 - problem.ndim
    weights: list[tuple[np.ndarray, WeightWalk | None]]
    if gather and _reads_in_place(problem, nr):  # each phase's taps read in place
        weights = [(w4, flipped_walk(w4, nr, (1,) * lead + tuple(p.taps for p in s.phase),
                                     (0,) * lead + tuple(p.a0 for p in s.phase),
                                     (1,) * lead + problem.stride)) for s in steps]
    else:  # all phases packed in one cache entry: one comparison of w a call
        flat, _ = PACKED.get(w, ("phases", problem.stride, nr),
                             lambda w: _pack_phases(w, problem, steps, nr))
        weights = [(wp, None) for wp in _phase_panels(flat, problem, steps, nr)]
    for s, (wp, walk) in zip(steps, weights, strict=True):
        if gather:
            window = dyp[strided.window(s)].reshape(s.problem.x_shape("NHWC"))
            y = _forward(s.problem, window, wp, nr=nr, walk=walk)
            dx4[strided.outputs(s)] = _as2d(y, problem.ndim)
        else:
            run_into(dx, s.first, s.step, s.problem, dyp, s.origin, wp)
    return dx


def _phase_shapes(problem: ConvProblem, steps: Sequence[strided.Step],
                  nr: int) -> list[tuple[int, ...]]:
    """The shape of each phase's packed sub-kernel (:func:`pack_weight`'s layout)."""
    blocks, lead = -(-problem.in_channels // nr), (1,) * (2 - problem.ndim)
    return [(blocks, *lead, *s.problem.kernel, problem.out_channels, nr) for s in steps]


def _phase_panels(flat: np.ndarray, problem: ConvProblem, steps: Sequence[strided.Step],
                  nr: int) -> list[np.ndarray]:
    """The phases' packed sub-kernels, views of ``flat`` one after another."""
    panels, at = [], 0
    for shape in _phase_shapes(problem, steps, nr):
        panels.append(flat[at:at + math.prod(shape)].reshape(shape))
        at += math.prod(shape)
    return panels


def _pack_phases(w: np.ndarray, problem: ConvProblem, steps: Sequence[strided.Step],
                 nr: int) -> np.ndarray:
    """Every phase's flipped sub-kernel packed, one after another in one flat array."""
    flat = np.empty(sum(map(math.prod, _phase_shapes(problem, steps, nr))), np.float32)
    for s, panels in zip(steps, _phase_panels(flat, problem, steps, nr), strict=True):
        pack_weight(strided.sub_kernel(w, problem, s.phase), problem.ndim, nr, out=panels)
    return flat
