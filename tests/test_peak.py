"""The measured compute peak (convengine.peak), its cache, and bench's "% peak" column."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from convengine import _host, config, peak


@pytest.fixture
def cache(tmp_path):
    with config.override(cache_dir=tmp_path):
        yield tmp_path / peak.FILE


@pytest.fixture
def counted(monkeypatch):
    """peak.measure replaced by a quick fake that counts its calls."""
    calls = []

    def fake(n, seconds=peak.SECONDS):
        calls.append(n)
        return peak.Peak(n, 100.0 * n, None, "fake")

    monkeypatch.setattr(peak, "measure", fake)
    return calls


@pytest.mark.parametrize("n", [1, 2])
def test_measured_peak_is_plausible(n):
    found = peak.measure(n, seconds=0.05)
    assert found.threads == n
    assert 1 <= found.fp32_gflops <= 10_000
    if _host.HAS_VNNI:  # 64 byte products an instruction: above the float32 rate
        assert found.int8_gops is not None and 1 <= found.int8_gops <= 100_000
    else:
        assert found.int8_gops is None and "VNNI" in found.note


def test_measure_rejects_bad_thread_counts():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n must be a positive int"):
            peak.measure(bad)


def test_cache_round_trips(cache, counted):
    first = peak.peak(1)
    assert counted == [1] and cache.is_file()
    assert peak.peak(1) == first and counted == [1]  # from the file
    second = peak.peak(2)
    assert counted == [1, 2] and second.fp32_gflops == 200.0
    entries = json.loads(cache.read_text())
    assert set(entries) == {peak.cache_key(1), peak.cache_key(2)}
    assert peak.peak(1, refresh=True) == first and counted == [1, 2, 1]


def test_cache_is_keyed_on_version_and_isa(cache, counted, monkeypatch):
    peak.peak(1)
    monkeypatch.setattr(peak, "__version__", "0.0.0-other")
    peak.peak(1)
    monkeypatch.setattr(_host, "ISA", "none")
    peak.peak(1)
    assert counted == [1, 1, 1] and len(json.loads(cache.read_text())) == 3


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "",
                                  json.dumps({"KEY": {"threads": 1, "fp32_gflops": "fast",
                                                      "int8_gops": None, "note": ""}}),
                                  json.dumps({"KEY": {"threads": 1, "fp32_gflops": -3.0,
                                                      "int8_gops": None, "note": ""}})])
def test_corrupt_cache_is_measured_again(cache, counted, text):
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(text.replace("KEY", peak.cache_key(1)))
    assert peak.peak(1).fp32_gflops == 100.0 and counted == [1]
    entries = json.loads(cache.read_text())  # rewritten whole
    assert entries[peak.cache_key(1)]["fp32_gflops"] == 100.0
    assert peak.peak(1).fp32_gflops == 100.0 and counted == [1]


def test_busy_measurement_is_not_stored(cache, monkeypatch):
    monkeypatch.setattr(peak, "measure", lambda n, seconds=0: peak.Peak(
        n, 5.0, None, f"{peak.BUSY}: {n} threads ran no faster than one"))
    assert peak.peak(2).fp32_gflops == 5.0
    assert not cache.exists()


def test_bench_prints_the_fraction_of_the_peak(tmp_path):
    env = {**os.environ, "CONVENGINE_CACHE_DIR": str(tmp_path), "CONVENGINE_TUNING": "off"}
    argv = ["bench", "--suite", "conv1d", "--layers", "conformer.dw", "--batch", "1",
            "--rounds", "3", "--budget", "0.2", "--threads", "1", "--quiet"]
    code = "import sys; from convengine.cli import main; sys.exit(main(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True,
                         text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert any(line.startswith("measured peak on 1 threads: ") for line in lines)
    header = next(line for line in lines if line.startswith("layer"))
    assert "% peak" in header
    row = next(line for line in lines if line.startswith("conformer.dw"))
    gflops, percent = (float(cell) for cell in row.split()[-2:])
    stored = json.loads((tmp_path / peak.FILE).read_text())
    (entry,) = stored.values()
    assert percent == pytest.approx(100 * gflops / entry["fp32_gflops"], rel=0.02, abs=0.1)
