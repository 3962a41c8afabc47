"""convengine.set_num_threads sets numba's and numpy's BLAS thread counts."""

from __future__ import annotations

import threading

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info

import convengine as ce
from convengine import threads


def _numpy_blas_threads() -> int:
    libs = [i for i in threadpool_info() if i["user_api"] == "blas"]
    numpy_libs = [i for i in libs if "numpy" in i["filepath"]] or libs
    return numpy_libs[0]["num_threads"]


@pytest.fixture
def restore_threads():
    before = ce.get_num_threads()
    yield
    ce.set_num_threads(before)


def test_set_num_threads_sets_both_pools(restore_threads) -> None:
    ce.set_num_threads(1)
    assert numba.get_num_threads() == 1 == ce.get_num_threads()
    assert _numpy_blas_threads() == 1
    n = min(2, numba.config.NUMBA_NUM_THREADS)
    ce.set_num_threads(n)
    assert numba.get_num_threads() == n
    assert _numpy_blas_threads() == n


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (10**6, ValueError),
                                              (1.5, TypeError), (True, TypeError)])
def test_set_num_threads_rejects(value, error) -> None:
    with pytest.raises(error, match="n must be"):
        ce.set_num_threads(value)


def test_single_threaded_blas_nests_and_restores(restore_threads) -> None:
    n = min(2, numba.config.NUMBA_NUM_THREADS)
    ce.set_num_threads(n)
    with threads.single_threaded_blas():
        assert _numpy_blas_threads() == 1
        with threads.single_threaded_blas():
            assert _numpy_blas_threads() == 1
        assert _numpy_blas_threads() == 1
    assert _numpy_blas_threads() == n


def test_run_parallel_covers_every_part_and_raises() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def record(part: int, parts: int) -> None:
        with lock:
            seen.append(part)

    threads.run_parallel(record, 5)
    assert sorted(seen) == [0, 1, 2, 3, 4]

    def fail(part: int, parts: int) -> None:
        if part == 3:
            raise RuntimeError("part 3 failed")

    with pytest.raises(RuntimeError, match="part 3"):
        threads.run_parallel(fail, 4)


def test_kernels_agree_across_thread_counts(restore_threads) -> None:
    """Results must not depend on the thread count beyond float rounding order."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    out = {}
    for n in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
        ce.set_num_threads(n)
        out[n] = [ce.conv(x, w, padding=1, algo=a) for a in ("direct", "winograd")]
    first, *rest = out.values()
    for other in rest:
        for a, b in zip(first, other, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
