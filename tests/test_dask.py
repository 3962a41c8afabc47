"""convengine.dask against the one-array float64 reference, on small odd chunkings,
with the threaded, processes and distributed schedulers."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import convengine as ce
from convengine import ConvSetupError

da = pytest.importorskip("dask.array")
ced = pytest.importorskip("convengine.dask")

from oracle import assert_close  # noqa: E402

# (x shape NCHW, chunks of the spatial dims, w shape, stride, padding, dilation, groups)
FORWARD = [
    ((2, 3, 17), ((4, 7, 6),), (4, 3, 3), 2, "same", 1, 1),
    ((2, 3, 17), ((5, 5, 5, 2),), (4, 3, 3), 3, ((2, 1),), 2, 1),
    ((3, 4, 13, 11), ((3, 5, 5), (4, 4, 3)), (6, 2, 3, 2), 1, 0, 1, 2),
    ((3, 4, 13, 11), ((3, 5, 5), (4, 4, 3)), (6, 2, 3, 2), 2, "same", 1, 2),
    ((3, 4, 13, 11), ((1, 2, 10), (5, 6)), (4, 4, 3, 3), (3, 2), ((1, 2), (0, 3)), (2, 1), 1),
    ((3, 4, 13, 11), ((7, 6), (1, 1, 9)), (4, 4, 3, 3), 2, "same_lower", 2, 1),
    ((3, 4, 13, 11), ((4, 9), (6, 5)), (4, 4, 2, 2), 1, 5, 1, 1),
    ((3, 4, 13, 11), ((4, 9), (6, 5)), (4, 1, 3, 3), 2, "valid", 1, 4),
    ((1, 2, 9, 8, 7), ((4, 5), (3, 5), (7,)), (3, 2, 3, 3, 2), (2, 1, 3), "same", (1, 2, 1), 1),
]


def _dask(x: np.ndarray, spatial_chunks, layout: str = "NCHW"):
    """x (NCHW) as a dask array in ``layout``, batch chunks of 2, the given spatial
    chunks, channels split in two where there are several."""
    c = x.shape[1]
    chunks = (2, (c // 2, c - c // 2) if c > 1 else (1,), *spatial_chunks)
    if layout == "NHWC":
        x = np.moveaxis(x, 1, -1)
        chunks = (chunks[0], *chunks[2:], chunks[1])
    return da.from_array(x, chunks=chunks)


def _nhwc_w(w: np.ndarray) -> np.ndarray:
    return np.moveaxis(w, 1, -1)


@pytest.mark.parametrize("case", FORWARD, ids=lambda c: f"{c[0]}-s{c[3]}-p{c[4]}-d{c[5]}-g{c[6]}")
def test_conv_equals_one_array_reference(case):
    shape, chunks, wshape, stride, padding, dilation, groups = case
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal(shape), rng.standard_normal(wshape), rng.standard_normal(wshape[0])
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    ref = ce.conv(x, w, b, **kw, algo="reference")
    y = ced.conv(_dask(x, chunks), w, b, **kw, algo="reference")
    assert y.shape == ref.shape
    np.testing.assert_array_equal(y.compute(scheduler="threads"), ref)


@pytest.mark.parametrize("case", [FORWARD[1], FORWARD[3], FORWARD[4]], ids=str)
def test_conv_float32_auto_nhwc(case):
    shape, chunks, wshape, stride, padding, dilation, groups = case
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(shape), rng.standard_normal(wshape)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    ref = np.moveaxis(ce.conv(x, w, **kw, algo="reference"), 1, -1)
    xd = _dask(x.astype(np.float32), chunks, "NHWC")
    y = ced.conv(xd, _nhwc_w(w).astype(np.float32), **kw, layout="NHWC").compute()
    assert y.dtype == np.float32
    assert_close(y, ref, "float32", "dask conv NHWC")


TRANSPOSE = [
    # x NCHW, spatial chunks, w (C_in, C_out // g, *K), stride, padding, output_padding,
    # dilation, groups
    ((2, 4, 11), ((3, 1, 7),), (4, 3, 3), 2, 1, 1, 1, 1),
    ((3, 4, 13, 11), ((3, 5, 5), (1, 7, 3)), (4, 3, 3, 2), 1, 0, 0, 1, 1),
    ((3, 4, 13, 11), ((3, 5, 5), (1, 7, 3)), (4, 3, 3, 2), 3, ((1, 2), (0, 1)), 0, (2, 1), 1),
    ((3, 4, 13, 11), ((6, 7), (5, 6)), (4, 2, 3, 3), 2, "same", 0, 1, 2),
    ((3, 4, 13, 11), ((2, 11), (4, 7)), (4, 3, 1, 2), (3, 2), 0, (2, 1), (1, 2), 1),
]


@pytest.mark.parametrize("case", TRANSPOSE, ids=lambda c: f"{c[0]}-s{c[3]}-p{c[4]}-op{c[5]}")
def test_conv_transpose_equals_one_array_reference(case):
    shape, chunks, wshape, stride, padding, out_pad, dilation, groups = case
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(shape), rng.standard_normal(wshape)
    b = rng.standard_normal(wshape[1] * groups)
    kw = dict(stride=stride, padding=padding, output_padding=out_pad, dilation=dilation,
              groups=groups)
    ref = ce.conv_transpose(x, w, b, **kw, algo="reference")
    y = ced.conv_transpose(_dask(x, chunks), w, b, **kw)
    assert y.shape == ref.shape
    assert_close(y.compute(scheduler="threads"), ref, "float64", "dask conv_transpose")


def _quantized(rng, shape, wshape):
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    w = rng.integers(-128, 128, wshape, dtype=np.int8)
    return x, w


@pytest.mark.parametrize("padding,stride", [("same", 2), ((1, 3), 1)])
def test_qconv_exact(padding, stride):
    """The int32 accumulator equals the float64 reference conv of the zero-point-shifted
    integers (padding holds the zero point); requantized output with bias and ReLU
    equals the one-array qconv byte for byte."""
    rng = np.random.default_rng(3)
    x, w = _quantized(rng, (3, 5, 13, 10), (4, 5, 3, 3))
    xzp, wzp = 7, np.array([0, 1, -2, 3])
    kw = dict(stride=stride, padding=padding)
    xd = _dask(x, ((3, 5, 5), (4, 1, 5)))
    acc = ced.qconv(xd, 1.0, xzp, w, 1.0, wzp, out_dtype=np.int32, **kw).compute()
    shifted_w = w.astype(np.float64) - wzp.reshape(-1, 1, 1, 1)
    ref = ce.conv(x.astype(np.float64) - xzp, shifted_w, algo="reference", **kw)
    np.testing.assert_array_equal(acc, np.rint(ref).astype(np.int32))
    args = (x, 0.02, xzp, w, np.array([0.01, 0.02, 0.03, 0.01]), wzp,
            rng.standard_normal(4).astype(np.float32))
    qkw = dict(out_scale=0.5, out_zero_point=3, relu=True, **kw)
    one = ce.qconv(*args, **qkw)
    got = ced.qconv(xd, *args[1:], **qkw).compute()
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, one)


def test_weights_are_one_key():
    """A large weight is in the graph once: no task carries its own copy."""
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((4, 32, 12, 12)), rng.standard_normal((32, 32, 3, 3))
    y = ced.conv(_dask(x, ((5, 7), (6, 6))), w, padding=1)
    graph = dict(y.__dask_graph__())
    layer = [k for k in graph if isinstance(k, tuple) and k[0] == y.name]
    assert len(layer) == 8  # 2 batch x 2 x 2 spatial blocks
    sizes = [len(pickle.dumps(graph[k])) for k in layer]
    assert max(sizes) < w.nbytes / 20, sizes
    assert sum(isinstance(v, np.ndarray) and v.shape == w.shape for v in graph.values()) <= 1


def test_errors():
    w = np.zeros((4, 3, 3, 3))
    with pytest.raises(TypeError, match="dask.array.Array"):
        ced.conv(np.zeros((1, 3, 8, 8)), w)
    with pytest.raises(ConvSetupError, match="channel"):
        ced.conv(da.zeros((1, 2, 8, 8), chunks=4), w)
    with pytest.raises(ConvSetupError, match="layout"):
        ced.conv(da.zeros((1, 3, 8, 8), chunks=4), w, layout="NCWH")
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        ced.conv(da.zeros((1, 3, 8, 8), chunks=4), w, threads=0)


def test_default_threads_rule():
    import dask

    cores = os.cpu_count() or 1
    with dask.config.set(num_workers=1):
        assert ced.default_threads() == cores
    with dask.config.set(num_workers=2 * cores):
        assert ced.default_threads() == 1


def _small_problem():
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((3, 2, 11, 9)), rng.standard_normal((3, 2, 3, 3))
    return x, w, dict(stride=2, padding="same", algo="reference")


@pytest.mark.slow
def test_processes_scheduler():
    x, w, kw = _small_problem()
    y = ced.conv(_dask(x, ((4, 7), (5, 4))), w, **kw).compute(scheduler="processes",
                                                              num_workers=2)
    np.testing.assert_array_equal(y, ce.conv(x, w, **kw))


@pytest.mark.slow
def test_distributed_local_cluster():
    distributed = pytest.importorskip("distributed")
    x, w, kw = _small_problem()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        y = client.compute(ced.conv(_dask(x, ((4, 7), (5, 4))), w, **kw)).result()
        threads = client.submit(ced.default_threads, pure=False).result()
    np.testing.assert_array_equal(y, ce.conv(x, w, **kw))
    assert threads == max(1, (os.cpu_count() or 1) // 2)


def test_tasks_leave_the_callers_threads_alone():
    """Tasks set numba threads for their own thread; BLAS returns to its setting."""
    from threadpoolctl import threadpool_info

    def blas_threads():
        return sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    x, w, kw = _small_problem()
    before, numba_before = blas_threads(), ce.get_num_threads()
    y = ced.conv(_dask(x, ((4, 7), (5, 4))), w, padding=1, threads=1)
    y.compute(scheduler="threads", num_workers=2)
    assert blas_threads() == before and ce.get_num_threads() == numba_before


def test_conv_transpose_nhwc_float32_with_bias():
    shape, chunks, wshape, stride, padding, out_pad, dilation, groups = TRANSPOSE[3]
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal(shape), rng.standard_normal(wshape)
    b = rng.standard_normal(wshape[1] * groups)
    kw = dict(stride=stride, padding=padding, output_padding=out_pad, dilation=dilation,
              groups=groups)
    ref = np.moveaxis(ce.conv_transpose(x, w, b, **kw, algo="reference"), 1, -1)
    xd = _dask(x.astype(np.float32), chunks, "NHWC")
    y = ced.conv_transpose(xd, _nhwc_w(w).astype(np.float32), b.astype(np.float32), **kw,
                           layout="NHWC").compute()
    assert y.dtype == np.float32
    assert_close(y, ref, "float32", "dask conv_transpose NHWC")
