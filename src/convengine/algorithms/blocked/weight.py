"""``blocked`` backward-weight: the weight gradient by a register-blocked vector kernel.

``dw[o, a, b, c] = sum_{n, i, j} dy[n, i, j, o] * xp[n, i*sh + a*dh, j*sw + b*dw, c]``
with ``xp`` the zero-padded input (channels-last) and ``dy`` as given (channels-last):
no column matrix, no packing. A micro-kernel holds ``MR`` output channels x
``VEC * nvec`` input channels of one kernel tap in vector registers and walks the
reduction over pixels, broadcasting ``MR`` adjacent values of ``dy`` and loading
``nvec`` vectors of ``xp`` per pixel (the forward micro-kernel of ``blocked`` with
the roles of the operands exchanged).

The pixels are taken in chunks small enough for a core's L2 (``CHUNK_BYTES`` of
``x`` and ``dy``); the (tap, output-channel block, input-channel
block) tasks are shared out among the threads once, and each thread runs all its
tasks on a chunk before the next, adding the chunk's sum to its blocks of ``dw``.
The sum over pixels therefore runs in chunk order, in float32, one rounding per fused
multiply-add.

With few input channels (the 3-channel stems) the roles turn: a block holds ``MR``
consecutive taps of one kernel row (its columns x channels are one contiguous run of
``xp`` at unit column dilation) x ``VEC * nvec`` output channels, broadcasting x and loading dy.

Serves float32, dense (groups 1), 1-D and 2-D, input channels a multiple of VEC (16
float32 with AVX-512, 8 with AVX2) or output channels a multiple of VEC at unit column
dilation.
"""

from __future__ import annotations

import math
from functools import cache, lru_cache
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ... import host_params
from ..._host import ACCUMULATORS, VECTOR_BYTES
from ..._kernel_cache import instantiate
from ...params import Params, Space, around
from ...problem import ConvProblem
from ...registry import register
from ...threads import get_num_threads
from .._common import too_large
from ..fma import row_pointers, splat, store_rows
from .forward import _as2d, dense_float32_2d, padded_input

MR = 6  # output channels per register block
VEC = VECTOR_BYTES // 4  # float32 lanes of a vector register
# vectors per block that keep its MR x nvec accumulators in registers (4, 2, 1 with
# AVX-512; 2, 1 with AVX2)
NVECS = tuple(v for v in (4, 2, 1) if MR * v <= ACCUMULATORS)
# x and dy bytes per chunk of pixels: three eighths of a core's L2, 384 KiB of 1 MiB
# (see host_params.weight_chunk_bytes)
CHUNK_BYTES = host_params.weight_chunk_bytes()
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, VEC)


def _make_ukernel(nvec: int) -> Any:
    """Micro-kernel of ``MR`` output channels x ``VEC * nvec`` input channels:

    ``ukernel(d, d_off, dn, dh, dw, nn, nh, nw, x, x_off, xn, xh, xw, mr, y, y_off, ys,
    add)`` sets, for ``r < mr`` and lanes ``j < VEC * nvec``,
    ``y[y_off + r * ys + j] = (y[...] if add else 0) + sum_{n<nn, h<nh, w<nw}
    d[d_off + n*dn + h*dh + w*dw + r] * x[x_off + n*xn + h*xh + w*xw + j]``.
    Rows ``r >= mr`` recompute row ``mr - 1`` and are not stored.
    """

    def ukernel(typingctx, d, d_off, dn, dh, dw, nn, nh, nw, x, x_off, xn, xh, xw, mr, y,
                y_off, ys, add):
        i = types.intp
        sig = types.void(d, i, i, i, i, i, i, i, x, i, i, i, i, i, y, i, i, i)

        def codegen(context, builder, signature, args):
            d_arr = context.make_array(signature.args[0])(context, builder, args[0])
            x_arr = context.make_array(signature.args[8])(context, builder, args[8])
            y_arr = context.make_array(signature.args[14])(context, builder, args[14])
            (_, d_off, dn, dh, dw, nn, nh, nw, _, x_off, xn, xh, xw, mr, _, y_off, ys,
             add) = args
            intp = d_off.type
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), f"llvm.fma.v{VEC}f32")
            one = ir.Constant(intp, 1)
            rows = row_pointers(builder, builder.gep(d_arr.data, [d_off]), MR, mr, one)
            x_base = builder.gep(x_arr.data, [x_off])
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_VF, None))
                     for _ in range(nvec)] for _ in range(MR)]
            with cgutils.for_range(builder, nn) as n_loop:
                d_n = builder.mul(n_loop.index, dn)
                x_n = builder.mul(n_loop.index, xn)
                with cgutils.for_range(builder, nh) as h_loop:
                    d_nh = builder.add(d_n, builder.mul(h_loop.index, dh))
                    x_nh = builder.add(x_n, builder.mul(h_loop.index, xh))
                    with cgutils.for_range(builder, nw) as w_loop:
                        d_at = builder.add(d_nh, builder.mul(w_loop.index, dw))
                        x_at = builder.gep(x_base, [builder.add(x_nh, builder.mul(w_loop.index, xw))])
                        xv = [builder.load(builder.bitcast(
                            builder.gep(x_at, [ir.Constant(intp, VEC * j)]), _VF.as_pointer()),
                            align=4) for j in range(nvec)]
                        for r in range(MR):
                            dv = splat(builder, builder.load(builder.gep(rows[r], [d_at])), _VF)
                            for j in range(nvec):
                                acc = accs[r][j]
                                builder.store(builder.call(fma, [dv, xv[j], builder.load(acc)]), acc)
            adding = builder.icmp_signed("!=", add, ir.Constant(intp, 0))
            store_rows(builder, accs, builder.gep(y_arr.data, [y_off]), mr, ys, 4, adding)
            return context.get_dummy_value()

        return sig, codegen

    ukernel.__name__ = f"ukernel_wgrad_{MR}x{VEC * nvec}"
    return intrinsic(ukernel)


