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
on the instruction-set level (``_host.ISA``), the cache-derived parameters
(``host_params.key()``) and checked mode (``checked.CHECKED``), so that processes run
with and without ``CONVENGINE_ISA`` or ``CONVENGINE_CHECKED`` share one cache without
loading each other's code.

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
    checked,
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
    and features, the instruction-set level, checked mode, and the source files of the
    code the kernel calls (source_digest)."""
    if home in _FINGERPRINTS:
        return _FINGERPRINTS[home]
    import llvmlite
    from llvmlite import binding

    h = hashlib.sha256()
    for part in (__version__, numba.__version__, llvmlite.__version__,
                 binding.get_host_cpu_name(), binding.get_host_cpu_features().flatten(),
                 _host.ISA, host_params.key(), f"checked={checked.CHECKED}", sys.version,
                 source_digest(home)):
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
    entry keyed also on the instruction-set level and checked mode."""

    def __init__(self, py_func: Any, variant: str = "") -> None:
        super().__init__(py_func)
        own = self._cache_file._source_stamp
        base = f"{self._impl.filename_base}-{variant}" if variant else self._impl.filename_base
        self._cache_file = _IndexFile(self._cache_path, base, own, py_func.__module__)

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        return (*super()._index_key(sig, codegen), _host.ISA, host_params.key(),
                checked.CHECKED)


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


def _imported(text: bytes) -> list[str]:
    """The convengine modules a template imports from."""
    return sorted({node.module for node in ast.walk(ast.parse(text))
                   if isinstance(node, ast.ImportFrom) and node.module
                   and node.module.startswith("convengine.")})


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
