"""The on-disk cache of generated kernels.

Kernels generated per shape (depthwise, Winograd, blocked, ...) are written out as
Python modules under ``<cache dir>/kernels/`` (the tuning cache's directory,
``$CONVENGINE_CACHE_DIR``), one file per kernel, named by a hash of everything that
changes its machine code: the generated source, convengine's version and the source
files of the code it calls, numba's and llvmlite's versions, the CPU's name and features.
The file is imported and its functions compiled with numba's on-disk cache (in the
``__pycache__`` next to it), so a later process loads machine code instead of
compiling.

- A stale entry is never loaded: anything that would change the code changes the name.
- A corrupt or unreadable entry (a module file whose text is not what its name says,
  a numba index or data file that does not unpickle) is compiled again, with one
  :class:`KernelCacheWarning` per entry.
- Several processes filling the cache at once: a module file appears whole (written
  to a temporary name, then linked into place; the first writer wins), numba writes
  its own files the same way.
- A read-only cache is read (numba's files too); what cannot be written there is
  compiled in a private temporary directory instead.
- Cached code whose signature is not the one asked for (two processes saving
  overloads of one function at once can leave numba's index naming the other's
  data file) is never run: it is compiled again, with one warning.

Kernels written as ordinary functions in convengine's modules are compiled with
:func:`kernel` (``@kernel(parallel=True)`` for ``@njit(parallel=True, cache=True)``):
numba's on-disk cache, in ``<kernel dir>/modules/<module>-<digest>/`` where the digest
covers every source file the module's kernels can inline (its own, and those of the
intrinsics and jitted functions it calls, transitively), not only the function's own
file; each entry is keyed also on the instruction-set level (``_host.ISA``) and
checked mode (``checked.CHECKED``), so that processes run with and without
``CONVENGINE_ISA`` or ``CONVENGINE_CHECKED`` share one cache without loading each
other's code.

Every key names the CPU compiled for (numba's own index: the CPU name and features),
which is the host unless a portable target is set (``_targets``): then the kernel
directory is ``<kernel dir>/<target>``, seeded on first use with the kernels shipped
for that target (:func:`_seed`: each file checked against the shipped manifest's
hash; a damaged one is left out, and compiled, with one warning).

Kernels whose code depends on compile-time constants (tile shapes, kernel sizes) are
written as *templates*: ordinary module files (``*_template.py``, beside the family
module that uses them) that read their constants at the top with :func:`parameters`
and compile their functions with :func:`compiled`. :func:`instantiate` makes one kernel
module per set of constants from the template's text, verbatim (what runs is what one
reads, line for line; a traceback names the template's tag and line).

Code that is generated (scalar tails of a transform, kernels unrolled per tap) is
described by a :class:`Source`, the one generator: values and expressions bound to
names, generated function definitions, in the globals of the module that generated
it; its text is a readable module in the cache directory.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numba
from numba.core import caching

from . import (
    _compile_log,  # noqa: F401  (logs slow compilations)
    _host,
    _targets,
    checked,
    config,
)
from ._version import __version__

logger = logging.getLogger("convengine")

SUBDIR = "kernels"
KERNEL_DIR_VARIABLE = "CONVENGINE_KERNEL_DIR"
MODULE_PREFIX = _compile_log.MODULE_PREFIX
_LITERALS = (int, float, bool, str)
_KERNEL_CODE = ("convengine.algorithms.", "convengine.quant.", "convengine.epilogue_codes")


class KernelCacheWarning(UserWarning):
    """A cached kernel could not be used; it is compiled again."""


def kernel_dir() -> Path:
    """``<cache dir>/kernels`` (``CONVENGINE_CACHE_DIR`` moves it, as for tuning), or
    ``$CONVENGINE_KERNEL_DIR`` (the test suite keeps a private tuning cache, but
    compiled kernels across runs); in a process compiling for a portable target
    (``_targets``), its folder ``<target name>`` there."""
    own = os.environ.get(KERNEL_DIR_VARIABLE)
    root = Path(own).expanduser() if own else config.cache_dir() / SUBDIR
    return root if _targets.ACTIVE is None else root / _targets.ACTIVE.name


def _kernel_home() -> Path:
    """:func:`kernel_dir`, where kernels are loaded from and saved to: seeded with the
    active target's shipped kernels on first use in the process (:func:`_seed`)."""
    root = kernel_dir()
    if _targets.SHIPPED is not None and root not in _SEEDED:
        with _LOCK:
            if root not in _SEEDED:
                _seed(root)
                _SEEDED.add(root)
    return root


