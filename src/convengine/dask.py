"""Convolutions over dask arrays (extra ``dask``): ``conv``, ``conv_transpose``, ``qconv``.

x is a ``dask.array.Array`` of any chunking. Batch chunks map straight to output
chunks; the channel axis is gathered into one chunk; along each spatial dim the
output is cut where the input is cut (output ``j`` belongs to the input chunk
holding the first pixel it reads), and each output block reads exactly the input
range it needs (its chunk plus a halo of at most ``dilation * (K - 1)`` pixels into
the following chunks, whatever the stride), with the zero padding written into the
block (halos are copied out of their chunks by small tasks of their own, so a chunk
is freed once its own block has run). Each block is then one ordinary convengine
call with ``padding=0``, so the result is the one-array result for every padding,
stride and dilation. The weights
(and bias) are one key of the graph: a worker receives them once, not per task.

Threads: each task runs convengine's kernels on ``threads`` numba threads (set for
the task's thread only; numpy's BLAS, one pool per process, runs single-threaded
while one-thread tasks run), by default ``max(1, cores // tasks_at_once)``, where
``tasks_at_once`` is the dask threads of all workers on this host (``distributed``)
or the local scheduler's pool size (``num_workers``, by default the number of
cores). So workers x threads per worker x convengine threads stays at the cores.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

try:
    import dask
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "convengine.dask needs dask: pip install 'convengine[dask]'"
    ) from exc

from . import api, builders
from .errors import ConvSetupError
from .problem import check_layout, make_problem
from .quant import qconv as _qconv
from .threads import single_threaded_blas

__all__ = ["conv", "conv_transpose", "qconv", "default_threads"]

Range = tuple[int, int]


# ---------------------------------------------------------------- geometry


def _bounds(chunks: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(chunks)]


def _cut(points: Sequence[int], size: int) -> tuple[int, ...]:
    """Chunk sizes of ``[0, size)`` cut at ``points`` (clipped, empty pieces dropped)."""
    edges = sorted({0, size, *(min(max(p, 0), size) for p in points)})
    return tuple(b - a for a, b in zip(edges, edges[1:]))


def _forward_dim(chunks: Sequence[int], k: int, s: int, d: int, pad: Range, out: int
                 ) -> tuple[tuple[int, ...], list[Range]]:
    """Output chunks along one dim and, per output chunk, the input range
    ``[start, stop)`` it reads (may reach into the padding: < 0 or > n)."""
    lo, reach = pad[0], d * (k - 1) + 1
    out_chunks = _cut([-(-(c + lo) // s) for c in _bounds(chunks)[1:-1]], out)
    ranges = [(a * s - lo, (b - 1) * s - lo + reach)
              for a, b in itertools.pairwise(_bounds(out_chunks))]
    return out_chunks, ranges


def _transpose_dim(chunks: Sequence[int], k: int, s: int, d: int, pad: Range, out: int
                   ) -> tuple[tuple[int, ...], list[Range], list[int]]:
    """Output chunks of a transposed conv along one dim; per output chunk the input
    range ``[start, stop)`` whose taps reach it and where that range's full scatter
    starts, in output coordinates."""
    lo, reach, n = pad[0], d * (k - 1) + 1, sum(chunks)
    out_chunks = _cut([c * s - lo for c in _bounds(chunks)[1:-1]], out)
    ranges, origins = [], []
    for a, b in itertools.pairwise(_bounds(out_chunks)):
        start = max(0, -(-(a + lo - reach + 1) // s))
        stop = min(n, (b - 1 + lo) // s + 1)
        ranges.append((start, max(start, stop)))
        origins.append(start * s - lo)
    return out_chunks, ranges, origins


def _pieces(chunks: Sequence[int], start: int, stop: int) -> list[tuple[int, slice, slice]]:
    """(chunk index, slice in the chunk, slice in the block) of each chunk meeting
    ``[start, stop)``."""
    found = []
    for i, (a, b) in enumerate(itertools.pairwise(_bounds(chunks))):
        lo, hi = max(a, start), min(b, stop)
        if lo < hi:
            found.append((i, slice(lo - a, hi - a), slice(lo - start, hi - start)))
    return found


# ---------------------------------------------------------------- tasks


@dataclass(frozen=True)
class _Block:
    """How one task assembles its input block: the block's shape and dtype, the value
    of the padding, and per input chunk (in task argument order) its source and target slices."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fill: Any
    slices: tuple[tuple[tuple[slice, ...], tuple[slice, ...]], ...]


