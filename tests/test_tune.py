"""The tuner in one process: keys, modes, choice, failure handling, the cache file."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import warnings

import numpy as np
import pytest

import convengine as ce
from convengine import registry, select
from convengine.errors import ConvSetupError
from convengine.tune import bench, cache, keys, transfer, tuner
from convengine.tune.keys import bucket, tuning_key
from oracle import assert_close
from test_tune_helpers import fast_registry, operands, problem


@pytest.fixture(autouse=True)
def tuning(tmp_path, monkeypatch):
    """Tuning on, a private cache directory, numpy-only candidates; restored after."""
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path / "cache"))
    # store whatever the host measures: these tests are about the cache, not the host
    monkeypatch.setattr(bench, "QUIET", float("inf"))
    monkeypatch.setattr(bench, "BUSY", float("inf"))
    for pass_, table in fast_registry().items():
        monkeypatch.setitem(registry._REGISTRY, pass_, table)
    previous = ce.set_tuning("on")
    yield tmp_path / "cache"
    ce.set_tuning(previous)


@pytest.fixture
def count_benchmarks(monkeypatch):
    """Counts calls of the benchmark loop (still runs it)."""
    calls = []
    real = bench.benchmark

    def counting(p, candidates, keep=None):
        calls.append(p)
        return real(p, candidates, keep)

    monkeypatch.setattr(bench, "benchmark", counting)
    return calls


@pytest.fixture
def no_benchmark(monkeypatch):
    def refuse(p, candidates, keep=None):
        raise AssertionError("benchmarked although it must not")

    monkeypatch.setattr(bench, "benchmark", refuse)


def expected_conv(x, w, **kw):
    return ce.conv(x.astype(np.float64), w.astype(np.float64), algo="reference", **kw)


def tuning_warnings(record):
    return [w for w in record if issubclass(w.category, ce.TuningCacheWarning)]


# --------------------------------------------------------------------------- keys


def test_bucket_rounds_up_to_powers_of_two():
    assert [bucket(n) for n in (0, 1, 2, 3, 5, 56, 64, 65, 1000)] == [
        0, 1, 2, 4, 8, 64, 64, 128, 1024]


def test_key_buckets_sizes_and_keeps_geometry_exact():
    base = tuning_key(problem(batch=3, c=6, o=5, size=7))
    assert tuning_key(problem(batch=4, c=8, o=8, size=8)) == base
    assert (base.batch, base.in_channels, base.out_channels, base.in_size) == (4, 8, 8, (8, 8))
    different = {
        "kernel": problem(k=5, padding=1),
        "stride": problem(stride=2),
        "padding": problem(padding=0),
        "dilation": problem(dilation=2),
        "groups": problem(c=6, o=6, groups=2),
        "pass": problem("backward_data"),
        "layout": dataclasses.replace(problem(), layout="NHWC"),
        "dtype": dataclasses.replace(problem(), dtype="float64"),
        "bias": dataclasses.replace(problem(), has_bias=True),
        "batch bucket": problem(batch=5),
    }
    for what, p in different.items():
        assert tuning_key(p) != tuning_key(problem()), what


def test_results_are_invalidated_by_version_code_host_threads_and_candidate_set(monkeypatch,
                                                                  count_benchmarks):
    p = problem()
    tuner.choose(p)
    tuner.choose(p)
    assert len(count_benchmarks) == 1
    monkeypatch.setattr(keys, "__version__", "999.0")
    tuner.choose(p)
    assert len(count_benchmarks) == 2
    monkeypatch.setattr(keys, "code_digest", lambda: "changed kernels")
    tuner.choose(p)
    assert len(count_benchmarks) == 3
    monkeypatch.setattr(keys, "host_signature", lambda: "another machine")
    tuner.choose(p)
    assert len(count_benchmarks) == 4
    monkeypatch.setattr(tuner.threads, "get_num_threads", lambda: 17)
    assert tuner.ident(p)[0].endswith(" T17")
    tuner.choose(p)
    assert len(count_benchmarks) == 5
    new = dict(registry._REGISTRY["forward"])
    new["im2col_again"] = dataclasses.replace(new["im2col"], name="im2col_again")
    monkeypatch.setitem(registry._REGISTRY, "forward", new)
    tuner.choose(p)
    assert len(count_benchmarks) == 6


def test_host_signature_names_cpu_and_cores():
    sig = keys.host_signature()
    assert "cores" in sig and sig.count("|") == 3


# --------------------------------------------------------------------------- choice


def test_rank_prefers_more_accurate_within_the_tie_band_and_skips_failures():
    results = {
        "fast_rough": {"median_s": 1.00},
        "exact": {"median_s": 1.03},
        "slow": {"median_s": 2.0},
        "broken": {"error": "RuntimeError: no"},
    }
    accuracy = {"fast_rough": 0, "exact": 2, "slow": 5, "broken": 9}
    assert bench.rank(results, accuracy) == ["exact", "fast_rough", "slow"]
    results["exact"]["median_s"] = 1.2  # outside the 5% band: time decides
    assert bench.rank(results, accuracy) == ["fast_rough", "exact", "slow"]
    assert bench.rank({"broken": {"error": "x"}}, accuracy) == []


def test_bucket_mates_get_the_best_measured_algorithm_that_serves_them(monkeypatch):
    def picky(p):
        return "odd batches only" if p.batch % 2 == 0 else None

    table = dict(registry._REGISTRY["forward"])
    table["picky"] = dataclasses.replace(table["im2col"], name="picky", supports=picky)
    monkeypatch.setitem(registry._REGISTRY, "forward", table)
    odd, even = problem(batch=3), problem(batch=4)
    assert tuner.ident(odd) == tuner.ident(even)
    entry = cache.Entry(*tuner.ident(odd)[:1], "forward", *tuner.ident(odd)[1:], "picky",
                        {"picky": {"median_s": 1.0}, "im2col": {"median_s": 2.0}}, "")
    assert tuner.pick(entry, odd).name == "picky"
    assert tuner.pick(entry, even).name == "im2col"


def test_float64_problems_never_get_an_inexact_algorithm(monkeypatch):
    table = dict(registry._REGISTRY["forward"])
    table["rough"] = dataclasses.replace(table["im2col"], name="rough", exact=False,
                                         accuracy=9)
    monkeypatch.setitem(registry._REGISTRY, "forward", table)
    p64 = dataclasses.replace(problem(), dtype="float64")
    assert "rough" not in tuner.tune_problem(p64).results
    assert "rough" in tuner.tune_problem(problem()).results


def test_tuned_conv_matches_the_reference(count_benchmarks):
    p = problem(batch=3, c=5, o=7, size=9)
    x, w = operands(p)
    y = ce.conv(x, w, padding=1)
    assert len(count_benchmarks) == 1
    assert_close(y, expected_conv(x, w, padding=1), "float32", "tuned conv")
    dx = ce.conv_backward_data(y, w, x.shape, padding=1)
    dw = ce.conv_backward_weight(x, y, w.shape, padding=1)
    y64 = y.astype(np.float64)
    assert_close(dx, ce.conv_backward_data(y64, w.astype(np.float64), x.shape, padding=1,
                                           algo="reference"), "float32", "tuned dgrad")
    assert_close(dw, ce.conv_backward_weight(x.astype(np.float64), y64, w.shape, padding=1,
                                             algo="reference"), "float32", "tuned wgrad")
    assert len(count_benchmarks) == 3
    ce.conv(x, w, padding=1)
    assert len(count_benchmarks) == 3


def test_choice_is_registered_supported_and_recorded(tuning):
    p = problem()
    algo = tuner.choose(p)
    assert algo is not None and algo.supports(p) is None
    (entry,) = tuner.default_cache().entries()
    assert entry.choice == algo.name
    # every candidate that serves is timed, but the float64 oracle where others serve
    assert set(entry.results) == {a.name for a in registry.all_for("forward")
                                  if a.supports(p) is None and a.name != "reference"}
    assert all("median_s" in r for r in entry.results.values())


@pytest.fixture
def bad_candidates():
    """Two throwaway forward algorithms: one raises, one is fast but wrong."""

    def raises(p, x, w):
        raise RuntimeError("this candidate always fails")

    def wrong(p, x, w):
        return np.zeros(p.y_shape("NHWC"), p.compute_dtype)

    def any_problem(p):
        return None

    registry.register("always_fails", "forward", supports=any_problem, accuracy=9)(raises)
    registry.register("fast_but_wrong", "forward", supports=any_problem, accuracy=9)(wrong)
    yield
    registry.unregister("always_fails", "forward")
    registry.unregister("fast_but_wrong", "forward")


def test_a_failing_or_wrong_candidate_is_recorded_and_never_chosen(bad_candidates):
    p = problem(batch=1, c=3, o=2, size=5)
    x, w = operands(p)
    result = tuner.tune_problem(p)
    assert result.choice not in ("always_fails", "fast_but_wrong")
    assert result.results["always_fails"]["error"].startswith("RuntimeError: this candidate")
    assert "disagrees" in result.results["fast_but_wrong"]["error"]
    # what auto runs: the stored choice, or the heuristic where timings were too noisy
    assert (tuner.choose(p) or select.heuristic(p)).name == result.choice
    assert_close(ce.conv(x, w, padding=1), expected_conv(x, w, padding=1), "float32")


# --------------------------------------------------------------------------- modes


def test_modes_and_environment(monkeypatch):
    ce.set_tuning(None)
    monkeypatch.setenv("CONVENGINE_TUNING", "cache-only")
    assert ce.get_tuning() == "cache-only"
    monkeypatch.setenv("CONVENGINE_TUNING", "sometimes")
    with pytest.raises(ConvSetupError, match=r"\$CONVENGINE_TUNING.*'off', 'on', 'cache-only'"):
        ce.get_tuning()
    assert ce.set_tuning("off") is None
    assert ce.get_tuning() == "off"
    with pytest.raises(ConvSetupError, match="tuning must be one of"):
        ce.set_tuning("fast")


def test_off_uses_the_heuristic_without_benchmarking(no_benchmark):
    ce.set_tuning("off")
    p = problem()
    x, w = operands(p)
    assert tuner.choose(p) is None
    assert_close(ce.conv(x, w, padding=1), expected_conv(x, w, padding=1), "float32")
    assert tuner.default_cache().entries() == []


def test_cache_only_never_benchmarks(no_benchmark):
    ce.set_tuning("cache-only")
    p = problem()
    x, w = operands(p)
    assert tuner.choose(p) is None
    assert_close(ce.conv(x, w, padding=1), expected_conv(x, w, padding=1), "float32")
    assert tuner.default_cache().entries() == []
    assert "not tuned: cache-only" in ce.explain(p).source


def test_cache_only_uses_cached_choices(monkeypatch):
    p = problem()
    chosen = tuner.tune_problem(p).choice
    tuner.default_cache().forget()  # read it back from the file
    ce.set_tuning("cache-only")
    monkeypatch.setattr(bench, "benchmark", lambda *a: pytest.fail("benchmarked"))
    assert tuner.choose(p).name == chosen


def test_empty_batch_is_not_tuned(no_benchmark):
    p = problem(batch=0)
    assert tuner.choose(p) is None
    assert tuner.tune_problem(p).source == "skipped"


def test_tune_pre_tunes_a_list_and_reports(count_benchmarks):
    a, b = problem(), problem(k=1, padding=0)
    results = ce.tune([a, b, a], progress=False)
    assert [r.source for r in results] == ["tuned", "tuned", "cache"]
    assert all(r.median_s > 0 for r in results)
    assert len(count_benchmarks) == 2
    assert ce.tune([a], force=True, progress=False)[0].source == "tuned"
    with pytest.raises(TypeError, match=r"problems\[1\] must be a ConvProblem"):
        ce.tune([a, "conv"])


def test_explain_shows_the_tuned_choice():
    p = problem()
    before = ce.explain(p)
    assert "tuned on first call" in before.source and before.timings == {}
    chosen = tuner.tune_problem(p).choice
    after = ce.explain(p)
    assert after.source == "tuned, from the cache" and after.chosen == chosen
    assert set(after.timings) == set(after.supported) - {"reference"}  # the oracle: untimed
    assert "ms" in str(after)


def test_threads_tuning_at_once_measure_once(count_benchmarks):
    p = problem(batch=4, c=8, o=8, size=8)
    x, w = operands(p)
    expected = expected_conv(x, w, padding=1)
    outputs, errors = [], []

    def work():
        try:
            outputs.append(ce.conv(x, w, padding=1))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert tuning_warnings(record) == [] and errors == [] and len(outputs) == 4
    for y in outputs:
        assert_close(y, expected, "float32", "threaded conv")
    assert len(count_benchmarks) == 1


# --------------------------------------------------------------------------- the file


def test_second_cache_object_reads_the_first_ones_file(tuning, count_benchmarks):
    p = problem()
    chosen = tuner.choose(p).name
    fresh = cache.TuningCache(tuning / cache.DB_NAME)
    entry = fresh.get(tuner.ident(p))
    assert entry is not None and entry.choice == chosen
    with sqlite3.connect(tuning / cache.DB_NAME) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_connections_creating_the_file_at_once_all_succeed(tmp_path):
    """The table and its schema version appear in one transaction."""
    for trial in range(10):
        path = tmp_path / str(trial) / cache.DB_NAME
        caches = [cache.TuningCache(path) for _ in range(6)]
        workers = [threading.Thread(target=c.get, args=(("k", "h", "v", "c"),))
                   for c in caches]
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for t in workers:
                t.start()
            for t in workers:
                t.join()
        assert [c.failure for c in caches if c.failure] == [] and not tuning_warnings(record)


def run_convs_expecting_one_warning(problems):
    """conv() on each problem: every result correct, exactly one TuningCacheWarning."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for p in problems:
            x, w = operands(p)
            assert_close(ce.conv(x, w, padding=1), expected_conv(x, w, padding=1), "float32")
    found = tuning_warnings(record)
    assert len(found) == 1, [str(w.message) for w in record]
    return str(found[0].message)


