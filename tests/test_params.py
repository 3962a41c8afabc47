"""Tunable kernel parameters: labels, every variant against the float64 reference, and
the tuner's search of them (issue 46)."""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
import pytest

import convengine as ce
from convengine import params, registry
from convengine.errors import ConvSetupError
from convengine.problem import make_problem
from convengine.tune import bench, tuner
from oracle import assert_close, reference
from test_tune_helpers import fast_registry, problem


def test_label_and_parse_round_trip():
    assert params.label("blocked", {}) == "blocked"
    text = params.label("blocked", {"tasks": 4, "nvec": 2})
    assert text == "blocked[nvec=2,tasks=4]"
    assert params.parse(text) == ("blocked", {"nvec": 2, "tasks": 4})
    assert params.parse("winograd4") == ("winograd4", {})


@pytest.mark.parametrize("text", ["blocked[", "blocked[tasks]", "blocked[tasks=x]",
                                  "blocked[tasks=1,tasks=2]", "blocked[Tasks=1]", "[a=1]",
                                  "blocked[a=1]extra"])
def test_malformed_labels_are_refused(text):
    with pytest.raises(ValueError, match="label"):
        params.parse(text)


def test_check_names_the_bad_parameter():
    space = {"tasks": (8, 2, 4), "inside": (1, 0)}
    assert params.check(space, {"tasks": 4}) is None
    assert "unknown parameter 'depth'" in params.check(space, {"depth": 1})
    assert "tasks=3 not among (8, 2, 4)" in params.check(space, {"tasks": 3})
    assert params.value(space, {"tasks": 2}, "tasks") == 2
    assert params.value(space, None, "inside") == 1
    assert params.alternatives(space) == [("tasks", 2), ("tasks", 4), ("inside", 0)]


def test_a_variant_runs_with_its_parameters_and_names_them():
    seen = []

    def run(problem_, a, b, params=None):
        seen.append(params)
        return a

    algo = registry.Algorithm("knobbed", "forward", run, lambda p: None,
                              tunables=lambda p: {"split": (1, 2)})
    assert algo.variant({}) is algo
    chosen = algo.variant({"split": 2})
    assert chosen.label == "knobbed[split=2]" and chosen.name == "knobbed"
    chosen.run(problem(), np.zeros(1), np.zeros(1))
    assert seen == [{"split": 2}]
    plain = dataclasses.replace(algo, tunables=None)
    with pytest.raises(ValueError, match="no tunable parameters"):
        plain.variant({"split": 2})


# --------------------------------------------------------------------------- kernels


def _every_variant(algo_name: str, p) -> list[str]:
    """The label of every single-parameter variant of ``algo_name`` on problem p."""
    space = registry.get(algo_name, p.pass_).space(p)
    return [params.label(algo_name, {k: v}) for k, v in params.alternatives(space)]


def _operands(p, rng):
    return {
        "forward": (p.x_shape("NHWC"), p.w_shape("NHWC")),
        "backward_data": (p.y_shape("NHWC"), p.w_shape("NHWC")),
        "backward_weight": (p.x_shape("NHWC"), p.y_shape("NHWC")),
    }[p.pass_]


def _run(p, label, a, b, **conv):
    if p.pass_ == "forward":
        return ce.conv(a, b, algo=label, layout="NHWC", **conv)
    if p.pass_ == "backward_data":
        return ce.conv_backward_data(a, b, p.x_shape("NHWC"), algo=label, layout="NHWC", **conv)
    return ce.conv_backward_weight(a, b, p.w_shape("NHWC"), algo=label, layout="NHWC", **conv)


def _expected(p, a, b, **conv):
    shape = {"forward": None, "backward_data": p.x_shape("NHWC"),
             "backward_weight": p.w_shape("NHWC")}[p.pass_]
    return reference(p.pass_, a, b, shape, layout="NHWC", **conv)


