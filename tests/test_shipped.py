"""Shipped kernels: the portable target a host takes, kernels built for it loaded by a
new process with empty caches (nothing compiled), and shipped files that do not fit
(damaged, truncated, other versions) compiled instead with one warning, never loaded."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numba
import pytest

from convengine import _kernel_cache as kc
from convengine import _targets, shipping

V3 = frozenset(_targets.TARGETS["x86-64-v3"].flags)
V4 = frozenset(_targets.TARGETS["x86-64-v4"].flags)
VNNI = V4 | {"avx512_vnni"}
AMX = VNNI | {"amx_int8", "amx_tile"}


def _folder(tmp_path: Path, *names: str, python: str | None = None) -> Path:
    """A shipped folder holding a manifest for each target of ``names``."""
    for name in names:
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / _targets.MANIFEST).write_text(json.dumps(
            {"target": name, "python": python or _targets.python_version(), "files": {}}))
    return tmp_path


def test_the_isa_level_of_cpu_flags() -> None:
    assert _targets.isa_level(frozenset()) == "none"
    assert _targets.isa_level(V3 - {"fma"}) == "none"
    assert _targets.isa_level(V3) == "avx2"
    assert _targets.isa_level((V4 | {"avx512_vnni"}) - {"avx512vl"}) == "avx2"
    assert _targets.isa_level(V4) == "avx512"
    assert _targets.isa_level(VNNI) == "avx512_vnni"
    assert _targets.isa_level(AMX) == "amx"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="targets are for Linux x86-64")
def test_a_host_takes_the_shipped_target_of_its_own_level(tmp_path: Path) -> None:
    folder = _folder(tmp_path, *_targets.TARGETS)
    if _targets.platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("targets are for x86-64")
    pick = {level: _targets._choose({}, flags, folder)[0]
            for level, flags in (("v3", V3), ("v4", V4), ("vnni", VNNI), ("amx", AMX))}
    assert pick["v3"] is _targets.TARGETS["x86-64-v3"]
    assert pick["v4"] is _targets.TARGETS["x86-64-v4"]
    assert pick["vnni"] is _targets.TARGETS["x86-64-v4-vnni"]
    assert pick["amx"] is None  # an AMX host compiles for itself: it keeps its AMX kernels
    assert _targets._choose({}, V3 - {"avx2"}, folder) == (None, None)
    assert _targets._choose({}, VNNI, tmp_path / "none") == (None, None)  # nothing shipped
    target, shipped = _targets._choose({}, VNNI, folder)
    assert shipped == folder / "x86-64-v4-vnni"


@pytest.mark.parametrize("variable,value", [("NUMBA_CPU_NAME", "znver4"),
                                            ("NUMBA_CPU_FEATURES", "+avx2"),
                                            ("CONVENGINE_ISA", "avx2"),
                                            ("CONVENGINE_SHIPPED", "0")])
def test_a_choice_of_the_user_wins_over_shipped_kernels(tmp_path: Path, variable: str,
                                                        value: str) -> None:
    folder = _folder(tmp_path, *_targets.TARGETS)
    assert _targets._choose({variable: value}, VNNI, folder) == (None, None)


def test_shipped_kernels_for_another_python_or_unreadable_are_not_used(tmp_path: Path) -> None:
    if _targets.platform.machine().lower() not in ("x86_64", "amd64") or \
            not sys.platform.startswith("linux"):
        pytest.skip("targets are for Linux x86-64")
    folder = _folder(tmp_path / "a", "x86-64-v3", python="2.7")
    with pytest.warns(_targets.ShippedKernelWarning, match="for Python 2.7"):
        assert _targets._choose({}, V3, folder) == (None, None)
    folder = _folder(tmp_path / "b", "x86-64-v3")
    (folder / "x86-64-v3" / _targets.MANIFEST).write_text("{not json")
    with pytest.warns(_targets.ShippedKernelWarning, match="unreadable manifest"):
        assert _targets._choose({}, V3, folder) == (None, None)


def test_a_forced_target_is_checked(tmp_path: Path) -> None:
    env = {_targets.TARGET_ENV: "x86-64-v9"}
    with pytest.raises(ValueError, match="CONVENGINE_TARGET must be one of"):
        _targets._choose(env, VNNI, tmp_path)
    env = {_targets.TARGET_ENV: "x86-64-v4", "NUMBA_CPU_NAME": "znver4"}
    with pytest.raises(ValueError, match="unset .NUMBA_CPU_NAME"):
        _targets._choose(env, VNNI, tmp_path)
    with pytest.raises(ValueError, match="unset .CONVENGINE_ISA"):
        _targets._choose({_targets.TARGET_ENV: "x86-64-v4", "CONVENGINE_ISA": "avx2"}, VNNI,
                         tmp_path)
    # what a parent process compiling for the target passes on: the same target
    inherited = {_targets.TARGET_ENV: "x86-64-v4-vnni", "NUMBA_CPU_NAME": "x86-64-v4",
                 "NUMBA_CPU_FEATURES": "+avx512vnni"}
    folder = _folder(tmp_path / "shipped", "x86-64-v4-vnni")
    assert _targets._choose(inherited, VNNI, folder) == (
        _targets.TARGETS["x86-64-v4-vnni"], folder / "x86-64-v4-vnni")
    assert _targets._choose({**inherited, "CONVENGINE_SHIPPED": "0"}, VNNI, folder) == (
        _targets.TARGETS["x86-64-v4-vnni"], None)  # the target, not its shipped kernels
    with pytest.raises(ValueError, match="this CPU lacks"):
        _targets._choose({_targets.TARGET_ENV: "x86-64-v4"}, V3, tmp_path)
    assert _targets._choose({_targets.TARGET_ENV: "x86-64-v3"}, VNNI, tmp_path) == (
        _targets.TARGETS["x86-64-v3"], None)  # compiles for it; nothing shipped to seed
    with pytest.raises(ValueError, match="target must be one of"):
        shipping.check_target("avx9")
    with pytest.raises(ValueError, match="cannot run x86-64-v4 code"):
        shipping.check_target("x86-64-v4", V3)


def test_onnx_models_to_build_must_be_files(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    assert shipping.check_models([tmp_path / "m.onnx"]) == [(tmp_path / "m.onnx").resolve()]
    with pytest.raises(ValueError, match="nope.onnx is not a file"):
        shipping.check_models([tmp_path / "m.onnx", tmp_path / "nope.onnx"])


def test_manifest_names_outside_the_directory_are_refused() -> None:
    assert kc._safe_relative("modules/a-1/f.nbi")
    for bad in ("", "/etc/passwd", "../x", "a/../../x", 3, None):
        assert not kc._safe_relative(bad)


def _host_params_names(module: Any) -> set[str]:
    """The module's globals assigned from ``host_params.<f>()`` in its source."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and isinstance(node.value.func.value, ast.Name)
                and node.value.func.value.id == "host_params"):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_no_kernel_reads_a_cache_derived_constant() -> None:
    """Kernels are keyed on the target, not on the host's cache sizes: a jitted function
    never reads a value derived from them as a global (numba would freeze it into the
    machine code); drivers pass it as an argument."""
    import convengine  # noqa: F401  (every family imported)
    import convengine.algorithms  # noqa: F401

    checked = 0
    for name in sorted(sys.modules):
        if not name.startswith("convengine."):
            continue
        module = sys.modules[name]
        if not getattr(module, "__file__", None) or not str(module.__file__).endswith(".py"):
            continue
        derived = _host_params_names(module)
        if not derived:
            continue
        for value in vars(module).values():
            if isinstance(value, numba.core.registry.CPUDispatcher):
                checked += 1
                assert not derived & set(value.py_func.__code__.co_names), (
                    f"{name}.{value.py_func.__name__} reads {derived & set(value.py_func.__code__.co_names)}")
    assert checked > 5  # the families with derived constants have kernels


