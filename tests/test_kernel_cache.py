"""The on-disk cache of generated kernels: loaded by later processes, stale entries
never loaded, corrupt or unreadable ones compiled again with one warning, several
processes filling it at once, the slow-compile log line."""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convengine as ce
from convengine import _compile_log
from convengine import _kernel_cache as kc
from convengine.bench.suites import suite

HOME = "convengine._kernel_cache"  # any importable module will do as the kernels' home


def _source(k: int, tag: str = "test_scale") -> kc.Source:
    """A kernel module with ``scale(a) = a * k + 1`` (k a literal of its text)."""
    src = kc.Source(HOME, tag)
    src.value("k", k)
    src.code("def scale(a):\n    return a * k + 1.0\n", "scale")
    src.jit("scale", nogil=True)
    return src


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(kc.KERNEL_DIR_VARIABLE, raising=False)
    monkeypatch.setattr(kc, "_LOADED", {})
    monkeypatch.setattr(kc, "_WARNED", set())
    monkeypatch.setattr(kc, "_FINGERPRINTS", {})
    return tmp_path / kc.SUBDIR


def _run(cache_dir: Path, k: int) -> tuple[int, int, list[float]]:
    """In a fresh process: (cache hits, cache misses, scale(k)([0, 1, 2]))."""
    code = textwrap.dedent(f"""
        import numpy as np, warnings
        warnings.simplefilter("error")
        from tests.test_kernel_cache import _source
        from convengine import _kernel_cache as kc
        f = kc.load(_source({k})).scale
        out = f(np.arange(3.0))
        print(sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values()), *out)
    """)
    env = {**os.environ, "CONVENGINE_KERNEL_DIR": str(cache_dir)}
    root = Path(__file__).parent.parent
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    hits, misses, *values = res.stdout.split()
    return int(hits), int(misses), list(map(float, values))


@pytest.mark.slow
def test_a_later_process_loads_the_compiled_kernel(cache: Path) -> None:
    assert _run(cache, 3)[1:] == (1, [1.0, 4.0, 7.0])
    hits, misses, values = _run(cache, 3)
    assert (hits, misses, values) == (1, 0, [1.0, 4.0, 7.0])
    assert len(list(cache.glob("test_scale_*.py"))) == 1