# ---------------------------------------------------------------- the key


_FINGERPRINTS: dict[str, str] = {}
_SOURCE_DIGESTS: dict[str, str] = {}


def _code_modules(home: str) -> tuple[list[str], bool]:
    """``home`` and the convengine modules whose code its kernels can call, transitively:
    those holding its jitted functions or intrinsics, and any function or module of
    kernel code (``convengine.algorithms``, ``convengine.quant``: intrinsic
    factories), not the Python code around them. Also whether one of them is still
    being imported (its globals, hence the list, may be incomplete)."""
    names: set[str] = set()
    todo = [home]
    partial = False
    while todo:
        name = todo.pop()
        if name in names:
            continue
        names.add(name)
        module = importlib.import_module(name)
        partial |= bool(getattr(module.__spec__, "_initializing", False))
        for value in vars(module).values():
            if isinstance(value, ModuleType):
                if value.__name__.startswith(_KERNEL_CODE):
                    todo.append(value.__name__)
                continue
            if not callable(value):
                continue
            compiled = getattr(value, "py_func", None) or getattr(value, "_defn", None)
            owner = getattr(compiled or value, "__module__", None)
            if not isinstance(owner, str) or not owner.startswith("convengine."):
                continue
            if compiled is not None or owner.startswith(_KERNEL_CODE):
                todo.append(owner)
    return sorted(names), partial