def test_corrupt_file_warns_once_falls_back_to_memory_and_is_left_alone(tuning):
    tuning.mkdir(parents=True)
    db = tuning / cache.DB_NAME
    garbage = b"this is not an SQLite database\n" * 64
    db.write_bytes(garbage)
    message = run_convs_expecting_one_warning([problem(), problem(k=1, padding=0)])
    assert str(db) in message and "left untouched" in message
    assert db.read_bytes() == garbage
    assert len(tuner.default_cache().entries()) == 2  # kept in memory


@pytest.mark.parametrize("how", ["read-only directory", "directory cannot be created"])
def test_unwritable_directory_warns_once(tmp_path, monkeypatch, how):
    if how == "read-only directory":
        directory = tmp_path / "ro"
        directory.mkdir()
        directory.chmod(0o555)
        try:
            probe = directory / "probe"
            probe.touch()
            probe.unlink()
            pytest.skip("permissions are not enforced for this user (root)")
        except PermissionError:
            pass
    else:
        (tmp_path / "a_file").write_text("")
        directory = tmp_path / "a_file" / "cache"
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(directory))
    try:
        run_convs_expecting_one_warning([problem(), problem(k=1, padding=0)])
    finally:
        if directory.exists():
            directory.chmod(0o755)


def test_locked_database_warns_once(tuning, monkeypatch):
    monkeypatch.setattr(cache, "LOCK_TIMEOUT_S", 0.05)
    tuner.tune_problem(problem(k=5, padding=2))  # creates the file
    holder = sqlite3.connect(tuning / cache.DB_NAME, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        other = cache.TuningCache(tuning / cache.DB_NAME)
        monkeypatch.setattr(tuner, "_caches", {str(tuning / cache.DB_NAME): other})
        message = run_convs_expecting_one_warning([problem(), problem(k=1, padding=0)])
        assert "locked" in message
    finally:
        holder.rollback()
        holder.close()


# --------------------------------------------------------------------------- export / import


def test_export_import_round_trip(tmp_path):
    problems = [problem(), problem(k=1, padding=0), problem("backward_weight")]
    ce.tune(problems, progress=False)
    before = {e.ident: (e.choice, e.results) for e in tuner.default_cache().entries()}
    path = tmp_path / "tuning.json"
    assert transfer.export_cache(path) == 3
    tuner.default_cache().clear()
    assert tuner.default_cache().entries() == []
    report = transfer.import_cache(path)
    assert (report.imported, report.refused_host, report.stale) == (3, 0, 0)
    tuner.default_cache().forget()
    after = {e.ident: (e.choice, e.results) for e in tuner.default_cache().entries()}
    assert after == before


def test_import_refuses_other_hosts_unless_forced(tmp_path):
    ce.tune([problem(), problem(k=1, padding=0)], progress=False)
    path = tmp_path / "tuning.json"
    transfer.export_cache(path)
    document = json.loads(path.read_text())
    for e in document["entries"]:
        e["host"] = "aarch64 | another CPU | asimd | 64 cores"
    document["entries"][1]["version"] = "0.0.1"
    path.write_text(json.dumps(document))
    tuner.default_cache().clear()
    report = transfer.import_cache(path)
    assert (report.imported, report.refused_host, report.stale) == (0, 1, 1)
    assert "another host" in str(report) and tuner.default_cache().entries() == []
    report = transfer.import_cache(path, force=True)
    assert (report.imported, report.refused_host, report.stale) == (1, 0, 1)
    (entry,) = tuner.default_cache().entries()
    assert entry.host == keys.host_signature()
    assert tuner.choose(problem()).name == entry.choice


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="something else"), "not a convengine tuning cache"),
        (lambda d: d["entries"][0].pop("choice"), r"entries\[0\]: field 'choice'"),
        (lambda d: d["entries"][0]["results"].update(x={"median_s": -1}),
         r"results\['x'\] must hold"),
        (lambda d: d["entries"][0].update(choice="nope"), "has no timing"),
    ],
)
def test_import_validates_and_imports_nothing_on_error(tmp_path, mutate, message):
    ce.tune([problem()], progress=False)
    path = tmp_path / "tuning.json"
    transfer.export_cache(path)
    document = json.loads(path.read_text())
    mutate(document)
    path.write_text(json.dumps(document))
    tuner.default_cache().clear()
    with pytest.raises(ValueError, match=message):
        transfer.import_cache(path)
    assert tuner.default_cache().entries() == []


