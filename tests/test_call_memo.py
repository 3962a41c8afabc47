"""The steady-state memo of the public calls (api._CALLS): a repeated call skips
validation and resolution, every setting that can change ``auto``'s answer makes the
next call resolve afresh, and arguments that only compare equal (1 and True, 1 and
1.0) never share an entry."""

import contextlib

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


@contextlib.contextmanager
def _set(setter, value):
    """A process-wide setting changed inside, restored after."""
    previous = setter(value)
    try:
        yield
    finally:
        setter(previous)


@contextlib.contextmanager
def _other_thread_count():
    n = ce.get_num_threads()
    ce.set_num_threads(1 if n > 1 else 2)
    try:
        yield
    finally:
        ce.set_num_threads(n)


def _without(name):
    """The forward table without ``name``, swapped in for the test's duration."""
    table = {k: v for k, v in registry._REGISTRY["forward"].items() if k != name}
    return lambda mp, tmp: mp.setitem(registry._REGISTRY, "forward", table)


def _register_probe(mp, tmp):
    mp.setitem(registry._REGISTRY, "forward", dict(registry._REGISTRY["forward"]))
    registry.register("memo_probe", "forward", supports=lambda p: "never")(lambda p, a, b: a)


# each: (monkeypatch, tmp_path) -> a change that lasts for the test, or a context
# manager within which the change holds
CHANGES = {
    "env_tuning": lambda mp, tmp: mp.setenv("CONVENGINE_TUNING", "cache-only"),
    "env_inexact": lambda mp, tmp: mp.setenv("CONVENGINE_INEXACT", "off"),
    "env_cache_dir": lambda mp, tmp: mp.setenv("CONVENGINE_CACHE_DIR", str(tmp)),
    "set_tuning": lambda mp, tmp: _set(ce.set_tuning, "cache-only"),
    "allow_inexact": lambda mp, tmp: _set(ce.allow_inexact, False),
    "threads": lambda mp, tmp: _other_thread_count(),
    "register": _register_probe,
    "swap_table": _without("im2col"),  # (an equal copy would rightly keep the memo)
    "tuning_cache": lambda mp, tmp: tuner.default_cache().forget(),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_settings_changes_resolve_afresh(change, resolutions, monkeypatch, tmp_path):
    ce.conv(X, W, padding=1)
    ce.conv(X, W, padding=1)
    assert len(resolutions) == 1
    context = CHANGES[change](monkeypatch, tmp_path)
    with context if context is not None else contextlib.nullcontext():
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


@pytest.mark.slow
def test_a_remembered_depthwise_call_holds_the_plan_for_its_thread_count():
    """direct binds its depthwise plan to the remembered call; a new thread count makes
    a new entry with the plan for it (serial at 1 thread, two row blocks at 2)."""
    x = np.zeros((1, 56, 56, 144), np.float32)  # 4.1M multiply-adds: parallel at 2
    w = np.zeros((144, 3, 3, 1), np.float32)
    previous = ce.get_num_threads()
    api._CALLS.clear()
    try:
        for threads, parts in ((1, (1, 1)), (2, (2, 1)), (1, (1, 1))):
            ce.set_num_threads(threads)
            ce.conv(x, w, padding=1, groups=144, layout="NHWC")
            (entry,) = api._CALLS.values()
            problem, chosen, bound = entry[1:]
            assert chosen.name == "direct"
            assert bound.args[3:] == parts
            assert bound(x, w).shape == problem.y_shape("NHWC")
    finally:
        ce.set_num_threads(previous)


@pytest.mark.parametrize("pass_", ["forward", "backward_data"])
def test_a_remembered_blocked_call_follows_weights_changed_in_place(pass_):
    """blocked binds its kernel to the remembered call once (prepare); weights written
    in place between calls still give their own result, and the binding keeps no
    weights alive (only the weight cache does)."""
    import gc
    import weakref

    from convengine.algorithms.blocked import forward as blocked

    x = RNG.standard_normal((2, 7, 7, 16), dtype=np.float32)
    w = RNG.standard_normal((32, 3, 3, 16), dtype=np.float32)
    dy = RNG.standard_normal((2, 7, 7, 32), dtype=np.float32)
    kw = {"padding": 1, "layout": "NHWC", "algo": "blocked"}

    def call():
        if pass_ == "forward":
            return ce.conv(x, w, **kw), reference("forward", x, w, **kw)
        return (ce.conv_backward_data(dy, w, x.shape, **kw),
                reference("backward_data", dy, w, x.shape, **kw))

    api._CALLS.clear()
    for _ in range(3):
        got, want = call()
        assert_close(got, want, "float32")
        w *= -1.5  # in place: the same array object, other bits
    (entry,) = [e for e in api._CALLS.values() if e[2].name == "blocked"]
    assert entry[1].pass_ == pass_
    blocked.PACKED.clear()
    call()
    packed = [weakref.ref(u) for _, u, _ in
              (item for items in blocked.PACKED.entries.values() for item in items)]
    assert packed
    blocked.PACKED.clear()
    gc.collect()
    assert all(ref() is None for ref in packed)
