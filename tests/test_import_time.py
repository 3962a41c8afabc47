"""``import convengine`` stays quick: what it must not import, checked in a new process
(sys.modules, not time: a loaded CI host times anything)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# optional integrations, the benchmark/demo code, and ml_dtypes (1.1 s to import,
# for bfloat16 only): each loads where it is used, never at start-up
NOT_AT_IMPORT = ("ml_dtypes", "torch", "onnx", "onnxruntime", "dask", "triton", "matplotlib",
                 "sklearn", "convengine.bench")


# a level asked for ($CONVENGINE_ISA, as CI's AVX2 pass sets) loads _host and numba at import
_ENV = {k: v for k, v in os.environ.items() if k != "CONVENGINE_ISA"}


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True, env=_ENV)
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_import_convengine_loads_no_optional_package():
    loaded = _loaded_after("import convengine")
    assert "convengine" in loaded
    assert not [m for m in NOT_AT_IMPORT if m in loaded]
    assert not [m for m in loaded if m.startswith("convengine.bench.")]


def test_the_cli_loads_the_bench_package_only_in_its_subcommands():
    loaded = _loaded_after("import convengine.cli as c; c.parser()")
    assert not [m for m in NOT_AT_IMPORT if m in loaded]


def test_import_convengine_loads_no_numba_and_no_kernel():
    loaded = _loaded_after("import convengine")
    assert "numba" not in loaded and "llvmlite" not in loaded
    assert "convengine._targets" in loaded  # runs at import, before numba compiles anything
    assert not [m for m in loaded if m.startswith(("convengine.algorithms", "convengine.api"))]


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False, env=_ENV)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[-1]


# after each: convengine.tune / convengine.warmup are the functions, the submodules of
# those names still import
_FUNCTIONS = """
import types, convengine, convengine.warmup
from convengine.tune import tuner
import sys
assert convengine.tune is tuner.tune, convengine.tune
assert convengine.warmup is sys.modules["convengine.warmup"].warmup, convengine.warmup
assert not isinstance(convengine.tune, types.ModuleType)
from convengine import tune, warmup
assert tune is convengine.tune and warmup is convengine.warmup
from convengine.tune import TuneResult, tuner as t2
assert t2 is tuner and convengine.TuneResult is TuneResult
print("ok")
"""


@pytest.mark.parametrize("first", [
    "import convengine",
    "import convengine.onnx",
    "from convengine.tune import tuner",
    "import convengine.warmup",
    "from convengine import tune",
    "from convengine import warmup; import convengine.tune",
])
def test_tune_and_warmup_are_the_functions_whatever_is_imported_first(first):
    assert _run(f"{first}\n{_FUNCTIONS}") == "ok"


def test_every_public_name_resolves_lazily():
    code = """
import sys, convengine
assert "numba" not in sys.modules
names = {n: getattr(convengine, n) for n in convengine.__all__}
assert "convengine.algorithms" in sys.modules  # every algorithm registered on first use
assert not [n for n in convengine.__all__ if n not in dir(convengine)]
from convengine.api import conv
from convengine.registry import algorithms
from convengine.prepared import PreparedConv
from convengine._kernel_cache import KernelCacheWarning
import convengine.config
assert names["conv"] is conv and names["list_algorithms"] is algorithms
assert names["PreparedConv"] is PreparedConv and names["KernelCacheWarning"] is KernelCacheWarning
assert names["config"] is convengine.config and "blocked" in algorithms()
ns = {}
exec("from convengine import *", ns)
assert {n: ns[n] for n in convengine.__all__} == names
print("ok")
"""
    assert _run(code) == "ok"


def test_star_import_in_a_new_process():
    code = "from convengine import *\nprint(conv.__module__, tune.__module__, sorted(list_algorithms())[0])"
    assert _run(code).split()[:2] == ["convengine.api", "convengine.tune.tuner"]


def test_a_submodule_first_still_registers_every_algorithm():
    code = ("from convengine.api import conv\nfrom convengine import registry\n"
            "print(len(registry.algorithms()))")
    assert int(_run(code)) > 1


def test_the_lazy_table_covers_all_but_the_eager_names():
    import convengine

    assert set(convengine._LAZY) | {"__version__", "ConvSetupError", "ShippedKernelWarning"} == set(
        convengine.__all__)


def test_threads_loading_the_api_at_once_get_the_same_objects():
    code = """
import threading, convengine
got = []
threads = [threading.Thread(target=lambda: got.append((convengine.conv, convengine.tune)))
           for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
assert len(got) == 4 and len(set(got)) == 1, got
print("ok")
"""
    assert _run(code) == "ok"