def test_clear_removes_a_corrupt_file_and_says_so(tuning):
    tuning.mkdir(parents=True)
    db = tuning / cache.DB_NAME
    db.write_bytes(b"garbage" * 100)
    text = tuner.default_cache().clear()
    assert "removed the file" in text and str(db) in text
    assert not db.exists()
    assert os.listdir(tuning) == []


# ------------------------------------------------------------ the heuristic stands


def _timed(median_s: float, spread: float = 0.05, **extra) -> dict:
    return {"median_s": median_s, "runs": 5, "eliminated": False, "spread": spread, **extra}


@pytest.mark.parametrize(("results", "expected"), [
    # the fastest is the heuristic's pick
    ({"a": _timed(1.0), "b": _timed(1.2)}, ("a", "agrees")),
    # clearly faster on a quiet host
    ({"a": _timed(1.0), "b": _timed(1.3)}, ("a", "faster")),
    # faster, but within the margin: too close to call
    ({"a": _timed(1.0), "b": _timed(1.1)}, ("b", "margin")),
    # clearly faster, but the runs spread too much to trust
    ({"a": _timed(1.0, spread=0.6), "b": _timed(1.5)}, ("b", "noisy")),
    ({"a": _timed(1.0), "b": _timed(1.5, spread=0.4)}, ("b", "noisy")),
    # clearly faster with a tight spread, but other processes kept the host busy
    ({"a": _timed(1.0, others_busy=0.4), "b": _timed(8.0, others_busy=0.4)}, ("b", "noisy")),
    # the heuristic's pick failed or was eliminated
    ({"a": _timed(1.0), "b": {"error": "boom"}}, ("a", "faster")),
    ({"a": _timed(1.0, spread=0.9), "b": _timed(4.0, eliminated=True)}, ("a", "faster")),
])
def test_decide_keeps_the_heuristic_unless_clearly_beaten(results, expected, monkeypatch):
    monkeypatch.setattr(bench, "QUIET", 0.25)
    monkeypatch.setattr(bench, "BUSY", 0.15)
    ranked = bench.rank(results, {"a": 0, "b": 0})
    assert bench.decide(results, ranked, "b" if expected != ("a", "agrees") else "a") == expected


