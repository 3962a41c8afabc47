"""The steady-state memo of the public calls (api._CALLS): a repeated call skips
validation and resolution, every setting that can change ``auto``'s answer makes the
next call resolve afresh, and arguments that only compare equal (1 and True, 1 and
1.0) never share an entry."""

import numpy as np
import pytest

import convengine as ce
from convengine import api, environment, registry, select
from convengine.errors import ConvSetupError
from convengine.tune import tuner
from oracle import assert_close, reference

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 4, 9, 9), dtype=np.float32)
W = RNG.standard_normal((6, 4, 3, 3), dtype=np.float32)


@pytest.fixture
def resolutions(monkeypatch):
    """The problems select.resolve was asked about, in order."""
    asked = []
    real = select.resolve

    def spy(problem, algo="auto"):
        asked.append((problem.pass_, algo))
        return real(problem, algo)

    monkeypatch.setattr(select, "resolve", spy)
    api._CALLS.clear()
    return asked


def test_repeated_calls_resolve_once(resolutions):
    dy = RNG.standard_normal((2, 6, 9, 9), dtype=np.float32)
    first = [ce.conv(X, W, padding=1), ce.conv_backward_data(dy, W, X.shape, padding=1),
             ce.conv_backward_weight(X, dy, W.shape, padding=1),
             ce.conv_transpose(dy, W, padding=1)]
    again = [ce.conv(X, W, padding=1), ce.conv_backward_data(dy, W, X.shape, padding=1),
             ce.conv_backward_weight(X, dy, W.shape, padding=1),
             ce.conv_transpose(dy, W, padding=1)]
    assert [p for p, _ in resolutions] == [
        "forward", "backward_data", "backward_weight", "backward_data"]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert_close(first[0], reference("forward", X, W, padding=1), "float32")


@pytest.mark.parametrize("change", [
    "env_tuning", "env_inexact", "env_cache_dir", "set_tuning", "allow_inexact", "threads",
    "register", "swap_table", "tuning_cache",
])
def test_settings_changes_resolve_afresh(change, resolutions, monkeypatch, tmp_path):
    ce.conv(X, W, padding=1)
    ce.conv(X, W, padding=1)
    assert len(resolutions) == 1
    if change == "env_tuning":
        monkeypatch.setenv("CONVENGINE_TUNING", "cache-only")
    elif change == "env_inexact":
        monkeypatch.setenv("CONVENGINE_INEXACT", "off")
    elif change == "env_cache_dir":
        monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    elif change == "set_tuning":
        previous = ce.set_tuning("cache-only")
        try:
            ce.conv(X, W, padding=1)
        finally:
            ce.set_tuning(previous)
        assert len(resolutions) == 2
        return
    elif change == "allow_inexact":
        previous = ce.allow_inexact(False)
        try:
            ce.conv(X, W, padding=1)
        finally:
            ce.allow_inexact(previous)
        assert len(resolutions) == 2
        return
    elif change == "threads":
        n = ce.get_num_threads()
        ce.set_num_threads(1 if n > 1 else 2)
        try:
            ce.conv(X, W, padding=1)
        finally:
            ce.set_num_threads(n)
        assert len(resolutions) == 2
        return
    elif change == "register":
        monkeypatch.setitem(registry._REGISTRY, "forward", dict(registry._REGISTRY["forward"]))
        registry.register("memo_probe", "forward", supports=lambda p: "never")(lambda p, a, b: a)
    elif change == "swap_table":  # (an equal copy would rightly keep the memo)
        table = {k: v for k, v in registry._REGISTRY["forward"].items() if k != "im2col"}
        monkeypatch.setitem(registry._REGISTRY, "forward", table)
    elif change == "tuning_cache":
        tuner.default_cache().forget()
    ce.conv(X, W, padding=1)
    assert len(resolutions) == 2


def test_forced_algorithm_removed_from_registry_is_refused(monkeypatch):
    ce.conv(X, W, padding=1, algo="direct")
    table = {k: v for k, v in registry._REGISTRY["forward"].items() if k != "direct"}
    monkeypatch.setitem(registry._REGISTRY, "forward", table)
    with pytest.raises(ConvSetupError, match="direct"):
        ce.conv(X, W, padding=1, algo="direct")


@pytest.mark.parametrize("name, good, bad", [
    ("stride", 1, True), ("dilation", 1, True), ("groups", 1, True), ("padding", 1, 1.0),
    ("padding", (1, 1), (1, True)),
])
def test_equal_but_invalid_arguments_are_not_served_from_the_memo(name, good, bad):
    ce.conv(X, W, **{name: good})
    with pytest.raises((TypeError, ConvSetupError)):
        ce.conv(X, W, **{name: bad})


def test_unhashable_arguments_still_work_without_the_memo(resolutions):
    y = ce.conv(X, W, padding=[[1, 1], [1, 1]])
    y2 = ce.conv(X, W, padding=[[1, 1], [1, 1]])  # lists of lists: hashed as tuples
    np.testing.assert_array_equal(y, y2)
    bad = np.array([1, 1])  # an array as padding is unhashable: validated every call
    with pytest.raises((TypeError, ConvSetupError)):
        ce.conv(X, W, padding=bad)


def test_dtype_and_bias_are_part_of_the_key():
    y32 = ce.conv(X, W, padding=1)
    y64 = ce.conv(X.astype(np.float64), W.astype(np.float64), padding=1)
    assert y32.dtype == np.float32 and y64.dtype == np.float64
    b = RNG.standard_normal(6, dtype=np.float32)
    yb = ce.conv(X, W, b, padding=1)
    assert_close(yb, reference("forward", X, W, b, padding=1), "float32")
    with pytest.raises((ValueError, ConvSetupError), match="bias"):
        ce.conv(X, W, np.ones(5, np.float32), padding=1)


def test_environment_reads_follow_os_environ(monkeypatch):
    monkeypatch.setenv("CONVENGINE_INEXACT", "off")
    assert environment.get("CONVENGINE_INEXACT", "on") == "off"
    before = environment.snapshot()
    monkeypatch.setenv("CONVENGINE_INEXACT", "on")
    assert environment.get("CONVENGINE_INEXACT", "x") == "on"
    assert environment.snapshot() != before
    monkeypatch.delenv("CONVENGINE_INEXACT")
    assert environment.get("CONVENGINE_INEXACT", "default") == "default"
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", "/tmp/caf\u00e9")
    assert environment.get("CONVENGINE_CACHE_DIR", "") == "/tmp/caf\u00e9"
