"""convengine's use of the cores: its thread count, BLAS kept single-threaded, a
passive OpenMP pool, concurrent Python threads and forked children."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

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


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=env)


def test_set_num_threads_sets_numba_and_leaves_numpy_blas(restore_threads) -> None:
    with threadpool_limits(limits=2, user_api="blas"):
        blas_before = _numpy_blas_threads()
        ce.set_num_threads(1)
        assert numba.get_num_threads() == 1 == ce.get_num_threads()
        n = min(2, numba.config.NUMBA_NUM_THREADS)
        ce.set_num_threads(n)
        assert numba.get_num_threads() == n
        assert _numpy_blas_threads() == blas_before


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (10**6, ValueError),
                                              (1.5, TypeError), (True, TypeError)])
def test_set_num_threads_rejects(value, error) -> None:
    with pytest.raises(error, match="n must be"):
        ce.set_num_threads(value)


def test_single_threaded_blas_nests_and_restores() -> None:
    with threadpool_limits(limits=2, user_api="blas"):
        with threads.single_threaded_blas():
            assert _numpy_blas_threads() == 1
            with threads.single_threaded_blas():
                assert _numpy_blas_threads() == 1
            assert _numpy_blas_threads() == 1
        assert _numpy_blas_threads() == 2


@pytest.mark.parametrize("through", ["torch", "numpy"])
@pytest.mark.parametrize(("m", "k", "n", "transposed"),
                         [(1, 3, 5, False), (300, 64, 72, False), (37, 300, 600, True),
                          (1000, 256, 64, False), (64, 4096, 9, True)])
def test_matmul_matches_float64(restore_threads, monkeypatch, through, m, k, n,
                                transposed) -> None:
    """Through PyTorch's pool where torch is imported, else numpy's BLAS on
    convengine's threads; either way numpy's BLAS setting is left as it was."""
    if through == "torch":
        pytest.importorskip("torch")
    else:
        monkeypatch.setitem(sys.modules, "torch", None)  # as if PyTorch were not imported
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((k, m) if transposed else (m, k)).astype(np.float32)
    a = a.T if transposed else a
    b = rng.standard_normal((k, n)).astype(np.float32)
    ce.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    with threadpool_limits(limits=2, user_api="blas"):
        out = np.full((m, n), np.nan, np.float32)
        got = threads.matmul(a, b, out=out)
        assert got is out
        assert _numpy_blas_threads() == 2  # restored after the call
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    np.testing.assert_allclose(threads.matmul(a, b), got, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


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
        out[n] = [ce.conv(x, w, padding=1, algo=a) for a in ("direct", "winograd", "im2col")]
    first, *rest = out.values()
    for other in rest:
        for a, b in zip(first, other, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_python_threads_call_at_once() -> None:
    """Eight Python threads, every pass and several algorithms, against float64."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 16, 10, 10)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    w1 = rng.standard_normal((24, 16, 1, 1)).astype(np.float32)
    ref = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1, algo="reference")
    ref1 = ce.conv(x.astype(np.float64), w1.astype(np.float64), algo="reference")
    ref_dw = ce.conv_backward_weight(x.astype(np.float64), ref, w.shape, padding=1, algo="reference")
    calls = [
        (lambda: ce.conv(x, w, padding=1, algo="direct"), ref),
        (lambda: ce.conv(x, w, padding=1, algo="winograd"), ref),
        (lambda: ce.conv(x, w, padding=1, algo="im2col"), ref),
        (lambda: ce.conv(x, w1, algo="1x1"), ref1),
        (lambda: ce.conv_backward_weight(x, ref.astype(np.float32), w.shape, padding=1,
                                         algo="direct"), ref_dw),
    ]
    errors: list[str] = []

    def worker(i: int) -> None:
        try:
            for j in range(6):
                fn, expected = calls[(i + j) % len(calls)]
                got = fn()
                scale = np.abs(expected).max()
                if not np.allclose(got, expected, rtol=1e-4, atol=1e-4 * scale):
                    errors.append(f"thread {i} call {j}: max error {np.abs(got - expected).max()}")
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(f"thread {i}: {e!r}")

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in pool), "a thread hung"
    assert errors == []


@pytest.mark.slow
def test_numba_pool_waits_passively_and_env_is_restored() -> None:
    """The system libgomp numba loads was loaded with OMP_WAIT_POLICY=PASSIVE (it runs
    convengine's kernels where PyTorch is absent), the variable did not stay in the
    environment, and PyTorch (if present) has its own libgomp loaded too."""
    done = _run("""
        import ctypes, os
        import numpy as np
        import convengine as ce
        import numba
        x = np.ones((1, 4, 6, 6), np.float32)
        ce.conv(x, np.ones((4, 4, 3, 3), np.float32), algo="direct")
        print("layer", numba.threading_layer())
        print("env", "OMP_WAIT_POLICY" in os.environ)
        ctypes.CDLL("libgomp.so.1.0.0").omp_display_env(0)
        try:
            import torch
        except ImportError:
            print("gomps skip")
        else:
            maps = {l.split()[-1] for l in open("/proc/self/maps") if "libgomp" in l}
            print("gomps", len(maps))
    """)
    assert done.returncode == 0, done.stderr
    assert "layer omp" in done.stdout
    assert "env False" in done.stdout
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in done.stderr
    assert "gomps 2" in done.stdout or "gomps skip" in done.stdout