def test_one_slow_run_does_not_eliminate_the_heuristics_pick():
    """Seen in a whole-network run: the stem's ``blocked`` (2 ms) took 139 ms on its
    first timed run, was eliminated after that one round, and ``direct`` (8 ms) was
    stored. The kept candidate runs every round, so its median forgets the stray run."""
    import time

    from convengine.registry import Algorithm

    p = problem()
    out = np.zeros(p.y_shape("NHWC"), np.float32)
    runs = {"kept": 0}

    def kept(problem_, a, b):
        runs["kept"] += 1
        time.sleep(0.08 if runs["kept"] == 2 else 0.002)  # run 1 is the warm-up
        return out

    def steady(problem_, a, b):
        time.sleep(0.006)
        return out

    candidates = [Algorithm("kept", "forward", kept, lambda p: None),
                  Algorithm("steady", "forward", steady, lambda p: None)]
    results = bench.benchmark(p, candidates, keep="kept")
    assert not results["kept"]["eliminated"] and results["kept"]["runs"] >= bench.MIN_ROUNDS
    assert results["kept"]["median_s"] < results["steady"]["median_s"]
    ranked = bench.rank(results, {"kept": 0, "steady": 0})
    assert bench.decide(results, ranked, "kept") == ("kept", "agrees")
    # without the keep, that one stray run had handed the choice to the slower one
    runs["kept"] = 0
    results = bench.benchmark(p, candidates)
    assert results["kept"]["eliminated"] and results["kept"]["runs"] == 1