# ------------------------------------------------ built, shipped, loaded (subprocesses)

_RUN = """
import json, os, time, warnings
warnings.simplefilter("always")
import numpy as np
from numba.core import event
with warnings.catch_warnings(record=True) as caught:
    import convengine as ce
    from convengine.bench import suites
    from tests.oracle import reference

    class Count(event.Listener):
        n = 0
        depth = 0
        def on_start(self, ev):
            Count.depth += 1
        def on_end(self, ev):
            Count.depth -= 1
            Count.n += Count.depth == 0
    event.register("numba:compile", Count())
    rng = np.random.default_rng(0)
    worst = 0.0
    for layer in suites.suite("conv1d", 1):
        x = rng.standard_normal(layer.x).astype(np.float32)
        w = rng.standard_normal(layer.w).astype(np.float32)
        kw = layer.conv_args()
        y = ce.conv(x, w, **kw)
        kw.pop("layout")
        ref = reference("forward", x.astype(np.float64), w.astype(np.float64), **kw)
        worst = max(worst, float(np.abs(y - ref).max() / np.abs(ref).max()))
from convengine import _kernel_cache
print(json.dumps({"compiled": Count.n, "worst": worst, "cpu": os.environ.get("NUMBA_CPU_NAME"),
                  "warnings": [str(w.message) for w in caught],
                  "described": _kernel_cache.describe_target(),
                  "passed_on": {k: os.environ[k] for k in ("CONVENGINE_TARGET", "NUMBA_CPU_NAME",
                                                           "NUMBA_CPU_FEATURES") if k in os.environ}}))
"""


def _host_target() -> str:
    flags = _targets.cpu_flags()
    for target in _targets.TARGETS.values():
        if _targets.runs_on(target, flags):
            return target.name
    pytest.skip("no portable target runs this CPU at its own level (AMX, or not x86-64)")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in shipping._CLEARED}
    env.update(CONVENGINE_TUNING="off", **extra)
    return env