@pytest.mark.parametrize(("x_shape", "w_shape", "conv"), [
    ((2, 14, 14, 32), (48, 1, 1, 32), {}),                       # 1x1
    ((2, 15, 15, 3), (64, 7, 7, 3), {"stride": 2, "padding": 3}),  # a stem
    ((1, 16, 16, 32), (96, 3, 3, 32), {"stride": 2, "padding": 1}),
])
def test_every_blocked_forward_variant_matches_the_reference(x_shape, w_shape, conv):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    p = make_problem("forward", x.shape, w.shape, dtype="float32", layout="NHWC", **conv)
    labels = _every_variant("blocked", p)
    assert {params.parse(lab)[1].popitem()[0] for lab in labels} >= {"nvec", "tasks", "inside"}
    expected = _expected(p, x, w, **conv)
    for label in labels:
        assert_close(_run(p, label, x, w, **conv), expected, "float32", label)


@pytest.mark.parametrize(("pass_", "x_shape", "w_shape"), [
    ("forward", (1, 7, 7, 256), (256, 1, 1, 256)),
    ("backward_data", (2, 5, 6, 256), (224, 3, 3, 256)),
])
def test_blocked_tasks_of_one_block_over_all_tiles_match_the_reference(pass_, x_shape,
                                                                        w_shape):
    """``by_block``: offered where the weights are not all read per tile and there are
    several blocks (256 KiB and more, above any L1d), and right for each of its values."""
    rng = np.random.default_rng(5)
    conv = {"padding": 1} if w_shape[1] == 3 else {}
    p = make_problem(pass_, x_shape, w_shape, dtype="float32", layout="NHWC", **conv)
    assert registry.get("blocked", pass_).space(p)["by_block"] == (0, 1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in _operands(p, rng))
    expected = _expected(p, a, b, **conv)
    for label in ("blocked[by_block=0]", "blocked[by_block=1]", "blocked[by_block=1,tasks=2]"):
        assert_close(_run(p, label, a, b, **conv), expected, "float32", label)


@pytest.mark.parametrize(("pass_", "x_shape", "w_shape", "conv", "expected_keys"), [
    ("backward_data", (2, 9, 10, 32), (48, 3, 3, 32), {"padding": 1},
     {"nvec", "tasks", "inside", "ahead"}),
    ("backward_data", (2, 14, 13, 32), (48, 3, 3, 32), {"stride": 2, "padding": 1},
     {"gather"}),  # by phases
    ("backward_weight", (2, 9, 10, 64), (48, 3, 3, 64), {"padding": 1},
     {"chunk_kib", "nvec"}),
    ("backward_weight", (2, 31, 31, 3), (64, 7, 7, 3), {"stride": 2, "padding": 3},
     {"chunk_kib", "nvec"}),  # the stem: blocks over a row's taps
])
def test_every_blocked_backward_variant_matches_the_reference(pass_, x_shape, w_shape, conv,
                                                              expected_keys):
    rng = np.random.default_rng(3)
    p = make_problem(pass_, x_shape, w_shape, dtype="float32", layout="NHWC", **conv)
    labels = _every_variant("blocked", p)
    assert {next(iter(params.parse(lab)[1])) for lab in labels} == expected_keys
    a, b = (rng.standard_normal(s).astype(np.float32) for s in _operands(p, rng))
    expected = _expected(p, a, b, **conv)
    for label in ["blocked", *labels]:
        assert_close(_run(p, label, a, b, **conv), expected, "float32", label)


@pytest.mark.parametrize("pass_", ["forward", "backward_data"])
@pytest.mark.parametrize("algo", ["winograd", "winograd4"])
def test_every_winograd_variant_matches_the_reference(pass_, algo):
    rng = np.random.default_rng(1)
    p = make_problem(pass_, (2, 20, 20, 32), (64, 3, 3, 32), dtype="float32", layout="NHWC",
                     padding=1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in _operands(p, rng))
    expected = _expected(p, a, b, padding=1)
    scale = float(np.abs(expected).max())
    for label in [algo, *_every_variant(algo, p)]:
        got = _run(p, label, a, b, padding=1)
        err = float(np.abs(got - expected).max()) / scale
        assert err < {"winograd": 2e-6, "winograd4": 2e-5}[algo], (label, err)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one thread: nothing to split")
