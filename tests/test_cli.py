"""The ``convengine`` command: each subcommand runs and its ``--json`` output parses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import convengine as ce
from convengine import cli, registry, threads
from convengine.tune import keys
from test_tune_helpers import fast_registry


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path / "cache"))
    for pass_, table in fast_registry().items():
        monkeypatch.setitem(registry._REGISTRY, pass_, table)
    previous, n_threads = ce.set_tuning("on"), threads.get_num_threads()
    yield tmp_path / "cache"
    ce.set_tuning(previous)
    threads.set_num_threads(n_threads)  # bench fixes the thread count


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv: str):
    code, out, err = run(capsys, *argv, "--json", "-")
    assert code == 0, err
    return json.loads(out)


EXPLAIN = ("explain", "--x", "2,6,7,7", "--w", "4,6,3,3", "--padding", "1")


def test_explain_prints_the_table_and_json(capsys):
    code, out, _ = run(capsys, *EXPLAIN)
    assert code == 0 and "CHOSEN by auto" in out and "tuned on first call" in out
    doc = run_json(capsys, *EXPLAIN)
    assert doc["chosen"] in doc["supported"] and doc["timings"] == {}
    assert doc["problem"].startswith("forward 2-D NCHW float32 x=(2, 6, 7, 7)")
    doc = run_json(capsys, *EXPLAIN, "--tune")
    assert doc["source"] == "tuned, from the cache"
    assert set(doc["timings"]) == set(doc["supported"]) - {"reference"}  # the oracle: untimed


def test_explain_parses_geometry(capsys):
    doc = run_json(capsys, "explain", "--x", "1,9,10,3", "--w", "4,3,3,3", "--layout", "NHWC",
                   "--stride", "2,1", "--padding", "0:1,1:1", "--dilation", "1", "--pass",
                   "bwd_weight")
    assert doc["problem"].startswith("backward_weight 2-D NHWC")
    assert "stride=(2, 1) padding=(0:1,1:1)" in doc["problem"]


def test_bad_arguments_exit_2_with_a_message(capsys):
    code, _, err = run(capsys, "explain", "--x", "2,6", "--w", "4,6,3,3")
    assert code == 2 and "x must have 3, 4 or 5 dims" in err
    code, _, err = run(capsys, "bench", "--pass", "sideways")
    assert code == 2 and "--pass: unknown pass 'sideways'" in err
    with pytest.raises(SystemExit):
        cli.main(["cache", "export"])


def test_passes_are_named_as_in_the_api_and_the_short_names_still_work(capsys):
    short = ("tune", "--suite", "conv1d", "--layers", "conformer.pw2", "--quiet")
    by_api = run_json(capsys, *short, "--pass", "forward,backward_data,backward_weight")
    by_alias = run_json(capsys, *short, "--pass", "fwd,bwd_data,bwd_weight")
    assert [e["problem"].split()[0] for e in by_api["entries"]] == [
        "forward", "backward_data", "backward_weight"]
    assert [e["key"] for e in by_alias["entries"]] == [e["key"] for e in by_api["entries"]]
    for first, again in zip(by_api["entries"], by_alias["entries"], strict=True):
        # the same problems: what the first run stored comes from the cache; a result
        # too noisy to store (a loaded host) is measured again
        assert (again["source"] == "cache" if first["source"] == "tuned"
                else first["source"] == "noisy" and again["source"] in ("tuned", "noisy"))
    doc = run_json(capsys, "explain", "--x", "1,4,6,6", "--w", "4,4,3,3", "--pass",
                   "backward_data")
    assert doc["problem"].startswith("backward_data 2-D")
    code, _, err = run(capsys, "tune", *short[1:], "--pass", "forward,bwd")
    assert code == 2 and "'bwd'" in err and "forward, backward_data, backward_weight" in err
    for command in ("bench", "tune", "warmup"):  # help and defaults speak the API's names
        text = cli.parser()._subparsers._group_actions[0].choices[command].format_help()
        assert "forward, backward_data, backward_weight" in " ".join(text.split())
        assert "fwd" not in cli.parser().parse_args([command]).pass_


def test_suites_load_with_the_subcommand_and_the_help_names_them_all(capsys):
    from convengine.bench import suites

    assert cli._SUITES.split(", ") == [*suites.suite_names(), "all"]
    code, _, err = run(capsys, "bench", "--suite", "vgg")
    assert code == 2 and "--suite: unknown suite 'vgg'" in err
    code, _, err = run(capsys, "warmup", "--suite", "resnet50,vgg")
    assert code == 2 and "--suite: unknown value 'vgg'" in err


@pytest.mark.slow
def test_tune_fills_the_cache_and_show_lists_it(capsys):
    argv = ("tune", "--suite", "conv1d", "--layers", "conformer.pw2", "--pass", "fwd,bwd_data")
    doc = run_json(capsys, *argv, "--quiet")
    assert [e["source"] for e in doc["entries"]] == ["tuned", "tuned"]
    assert all(e["choice"] and e["median_s"] > 0 for e in doc["entries"])
    assert [e["source"] for e in run_json(capsys, *argv)["entries"]] == ["cache", "cache"]
    shown = run_json(capsys, "cache", "show")
    assert shown["host"] == keys.host_signature() and shown["usable"]
    assert sorted(e["key"] for e in shown["entries"]) == sorted(e["key"] for e in doc["entries"])
    assert not any(e["stale"] for e in shown["entries"])
    code, out, _ = run(capsys, "cache", "show")
    assert code == 0 and "conv1d" not in out and "forward 1d NCHW float32 k1" in out


@pytest.mark.slow
def test_bench_reports_every_layer(capsys):
    doc = run_json(capsys, "bench", "--suite", "conv1d", "--layers", "conformer", "--batch",
                   "1", "--rounds", "3", "--quiet")
    assert [r["layer"] for r in doc["rows"]] == ["conformer.pw1", "conformer.dw",
                                                 "conformer.pw2"]
    for r in doc["rows"]:
        assert r["algo"] in r["candidates"] and r["median_s"] > 0
        assert r["gflops"] == pytest.approx(r["gflop"] / r["median_s"])
    assert doc["total"]["convengine_s"] > 0
    code, out, _ = run(capsys, "bench", "--suite", "conv1d", "--layers", "conformer.dw",
                       "--batch", "1", "--rounds", "3")
    assert code == 0 and "network total" in out and "conformer.dw" in out


@pytest.mark.slow
def test_bench_compares_with_torch(capsys):
    pytest.importorskip("torch")
    doc = run_json(capsys, "bench", "--suite", "mobilenet_v2", "--layers", "s5.dw_first",
                   "--batch", "1", "--pass", "forward,bwd_data,backward_weight", "--rounds", "3",
                   "--compare", "torch", "--quiet")
    assert [r["pass"] for r in doc["rows"]] == ["forward", "backward_data", "backward_weight"]
    for r in doc["rows"]:
        assert set(r["torch_medians_s"]) == {"NCHW", "channels_last"}
        assert r["torch_median_s"] == min(r["torch_medians_s"].values())
        assert r["ratio"] == pytest.approx(r["torch_median_s"] / r["median_s"])
        assert r["rel_err_vs_torch"] < 1e-5
    assert doc["total"]["ratio"] > 0


def test_cache_export_clear_import(capsys, tmp_path, monkeypatch):
    from convengine.tune import bench

    monkeypatch.setattr(bench, "QUIET", float("inf"))  # store whatever this host measures
    monkeypatch.setattr(bench, "BUSY", float("inf"))
    run_json(capsys, "tune", "--suite", "conv1d", "--layers", "conformer.pw2", "--pass", "fwd")
    path = tmp_path / "tuning.json"
    assert run(capsys, "cache", "export", str(path))[1].startswith("exported 1 entries")
    assert "removed 1 entries" in run(capsys, "cache", "clear")[1]
    assert run_json(capsys, "cache", "show")["entries"] == []
    assert "imported 1 entries" in run(capsys, "cache", "import", str(path))[1]
    assert len(run_json(capsys, "cache", "show")["entries"]) == 1

    document = json.loads(path.read_text())
    document["entries"][0]["host"] = "riscv64 | another CPU | - | 4 cores"
    path.write_text(json.dumps(document))
    run(capsys, "cache", "clear")
    code, out, _ = run(capsys, "cache", "import", str(path))
    assert code == 0 and "imported 0 entries; refused 1" in out
    code, out, _ = run(capsys, "cache", "import", str(path), "--force")
    assert code == 0 and out.startswith("imported 1 entries")
    path.write_text("{not json")
    code, _, err = run(capsys, "cache", "import", str(path))
    assert code == 2 and "is not JSON" in err


def test_cache_clear_replaces_a_corrupt_file(capsys, private_cache):
    private_cache.mkdir(parents=True)
    (private_cache / "tuning.sqlite3").write_bytes(b"not a database" * 50)
    with pytest.warns(ce.TuningCacheWarning):
        assert run_json(capsys, "cache", "show")["usable"] is False
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "not a usable tuning database" in out and "removed the file" in out


@pytest.mark.slow
def test_console_script_entry_point(private_cache):
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "convengine"]
    assert script.value == "convengine.cli:main"
    env = {**os.environ, "CONVENGINE_CACHE_DIR": str(private_cache)}
    proc = subprocess.run([sys.executable, "-m", "convengine.cli", "cache", "show", "--json",
                           "-"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["entries"] == []


@pytest.mark.slow
def test_tune_recheck_measures_stored_choices_again(capsys, monkeypatch):
    from convengine.tune import bench

    monkeypatch.setattr(bench, "QUIET", float("inf"))  # store whatever this host measures
    monkeypatch.setattr(bench, "BUSY", float("inf"))
    args = ("tune", "--suite", "conv1d", "--layers", "conformer.pw2", "--pass", "fwd")
    first = run_json(capsys, *args)["entries"][0]
    assert first["source"] == "tuned" and first["why"] in ("agrees", "faster", "margin")
    again = run_json(capsys, *args, "--recheck")["entries"][0]
    assert again["source"] == "tuned" and again["was"] == first["choice"]
    code, out, _ = run(capsys, *args, "--recheck")
    assert code == 0 and "was" in out and "choices changed" in out