def test_stale_entries_are_never_loaded(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kc.load(_source(2))
    np.testing.assert_array_equal(first.scale(np.arange(3.0)), [1.0, 3.0, 5.0])
    # another convengine version (or numba, llvmlite, CPU): another file, compiled anew
    monkeypatch.setattr(kc, "__version__", "0.0.0-other")
    monkeypatch.setattr(kc, "_FINGERPRINTS", {})
    other = kc.load(_source(2))
    assert other.__file__ != first.__file__
    np.testing.assert_array_equal(other.scale(np.arange(3.0)), [1.0, 3.0, 5.0])
    stats = other.scale.stats
    assert sum(stats.cache_misses.values()) == 1 and not stats.cache_hits
    # another source: another file
    assert kc.load(_source(5)).__file__ not in (first.__file__, other.__file__)


def _reload(k: int) -> object:
    kc._LOADED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = kc.load(_source(k))
        out = module.scale(np.arange(3.0))  # type: ignore[attr-defined]
    np.testing.assert_array_equal(out, np.arange(3.0) * k + 1.0)
    return [w for w in caught if issubclass(w.category, kc.KernelCacheWarning)]


def test_a_corrupt_module_file_is_compiled_again_with_one_warning(cache: Path) -> None:
    path = Path(kc.load(_source(4)).__file__)  # type: ignore[arg-type]
    path.write_text("def scale(a):\n    return a * 100\n")
    caught = _reload(4)
    assert len(caught) == 1 and "corrupt" in str(caught[0].message)
    assert path.read_text() == _source(4).text  # rewritten whole
    assert _reload(4) == []


def test_corrupt_numba_files_are_compiled_again_with_one_warning(cache: Path) -> None:
    kc.load(_source(6)).scale(np.arange(3.0))  # type: ignore[attr-defined]
    files = list((cache / "__pycache__").glob("test_scale_*.nb*"))
    assert files
    for f in files:
        f.write_bytes(b"\x80\x04garbage" + bytes(range(256)))
    caught = _reload(6)
    assert len(caught) == 1 and "does not load" in str(caught[0].message)


def test_an_unreadable_entry_is_compiled_elsewhere_with_one_warning(cache: Path) -> None:
    src = _source(7)
    path = Path(kc.load(src).__file__)  # type: ignore[arg-type]
    path.unlink()
    path.mkdir()  # a directory where the module file should be
    caught = _reload(7)
    assert len(caught) == 1 and "cannot be read" in str(caught[0].message)


@pytest.mark.slow
def test_several_processes_filling_the_cache_at_once(cache: Path) -> None:
    root = Path(__file__).parent.parent
    code = ("import numpy as np; from tests.test_kernel_cache import _source; "
            "from convengine import _kernel_cache as kc; "
            "print(*kc.load(_source(9)).scale(np.arange(3.0)))")
    env = {**os.environ, "CONVENGINE_KERNEL_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-W", "error", "-c", code], env=env, cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        assert list(map(float, out.split())) == [1.0, 10.0, 19.0]
    assert len(list(cache.glob("test_scale_*.py"))) == 1
    assert not list(cache.glob(".*tmp"))
    hits, misses, values = _run(cache, 9)
    assert (hits, misses, values) == (1, 0, [1.0, 10.0, 19.0])


def test_a_slow_compile_logs_one_line(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_compile_log, "SLOW_COMPILE_S", 0.0)
    caplog.set_level(logging.INFO, logger="convengine")
    f = kc.load(_source(11, tag="test_logged")).scale
    f(np.arange(3.0))
    f(np.arange(3.0))
    lines = [r.getMessage() for r in caplog.records if r.name == "convengine"]
    assert len(lines) == 1 and "test_logged" in lines[0], lines


def test_source_refuses_bad_tags() -> None:
    with pytest.raises(ValueError, match="tag"):
        kc.Source(HOME, "a-b")


TEMPLATE = '''"""A test template: scale(a) = a * K + B, compiled twice."""
from convengine._kernel_cache import compiled, parameters

K, B = parameters(__name__, "K", "B")


def scale(a):
    return a * K + B


parallel = compiled("parallel", parallel=True)(scale)
serial = compiled("serial")(scale)
'''


@pytest.fixture
def template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path) -> str:
    """A module ``ce_template_home`` with ``scale_template.py`` beside it."""
    (tmp_path / "ce_template_home.py").write_text("")
    (tmp_path / "scale_template.py").write_text(TEMPLATE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ce_template_home", raising=False)
    return "ce_template_home"


def test_a_template_runs_verbatim_per_constant_set(template: str, cache: Path) -> None:
    a = np.arange(3.0)
    two = kc.instantiate(template, "scale_template.py", "scale", K=2.0, B=1.0)
    three = kc.instantiate(template, "scale_template.py", "scale", K=3.0, B=0.0)
    np.testing.assert_array_equal(two.parallel(a), [1.0, 3.0, 5.0])
    np.testing.assert_array_equal(two.serial(a), [1.0, 3.0, 5.0])
    np.testing.assert_array_equal(three.serial(a), [0.0, 3.0, 6.0])
    assert kc.instantiate(template, "scale_template.py", "scale", K=2.0, B=1.0) is two
    files = sorted(cache.glob("scale_*.py"))
    assert len(files) == 2 and all(f.read_text() == TEMPLATE for f in files)
    # one function compiled twice: each variant its own numba index beside the module
    indexes = {p.name for p in (cache / "__pycache__").glob("*.nbi")}
    assert any("-parallel" in n for n in indexes) and any("-serial" in n for n in indexes)


def test_template_constants_are_literals_and_complete(template: str) -> None:
    with pytest.raises(TypeError, match="K: a template constant must be a literal"):
        kc.instantiate(template, "scale_template.py", "scale", K=np.float64(2.0), B=1.0)
    with pytest.raises(TypeError, match=r"needs the constants \['B'\]"):
        kc.instantiate(template, "scale_template.py", "scale_b", K=2.0)
    with pytest.raises(RuntimeError, match="is a kernel template"):
        kc.parameters("convengine.algorithms.blocked.rows_template", "MR")


def test_a_template_key_covers_the_modules_it_imports() -> None:
    text = (Path(kc.__file__).parent / "algorithms" / "winograd" / "fused_template.py").read_bytes()
    assert {"convengine.algorithms.fma", "convengine.algorithms.winograd.kernels"} <= set(
        kc._imported(text))


def test_warmup_compiles_without_tuning_unless_asked(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from convengine import registry
    from convengine.tune import tuner
    from test_tune_helpers import fast_registry, problem

    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    for pass_, table in fast_registry().items():
        monkeypatch.setitem(registry._REGISTRY, pass_, table)
    previous = ce.set_tuning("on")
    try:
        problems = [problem(p) for p in ("forward", "backward_data", "backward_weight")]
        done = ce.warmup(problems, int8=problems[:1], progress=False)
        assert [(w.problem, w.kind) for w in done] == [
            *((p, "float") for p in problems), (problems[0], "int8")]
        assert all(w.seconds > 0 for w in done)
        assert tuner.default_cache().entries() == [] and ce.get_tuning() == "on"
        ce.warmup(problems, tune=True, progress=False)
        assert len(tuner.default_cache().entries()) == 3
    finally:
        ce.set_tuning(previous)
    with pytest.raises(TypeError, match=r"problems\[0\] must be a ConvProblem"):
        ce.warmup(["resnet50"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"int8\[0\] must be a forward problem"):
        ce.warmup(int8=problems[1:])


@pytest.mark.slow
def test_warmup_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    from convengine import cli

    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    assert cli.main(["warmup", "--suite", "conv1d", "--batch", "1", "--dtype", "int8",
                     "--quiet", "--json", "-"]) == 0
    calls = json.loads(capsys.readouterr().out)["calls"]
    assert len(calls) == len(suite("conv1d")) and {c["kind"] for c in calls} == {"int8"}
    assert cli.main(["warmup", "--suite", "resnet50,nope"]) == 2
    assert "--suite: unknown value 'nope'" in capsys.readouterr().err
    assert cli.main(["warmup", "--dtype", "int4"]) == 2


def test_cached_code_for_another_signature_is_never_run(cache: Path) -> None:
    f = kc.load(_source(3)).scale
    f(np.arange(3.0))
    f(np.arange(3))  # a second overload: int64, its own data file
    data = sorted((cache / "__pycache__").glob("test_scale_*.nbc"))
    assert len(data) == 2
    first, second = data[0].read_bytes(), data[1].read_bytes()
    data[0].write_bytes(second)  # what two processes saving at once can leave
    data[1].write_bytes(first)
    kc._LOADED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = kc.load(_source(3)).scale
        np.testing.assert_array_equal(g(np.arange(3.0)), [1.0, 4.0, 7.0])
        np.testing.assert_array_equal(g(np.arange(3)), [1.0, 4.0, 7.0])
    assert any("is for" in str(w.message) for w in caught)


def test_import_compiles_nothing() -> None:
    code = ("import numba\nfrom numba.core import event\n"
            "with event.install_recorder('numba:compile') as rec:\n    import convengine\n"
            "print(len(rec.buffer))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert res.stdout.split() == ["0"], res.stderr


# ------------------------------------------- module kernels (@kernel): the cache's key


def test_module_kernels_cover_the_code_they_inline() -> None:
    from convengine.quant.dense import kernels
    from convengine.quant.depthwise import kernels as depthwise

    mods, partial = kc._code_modules("convengine.quant.dense.kernels")
    assert not partial
    assert {"convengine.quant._ir", "convengine.quant.dense.vnni",
            "convengine.quant.dense.avx2", "convengine.quant.dense.amx"} <= set(mods)
    for module in mods:  # transitively: what those inline in turn
        assert set(kc._code_modules(module)[0]) <= set(mods)
    # depthwise.avx2 does not import quant._ir; depthwise.kernels, whose code it inlines, does
    assert "_ir" not in vars(importlib.import_module("convengine.quant.depthwise.avx2"))
    assert "convengine.quant._ir" in kc._code_modules("convengine.quant.depthwise.avx2")[0]
    for fn in (kernels.conv_vnni, kernels.conv_avx2, kernels.conv_portable,
               depthwise.conv_depthwise):
        assert isinstance(fn._cache, kc._ModuleCache)


def test_the_source_digest_is_computed_once_per_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kc, "_SOURCE_DIGESTS", {})
    calls: list[str] = []
    real = kc._code_modules
    monkeypatch.setattr(kc, "_code_modules", lambda home: calls.append(home) or real(home))
    first = kc.source_digest("convengine.quant.depthwise.kernels")
    assert all(kc.source_digest("convengine.quant.depthwise.kernels") == first for _ in range(3))
    assert calls == ["convengine.quant.depthwise.kernels"]


PROBE = '''
def twice(a):
    return a * 2.0
'''


def _twice(module: Any) -> tuple[int, int]:
    """(cache hits, cache misses) of a fresh @kernel dispatcher of module.twice."""
    dispatcher = kc.kernel(nogil=True)(module.twice)
    np.testing.assert_array_equal(dispatcher(np.arange(3.0)), [0.0, 2.0, 4.0])
    return sum(dispatcher.stats.cache_hits.values()), sum(dispatcher.stats.cache_misses.values())


def test_module_kernels_miss_after_an_inlined_edit_or_another_isa(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest of the inlined sources and the ISA level are in the key: a changed
    digest (an edited intrinsic) or level compiles; the same loads."""
    from convengine import _host

    (tmp_path / "ce_probe_kernels.py").write_text(PROBE)
    monkeypatch.setenv("CONVENGINE_KERNEL_DIR", str(tmp_path / "kernels"))  # numba's files
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ce_probe_kernels", raising=False)  # gone after
    module = importlib.import_module("ce_probe_kernels")
    monkeypatch.setattr(kc, "_SOURCE_DIGESTS", {})
    assert _twice(module) == (0, 1)
    assert _twice(module) == (1, 0)
    kc._SOURCE_DIGESTS["ce_probe_kernels"] = "an inlined file was edited"
    assert _twice(module) == (0, 1)
    assert _twice(module) == (1, 0)
    level = _host.ISA
    monkeypatch.setattr(_host, "ISA", "none" if level != "none" else "avx2")
    assert _twice(module) == (0, 1)
    monkeypatch.setattr(_host, "ISA", level)  # the first level's entry is still there
    assert _twice(module) == (1, 0)


def _padded16(src: Path, numba_dir: Path, isa: str | None = None) -> tuple[int, int]:
    """In a fresh process importing convengine from ``src``: (hits, misses) of
    quant.depthwise.kernels._padded16, a @kernel function of a module that inlines intrinsics."""
    code = textwrap.dedent("""
        import numpy as np, convengine
        from convengine.quant.depthwise.kernels import _padded16
        assert convengine.__file__.startswith({src!r}), convengine.__file__
        assert list(_padded16(np.arange(1, 4, dtype=np.int32), 16)[:5]) == [1, 2, 3, 0, 0]
        print(sum(_padded16.stats.cache_hits.values()), sum(_padded16.stats.cache_misses.values()))
    """).format(src=str(src))
    env = {**os.environ, "PYTHONPATH": str(src.parent), "CONVENGINE_KERNEL_DIR": str(numba_dir)}
    env.pop("CONVENGINE_ISA", None)
    if isa:
        env["CONVENGINE_ISA"] = isa
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=src.parent.parent,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    hits, misses = map(int, res.stdout.split()[-2:])
    return hits, misses


@pytest.mark.slow
def test_an_edited_intrinsic_is_never_loaded_stale(tmp_path: Path) -> None:
    """A copy of convengine's source: editing a file that quant.depthwise.kernels inlines only
    through quant._ir (an algorithms module) compiles again; editing a file it does
    not inline (cli.py) loads; the AVX2 level has its own entry beside the default."""
    from convengine import _host

    package = Path(ce.__file__).parent
    src = tmp_path / "src" / "convengine"
    shutil.copytree(package, src, ignore=shutil.ignore_patterns("__pycache__"))
    numba_dir = tmp_path / "numba"
    inlined = [m for m in kc._code_modules("convengine.quant.depthwise.kernels")[0]
               if m.startswith("convengine.algorithms.")]
    assert inlined
    edited = src / Path(sys.modules[inlined[0]].__file__).relative_to(package)  # type: ignore[arg-type]

    assert _padded16(src, numba_dir) == (0, 1)
    assert _padded16(src, numba_dir) == (1, 0)
    edited.write_text(edited.read_text() + "\n# an edit\n")
    assert _padded16(src, numba_dir) == (0, 1)
    assert _padded16(src, numba_dir) == (1, 0)
    (src / "cli.py").write_text((src / "cli.py").read_text() + "\n# an edit\n")
    assert _padded16(src, numba_dir) == (1, 0)
    if _host.ISA_LEVELS.index(_host.CPU_ISA) > _host.ISA_LEVELS.index("avx2"):
        assert _padded16(src, numba_dir, "avx2") == (0, 1)
        assert _padded16(src, numba_dir, "avx2") == (1, 0)
        assert _padded16(src, numba_dir) == (1, 0)
