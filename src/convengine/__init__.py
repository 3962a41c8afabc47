"""convengine: a convolution engine for Python (N-d conv, its gradients, int8).

The public API is re-exported here; see the README for the tables.

``import convengine`` is quick: it imports neither numba nor any kernel (numba only
where ``$CONVENGINE_ISA`` asks for a level: see ``_host``). The public names load on
first use (PEP 562): the first access to any of them imports the whole API, every
algorithm registered first, as the eager import did (``config``, a module, imports only
itself). ``convengine.tune`` and ``convengine.warmup`` are always the functions, also
after ``import convengine.tune`` / ``convengine.warmup``, the submodules of those names
(convengine's own modules import from the submodules, never these names).
"""

from __future__ import annotations

import importlib as _importlib
import os as _os
import sys as _sys
import threading as _threading
import types as _types
from typing import TYPE_CHECKING

from . import _targets  # noqa: F401  (first: it must run before numba compiles anything)
from ._targets import ShippedKernelWarning
from ._version import __version__
from .errors import ConvSetupError

if _os.environ.get("CONVENGINE_ISA", "").strip():
    # a level asked for: refused here if unknown or above the CPU's, and numba's LLVM
    # target lowered to it before numba compiles anything (see _host)
    from . import _host  # noqa: F401

if TYPE_CHECKING:
    from typing import Any

    from . import config
    from ._kernel_cache import KernelCacheWarning
    from .api import conv, conv_backward_data, conv_backward_weight, conv_transpose, explain, qconv
    from .exactness import allow_inexact, inexact_allowed
    from .graph import Graph, Plan, PlanCache
    from .prepared import PreparedConv
    from .problem import ConvProblem
    from .quant import dequantize, quantize, quantize_per_channel, requantize
    from .registry import algorithms as list_algorithms
    from .select import Explanation
    from .threads import get_num_threads, set_num_threads
    from .tune import TuneResult, TuningCacheWarning, get_tuning, set_tuning, tune
    from .warmup import warmup

__all__ = [
    "ConvProblem",
    "ConvSetupError",
    "Explanation",
    "Graph",
    "KernelCacheWarning",
    "Plan",
    "PlanCache",
    "PreparedConv",
    "ShippedKernelWarning",
    "TuneResult",
    "TuningCacheWarning",
    "__version__",
    "config",
    "allow_inexact",
    "conv",
    "conv_backward_data",
    "conv_backward_weight",
    "conv_transpose",
    "dequantize",
    "explain",
    "get_num_threads",
    "get_tuning",
    "inexact_allowed",
    "list_algorithms",
    "qconv",
    "quantize",
    "quantize_per_channel",
    "requantize",
    "set_num_threads",
    "set_tuning",
    "tune",
    "warmup",
]

# The public names loaded on first use: name -> (submodule, its attribute; "" for the
# submodule itself), imported in this order after ``algorithms`` (the same imports as
# the ``TYPE_CHECKING`` block above).
_LAZY: dict[str, tuple[str, str]] = {
    "config": ("config", ""),
    "KernelCacheWarning": ("_kernel_cache", "KernelCacheWarning"),
    **{n: ("api", n) for n in ("conv", "conv_backward_data", "conv_backward_weight",
                               "conv_transpose", "explain", "qconv")},
    **{n: ("exactness", n) for n in ("allow_inexact", "inexact_allowed")},
    **{n: ("graph", n) for n in ("Graph", "Plan", "PlanCache")},
    "PreparedConv": ("prepared", "PreparedConv"),
    "ConvProblem": ("problem", "ConvProblem"),
    **{n: ("quant", n) for n in ("dequantize", "quantize", "quantize_per_channel", "requantize")},
    "list_algorithms": ("registry", "algorithms"),
    "Explanation": ("select", "Explanation"),
    **{n: ("threads", n) for n in ("get_num_threads", "set_num_threads")},
    **{n: ("tune", n) for n in ("TuneResult", "TuningCacheWarning", "get_tuning", "set_tuning",
                                "tune")},
    "warmup": ("warmup", "warmup"),
}

_api_lock = _threading.RLock()
_api_loaded = False
_api_loading = False


def _load_api() -> bool:
    """Import the public API once (``algorithms`` first: it registers every algorithm)
    and bind its names here. False when called back by those imports themselves (in
    this thread), which then take the submodule of a name, as the import system does
    for an attribute the package lacks; another thread waits for the first."""
    global _api_loaded, _api_loading
    if _api_loaded:
        return True
    with _api_lock:
        if _api_loaded:
            return True
        if _api_loading:
            return False
        _api_loading = True
        try:
            _importlib.import_module(f"{__name__}.algorithms")
            namespace = globals()
            for name, (module_name, attribute) in _LAZY.items():
                module = _importlib.import_module(f"{__name__}.{module_name}")
                # setdefault: a value assigned before (the config module, or the user's)
                namespace.setdefault(name, getattr(module, attribute) if attribute else module)
            _api_loaded = True
        finally:
            _api_loading = False
    return True


def __getattr__(name: str) -> Any:
    if name == "config":  # a module: the modules of convengine import it (`from . import config`)
        return _importlib.import_module(f"{__name__}.config")
    if name in _LAZY and _load_api():
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _function(name: str) -> property:
    """``convengine.<name>``: the function of the public API, never the submodule of the
    same name that the import system assigns to the package on importing it."""

    def get(package: _types.ModuleType) -> Any:
        if name not in package.__dict__ and not _load_api():
            raise AttributeError(name)  # called back while loading: the submodule
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {package.__name__!r} has no attribute {name!r}") from None

    def set_(package: _types.ModuleType, value: object) -> None:
        if isinstance(value, _types.ModuleType) and value.__name__ == f"{package.__name__}.{name}":
            return  # the import system binding the submodule: the function stays
        package.__dict__[name] = value

    def delete(package: _types.ModuleType) -> None:
        package.__dict__.pop(name, None)

    return property(get, set_, delete, doc=f"the function ``{name}`` (not the submodule)")


class _Package(_types.ModuleType):
    """convengine's module type: ``tune`` and ``warmup`` are always the functions."""

    tune = _function("tune")
    warmup = _function("warmup")


_sys.modules[__name__].__class__ = _Package