def test_a_candidate_that_cannot_win_stops_after_the_minimum_rounds():
    """A candidate 1.3x slower than the heuristic's pick (within ``ELIMINATE``) is timed
    for ``MIN_ROUNDS`` rounds, not until the budget runs out; one faster than the pick
    goes on being timed beside it."""
    import time

    from convengine.registry import Algorithm

    p = problem()
    out = np.zeros(p.y_shape("NHWC"), np.float32)

    def sleeper(seconds):
        def run(problem_, a, b):
            time.sleep(seconds)
            return out
        return run

    def timed(**seconds):
        candidates = [Algorithm(name, "forward", sleeper(s), lambda p: None)
                      for name, s in seconds.items()]
        return bench.benchmark(p, candidates, keep="kept")

    results = timed(kept=0.004, slower=0.0052)
    assert results["slower"]["runs"] == bench.MIN_ROUNDS and results["slower"]["eliminated"]
    results = timed(kept=0.004, faster=0.003)
    assert results["faster"]["runs"] == results["kept"]["runs"] > bench.MIN_ROUNDS
    assert not results["faster"]["eliminated"]


def test_noisy_measurement_is_not_stored(tuning, monkeypatch):
    """A win measured on a noisy host leaves the heuristic's pick in place, stores
    nothing, and is not measured again in this process."""
    p = problem()
    default = select.heuristic(p).name
    other = next(a.name for a in registry.all_for("forward")
                 if a.supports(p) is None and a.name not in (default, "reference"))
    calls = []

    def noisy(problem_, candidates, keep=None):
        calls.append(problem_)
        return {other: _timed(1e-3, spread=0.8), default: _timed(5e-3, spread=0.8)}

    monkeypatch.setattr(bench, "benchmark", noisy)
    monkeypatch.setattr(bench, "QUIET", 0.25)
    result = tuner.tune_problem(p)
    assert (result.choice, result.source, result.why) == (default, "noisy", "noisy")
    assert tuner.default_cache().entries() == []
    assert tuner.choose(p) is None  # auto falls back to the heuristic
    assert len(calls) == 1
    monkeypatch.setattr(tuner, "_noisy", {})


def test_choice_within_margin_is_stored_as_the_heuristic(tuning, monkeypatch):
    p = problem()
    default = select.heuristic(p).name
    other = next(a.name for a in registry.all_for("forward")
                 if a.supports(p) is None and a.name not in (default, "reference"))
    monkeypatch.setattr(bench, "benchmark", lambda problem_, candidates, keep=None: {
        other: _timed(1.0e-3), default: _timed(1.05e-3)})
    result = tuner.tune_problem(p)
    assert (result.choice, result.why) == (default, "margin")
    (entry,) = tuner.default_cache().entries()
    assert entry.choice == default and tuner.choose(p).name == default


def test_a_busy_host_is_seen():
    """Other processes spinning on every CPU take most of the host's CPU time between
    two readings; this process sleeping takes none of it."""
    import subprocess
    import sys
    import time

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.3)  # let them start
        before = bench._cpu_seconds()
        time.sleep(0.5)
        after = bench._cpu_seconds()
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    if before is None:
        pytest.skip("no /proc/stat on this system")
    assert bench._others_share(before, after) > 0.5
    assert bench._others_share(before, before) == 0.0