def _first_run(shipped: Path, home: Path, **extra: str) -> dict[str, Any]:
    """A new process with empty caches and ``shipped`` as the shipped folder."""
    env = _clean_env(CONVENGINE_SHIPPED_DIR=str(shipped),
                     CONVENGINE_KERNEL_DIR=str(home / "kernels"),
                     CONVENGINE_CACHE_DIR=str(home / "cache"), **extra)
    root = Path(__file__).resolve().parent.parent
    res = subprocess.run([sys.executable, "-c", _RUN], env=env, cwd=root, capture_output=True,
                         text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    assert out["worst"] < 1e-4  # float32 against the float64 reference, in every case
    return out


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name = _host_target()
    out = tmp_path_factory.mktemp("shipped")
    with warnings.catch_warnings():
        built = shipping.build(name, out, ["--suite", "conv1d", "--batch", "1",
                                           "--dtype", "float32", "--quiet"])
    assert built.files > 5 and (out / name / _targets.MANIFEST).is_file()
    return name, out


def _copy(shipped: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "shipped"
    shutil.copytree(shipped, copy)
    return copy


@pytest.mark.slow
def test_shipped_kernels_load_in_a_new_process_without_compiling(
        shipped: tuple[str, Path], tmp_path: Path) -> None:
    name, folder = shipped
    before = kc.file_hashes(folder)
    out = _first_run(folder, tmp_path / "home")
    assert out["cpu"] == _targets.TARGETS[name].llvm_cpu
    assert out["described"].startswith(f"{name} (LLVM ") and str(folder) in out["described"]
    assert out["compiled"] == 0, out
    assert out["warnings"] == []
    assert kc.file_hashes(folder) == before  # the install folder is only read
    # a process it starts inherits the target (CONVENGINE_TARGET, NUMBA_CPU_*): it loads
    # the shipped kernels too, into its own empty cache
    child = _first_run(folder, tmp_path / "child", **out["passed_on"])
    assert child["cpu"] == out["cpu"] and child["compiled"] == 0 and child["warnings"] == []
    control = _first_run(tmp_path / "nothing-shipped", tmp_path / "home2")
    assert control["cpu"] is None and control["compiled"] > 0  # the control compiles
    assert control["described"].startswith("this CPU (")


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_damaged_shipped_file_is_compiled_instead(
        shipped: tuple[str, Path], tmp_path: Path, damage: str) -> None:
    name, folder = shipped
    copy = _copy(folder, tmp_path)
    data = sorted((copy / name).rglob("*.nbc"), key=lambda p: p.stat().st_size)[-1]
    if damage == "flip":  # one byte in the middle of the largest machine-code file
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        index = sorted((copy / name).rglob("*.nbi"))[0]
        index.write_bytes(index.read_bytes()[:20])
    else:
        data.unlink()
    out = _first_run(copy, tmp_path / "home")
    assert out["compiled"] >= 1
    assert len(out["warnings"]) == 1 and "damaged or missing" in out["warnings"][0], out


@pytest.mark.slow
def test_shipped_kernels_of_another_numba_are_not_used(
        shipped: tuple[str, Path], tmp_path: Path) -> None:
    name, folder = shipped
    copy = _copy(folder, tmp_path)
    manifest = copy / name / _targets.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "numba": "0.1.0"}))
    out = _first_run(copy, tmp_path / "home")
    assert out["compiled"] >= 1
    assert len(out["warnings"]) == 1 and "numba 0.1.0" in out["warnings"][0], out


@pytest.mark.slow
def test_a_lower_target_built_here_loads_where_it_is_asked_for(tmp_path: Path) -> None:
    """x86-64-v3 (the AVX2 kernels) built on this CPU, whatever its level, through the
    command: a process asking for that target (CONVENGINE_TARGET) loads it all."""
    from convengine import cli

    if not set(_targets.TARGETS["x86-64-v3"].flags) <= _targets.cpu_flags():
        pytest.skip("the CPU cannot run x86-64-v3 code")
    assert cli.main(["build-cache", "--target", "x86-64-v3", "--out", str(tmp_path / "shipped"),
                     "--suite", "conv1d", "--dtype", "float32", "--no-tune"]) == 0
    out = _first_run(tmp_path / "shipped", tmp_path / "home", CONVENGINE_TARGET="x86-64-v3")
    assert out["cpu"] == "x86-64-v3"
    assert out["compiled"] == 0 and out["warnings"] == [], out


def test_the_build_cache_command_refuses_an_unknown_target(capsys: pytest.CaptureFixture[str]) -> None:
    from convengine import cli

    assert cli.main(["build-cache", "--target", "x86-64-v9"]) == 2
    assert "target must be one of" in capsys.readouterr().err