@pytest.mark.parametrize("pass_", ["forward", "backward_data", "backward_weight"])
@pytest.mark.parametrize("stride", [1, 2])
def test_both_depthwise_serial_choices_match_the_reference(pass_, stride):
    rng = np.random.default_rng(2)
    conv = {"stride": stride, "padding": 1, "groups": 32}
    p = make_problem(pass_, (2, 12, 12, 32), (32, 3, 3, 1), dtype="float32", layout="NHWC",
                     **conv)
    previous = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        labels = _every_variant("direct", p)
        assert [params.parse(lab)[1] for lab in labels] in ([{"serial": 0}], [{"serial": 1}])
        a, b = (rng.standard_normal(s).astype(np.float32) for s in _operands(p, rng))
        expected = _expected(p, a, b, **conv)
        for label in ["direct", *labels]:
            assert_close(_run(p, label, a, b, **conv), expected, "float32", label)
    finally:
        numba.set_num_threads(previous)


@pytest.mark.parametrize(("label", "message"), [
    ("blocked[depth=2]", "unknown parameter 'depth'"),
    ("blocked[tasks=3]", "tasks=3 not among"),
    ("blocked[tasks=", "malformed"),
    ("im2col[tasks=4]", "unknown parameter 'tasks'"),
])
def test_a_bad_label_is_a_setup_error_naming_it(label, message):
    x = np.ones((1, 8, 8, 16), np.float32)
    w = np.ones((16, 1, 1, 16), np.float32)
    with pytest.raises(ConvSetupError, match=message):
        ce.conv(x, w, algo=label, layout="NHWC")


# --------------------------------------------------------------------------- the search


def _timed(median_s: float) -> dict:
    return {"median_s": median_s, "runs": 5, "eliminated": False, "spread": 0.02,
            "others_busy": 0.0}


@pytest.fixture
def knobbed(tmp_path, monkeypatch):
    """A private tuning cache, numpy-only candidates and "knobbed": im2col with a
    parameter ``split`` (1 default, 2, 4) that the fake benchmark times as
    ``timings`` says; the parameters each run received in ``seen``."""
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path / "cache"))
    table = fast_registry()["forward"]
    seen: list = []
    im2col = table["im2col"]

    def run(p, a, b, params=None):
        seen.append(params)
        return im2col.run(p, a, b)

    table["knobbed"] = dataclasses.replace(im2col, name="knobbed", run=run, prepare=None,
                                           tunables=lambda p: {"split": (1, 2, 4)})
    monkeypatch.setitem(registry._REGISTRY, "forward", table)
    monkeypatch.setattr(tuner, "heuristic", lambda p: table["knobbed"])
    timings = {"knobbed": 1.0e-3, "im2col": 2.0e-3, "knobbed[split=2]": 0.5e-3,
               "knobbed[split=4]": 0.97e-3}
    measured: list[list[str]] = []

    def fake(p, candidates, keep=None):
        measured.append([c.label for c in candidates])
        return {c.label: _timed(timings.get(c.label, 3e-3)) for c in candidates}

    monkeypatch.setattr(bench, "benchmark", fake)
    previous = ce.set_tuning("on")
    yield seen, timings, measured
    ce.set_tuning(previous)


def test_tune_searches_parameters_and_calls_get_the_winner(knobbed):
    seen, _, measured = knobbed
    p = problem()
    (result,) = tuner.tune([p])
    assert result.choice == "knobbed[split=2]" and result.why == "faster"
    assert measured[1] == ["knobbed", "knobbed[split=2]", "knobbed[split=4]"]
    assert measured[2] == ["knobbed", "knobbed[split=2]"]  # the win confirmed
    (entry,) = tuner.default_cache().entries()
    assert entry.choice == "knobbed[split=2]"
    chosen = tuner.choose(p)
    assert chosen.label == "knobbed[split=2]"
    x, w = (np.ones(s, np.float32) for s in (p.x_shape(), p.w_shape()))
    y = ce.conv(x, w, padding=1)
    assert seen[-1] == {"split": 2}
    assert_close(y, reference("forward", x, w, padding=1), "float32")