def default_threads() -> int:
    """convengine threads per dask task: ``max(1, cores // tasks_at_once)`` (see the
    module docstring)."""
    cores = os.cpu_count() or 1
    return max(1, cores // _tasks_at_once(cores))


_HOST_THREADS: dict[str, int] = {}  # distributed worker address -> dask threads on its host


def _tasks_at_once(cores: int) -> int:
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return int(dask.config.get("num_workers", None) or cores)
    if worker.address not in _HOST_THREADS:
        host = worker.address.rsplit(":", 1)[0]
        info = worker.client.scheduler_info(n_workers=-1)["workers"]
        _HOST_THREADS[worker.address] = sum(
            w["nthreads"] for addr, w in info.items() if addr.rsplit(":", 1)[0] == host)
    return _HOST_THREADS[worker.address] or 1


def _run(op: Callable[..., np.ndarray], threads: int | None, block: _Block, w: Any,
         bias: Any, parts: list[np.ndarray], extra: Any) -> np.ndarray:
    """One task: assemble the input block from ``parts``, then ``op(block, w, bias, extra)``."""
    n = min(threads or default_threads(), numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    numba.set_num_threads(n)  # this thread's setting only
    xb = parts[0][block.slices[0][0]] if len(parts) == 1 else None
    if xb is None or xb.shape != block.shape:
        xb = np.full(block.shape, block.fill, dtype=block.dtype)
        for part, (src, dst) in zip(parts, block.slices):
            xb[dst] = part[src]
    # BLAS threads are per process: one-thread tasks hold them at 1 while any runs
    with single_threaded_blas() if n == 1 else contextlib.nullcontext():
        return op(xb, w, bias, extra)


@dataclass(frozen=True)
class _Index:
    """A tuple of slices, kept opaque to dask's task parser."""

    slices: tuple[slice, ...]


def _copy(a: np.ndarray, index: _Index) -> np.ndarray:
    """A copy (not a view, which would keep all of ``a`` alive) of ``a[index]``."""
    return np.array(a[index.slices])


def _size(index: tuple[slice, ...], shape: list[int]) -> int:
    return math.prod(len(range(*s.indices(n))) for s, n in zip(index, shape))


def _graph(name: str, x: Any, spatial_axes: tuple[int, ...], op: Callable[..., np.ndarray],
           threads: int | None, fill: Any, weights: tuple[Any, Any],
           out_chunks: tuple[tuple[int, ...], ...], in_ranges: list[list[Range]],
           extras: list[list[Any]], dtype: np.dtype) -> Any:
    """The dask array of ``op`` applied to every output block. ``out_chunks``: chunks of
    every output axis; ``in_ranges[i][j]``: the input range read along spatial dim ``i``
    by output chunk ``j``; ``extras[i][j]``: what ``op`` is told about it."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads must be an int >= 1 or None, got {threads!r}")
    w_key, b_key = f"{name}-weight", f"{name}-bias"
    dsk: dict[Any, Any] = {w_key: weights[0], b_key: weights[1]}
    batch_axis = 0
    for idx in itertools.product(*(range(len(c)) for c in out_chunks)):
        per_dim = [_pieces(x.chunks[ax], *in_ranges[i][idx[ax]])
                   for i, ax in enumerate(spatial_axes)]
        shape = list(x.shape)
        shape[batch_axis] = x.chunks[batch_axis][idx[batch_axis]]
        for i, ax in enumerate(spatial_axes):
            a, b = in_ranges[i][idx[ax]]
            shape[ax] = b - a
        keys, slices = [], []
        for combo in itertools.product(*per_dim):
            key = [x.name] + [0] * x.ndim
            src = [slice(None)] * x.ndim
            dst = [slice(None)] * x.ndim
            key[1 + batch_axis] = idx[batch_axis]
            for (chunk, s, t), ax in zip(combo, spatial_axes):
                key[1 + ax], src[ax], dst[ax] = chunk, s, t
            keys.append(tuple(key))
            slices.append((tuple(src), tuple(dst)))
        # the largest piece is read in place; the others (halos) are copied out by
        # tasks of their own, so that a chunk is freed once its own block has run
        main = max(range(len(keys)), key=lambda j: _size(slices[j][1], shape))
        for j in range(len(keys)):
            if j != main:
                halo = (f"{name}-halo", *idx, j)
                dsk[halo] = (_copy, keys[j], _Index(slices[j][0]))
                keys[j], slices[j] = halo, ((slice(None),) * x.ndim, slices[j][1])
        extra = tuple(extras[i][idx[ax]] for i, ax in enumerate(spatial_axes))
        block = _Block(tuple(shape), x.dtype, fill, tuple(slices))
        dsk[(name, *idx)] = (_run, op, threads, block, w_key, b_key, keys, extra)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[x])
    return da.Array(graph, name, chunks=out_chunks, dtype=dtype,
                    meta=np.empty((0,) * x.ndim, dtype=dtype))


def _as_dask(x: Any, layout: str) -> tuple[Any, int, tuple[int, ...]]:
    """x with the channel axis in one chunk, its channel axis and spatial axes."""
    if not isinstance(x, da.Array):
        raise TypeError(
            f"x must be a dask.array.Array, got {type(x).__name__} "
            "(wrap a numpy array with dask.array.from_array)"
        )
    if x.ndim not in (3, 4, 5):
        raise ConvSetupError(f"x must have 3-5 dims (N, C, *S), got shape {x.shape}")
    if any(math.isnan(c) for dims in x.chunks for c in dims):
        raise ConvSetupError("x has unknown chunk sizes; call x.compute_chunk_sizes() first")
    c_axis = 1 if layout == "NCHW" else x.ndim - 1
    spatial = tuple(range(2, x.ndim)) if layout == "NCHW" else tuple(range(1, x.ndim - 1))
    return x.rechunk({c_axis: -1}), c_axis, spatial


def _fake(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zero-strided stand-in of ``shape`` for validating a call without data."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)


def _out_chunks(x: Any, c_axis: int, channels: int, spatial: tuple[int, ...],
                per_dim: list[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    chunks = list(x.chunks)
    chunks[c_axis] = (channels,)
    for ax, c in zip(spatial, per_dim):
        chunks[ax] = c
    return tuple(chunks)


# ---------------------------------------------------------------- the ops


@dataclass(frozen=True)
class _Conv:
    """The conv of one block (its padding is in the blocks' overlap)."""

    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    layout: str
    algo: str

    def args(self) -> dict[str, Any]:
        return {"stride": self.stride, "dilation": self.dilation, "groups": self.groups,
                "layout": self.layout, "algo": self.algo}

    def __call__(self, xb: np.ndarray, w: np.ndarray, bias: Any, extra: Any) -> np.ndarray:
        return api.conv(xb, w, bias, **self.args())


def conv(x: Any, w: Any, bias: Any = None, *, stride: Any = 1, padding: Any = 0,
         dilation: Any = 1, groups: int = 1, layout: str = "NCHW", algo: str = "auto",
         threads: int | None = None) -> Any:
    """:func:`convengine.conv` of a dask array x ``(N, C, *S)`` (NCHW, or NHWC) with
    numpy w ``(O, C // groups, *K)``; returns a lazy dask array ``(N, O, *S_out)``.
    ``threads``: convengine threads per task (default :func:`default_threads`)."""
    layout = check_layout(layout)
    x, c_axis, spatial = _as_dask(x, layout)
    w = np.asarray(w)
    p = builders.forward_problem(_fake(x.shape, x.dtype), w, bias, stride=stride, padding=padding,
                            dilation=dilation, groups=groups, layout=layout)
    b = None if bias is None else builders.check_bias(bias, p.out_channels, p.compute_dtype)
    dims = [_forward_dim(x.chunks[ax], k, s, d, pad, o) for ax, k, s, d, pad, o in
            zip(spatial, p.kernel, p.stride, p.dilation, p.padding, p.out_size)]
    op = _Conv(p.stride, p.dilation, p.groups, layout, algo)
    name = "convengine-conv-" + tokenize(x, w, b, p, algo, threads)
    chunks = _out_chunks(x, c_axis, p.out_channels, spatial, [c for c, _ in dims])
    return _graph(name, x, spatial, op, threads, 0, (w, b), chunks,
                  [r for _, r in dims], [[None] * len(r) for _, r in dims], x.dtype)


@dataclass(frozen=True)
class _Transpose(_Conv):
    """The transposed conv of one block, cropped to its output chunk."""

    out_channels: int

    def __call__(self, xb: np.ndarray, w: np.ndarray, bias: Any, extra: Any) -> np.ndarray:
        """extra per spatial dim: (origin of xb's full scatter, output chunk start, size)."""
        nchw = self.layout == "NCHW"
        spatial = range(2, xb.ndim) if nchw else range(1, xb.ndim - 1)
        shape = list(xb.shape)
        shape[1 if nchw else -1] = self.out_channels
        for ax, (_, _, size) in zip(spatial, extra):
            shape[ax] = size
        y = np.zeros(shape, dtype=xb.dtype)
        if all(xb.shape[ax] for ax in spatial) and xb.shape[0]:
            full = api.conv_transpose(xb, w, **self.args())
            src, dst = [slice(None)] * xb.ndim, [slice(None)] * xb.ndim
            for ax, (origin, start, size) in zip(spatial, extra):
                lo, hi = max(origin, start), min(origin + full.shape[ax], start + size)
                src[ax], dst[ax] = slice(lo - origin, hi - origin), slice(lo - start, hi - start)
            y[tuple(dst)] = full[tuple(src)]
        if bias is not None:
            y += bias.reshape((-1,) + (1,) * (xb.ndim - 2) if nchw else -1)
        return y


def conv_transpose(x: Any, w: Any, bias: Any = None, *, stride: Any = 1, padding: Any = 0,
                   output_padding: Any = 0, dilation: Any = 1, groups: int = 1,
                   layout: str = "NCHW", algo: str = "auto", threads: int | None = None) -> Any:
    """:func:`convengine.conv_transpose` of a dask array x ``(N, C_in, *S)`` with numpy
    w ``(C_in, C_out // groups, *K)``; returns a lazy dask array ``(N, C_out, *S_out)``."""
    layout = check_layout(layout)
    x, c_axis, spatial = _as_dask(x, layout)
    w = np.asarray(w)
    p = builders.transpose_problem(_fake(x.shape, x.dtype), w, bias, stride=stride,
                              padding=padding, output_padding=output_padding,
                              dilation=dilation, groups=groups, layout=layout)
    b = None if bias is None else builders.check_bias(bias, p.in_channels, p.compute_dtype)
    if b is not None:
        b = b.astype(x.dtype)
    dims = [_transpose_dim(x.chunks[ax], k, s, d, pad, o) for ax, k, s, d, pad, o in
            zip(spatial, p.kernel, p.stride, p.dilation, p.padding, p.in_size)]
    extras = [[(origin, start, size) for origin, start, size in
               zip(origins, _bounds(c), c)] for c, _, origins in dims]
    op = _Transpose(p.stride, p.dilation, p.groups, layout, algo, p.in_channels)
    name = "convengine-conv-transpose-" + tokenize(x, w, b, p, algo, threads)
    chunks = _out_chunks(x, c_axis, p.in_channels, spatial, [c for c, _, _ in dims])
    return _graph(name, x, spatial, op, threads, 0, (w, b), chunks,
                  [r for _, r, _ in dims], extras, x.dtype)


@dataclass(frozen=True)
class _QConv:
    kwargs: tuple[tuple[str, Any], ...]

    def __call__(self, xb: np.ndarray, w: np.ndarray, bias: Any, extra: Any) -> np.ndarray:
        return _qconv(xb, w_q=w, bias=bias, **dict(self.kwargs))


def qconv(x_q: Any, x_scale: Any, x_zero_point: Any, w_q: Any, w_scale: Any,
          w_zero_point: Any, bias: Any = None, *, out_scale: Any = None,
          out_zero_point: Any = None, out_dtype: Any = np.uint8, relu: bool = False,
          bias_mode: str = "float", stride: Any = 1, padding: Any = 0, dilation: Any = 1,
          groups: int = 1, layout: str = "NCHW", algo: str = "auto",
          threads: int | None = None) -> Any:
    """:func:`convengine.qconv` of a dask array x_q (uint8/int8, per-tensor scale and
    zero point) with numpy w_q; the padding holds ``x_zero_point``, as in one call."""
    layout = check_layout(layout)
    x, c_axis, spatial = _as_dask(x_q, layout)
    w = np.asarray(w_q)
    kwargs = dict(x_scale=x_scale, x_zero_point=x_zero_point, w_scale=w_scale,
                  w_zero_point=w_zero_point, out_scale=out_scale,
                  out_zero_point=out_zero_point, out_dtype=out_dtype, relu=relu,
                  bias_mode=bias_mode, stride=stride, dilation=dilation, groups=groups,
                  layout=layout, algo=algo)
    # one call on a stand-in batch of 0 validates every argument and gives the dtype
    probe = _qconv(_fake((0, *x.shape[1:]), x.dtype), w_q=w, bias=bias, padding=padding,
                   **{k: v for k, v in kwargs.items() if k != "w_q"})
    if isinstance(x_zero_point, np.ndarray) and x_zero_point.size != 1:
        raise ConvSetupError("x_zero_point must be one value (per-tensor activations)")
    p = make_problem("forward", x.shape, w.shape, dtype="float32", stride=stride,
                     padding=padding, dilation=dilation, groups=groups, layout=layout)
    dims = [_forward_dim(x.chunks[ax], k, s, d, pad, o) for ax, k, s, d, pad, o in
            zip(spatial, p.kernel, p.stride, p.dilation, p.padding, p.out_size)]
    op = _QConv(tuple(sorted(kwargs.items(), key=lambda kv: kv[0])))
    fill = np.asarray(x_zero_point).astype(x.dtype).item()
    name = "convengine-qconv-" + tokenize(x, w, bias, sorted(kwargs.items()), padding, threads)
    chunks = _out_chunks(x, c_axis, p.out_channels, spatial, [c for c, _ in dims])
    return _graph(name, x, spatial, op, threads, fill, (w, bias), chunks,
                  [r for _, r in dims], [[None] * len(r) for _, r in dims], probe.dtype)
