"""How convengine shares the cores: one OpenMP pool, BLAS kept single-threaded.

In one process three thread pools can meet: numba's OpenMP pool, numpy's OpenBLAS
pool and PyTorch's libgomp. Each busy-waits after its work (measured here: libgomp
about 3.5 ms of CPU after every parallel region, OpenBLAS about 36 ms after every
multi-threaded GEMM), so on a small host two pools spinning at each other slow both
severalfold. convengine therefore, with no variable for the user to export:

- runs its compiled kernels on **one OpenMP runtime**. Where PyTorch is installed,
  convengine loads PyTorch's own libgomp (without importing torch, into the global
  symbol scope) before numba starts its OpenMP layer; numba's layer then binds its
  OpenMP calls to that runtime, so convengine's kernels and PyTorch's ops share one
  team of threads (the threads a PyTorch op leaves spinning pick up the next
  convengine kernel, and the other way round) and PyTorch keeps its defaults. Without
  PyTorch, numba's layer loads the system libgomp with ``OMP_WAIT_POLICY=PASSIVE``
  set for that load only (the environment is restored at once): nothing else shares
  that runtime, so its threads sleep as soon as a kernel ends;
- never runs numpy's BLAS multi-threaded, so OpenBLAS's workers are never woken:
  a GEMM (:func:`matmul`) runs through ``torch.mm`` on that same pool where the
  process has imported PyTorch, else single-threaded BLAS on convengine's threads
  (numpy's OpenBLAS serialises concurrent calls, so most of the speed is in
  ``blocked``'s own kernel);
- after ``fork()`` (multiprocessing, DataLoader workers, Dask's process scheduler),
  runs the child's kernels on one thread: GNU OpenMP cannot restart its pool in a
  forked child, and numba would stop such a child. Processes are the parallelism there.

A user who set ``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT`` or ``NUMBA_THREADING_LAYER``
keeps that choice; ``CONVENGINE_OMP_SPIN=n`` (no PyTorch) lets convengine's threads
spin ``n`` times (libgomp's count) before they sleep. ``set_num_threads(n)`` sets
convengine's thread count (numba's kernels and the GEMM splits); it leaves numpy's
own BLAS setting alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numba
import numpy as np
from threadpoolctl import ThreadpoolController

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_blas: Any = None  # numpy's OpenBLAS controller, found once
_blas_users = 0  # calls currently inside single_threaded_blas
_blas_saved = 1
_forked_omp = False  # a forked child of a process whose OpenMP pool had started

#: how many times convengine's OpenMP threads spin before sleeping (0: passive)
SPIN_ENV = "CONVENGINE_OMP_SPIN"
#: rows x columns x depth below which a GEMM is not split over threads
MATMUL_SPLIT_FLOPS = 1 << 21

# ------------------------------------------------------------------ numba's pool


def _preload_torch_openmp() -> None:
    """Load PyTorch's own libgomp (without importing torch) if torch is installed.

    Into the global symbol scope: numba's OpenMP layer, loaded next, resolves its
    OpenMP calls there first, so both libraries share PyTorch's runtime. (Else numba
    would load the system ``libgomp.so.1.0.0``, and a later ``import torch`` would bind
    to that copy, same soname, with the passive policy set for it.)"""
    if any("libgomp" in line for line in _mapped_files()):
        return
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libgomp.so.1"
    if lib.is_file():
        with contextlib.suppress(OSError):
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


def _mapped_files() -> list[str]:
    try:
        return Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []


def _start_numba_pool() -> None:
    """Start numba's threading layer, OpenMP first, its runtime waiting passively."""
    from numba.np.ufunc import parallel

    if parallel._is_initialized:  # the user's own numba code started it: keep it
        return
    user_env = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ)
    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]  # type: ignore[attr-defined]
    _preload_torch_openmp()
    if not parallel._backend_init_process_lock:
        # numba would make one through multiprocessing.get_start_method(), which fixes
        # the start method: the user's set_start_method("spawn") would then fail
        parallel._backend_init_process_lock = threading.RLock()  # type: ignore[assignment]
    if user_env:
        parallel._launch_threads()
        return
    name, value = _wait_setting()
    os.environ[name] = value  # read once, by the runtime loaded now
    try:
        parallel._launch_threads()
    finally:
        del os.environ[name]


def _wait_setting() -> tuple[str, str]:
    """How convengine's OpenMP threads wait: ``$CONVENGINE_OMP_SPIN`` spins of libgomp
    (``GOMP_SPINCOUNT``) before sleeping, default 0: passive."""
    spins = os.environ.get(SPIN_ENV, "0").strip()
    if not spins.isdigit():
        raise ValueError(f"${SPIN_ENV} must be a non-negative integer, got {spins!r}")
    return ("OMP_WAIT_POLICY", "PASSIVE") if int(spins) == 0 else ("GOMP_SPINCOUNT", spins)


def _after_fork_in_child() -> None:
    """Make convengine usable in a forked child (see the module docstring)."""
    global _pool, _lock, _blas_users, _forked_omp
    _lock = threading.Lock()
    _pool = None  # its threads did not survive the fork
    _blas_users = 0
    from numba.np.ufunc import parallel

    if not parallel._is_initialized or numba.threading_layer() != "omp":
        return
    from numba.np.ufunc import omppool  # type: ignore[attr-defined]

    if getattr(omppool, "openmp_vendor", "") != "GNU":
        return
    # numba's launch_threads records the pid whose children it refuses: ours now;
    # with one thread, GNU OpenMP never touches the pool the fork left behind.
    ctypes.CFUNCTYPE(None, ctypes.c_int)(omppool.launch_threads)(1)
    numba.set_num_threads(1)
    _forked_omp = True