def test_a_parameter_within_the_margin_keeps_the_default(knobbed):
    _, timings, _ = knobbed
    timings["knobbed[split=2]"] = 0.95e-3  # 5% faster: under PARAM_MARGIN
    (result,) = tuner.tune([problem()])
    assert result.choice == "knobbed"


def test_a_parameter_win_that_does_not_reproduce_keeps_the_default(knobbed, monkeypatch):
    """The variant found is timed against the starting point once more; a win that
    does not come back (a noisy first comparison) is dropped."""
    _, timings, measured = knobbed
    fake = bench.benchmark

    def slower_when_confirmed(p, candidates, keep=None):
        if len(measured) == 2:  # algorithms, then split's values: now the confirmation
            timings["knobbed[split=2]"] = 0.98e-3  # no faster than the default after all
        return fake(p, candidates, keep)

    monkeypatch.setattr(bench, "benchmark", slower_when_confirmed)
    (result,) = tuner.tune([problem()])
    assert measured[-1] == ["knobbed", "knobbed[split=2]"]
    assert result.choice == "knobbed"
    (entry,) = tuner.default_cache().entries()
    assert entry.choice == "knobbed"


def test_first_call_tuning_times_algorithms_only_and_tune_searches_later(knobbed):
    _, _, measured = knobbed
    p = problem()
    assert tuner.choose(p).label == "knobbed"  # mode "on": the first call's tuning
    assert len(measured) == 1 and "knobbed[split=2]" not in measured[0]
    (result,) = tuner.tune([p])  # the cached algorithm, its parameters searched now
    assert result.choice == "knobbed[split=2]" and len(measured) == 3  # search, confirmation
    (again,) = tuner.tune([p])
    assert again.source == "cache" and len(measured) == 3


def test_a_stored_label_the_algorithm_no_longer_accepts_is_not_applied(knobbed):
    seen, _, _ = knobbed
    p = problem()
    tuner.tune([p])
    (entry,) = tuner.default_cache().entries()
    stale = dataclasses.replace(entry, choice="knobbed[split=3]", results={
        **entry.results, "knobbed[split=3]": _timed(0.1e-3)})
    tuner.default_cache().put([stale])
    assert tuner.choose(p).label == "knobbed[split=2]"  # the best label that still fits
    assert tuner.tuned_variant(p, registry.get("knobbed", "forward")).label == "knobbed"


def test_explain_names_the_tuned_parameters(knobbed):
    p = problem()
    tuner.tune([p])
    x, w = (np.ones(s, np.float32) for s in (p.x_shape(), p.w_shape()))
    shown = ce.explain(x, w, padding=1)
    assert shown.chosen == "knobbed" and "knobbed[split=2]" in shown.source


def test_a_graph_tuned_after_a_parameter_search_runs_its_algorithm(tmp_path, monkeypatch):
    """The graph engines take algorithms by name: a searched label in the cache
    counts for its algorithm."""
    from convengine.graph import recipes
    from convengine.graph.plan import PlanCache

    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path / "cache"))
    g, _ = recipes.conv_bias_act((2, 8, 16, 16), (8, 8, 3, 3), padding=1)
    real = tuner.tune_problem

    def searched(problem_, **kw):
        result = real(problem_, **kw)
        label = params.label("blocked", {"tasks": 2})
        return dataclasses.replace(result, results={label: _timed(1e-9), **result.results})

    monkeypatch.setattr(tuner, "tune_problem", searched)
    plan = g.build("tune", cache=PlanCache())
    assert "blocked" in plan.describe()


def test_warmup_tunes_algorithms_only_when_asked(knobbed):
    _, _, measured = knobbed
    p = problem()
    ce.warmup([p], tune=True, search=False, progress=False)
    assert len(measured) == 1  # the algorithms, as a first call (build-cache) times them
    ce.warmup([p], tune=True, progress=False)
    assert len(measured) == 3 and "knobbed[split=2]" in measured[1]  # search, confirmation