def source_digest(home: str) -> str:
    """A hash of the source files of the code module ``home``'s kernels can call (see
    _code_modules) and of this file; computed once per module and process (not
    kept while one of those modules is still being imported)."""
    if home in _SOURCE_DIGESTS:
        return _SOURCE_DIGESTS[home]
    names, partial = _code_modules(home)
    files = {Path(str(getattr(sys.modules[n], "__file__", ""))) for n in names}
    h = hashlib.sha256()
    for path in sorted(f for f in {*files, Path(__file__)} if f.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    digest = h.hexdigest()
    if not partial:
        _SOURCE_DIGESTS[home] = digest
    return digest


def compile_target() -> tuple[str, str]:
    """The CPU name and feature string numba compiles for: ``$NUMBA_CPU_NAME`` /
    ``$NUMBA_CPU_FEATURES`` (a portable target, see _targets) where set, else the
    host's."""
    from llvmlite import binding
    from numba.core import config as numba_config

    name = getattr(numba_config, "CPU_NAME", None) or binding.get_host_cpu_name()
    features = getattr(numba_config, "CPU_FEATURES", None)
    if features is None:
        features = binding.get_host_cpu_features().flatten()
    return name, features


def fingerprint(home: str) -> str:
    """What the name of a kernel generated by module ``home`` depends on besides its
    source: convengine's, numba's, llvmlite's and Python's versions, the CPU name and
    features compiled for, the instruction-set level, checked mode, and the source
    files of the code the kernel calls (source_digest). Not the host's cache sizes:
    kernels take the values derived from them (``host_params``) as arguments or in
    their Python drivers, never as compile-time constants, so that one kernel serves
    every host of a target."""
    if home in _FINGERPRINTS:
        return _FINGERPRINTS[home]
    import llvmlite

    h = hashlib.sha256()
    for part in (__version__, numba.__version__, llvmlite.__version__, *compile_target(),
                 _host.ISA, f"checked={checked.CHECKED}", sys.version, source_digest(home)):
        h.update(part.encode() + b"\0")
    if home in _SOURCE_DIGESTS:  # not while a module it reads is half imported
        _FINGERPRINTS[home] = h.hexdigest()
    return h.hexdigest()


# ---------------------------------------------------------------- the source


class Source:
    """A kernel module's source. ``home``: the module whose globals the kernel code
    sees; ``tag``: a short readable name (``depthwise_3x3_s1``)."""

    def __init__(self, home: str, tag: str) -> None:
        if not re.fullmatch(r"\w+", tag):
            raise ValueError(f"tag must be letters, digits and underscores, got {tag!r}")
        self.tag = tag
        self.home = home
        self._names: set[str] = set()
        self._lines = [
            f"# convengine generated kernel {tag}: do not edit (named by its hash)",
            "from convengine import _kernel_cache as _kc",
            f"globals().update(_kc.home_globals({home!r}))",
            f"__kernel_tag__ = {tag!r}",
        ]

    def value(self, name: str, value: int | float | bool | str | tuple[Any, ...] | None) -> None:
        """``name = <value>`` (a literal)."""
        self.expr(name, repr(value))

    def expr(self, name: str, expression: str) -> None:
        """``name = <expression>``, evaluated in the kernel module (home's globals)."""
        self._lines.append(f"{name} = {expression}")
        self._names.add(name)

    def code(self, text: str, *names: str) -> None:
        """Source text defining ``names`` (e.g. generated function definitions)."""
        self._lines.append(text.rstrip("\n"))
        self._names.update(names)

    def jit(self, name: str, **jit: Any) -> None:
        """Compile the function ``name`` (defined already) with options ``jit``."""
        options = ", ".join(f"{k}={v!r}" for k, v in sorted(jit.items()))
        self._lines.append(f"{name} = _kc.jit({name}{', ' if options else ''}{options})")

    @property
    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def home_globals(module: str) -> dict[str, Any]:
    """The globals of ``module`` a kernel module takes over (not its dunders)."""
    return {k: v for k, v in vars(importlib.import_module(module)).items()
            if not k.startswith("__")}


# ---------------------------------------------------------------- numba's cache


class _Locator(caching.InTreeCacheLocator):
    """numba's files in ``__pycache__`` next to the kernel module, writable or not
    (a read-only cache is still read; saving there then fails quietly)."""

    def ensure_cache_path(self) -> None:
        os.makedirs(self.get_cache_path(), exist_ok=True)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> _Locator:
        return cls(py_func, py_file)


class _Impl(caching.CompileResultCacheImpl):
    _locator_classes = [_Locator]


class _RobustCache(caching.FunctionCache):
    """numba's function cache, which recompiles (one warning) instead of failing on an
    index or data file that does not load, and never fails on one it cannot save."""

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            cres = super().load_overload(sig, target_context)
        except Exception as exc:  # noqa: BLE001  (unpickling raises anything)
            _warn_once(self._cache_path, f"numba's cached code for {self._name} in "
                       f"{self._cache_path} does not load ({type(exc).__name__}: {exc}); "
                       "compiling it again")
            with contextlib.suppress(Exception):
                self.flush()
            return None
        if cres is not None and tuple(cres.signature.args) != tuple(sig):
            # two processes saving overloads of one function at once can leave the
            # index naming a data file the other one wrote: never run that code
            _warn_once(self._cache_path, f"numba's cached code for {self._name} in "
                       f"{self._cache_path} is for {cres.signature.args}, not {tuple(sig)}; "
                       "compiling it again")
            return None
        return cres

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            super().save_overload(sig, data)
        except Exception as exc:  # noqa: BLE001
            logger.debug("convengine: not saving %s to %s: %s", self._name,
                         self._cache_path, exc)


class _Cache(_RobustCache):
    """The cache of a kernel module's function (files next to the module, whose name
    covers what its code depends on); ``variant`` names one of several compilations
    of one function (``parallel``, ``serial``): its own index and data files."""

    _impl_class = _Impl  # type: ignore[assignment]

    def __init__(self, py_func: Any, variant: str = "") -> None:
        super().__init__(py_func)
        if variant:
            self._cache_file = caching.IndexDataCacheFile(
                self._cache_path, f"{self._impl.filename_base}-{variant}",
                self._impl.locator.get_source_stamp())


class _ModuleLocator(caching._CacheLocator):
    """numba's files for the functions of a convengine module, in
    ``<kernel dir>/modules/<module>-<digest>/``: the digest (source_digest, computed at
    the first load or save, once the modules are imported) covers every source file
    their code can inline, so the files need no time stamp of a source file and move
    with the kernel directory (shipped kernels, a copied cache)."""

    def __init__(self, py_func: Any) -> None:
        self._module = py_func.__module__
        self._lineno = py_func.__code__.co_firstlineno
        self._path: str | None = None

    def get_cache_path(self) -> str:
        if self._path is None:
            digest = source_digest(self._module)[:20]
            self._path = str(_kernel_home() / "modules" / f"{self._module}-{digest}")
        return self._path

    def ensure_cache_path(self) -> None:
        os.makedirs(self.get_cache_path(), exist_ok=True)

    def get_source_stamp(self) -> str:
        return "named by the source digest"

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> _ModuleLocator:
        return cls(py_func)


class _ModuleImpl(caching.CompileResultCacheImpl):
    _locator_classes = [_ModuleLocator]  # type: ignore[list-item]


class _ModuleCache(_RobustCache):
    """The cache of a function of a convengine source module (see _ModuleLocator),
    each entry keyed also on the instruction-set level and checked mode. Its folder
    and index file are made at the first load or save (numba's ``Cache.__init__``
    makes them at once, while the module is still being imported)."""

    _impl_class = _ModuleImpl  # type: ignore[assignment]

    def __init__(self, py_func: Any, variant: str = "") -> None:  # noqa: D107
        self._name = repr(py_func)
        self._py_func = py_func
        self._impl = self._impl_class(py_func)
        base = self._impl.filename_base
        self._base = f"{base}-{variant}" if variant else base
        self._file: Any = None
        self.enable()

    @property
    def _cache_path(self) -> str:
        return str(self._impl.locator.get_cache_path())

    @property
    def _cache_file(self) -> Any:
        if self._file is None:
            self._file = caching.IndexDataCacheFile(
                self._cache_path, self._base, self._impl.locator.get_source_stamp())
        return self._file

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        return (*super()._index_key(sig, codegen), _host.ISA, checked.CHECKED)


def jit(fn: Callable[..., Any], variant: str = "", **options: Any) -> Any:
    """``numba.njit(**options)(fn)`` with the kernel cache's on-disk cache (for the
    functions of kernel modules; ``variant``: see :class:`_Cache`)."""
    dispatcher = numba.njit(**_checked(options))(fn)
    dispatcher._cache = _Cache(fn, variant)
    return dispatcher


def _checked(options: dict[str, Any]) -> dict[str, Any]:
    """``options``, with numba's bounds check of every array index in checked mode."""
    return {"boundscheck": True, **options} if checked.CHECKED else options


def compiled(variant: str = "", **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@compiled(parallel=True)``: a template's function compiled with numba options
    ``options`` and cached beside its kernel module. ``compiled("serial", nogil=True)
    (fn)`` beside ``compiled("parallel", parallel=True)(fn)`` compiles one function
    twice, each with its own cache files."""
    return lambda fn: jit(fn, variant, **options)


def kernel(variant: str = "", **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@kernel(parallel=True)``: ``numba.njit(parallel=True, cache=True)`` for a
    function of a convengine module, with the cache described above (an edit to an
    intrinsic it inlines, or another ``CONVENGINE_ISA``, never loads stale code).
    ``variant``: one of several compilations of one function (``kernel("serial")
    (fn)`` beside ``kernel("parallel", parallel=True)(fn)``), each with its own files."""
    if "cache" in options:
        raise TypeError("kernel() caches always: drop cache=")

    def wrap(fn: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**_checked(options))(fn)
        dispatcher._cache = _ModuleCache(fn, variant)
        return dispatcher

    return wrap


# ---------------------------------------------------------------- the files


_LOCK = threading.RLock()
_WARNED: set[str] = set()
_SEEDED: set[Path] = set()  # kernel directories seeded (or found seeded) in this process
_LOADED: dict[str, ModuleType] = {}
_PRIVATE: list[Path] = []


def _warn_once(where: object, message: str) -> None:
    if str(where) in _WARNED:
        return
    _WARNED.add(str(where))
    warnings.warn(f"convengine: {message}", KernelCacheWarning, stacklevel=3)


def _private_dir() -> Path:
    """A temporary directory for this process, for kernels the cache cannot hold."""
    if not _PRIVATE:
        path = Path(tempfile.mkdtemp(prefix="convengine-kernels-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _PRIVATE.append(path)
    return _PRIVATE[0]


def _write(path: Path, data: bytes, replace: bool) -> None:
    """Write ``path`` whole: a temporary file linked into place (the first writer wins;
    ``replace``: renamed over what is there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if replace:
            os.replace(tmp, path)
            return
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def file_hashes(root: Path) -> dict[str, str]:
    """``{path relative to root: sha256}`` of every kernel file under ``root`` (what a
    shipped target's manifest lists; not temporary files or seeding markers)."""
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*"))
            if path.is_file() and not path.name.startswith(".")}


def _versions() -> dict[str, str]:
    import llvmlite

    return {"convengine": __version__, "numba": numba.__version__,
            "llvmlite": llvmlite.__version__}


def shipped_manifest(target: str, root: Path) -> dict[str, Any]:
    """The manifest of the kernels compiled into ``root`` for ``target``: the
    versions they are for and each file's hash."""
    return {"target": target, "python": _targets.python_version(), **_versions(),
            "files": file_hashes(root)}


def _safe_relative(name: object) -> bool:
    """A manifest's file name that stays inside the directory it is joined to."""
    if not isinstance(name, str) or not name:
        return False
    path = Path(name)
    return not path.is_absolute() and ".." not in path.parts


def _seed(root: Path) -> None:
    """Copy the shipped kernels of the active target (``_targets.SHIPPED``) into the
    kernel directory ``root``, once (a marker file, named by the manifest's hash, says
    it is done): each file ``root`` lacks, whose content has the manifest's hash (a
    damaged or missing one is left out, with one warning: its kernels compile). Shipped
    kernels for other versions of convengine, numba or llvmlite are not used (one
    warning). Nothing is copied where ``root`` cannot be written (they compile)."""
    shipped = _targets.SHIPPED
    manifest = _targets.manifest()
    if shipped is None:
        return
    wrong = {k: v for k, v in _versions().items() if manifest.get(k) != v}
    files = manifest.get("files")
    if wrong or not isinstance(files, dict):
        _targets.drop(f"built for {', '.join(f'{k} {manifest.get(k)}' for k in wrong)}"
                      if wrong else "its manifest lists no files")
        return
    marker = root / f".seeded-{hashlib.sha256(repr(manifest).encode()).hexdigest()[:16]}"
    if marker.exists():
        return
    bad = []
    try:
        for name, digest in files.items():
            if not _safe_relative(name):
                bad.append(str(name))
                continue
            dest = root / name
            if dest.exists():
                continue
            try:
                data = (shipped / name).read_bytes()
            except OSError:
                bad.append(name)
                continue
            if hashlib.sha256(data).hexdigest() != digest:
                bad.append(name)
                continue
            _write(dest, data, replace=False)
        root.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError as exc:  # a read-only or full cache: compile (privately if need be)
        logger.debug("convengine: cannot copy the shipped kernels into %s (%s)", root, exc)
        return
    if bad:
        _warn_once(shipped, f"{len(bad)} of the shipped kernel files in {shipped} are "
                   f"damaged or missing (the first: {bad[0]}); their kernels are "
                   "compiled instead")


def _place(name: str, data: bytes) -> Path:
    """The path of a module file holding exactly ``data``: in the cache if it is (or
    can be made) right there, else in the private directory."""
    path = _kernel_home() / name
    try:
        if path.read_bytes() == data:
            return path
        _warn_once(path, f"the cached kernel {path} is corrupt (its text is not what its "
                   "name says); compiling it again")
        _write(path, data, replace=True)
        return path
    except FileNotFoundError:
        pass
    except OSError as exc:  # unreadable, a directory, ...
        _warn_once(path, f"the cached kernel {path} cannot be read ({exc}); compiling it "
                   "again in a temporary directory")
        return _private(name, data)
    try:
        _write(path, data, replace=False)
        if path.read_bytes() == data:
            return path
    except OSError as exc:
        logger.debug("convengine: cannot write %s (%s); compiling in a temporary "
                     "directory", path, exc)
    return _private(name, data)


def _private(name: str, data: bytes) -> Path:
    path = _private_dir() / name
    _write(path, data, replace=True)
    return path


def load(source: Source) -> ModuleType:
    """The kernel module for ``source``, written to the cache (if not there yet) and
    imported; its jitted functions load their machine code from numba's cache."""
    return _import(source.tag, source.text.encode(), source.home, b"", {})


_PARAMETERS: dict[str, dict[str, Any]] = {}  # kernel module name -> its template's constants


def instantiate(home: str, template: str, tag: str, **constants: Any) -> ModuleType:
    """The kernel module made of the template file ``template`` (a file name in the
    package of the module ``home``, whose kernels' sources the cache key covers)
    for ``constants`` (ints, floats, bools, strings, tuples of them: what the template
    reads with :func:`parameters`), imported under a name covering the text, the
    constants and home's fingerprint. A template imports absolutely
    (``from convengine.algorithms.fma import splat``)."""
    for key, value in constants.items():
        if not _literal(value):
            raise TypeError(f"{key}: a template constant must be a literal, got "
                            f"{type(value).__name__}")
    text = (Path(str(importlib.import_module(home).__file__)).parent / template).read_bytes()
    salt = repr(sorted(constants.items())).encode()
    for module in _imported(text):  # and what they inline, transitively
        salt += source_digest(module).encode()
    return _import(tag, text, home, salt, constants)


@functools.cache
def _imported(text: bytes) -> tuple[str, ...]:
    """The convengine modules a template imports from (parsed once per text: a template
    serves several kernels)."""
    return tuple(sorted({node.module for node in ast.walk(ast.parse(text))
                         if isinstance(node, ast.ImportFrom) and node.module
                         and node.module.startswith("convengine.")}))


def _literal(value: object) -> bool:
    if isinstance(value, tuple):
        return all(_literal(v) for v in value)
    return type(value) in _LITERALS


def parameters(module: str, *names: str) -> tuple[Any, ...]:
    """In a template, its constants ``names`` (``MR, NR = parameters(__name__, "MR",
    "NR")``). RuntimeError if ``module`` is not a kernel module made by
    :func:`instantiate` (a template is not imported directly)."""
    try:
        given = _PARAMETERS[module]
    except KeyError:
        raise RuntimeError(f"{module} is a kernel template: convengine._kernel_cache."
                           "instantiate compiles it for its constants") from None
    missing = [n for n in names if n not in given]
    if missing:
        raise TypeError(f"{module} needs the constants {missing}; given {sorted(given)}")
    return tuple(given[n] for n in names)


def _import(tag: str, data: bytes, home: str, salt: bytes,
            constants: dict[str, Any]) -> ModuleType:
    """Import ``data`` as the kernel module ``<tag>_<hash>`` (once per process)."""
    digest = hashlib.sha256(data + salt + fingerprint(home).encode()).hexdigest()[:24]
    name = f"{tag}_{digest}"
    with _LOCK:
        if name in _LOADED:
            return _LOADED[name]
        path = _place(f"{name}.py", data)
        spec = importlib.util.spec_from_file_location(MODULE_PREFIX + name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        _PARAMETERS[spec.name] = constants
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[spec.name]
            raise
        _LOADED[name] = module
        return module


def describe_target() -> str:
    """What the kernels are compiled for, in words: a portable target (and where its
    shipped kernels come from), or this CPU."""
    name, features = compile_target()
    target = _targets.ACTIVE
    if target is None:
        return f"this CPU ({name})"
    shipped = f"shipped kernels from {_targets.SHIPPED}" if _targets.SHIPPED else "no shipped kernels"
    return f"{target.name} (LLVM {name} {features}; {shipped})"


def count() -> int:
    """How many kernel modules the cache holds."""
    return len(list(kernel_dir().glob("*.py")))


def clear() -> str:
    """Remove every cached kernel (processes running keep what they loaded); one line
    saying what was done. OSError with a clear message if it cannot."""
    path = kernel_dir()
    if not path.exists():
        return "the kernel cache is empty"
    if not path.is_dir():
        raise OSError(f"{path} is not a directory of compiled kernels: remove it or point "
                      "CONVENGINE_CACHE_DIR elsewhere")
    n = count()
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise OSError(f"cannot remove the compiled kernels in {path} ({exc})") from None
    return f"removed {n} compiled kernels from {path}"
