"""The "slow because compiling" log line.

A numba compilation of a convengine kernel (outermost, per thread) that takes more
than SLOW_COMPILE_S logs one line on the ``convengine`` logger (INFO), naming the
kernel and the time, and whether it is now cached on disk. Loads from the on-disk
cache are not compilations: later calls and later processes log nothing.
"""

from __future__ import annotations

import logging
import threading
import time

from numba.core import caching, event

logger = logging.getLogger("convengine")

SLOW_COMPILE_S = 2.0
MODULE_PREFIX = "_convengine_kernel_"  # generated kernel modules (see _kernel_cache)


class _SlowCompileListener(event.Listener):
    """Logs one line for each convengine kernel whose compilation (outermost, per
    thread) took more than SLOW_COMPILE_S."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _stack(self) -> list[float]:
        if not hasattr(self._local, "starts"):
            self._local.starts = []
        stack: list[float] = self._local.starts
        return stack

    def on_start(self, ev: event.Event) -> None:
        self._stack().append(time.perf_counter())

    def on_end(self, ev: event.Event) -> None:
        stack = self._stack()
        if not stack:
            return
        elapsed = time.perf_counter() - stack.pop()
        if stack or elapsed < SLOW_COMPILE_S:
            return
        dispatcher = (ev.data or {}).get("dispatcher")
        fn = getattr(dispatcher, "py_func", None)
        module = getattr(fn, "__module__", None) or ""
        if not module.startswith(("convengine", MODULE_PREFIX)):
            return
        what = getattr(fn, "__globals__", {}).get("__kernel_tag__", module)
        cached = not isinstance(getattr(dispatcher, "_cache", None), caching.NullCache)
        logger.info("convengine: compiling %s (%s) took %.1f s, on its first call in this "
                    "process%s", getattr(fn, "__qualname__", "?"), what, elapsed,
                    "; cached on disk for later processes (`convengine warmup` compiles "
                    "ahead of time)" if cached else "")


_LISTENER = _SlowCompileListener()
event.register("numba:compile", _LISTENER)