_start_numba_pool()
os.register_at_fork(after_in_child=_after_fork_in_child)
_layer_num_threads: Callable[[], int] = numba.np.ufunc.parallel._get_num_threads  # type: ignore[attr-defined]


def get_num_threads() -> int:
    """The number of threads convengine's kernels use (numba's setting, which is per
    Python thread): the threading layer's own C function, called directly (about a
    microsecond; ``numba.get_num_threads()`` takes two locks, 25-30 us with cold caches,
    and a compiled wrapper cannot be cached, so it compiled again in every process)."""
    return _layer_num_threads()


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in convengine's kernels and GEMMs (ValueError if ``n`` < 1 or
    above numba's ``NUMBA_NUM_THREADS`` launch limit). In a forked child of a process
    that ran OpenMP kernels, the compiled kernels stay on one thread."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {n!r}")
    limit = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    if not 1 <= n <= limit:
        raise ValueError(f"n must be between 1 and NUMBA_NUM_THREADS={limit}, got {n}")
    global _pool
    numba.set_num_threads(1 if _forked_omp else n)
    with _lock:
        if _pool is not None and _pool._max_workers != n:
            _pool.shutdown(wait=False)
            _pool = None


# ------------------------------------------------------------------ after idle

#: seconds of idle after which :func:`wake_after_idle` wakes the other cores first
IDLE_WAKE_S = 0.02
_last_active = 0.0


def wake_after_idle() -> None:
    """Before a burst of parallel kernels (an ONNX session's run): when convengine's
    last burst ended :data:`IDLE_WAKE_S` or more ago, start and join a trivial Python
    thread, so that the idle cores are running before the first parallel region.

    Measured on a 2-vCPU firecracker VM (AMD EPYC): after 30 ms or more of idle the
    first OpenMP region took 3-6 ms instead of 0.03-0.2 (its caller spins at the
    region's end for a worker whose vCPU does not run meanwhile; docs/interop.md);
    started behind this wake-up, which blocks rather than spins, 0.3-0.7 ms in all.
    Nothing is done with one thread, or within :data:`IDLE_WAKE_S` of the last burst."""
    if time.monotonic() - _last_active < IDLE_WAKE_S or get_num_threads() == 1:
        return
    waker = threading.Thread(target=_nothing, name="convengine-wake", daemon=True)
    try:
        waker.start()
    except RuntimeError:  # no new threads (interpreter shutdown, a thread limit): go on
        return
    waker.join()


def note_active() -> None:
    """Mark the end of a burst of kernels (see :func:`wake_after_idle`)."""
    global _last_active
    _last_active = time.monotonic()


def _nothing() -> None:
    pass


# ------------------------------------------------------------------ BLAS


def _numpy_blas() -> Any:
    """threadpoolctl's controller of the BLAS numpy links (None if not found)."""
    global _blas
    if _blas is None:
        found = ThreadpoolController().select(user_api="blas").lib_controllers
        numpy_libs = [c for c in found if "numpy" in c.filepath] or found
        _blas = numpy_libs[0] if numpy_libs else False
    return _blas or None


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
            if _blas_saved != 1:
                blas.set_num_threads(1)
        _blas_users += 1
    try:
        yield
    finally:
        with _lock:
            _blas_users -= 1
            if _blas_users == 0 and _blas_saved != 1:
                blas.set_num_threads(_blas_saved)


def run_parallel(fn: Callable[[int, int], None], parts: int) -> None:
    """Call ``fn(part, parts)`` for ``part`` in ``range(parts)``, on up to
    ``get_num_threads()`` threads (the caller runs part 0); exceptions propagate."""
    global _pool
    if parts <= 1:
        fn(0, 1)
        return
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(get_num_threads(), thread_name_prefix="convengine")
        pool = _pool
    futures = [pool.submit(fn, p, parts) for p in range(1, parts)]
    try:
        fn(0, parts)
    finally:
        for f in futures:
            f.result()


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a (M, K) @ b (K, N)`` into ``out (M, N)`` (allocated if None), without waking
    OpenBLAS's own pool: in a process that has imported PyTorch, by ``torch.mm`` on
    PyTorch's pool (the one its own ops keep warm), else by single-threaded BLAS on
    blocks of rows handed out to convengine's threads as each finishes its last."""
    m, n = a.shape[0], b.shape[1]
    if out is None:
        out = np.empty((m, n), np.result_type(a, b))
    torch = sys.modules.get("torch")
    if torch is not None and _torch_mm(torch, a, b, out):
        return out
    parts = min(get_num_threads(), max(1, m * n * a.shape[1] // MATMUL_SPLIT_FLOPS), -(-m // 8))
    with single_threaded_blas():
        if parts <= 1:
            np.matmul(a, b, out=out)
            return out
        step = (-(-m // (4 * parts)) + 7) // 8 * 8  # rows per block, a multiple of 8
        blocks = itertools.count()  # next() is atomic under the GIL

        def work(part: int, parts: int) -> None:
            while (start := next(blocks) * step) < m:
                rows = slice(start, min(m, start + step))
                np.matmul(a[rows], b, out=out[rows])

        run_parallel(work, parts)
    return out


def _torch_mm(torch: Any, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """``out = a @ b`` by torch.mm on views of the arrays; False where it cannot
    (dtypes other than float32/float64, read-only or oddly strided operands)."""
    if not (a.dtype == b.dtype == out.dtype and a.dtype in _TORCH_MM_DTYPES):
        return False
    if not (a.flags.writeable and b.flags.writeable and out.flags.c_contiguous):
        return False
    try:
        torch.mm(torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))
    except (RuntimeError, ValueError, TypeError):  # strides torch does not take
        return False
    return True


_TORCH_MM_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
