"""A bounded LRU of arrays derived from weights (Winograd's transforms, ``blocked``'s
packed panels), matched bit-exactly on the weights: a model calls its convs with the
same weights again and again, and deriving them anew each call costs a copy or more.
Weights changed in place (a training step) miss, at the cost of comparing a few
hundred words. A caller that knows its weights change on every call (a framework
seeing a parameter's version move between training steps) says so with
``with transient(True):``: what is derived then is not stored (no copy of the
weights, no entry pushing others out).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .._kernel_cache import kernel
from ..finite import nonfinite

_local = threading.local()  # .transient: the calling thread's weights change each call


class transient:  # noqa: N801 - used as a context manager, like a function
    """``with transient(flag):`` the weights of the calls inside change from call to
    call (``flag`` True): derived arrays are computed but not stored."""

    __slots__ = ("flag", "outer")

    def __init__(self, flag: bool) -> None:
        self.flag = flag

    def __enter__(self) -> None:
        self.outer = getattr(_local, "transient", False)
        _local.transient = self.flag

    def __exit__(self, *exc: object) -> None:
        _local.transient = self.outer


def is_transient() -> bool:
    """Whether the calling thread is inside ``transient(True)``."""
    return bool(getattr(_local, "transient", False))


@kernel(nogil=True)
def _same_words(a, b, head):
    """Whether two equally long 1-D unsigned-integer arrays are equal: the first
    ``head`` words compared first (arrays that differ early cost no full pass), then
    the OR of all XORs (one vectorised pass; blocks with an early exit measured 25%
    slower)."""
    diff = a[0] ^ b[0]
    for i in range(min(head, a.size)):
        diff |= a[i] ^ b[i]
    if diff != 0:
        return False
    for i in range(a.size):
        diff |= a[i] ^ b[i]
    return diff == 0


HEAD_WORDS = 512  # compared first: weights changed by a training step differ there


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two equally shaped contiguous arrays hold the same bits (compared as
    64-bit words where the size allows, the first ``HEAD_WORDS`` first)."""
    if a.size == 0:
        return True
    word = "u8" if a.nbytes % 8 == 0 else f"u{a.itemsize}"
    return bool(_same_words(a.reshape(-1).view(word), b.reshape(-1).view(word), HEAD_WORDS))


class WeightCache:
    """LRU of weight transforms, bounded in bytes, matched bit-exactly on the weights.

    ``get(w, kind, make)`` returns ``(u, special)``: ``u = make(w)`` (computed once per
    distinct weights and ``kind``) and whether u holds NaN or infinity."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple, list[tuple[np.ndarray, np.ndarray, bool]]] = (
            OrderedDict())
        self.lock = threading.Lock()
        self.hits = self.misses = 0
        self.bytes = 0  # held by the entries (weights and derived arrays)

    @staticmethod
    def _key(w: np.ndarray, kind: tuple) -> tuple:
        sample = w.reshape(-1)[:: max(1, w.size // 64)]
        return (kind, w.shape, w.dtype.str, sample.tobytes())

    def get(self, w: np.ndarray, kind: tuple, make) -> tuple[np.ndarray, bool]:
        key = self._key(w, kind)
        with self.lock:
            for stored, u, special in self.entries.get(key, ()):
                if same_bits(stored, w):
                    self.entries.move_to_end(key)
                    self.hits += 1
                    return u, special
        u = make(w)
        special = bool(nonfinite(u))
        with self.lock:
            self.misses += 1
            if is_transient():
                return u, special
            self.entries.setdefault(key, []).append((w.copy(), u, special))
            self.bytes += w.nbytes + u.nbytes
            self.entries.move_to_end(key)
            while self.bytes > self.max_bytes and len(self.entries) > 1:
                _, dropped = self.entries.popitem(last=False)
                self.bytes -= sum(a.nbytes + b.nbytes for a, b, _ in dropped)
        return u, special

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.hits = self.misses = self.bytes = 0
