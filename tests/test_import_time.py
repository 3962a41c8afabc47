"""``import convengine`` stays quick: what it must not import, checked in a new process
(sys.modules, not time: a loaded CI host times anything)."""

from __future__ import annotations

import json
import subprocess
import sys

# optional integrations, the benchmark/demo code, and ml_dtypes (1.1 s to import,
# for bfloat16 only): each loads where it is used, never at start-up
NOT_AT_IMPORT = ("ml_dtypes", "torch", "onnx", "onnxruntime", "dask", "triton", "matplotlib",
                 "sklearn", "convengine.bench")


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_import_convengine_loads_no_optional_package():
    loaded = _loaded_after("import convengine")
    assert "convengine" in loaded
    assert not [m for m in NOT_AT_IMPORT if m in loaded]
    assert not [m for m in loaded if m.startswith("convengine.bench.")]


def test_the_cli_loads_the_bench_package_only_in_its_subcommands():
    loaded = _loaded_after("import convengine.cli as c; c.parser()")
    assert not [m for m in NOT_AT_IMPORT if m in loaded]