@cache
def _driver(nvec: int) -> Any:
    """The compiled weight gradient for blocks of ``MR`` broadcast values x ``NR = VEC *
    nvec`` vector lanes: ``run(b, v, y, tasks, b_step, v_step, ys, n, oh, ow, imgs,
    rows, workers)``. ``b`` and ``v`` are the flat broadcast and vector operands (dy
    and x, or x and dy for the turned kernel), ``tasks`` rows ``(b offset, v offset, y
    offset, rows)`` of one block each, ``b_step``/``v_step`` the operands' strides
    per image, output row and output column. Each of ``workers`` threads takes an
    equal share of the tasks and walks the pixels in chunks of ``imgs`` images x
    ``rows`` output rows, all its tasks per chunk (one parallel region per call)."""
    return instantiate(__name__, "weight_template.py", f"blocked_wgrad_nr{VEC * nvec}",
                       NVEC=nvec).run


@lru_cache(maxsize=256)
def _tasks(problem: ConvProblem, nvec: int = 0) -> tuple[np.ndarray, int, int]:
    """(tasks, nvec, ys) of a problem (see :func:`_driver`): over (tap, output-channel
    block, input-channel block) broadcasting dy and loading x, or, turned
    (:func:`_by_rows`), over (kernel row, block of a row's taps, output-channel
    block) broadcasting x and loading dy into a ``(KH, KW*C, O)`` result; blocks of
    ``nvec`` vectors (0: :func:`panel_vectors`'s)."""
    lead = 2 - problem.ndim
    kh, kw = (1,) * lead + problem.kernel
    dh, dw = (1,) * lead + problem.dilation
    wp = ((0, 0),) * lead + problem.padding
    wpx = problem.in_size[-1] + sum(wp[1])
    c, o = problem.in_channels, problem.out_channels
    if _by_rows(problem):
        nvec, run = nvec or panel_vectors(o), kw * c
        a, t0, o0 = np.meshgrid(np.arange(kh), np.arange(0, run, MR),
                                np.arange(0, o, VEC * nvec), indexing="ij")
        table = [a * dh * wpx * c + t0, o0, (a * run + t0) * o + o0, np.minimum(MR, run - t0)]
        ys = o
    else:
        nvec = nvec or panel_vectors(c)
        a, b, o0, c0 = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(0, o, MR),
                                   np.arange(0, c, VEC * nvec), indexing="ij")
        table = [o0, (a * dh * wpx + b * dw) * c + c0, ((o0 * kh + a) * kw + b) * c + c0,
                 np.minimum(MR, o - o0)]
        ys = kh * kw * c
    tasks = np.stack([t.reshape(-1) for t in table], axis=1).astype(np.intp)
    tasks.flags.writeable = False
    return tasks, nvec, ys


def panel_vectors(channels: int) -> int:
    """Vectors per block: the most of :data:`NVECS` the count allows; 0 if it is not a
    multiple of VEC."""
    return next((v for v in NVECS if channels % (VEC * v) == 0), 0)


