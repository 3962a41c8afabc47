"""bench/soak.py: a short supervised soak (tiny models) ends with exit 0, no glibc heap
message, every workload run and compared with its reference (PyTorch eager, PyTorch's
quantized model, ONNX Runtime), the fork's child exiting 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

SOAK = Path(__file__).resolve().parents[1] / "bench" / "soak.py"


@pytest.mark.slow
def test_short_supervised_soak(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    # one round of the rotation (16 workloads) from two Python threads, a fork halfway;
    # size 64: ResNet-50's last stage 2x2 (train-mode BatchNorm needs more than 1 value)
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--supervise", "--iterations", "16", "--size", "64",
         "--width", "0.25", "--threads-py", "2", "--report", str(report)],
        capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    r = json.loads(report.read_text())
    assert r["exit"] == "0" and r["signal"] is None and r["heap_messages"] == []
    assert r["env"]["MALLOC_CHECK_"] == "3" and r["env"]["PYTHONMALLOC"] == "malloc"
    s = r["summary"]
    assert s["iterations"] == 16 and s["errors"] == 0 and s["mismatches"] == 0
    assert s["fork"]["exit"] == "0"
    from_soak = set(s["workloads"])
    assert {"float_resnet50", "train_mobilenet_v2", "int8fx_mobilenet_v2", "onnx_qdq_resnet50",
            "onnx_qop_mobilenet_v2", "repro", "int8_exit"} <= from_soak
    for name, t in s["workloads"].items():
        assert t["runs"] == 1 and t["errors"] == 0 and t["mismatches"] == 0, (name, t)


def test_supervisor_reports_a_heap_abort(tmp_path: Path) -> None:
    """The supervisor's report names glibc's message and the signal of a child that
    corrupts its heap (a double free through ctypes under MALLOC_CHECK_=3)."""
    sys.path.insert(0, str(SOAK.parent))
    try:
        import soak
    finally:
        sys.path.pop(0)
    script = tmp_path / "bad.py"
    script.write_text("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = "
                      "ctypes.c_void_p\np = libc.malloc(64)\nprint('[it     0] bad', flush=True)\n"
                      "libc.free(ctypes.c_void_p(p))\nlibc.free(ctypes.c_void_p(p))\n")
    report = tmp_path / "r.json"
    rc = soak.supervise([], str(report), cmd=[sys.executable, "-u", str(script)])
    r = json.loads(report.read_text())
    assert rc == 1 and r["signal"] == "SIGABRT", r
    assert any("free" in m for m in r["heap_messages"]), r
    assert r["last_lines"] == ["[it     0] bad"]
