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
numba's on-disk cache in numba's places (``__pycache__`` next to the source,
``NUMBA_CACHE_DIR``), but its index is reset when any source file the module's kernels
can inline changes (its own, and those of the intrinsics and jitted functions it
calls, transitively), not only the function's own file, and each entry is keyed also
on the instruction-set level (``_host.ISA``) and the cache-derived parameters
(``host_params.key()``), so that processes run with and without
``CONVENGINE_ISA`` share one cache without loading each other's code.

A :class:`Source` describes one kernel module: the globals of the module that
generated it (its helpers and constants), values and expressions bound to names, and
function definitions, taken from the generator's own (nested) functions by their
source text, so that closures become module functions over those names.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import shutil
import sys
import tempfile
import textwrap
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
    config,
    host_params,
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
    compiled kernels across runs)."""
    own = os.environ.get(KERNEL_DIR_VARIABLE)
    return Path(own).expanduser() if own else config.cache_dir() / SUBDIR


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


def fingerprint(home: str) -> str:
    """What the name of a kernel generated by module ``home`` depends on besides its
    source: convengine's, numba's, llvmlite's and Python's versions, the CPU's name
    and features, the instruction-set level, and the source files of the code the
    kernel calls (source_digest)."""
    if home in _FINGERPRINTS:
        return _FINGERPRINTS[home]
    import llvmlite
    from llvmlite import binding

    h = hashlib.sha256()
    for part in (__version__, numba.__version__, llvmlite.__version__,
                 binding.get_host_cpu_name(), binding.get_host_cpu_features().flatten(),
                 _host.ISA, host_params.key(), sys.version, source_digest(home)):
        h.update(part.encode() + b"\0")
    if home in _SOURCE_DIGESTS:  # not while a module it reads is half imported
        _FINGERPRINTS[home] = h.hexdigest()
    return h.hexdigest()


# ---------------------------------------------------------------- the source


def _function_source(fn: Callable[..., Any], name: str) -> str:
    """``fn``'s definition, dedented, decorators dropped, renamed ``name``."""
    text = textwrap.dedent(inspect.getsource(fn))
    start = re.search(r"^def ", text, re.MULTILINE)
    if start is None:
        raise ValueError(f"fn: {fn.__qualname__} is not a def statement")
    return re.sub(r"^def \w+\(", f"def {name}(", text[start.start():], count=1)


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

    def function(self, fn: Callable[..., Any], name: str | None = None, **jit: Any) -> None:
        """``fn``'s definition, compiled with numba options ``jit`` and the on-disk
        cache. Its closure's ints, floats, bools and strings are bound as literals;
        its other free names must be bound already."""
        name = name or fn.__name__
        cells = zip(fn.__code__.co_freevars, fn.__closure__ or ())
        for var, cell in cells:
            if var not in self._names and type(cell.cell_contents) in _LITERALS:
                self.value(var, cell.cell_contents)
        missing = set(fn.__code__.co_freevars) - self._names
        if missing:
            raise ValueError(f"fn: {fn.__qualname__} needs {sorted(missing)} bound first")
        self.code(_function_source(fn, name), name)
        self.jit(name, **jit)

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
    """The cache of a generated kernel module's function (files next to the module,
    whose name covers what its code depends on)."""

    _impl_class = _Impl  # type: ignore[assignment]


class _IndexFile(caching.IndexDataCacheFile):
    """numba's index file, stamped with the function's own file's stamp and the
    source digest of its module (computed at the first load or save, once per module
    and process): an edit to any of those files makes the index fresh."""

    def __init__(self, cache_path: str, filename_base: str, source_stamp: Any,
                 module: str) -> None:
        self._module = module
        super().__init__(cache_path, filename_base, source_stamp)

    @property
    def _source_stamp(self) -> Any:
        return self._own_stamp, source_digest(self._module)

    @_source_stamp.setter
    def _source_stamp(self, value: Any) -> None:
        self._own_stamp = value


class _ModuleCache(_RobustCache):
    """The cache of a function of a convengine source module: numba's files and
    places, the index reset by an edit to any file its kernels inline, and each
    entry keyed also on the instruction-set level."""

    def __init__(self, py_func: Any) -> None:
        super().__init__(py_func)
        own = self._cache_file._source_stamp
        self._cache_file = _IndexFile(self._cache_path, self._impl.filename_base, own,
                                      py_func.__module__)

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        return (*super()._index_key(sig, codegen), _host.ISA, host_params.key())


def jit(fn: Callable[..., Any], **options: Any) -> Any:
    """``numba.njit(**options)(fn)`` with the kernel cache's on-disk cache (for the
    functions of generated kernel modules)."""
    dispatcher = numba.njit(**options)(fn)
    dispatcher._cache = _Cache(fn)
    return dispatcher


def kernel(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@kernel(parallel=True)``: ``numba.njit(parallel=True, cache=True)`` for a
    function of a convengine module, with the cache described above (an edit to an
    intrinsic it inlines, or another ``CONVENGINE_ISA``, never loads stale code)."""
    if "cache" in options:
        raise TypeError("kernel() caches always: drop cache=")

    def wrap(fn: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**options)(fn)
        dispatcher._cache = _ModuleCache(fn)
        return dispatcher

    return wrap


# ---------------------------------------------------------------- the files


_LOCK = threading.RLock()
_WARNED: set[str] = set()
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


def _place(name: str, data: bytes) -> Path:
    """The path of a module file holding exactly ``data``: in the cache if it is (or
    can be made) right there, else in the private directory."""
    path = kernel_dir() / name
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
    data = source.text.encode()
    digest = hashlib.sha256(data + fingerprint(source.home).encode()).hexdigest()[:24]
    name = f"{source.tag}_{digest}"
    with _LOCK:
        if name in _LOADED:
            return _LOADED[name]
        path = _place(f"{name}.py", data)
        spec = importlib.util.spec_from_file_location(MODULE_PREFIX + name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[spec.name]
            raise
        _LOADED[name] = module
        return module


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