def _by_rows(problem: ConvProblem) -> bool:
    """Whether the turned kernel (:func:`_row_driver`) holds more accumulators than the
    one over input channels: input channels few or not a multiple of VEC, output
    channels a multiple of VEC, unit column dilation."""
    rows_ok = problem.out_channels % VEC == 0 and problem.dilation[-1] == 1
    return rows_ok and panel_vectors(problem.out_channels) > panel_vectors(problem.in_channels)


def _chunk(problem: ConvProblem, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, int]:
    """(images, output rows) per chunk: whole images while they fit ``chunk_bytes``,
    else rows of one image."""
    oh, ow = (1,) * (2 - problem.ndim) + problem.out_size
    row_bytes = 4 * ow * (problem.in_channels + problem.out_channels)
    rows = max(1, chunk_bytes // row_bytes)
    if rows < oh:
        return 1, rows
    return max(1, rows // oh), oh


def _supports(problem: ConvProblem) -> str | None:
    reason = dense_float32_2d(problem)
    if reason is not None:
        return reason
    if problem.in_channels % VEC and not _by_rows(problem):
        return (f"input channels must be a multiple of {VEC}, or output channels a "
                f"multiple of {VEC} at unit column dilation (got {problem.in_channels} "
                f"and {problem.out_channels}, dilation {problem.dilation})")
    return too_large(problem, _workspace(problem), "the padded copy of x")


def _workspace(problem: ConvProblem) -> int:
    """The padded copy of x (none when unpadded)."""
    if all(p == (0, 0) for p in problem.padding):
        return 0
    sizes = [n + lo + hi for n, (lo, hi) in zip(problem.in_size, problem.padding)]
    return 4 * problem.batch * math.prod(sizes) * problem.in_channels


def tunables(problem: ConvProblem) -> Space:
    """Backward-weight's parameters, the default first: ``chunk_kib``, KiB of x and dy
    per chunk of pixels (``CHUNK_BYTES``, three eighths of L2; then a quarter, half and
    twice that); ``nvec``, vectors per block (the most the channels allow, then the
    fewer ones)."""
    space: Space = {"chunk_kib": around(CHUNK_BYTES >> 10)}
    channels = problem.out_channels if _by_rows(problem) else problem.in_channels
    fits = [v for v in NVECS if channels % (VEC * v) == 0]
    if len(fits) > 1:
        space["nvec"] = tuple(fits)
    return space


@register("blocked", "backward_weight", supports=_supports, workspace_bytes=_workspace,
          accuracy=2, numpy_math=False, tunables=tunables)
def blocked_bwd_weight(problem: ConvProblem, x: np.ndarray, dy: np.ndarray,
                       params: Params | None = None) -> np.ndarray:
    dw = np.empty(problem.w_shape("NHWC"), np.float32)
    if problem.batch == 0 or 0 in problem.out_size:
        dw[...] = 0
        return dw
    lead = 2 - problem.ndim
    sh, sw = (1,) * lead + problem.stride
    dh, dwl = (1,) * lead + problem.dilation
    chosen = params or {}
    imgs, rows = _chunk(problem, chosen.get("chunk_kib", CHUNK_BYTES >> 10) << 10)
    xp, dy4 = padded_input(x, problem), _as2d(np.ascontiguousarray(dy), problem.ndim)
    n, hp, wpx, c = xp.shape
    _, oh, ow, o = dy4.shape
    x_step = np.array([hp * wpx * c, sh * wpx * c, sw * c], np.intp)
    dy_step = np.array([oh * ow * o, ow * o, o], np.intp)
    tasks, nvec, ys = _tasks(problem, chosen.get("nvec", 0))
    threads = get_num_threads()
    if not _by_rows(problem):
        _driver(nvec)(dy4.reshape(-1), xp.reshape(-1), dw.reshape(-1), tasks, dy_step, x_step,
                      ys, n, oh, ow, imgs, rows, threads)
        return dw
    _, kh, kw, _ = _as2d(dw, problem.ndim).shape
    out = np.empty((kh, kw * c, o), np.float32)
    _driver(nvec)(xp.reshape(-1), dy4.reshape(-1), out.reshape(-1), tasks, x_step, dy_step,
                  ys, n, oh, ow, imgs, rows, threads)
    dw[...] = out.reshape(kh, kw, c, o).transpose(3, 0, 1, 2).reshape(dw.shape)
    return dw
