"""Thread counts of the two pools convengine uses: numba's and numpy's BLAS.

Both pools busy-wait for a while after each parallel region, so running one while
the other spins oversubscribes the cores (measured on 2 cores: a 77 us numba region
took 8 ms right after a BLAS call). ``set_num_threads(n)`` sets both to ``n``.
Kernels that interleave compiled stages with BLAS calls (Winograd) instead run
``n`` Python threads, each with serial numba code and single-threaded BLAS
(:func:`single_threaded_blas`, :func:`run_parallel`), so that nothing spins.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
from threadpoolctl import ThreadpoolController

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_blas: Any = None  # numpy's OpenBLAS controller, found once
_blas_users = 0  # calls currently inside single_threaded_blas
_blas_saved = 1


def _numpy_blas() -> Any:
    """threadpoolctl's controller of the BLAS numpy links (None if not found)."""
    global _blas
    if _blas is None:
        import numpy  # noqa: F401  (its BLAS must be loaded to be found)

        found = ThreadpoolController().select(user_api="blas").lib_controllers
        numpy_libs = [c for c in found if "numpy" in c.filepath] or found
        _blas = numpy_libs[0] if numpy_libs else False
    return _blas or None


@numba.njit  # not cached: numba cannot cache code that reads the threading layer
def get_num_threads() -> int:
    """The number of threads convengine's kernels use (numba's setting, which is per
    Python thread). Compiled: ``numba.get_num_threads()`` called from Python takes two
    locks, 25-30 us a call with cold caches."""
    return numba.get_num_threads()


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in numba kernels and numpy's BLAS (ValueError if ``n`` < 1
    or above numba's ``NUMBA_NUM_THREADS`` launch limit)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {n!r}")
    limit = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    if not 1 <= n <= limit:
        raise ValueError(f"n must be between 1 and NUMBA_NUM_THREADS={limit}, got {n}")
    global _pool, _blas_saved
    numba.set_num_threads(n)
    blas = _numpy_blas()
    with _lock:
        if blas is not None:
            if _blas_users:
                _blas_saved = n  # restored when the single-threaded sections end
            else:
                blas.set_num_threads(n)
        if _pool is not None and _pool._max_workers != n:
            _pool.shutdown(wait=False)
            _pool = None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """numpy's BLAS runs single-threaded inside; restored when the last user leaves."""
    global _blas_users, _blas_saved
    blas = _numpy_blas()
    if blas is None:
        yield
        return
    with _lock:
        if _blas_users == 0:
            _blas_saved = blas.num_threads
            blas.set_num_threads(1)
        _blas_users += 1
    try:
        yield
    finally:
        with _lock:
            _blas_users -= 1
            if _blas_users == 0:
                blas.set_num_threads(_blas_saved)


def run_parallel(fn: Callable[[int, int], None], parts: int) -> None:
    """Call ``fn(part, parts)`` for ``part`` in ``range(parts)``, on up to
    ``get_num_threads()`` threads; exceptions propagate."""
    global _pool
    if parts <= 1:
        fn(0, 1)
        return
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(get_num_threads(), thread_name_prefix="convengine")
        pool = _pool
    futures = [pool.submit(fn, p, parts) for p in range(1, parts)]
    fn(0, parts)
    for f in futures:
        f.result()