def test_user_wait_policy_is_kept() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import ctypes, numpy as np, convengine as ce;"
         "ce.conv(np.ones((1,4,6,6),np.float32), np.ones((4,4,3,3),np.float32), algo='direct');"
         "ctypes.CDLL('libgomp.so.1.0.0').omp_display_env(0)"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_WAIT_POLICY": "ACTIVE"})
    assert done.returncode == 0, done.stderr
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in done.stderr


@pytest.mark.slow
def test_forked_children_can_convolve() -> None:
    """multiprocessing's fork start after kernels ran: the children convolve (one
    thread each) and Pool.map returns instead of hanging."""
    done = _run("""
        import multiprocessing as mp
        import numpy as np
        import convengine as ce
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
        w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
        ref = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1, algo="reference")
        ce.conv(x, w, padding=1, algo="direct")  # the parent's OpenMP pool starts

        def job(algo):
            y = ce.conv(x, w, padding=1, algo=algo)
            return float(np.abs(y - ref).max() / np.abs(ref).max()), ce.get_num_threads()

        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as pool:
                for err, n in pool.map(job, ["direct", "im2col", "winograd", "direct"]):
                    assert err < 1e-5, err
                    assert n == 1, n
            print("ok")
    """)
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout


@pytest.mark.parametrize(("value", "expected"), [("20000", "GOMP_SPINCOUNT = '20000'"),
                                                 ("many", "CONVENGINE_OMP_SPIN must be")])
def test_spin_setting(value, expected) -> None:
    """CONVENGINE_OMP_SPIN: convengine's threads alone spin that long; a bad value is
    named at import."""
    done = subprocess.run(
        [sys.executable, "-c", "import ctypes, numpy as np, convengine as ce;"
         "ce.conv(np.ones((1,4,6,6),np.float32), np.ones((4,4,3,3),np.float32), algo='direct');"
         "ctypes.CDLL('libgomp.so.1.0.0').omp_display_env(1)"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "CONVENGINE_OMP_SPIN": value})
    assert expected in done.stderr
    assert (done.returncode == 0) == value.isdigit()


@pytest.mark.slow
def test_kernels_share_pytorchs_openmp_threads() -> None:
    """Where PyTorch is present, convengine's kernels run on PyTorch's own OpenMP
    threads: the worker that did PyTorch's parallel work does convengine's too."""
    pytest.importorskip("torch")
    done = _run("""
        import os, threading
        import numpy as np
        import torch
        import convengine as ce
        torch.set_num_threads(2)
        ce.set_num_threads(2)
        main = threading.get_native_id()

        def cpu_ns():
            out = {}
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/schedstat") as fh:
                    out[int(tid)] = int(fh.read().split()[0])
            return out

        def workers(fn):
            # the threads besides this one that worked 20 ms or more in fn()
            fn()  # warm-up
            before = cpu_ns()
            fn()
            after = cpu_ns()
            return {t for t in after if t != main and after[t] - before.get(t, 0) > 20e6}

        a = torch.randn(1000, 1000)
        x = np.random.rand(8, 64, 64, 64).astype(np.float32)
        w = np.random.rand(64, 64, 3, 3).astype(np.float32)
        ce.conv(x, w, padding=1, algo="direct")
        theirs = workers(lambda: [torch.mm(a, a) for _ in range(20)])
        ours = workers(lambda: [ce.conv(x, w, padding=1, algo="direct") for _ in range(5)])
        assert theirs and ours and ours <= theirs, (theirs, ours)
    """)
    assert done.returncode == 0, done.stdout + done.stderr


def test_wake_after_idle_wakes_the_cores_only_after_idle(restore_threads, monkeypatch) -> None:
    """A wake-up thread runs (and is joined) only when the last burst of kernels ended
    IDLE_WAKE_S or more ago and kernels use more than one thread."""
    woken: list[str] = []
    monkeypatch.setattr(threads, "_nothing",
                        lambda: woken.append(threading.current_thread().name))
    ce.set_num_threads(2)
    threads.note_active()
    threads.wake_after_idle()
    assert woken == []  # just active
    monkeypatch.setattr(threads, "_last_active", threads._last_active - 2 * threads.IDLE_WAKE_S)
    threads.wake_after_idle()
    assert woken == ["convengine-wake"]  # joined before returning
    ce.set_num_threads(1)
    threads.wake_after_idle()
    assert woken == ["convengine-wake"]  # one thread: nothing to wake


def test_onnx_session_run_marks_its_burst(monkeypatch) -> None:
    """Session.run wakes the cores first (after idle) and notes its end as activity."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    import convengine.onnx as ceo

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    session = ceo.Session(helper.make_model(graph))
    calls: list[str] = []
    monkeypatch.setattr("convengine.onnx.session.wake_after_idle",
                        lambda: calls.append("wake"))
    before = threads._last_active
    (y,) = session.run(None, {"x": -np.ones((2, 3), np.float32)})
    assert calls == ["wake"] and threads._last_active > before
    assert not y.any()


def test_wake_after_idle_goes_on_when_no_thread_can_start(restore_threads, monkeypatch) -> None:
    """At interpreter shutdown (or a thread limit) Thread.start raises: the kernels run
    without the wake-up."""
    def refuse(self) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    ce.set_num_threads(2)
    monkeypatch.setattr(threads, "_last_active", 0.0)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    threads.wake_after_idle()  # no error
