"""The tuning cache and the ``convengine cache`` verbs on files convengine did not
write, read-only files, directories, flipped bytes and locks: convolutions keep
their results, every verb ends with a message (no traceback), ``clear`` leaves a
usable cache and removes the compiled kernels too."""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from pathlib import Path

import numpy as np
import pytest

import convengine as ce
from convengine import _kernel_cache, cli, registry
from convengine.tune import cache, tuner
from oracle import assert_close
from test_tune_helpers import fast_registry, operands, problem


@pytest.fixture(autouse=True)
def tuning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tuning on, a private cache directory, numpy-only candidates; restored after."""
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(_kernel_cache.KERNEL_DIR_VARIABLE, raising=False)
    for pass_, table in fast_registry().items():
        monkeypatch.setitem(registry._REGISTRY, pass_, table)
    previous = ce.set_tuning("on")
    yield tmp_path / "cache"
    ce.set_tuning(previous)


def _tuned_db() -> tuple[Path, np.ndarray, np.ndarray, np.ndarray]:
    """A cache file holding one tuned problem: (path, x, w, float64 reference y)."""
    p = problem()
    x, w = operands(p)
    ce.conv(x, w, padding=1)
    path = tuner.default_cache().path
    assert path is not None and path.exists()
    y64 = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1, algo="reference")
    return path, x, w, y64


def _fresh() -> cache.TuningCache:
    """The default cache, its memory dropped (read from the file again) and no failure."""
    c = tuner.default_cache()
    c.forget()
    c.failure, c._bad_rows = None, False
    return c


@pytest.mark.parametrize("results", ["[1, 2, 3]", "null", '{"im2col": {"median_s": "fast"}}',
                                     "not json"])
def test_rows_convengine_did_not_write_are_ignored_with_a_warning(
        results: str, capsys: pytest.CaptureFixture[str]) -> None:
    path, x, w, y64 = _tuned_db()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE tuning SET results=?", (results,))
    conn.close()
    _fresh()
    with pytest.warns(ce.TuningCacheWarning, match="did not write"):
        assert cli.main(["cache", "show"]) == 0
    assert "(no entries)" in capsys.readouterr().out
    _fresh()
    with pytest.warns(ce.TuningCacheWarning, match="did not write"):
        y = ce.conv(x, w, padding=1)  # tuned again, the row replaced
    assert_close(y, y64, "float32")
    assert [e.choice for e in _fresh().entries()] == [tuner.default_cache().entries()[0].choice]


def test_a_read_only_cache_is_read_and_left_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    path, x, w, y64 = _tuned_db()
    tuned = _fresh().entries()
    assert len(tuned) == 1
    before = path.read_bytes()
    real_access = os.access

    def no_writes(p: str, mode: int) -> bool:  # a read-only mount, even for root
        if mode & os.W_OK and str(p).startswith(str(path.parent)):
            return False
        return real_access(p, mode)

    monkeypatch.setattr(os, "access", no_writes)
    c = _fresh()
    assert c.read_only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c.entries() == tuned
        assert_close(ce.conv(x, w, padding=1), y64, "float32")
        ce.conv(*operands(problem(c=20)), padding=1)  # a new problem: tuned in memory
    assert c.failure is None
    assert path.read_bytes() == before
    assert len(c.entries()) == 2  # the new result, in memory


def _clear(capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(["cache", "clear"])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_clear_empties_both_caches(tuning: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tuned_db()
    kernels = _kernel_cache.kernel_dir()
    kernels.mkdir(parents=True)
    (kernels / "k_0.py").write_text("x = 1\n")
    assert cli.main(["cache", "show", "--json", "-"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["kernels"], shown["kernel_count"]) == (str(kernels), 1)
    status, out, _ = _clear(capsys)
    assert status == 0
    assert "removed 1 entries" in out and "removed 1 compiled kernels" in out
    assert not kernels.exists() and _fresh().entries() == []
    assert _clear(capsys)[:2] == (0, "removed 0 entries from "
                                     f"{tuner.default_cache().path}\nthe kernel cache is empty\n")


@pytest.mark.parametrize("damage", ["flipped bytes", "another database", "text"])
def test_clear_removes_a_file_that_is_not_a_usable_cache(
        damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    path, x, w, y64 = _tuned_db()
    if damage == "flipped bytes":
        data = bytearray(path.read_bytes())
        for i in range(100, len(data), 7):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "another database":
        path.unlink()
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE other (a)")
        conn.close()
    else:
        path.write_text("hello")
    status, out, err = _clear(capsys)
    assert status == 0 and "not a usable tuning database" in out, (out, err)
    assert not path.exists()
    _fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(ce.conv(x, w, padding=1), y64, "float32")  # tuned again, stored
    assert len(_fresh().entries()) == 1


def test_clear_reports_what_it_cannot_change(tuning: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tuner.default_cache().path
    assert path is not None
    path.mkdir(parents=True)  # a directory where the file should be
    status, _, err = _clear(capsys)
    assert status == 2 and "is a directory" in err and "Traceback" not in err
    path.rmdir()
    _tuned_db()
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        status, _, err = _clear(capsys)
    finally:
        lock.close()
    assert status == 2 and "cannot clear" in err and "locked" in err
    kernels = _kernel_cache.kernel_dir()
    kernels.parent.mkdir(parents=True, exist_ok=True)
    kernels.write_text("not a directory")
    status, out, err = _clear(capsys)
    assert status == 2 and "removed 1 entries" in out and "not a directory" in err
