"""The tuning cache across processes: a second process reuses the first one's
results, and processes tuning at once leave a consistent cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

# Tunes the forward problems given as (c, k) pairs on argv (tiny, fast candidates);
# prints how many benchmarks ran, each choice, the cache warnings, and the largest
# error of conv() against the float64 reference.
SCRIPT = """
import json, sys, warnings
import numpy as np
sys.path.insert(0, {here!r})
from test_tune_helpers import operands, problem, restrict_registry
import convengine as ce
from convengine.tune import bench

restrict_registry()
ce.set_tuning("on")
benchmarks = []
real = bench.benchmark
bench.benchmark = lambda p, c, keep=None: benchmarks.append(1) or real(p, c, keep)
choices, worst = [], 0.0
with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    for item in sys.argv[1:]:
        c, k = map(int, item.split(","))
        p = problem(c=c, k=k, batch=2, size=6)
        x, w = operands(p)
        y = ce.conv(x, w, padding=k // 2)
        ref = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=k // 2,
                      algo="reference")
        worst = max(worst, float(np.abs(y - ref).max() / max(1.0, np.abs(ref).max())))
        choices.append(ce.explain(p).chosen)
print(json.dumps({{"benchmarks": len(benchmarks), "choices": choices, "worst": worst,
                  "warnings": [str(w.message) for w in record
                               if issubclass(w.category, ce.TuningCacheWarning)]}}))
"""


def start(cache_dir: Path, problems: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "CONVENGINE_CACHE_DIR": str(cache_dir), "CONVENGINE_TUNING": "on"}
    code = SCRIPT.format(here=str(HERE))
    return subprocess.Popen([sys.executable, "-c", code, *problems], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n{err}")
    return json.loads(out.strip().splitlines()[-1])


PROBLEMS = ["3,3", "4,1", "5,3", "6,5"]


def test_a_second_process_reuses_the_first_ones_results(tmp_path):
    first = finish(start(tmp_path, PROBLEMS))
    assert first["benchmarks"] == len(PROBLEMS) and first["warnings"] == []
    second = finish(start(tmp_path, PROBLEMS))
    assert second["benchmarks"] == 0 and second["warnings"] == []
    assert second["choices"] == first["choices"]
    assert max(first["worst"], second["worst"]) < 2e-5


@pytest.mark.slow
def test_processes_tuning_at_once(tmp_path):
    import sqlite3

    procs = [start(tmp_path, PROBLEMS), start(tmp_path, PROBLEMS[::-1])]
    results = [finish(p) for p in procs]
    for r in results:
        assert r["warnings"] == [] and r["worst"] < 2e-5
    with sqlite3.connect(tmp_path / "tuning.sqlite3") as conn:
        (rows,) = conn.execute("SELECT count(*) FROM tuning").fetchone()
        (check,) = conn.execute("PRAGMA integrity_check").fetchone()
    assert rows == len(PROBLEMS) and check == "ok"
    third = finish(start(tmp_path, PROBLEMS))
    assert third["benchmarks"] == 0
