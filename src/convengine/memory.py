"""Large arrays from retained blocks: a caching allocator, as ONNX Runtime's CPU arena.

A network allocates outputs and temporaries of the same sizes pass after pass. A
fresh large numpy buffer comes from a new mapping whenever glibc's heap cannot serve
it, and each page faults on its first write; on the 2-vCPU VMs here the 25.7 MB
output of a ResNet-50 batch-8 layer took 2.8 ms to compute into a reused buffer and
6.5-25 ms into a fresh one (huge-page faults while both threads write), and the
batch-8 forward in network order spent a quarter of its time so.

:func:`empty` hands out arrays of ``MIN_BYTES`` or more from blocks kept after use,
64-byte aligned (a cache line: vector stores never straddle two). An array's block
returns to the pool once the last array, view or tensor sharing its memory is gone
(the block's lease is their common base). A request takes the most recently freed
block of its size class up to twice its size; one that finds none gets a new block,
and the pool first drops its oldest free blocks until what it holds (blocks in use and
free) stays within the larger of what is in use now plus ``SLACK_BYTES`` and its own
high-water mark of blocks in use plus a headroom, which grows only by misses that
found enough free bytes in blocks of other sizes: a network whose passes repeat
finds its blocks after a pass or two, and one whose blocks fit never holds more than
its peak in use (or ``SLACK_BYTES`` beyond what it uses). Free blocks beyond
``POOL_BYTES`` go back to the system, oldest first; :func:`clear` returns them all.

In checked mode (``CONVENGINE_CHECKED=1``, :mod:`convengine.checked`) each pooled
array is followed by ``GUARD_BYTES`` of a known pattern, verified when its block comes
back, and each freed block is filled with ``POISON`` (0xFF bytes: NaN as float32 and
float64, -1 as integers), so that a kernel writing past an array, or reading a block
after its array died, shows: :func:`check` raises :class:`~convengine.checked.BoundsError`
for a damaged guard (and the next :func:`empty` does).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from .checked import CHECKED, BoundsError

MIN_BYTES = 1 << 20
FIT = 2  # a free block serves requests down to 1/FIT of its size
POOL_BYTES = 1 << 30  # free blocks kept, at most
SLACK_BYTES = 32 << 20  # free bytes kept past a miss beyond those in use (see _take)
ALIGN = 64
GUARD_BYTES = 4096  # checked mode: after each pooled array
GUARD = 0xFD
POISON = 0xFF

_lock = threading.RLock()  # re-entrant: a lease may die (and give back) under it
_free: OrderedDict[int, np.ndarray] = OrderedDict()  # id -> free block, oldest first
_free_bytes = 0
_live_bytes = 0  # bytes of blocks handed out and not yet back
_peak_live_bytes = 0  # the high-water mark of _live_bytes
_headroom_bytes = 0  # what the pool may hold beyond that mark (see _take)
_damaged: list[str] = []  # checked mode: guards found overwritten, not yet reported


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_reset_after_fork)


def size_class(nbytes: int) -> int:
    """Block size for ``nbytes``: rounded up to 1/16 of its power of two (at most 6%
    more), so that nearby sizes share blocks."""
    step = max(ALIGN, 1 << max(0, nbytes.bit_length() - 5))
    return -(-nbytes // step) * step


class _Lease:
    """The base object of a pooled array: owns its block while any view lives."""

    __slots__ = ("block", "end", "__array_interface__")

    def __init__(self, block: np.ndarray, nbytes: int) -> None:
        self.block = block
        address = _address(block)
        start = -address % ALIGN
        self.end = start + nbytes  # the array's end in the block (the guard's start)
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (address + start, False), "version": 3}
        if CHECKED:
            block[self.end:self.end + GUARD_BYTES] = GUARD

    def __del__(self) -> None:
        try:
            if CHECKED:
                _verify(self.block, self.end)
            _give_back(self.block)
        except TypeError:  # interpreter shutdown: the module's globals are gone
            pass


def _verify(block: np.ndarray, end: int) -> None:
    """Checked mode: note a damaged guard after a dying array, poison its block."""
    guard = block[end:end + GUARD_BYTES]
    damaged = np.flatnonzero(guard != GUARD)
    if damaged.size:
        _damaged.append(f"{damaged.size} of the {GUARD_BYTES} guard bytes after a pooled "
                        f"array of {end - (-_address(block) % ALIGN)} bytes were "
                        f"overwritten (from byte {damaged[0]} past its end)")
    block.fill(POISON)


def check() -> None:
    """Checked mode: raise :class:`~convengine.checked.BoundsError` if a kernel wrote
    past a pooled array since the last check (found when the array's block came
    back); nothing otherwise."""
    if _damaged:
        found = "; ".join(_damaged)
        _damaged.clear()
        raise BoundsError(f"convengine checked mode: {found}")


def _take(size: int) -> np.ndarray:
    """The most recently freed block of ``size`` bytes up to ``FIT`` times that (a network's
    smaller outputs reuse its larger ones' blocks instead of holding their own; the last
    freed is the likeliest still in cache: a network pass in order against the smallest
    fitting block, in one process, MobileNetV2 batch 1 1.033x and batch 8 1.045x as
    fast, ResNet-50 batch 1 1.008x), else a new one, for which the oldest free blocks
    are released first until the pool holds at most the larger of its peak in use plus a
    headroom and its use now plus ``SLACK_BYTES``. The headroom grows by every miss that
    found enough free bytes in blocks of the wrong sizes (up to ``POOL_BYTES``), until a
    network's passes find their blocks. A fixed slack alone made MobileNetV2 batch 8
    (about 150 MiB churning per pass) miss 13 of 43 requests every pass and fault its 38
    MiB output afresh: 70 ms against 4.8 for that conv."""
    global _free_bytes, _live_bytes, _peak_live_bytes, _headroom_bytes
    with _lock:
        # the most recently freed block that fits: its lines are the likeliest to be
        # in cache still (a network writes the output into memory it just read)
        key = next((k for k in reversed(_free) if size <= _free[k].size <= FIT * size), None)
        if key is not None:
            block = _free.pop(key)
            _free_bytes -= block.size
        else:
            if _free_bytes >= size:  # the free blocks had the bytes, not the sizes
                _headroom_bytes = min(POOL_BYTES, _headroom_bytes + size)
            _release(max(SLACK_BYTES, _peak_live_bytes + _headroom_bytes - _live_bytes)
                     - size)
            block = np.empty(size, np.uint8)
        _live_bytes += block.size
        _peak_live_bytes = max(_peak_live_bytes, _live_bytes)
        return block


def _release(keep: int) -> None:
    """Drop the oldest free blocks until at most ``keep`` bytes are held (lock held)."""
    global _free_bytes
    while _free and _free_bytes > max(0, keep):
        _, old = _free.popitem(last=False)
        _free_bytes -= old.size


def _give_back(block: np.ndarray) -> None:
    global _free_bytes, _live_bytes
    try:
        with _lock:
            _live_bytes -= block.size
            _free[id(block)] = block
            _free_bytes += block.size
            _release(POOL_BYTES)
    except (TypeError, AttributeError):  # interpreter shutdown: the module is gone
        pass


def empty(shape: Sequence[int] | int, dtype: np.typing.DTypeLike = np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array starting on a 64-byte cache line, from the
    pool if ``MIN_BYTES`` or larger. (Vector loads of an unaligned array straddle two
    lines: the depthwise kernels took 2-3x as long on such inputs, e.g. 0.117 against
    0.037 ms for a 14x14x576 layer.)"""
    return allocator(shape, dtype)()


def allocator(shape: Sequence[int] | int, dtype: np.typing.DTypeLike = np.float32
              ) -> Callable[[], np.ndarray]:
    """``alloc() -> empty(shape, dtype)``, its sizes worked out once: a conv bound to
    its shapes allocates its output so on every call."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(map(int, shape))
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return functools.partial(_aligned_fresh, nbytes, dtype, shape)
    guard = GUARD_BYTES if CHECKED else 0
    return functools.partial(_pooled, size_class(nbytes + ALIGN + guard), nbytes, dtype, shape)


def _aligned_fresh(nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A new array from numpy (which starts it 16 bytes into a cache line), aligned."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -_address(raw) % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _pooled(size: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]
            ) -> np.ndarray:
    """An array on a block of ``size`` bytes from the pool."""
    if CHECKED:
        check()
    return np.asarray(_Lease(_take(size), nbytes)).view(dtype).reshape(shape)


def _address(a: np.ndarray) -> int:
    """The address of a writable array's first byte, through ctypes' from_buffer (0.3
    us): ``.ctypes.data`` costs 1-2 us, as much as a batch-1 conv's other Python, tens
    of times a network pass."""
    return ctypes.addressof(ctypes.c_char.from_buffer(a.data))


def zeros(shape: Sequence[int] | int, dtype: np.typing.DTypeLike = np.float32) -> np.ndarray:
    """:func:`empty`, filled with zeros."""
    a = empty(shape, dtype)
    a.fill(0)
    return a


def free_bytes() -> int:
    """Bytes held in free blocks."""
    return _free_bytes


def clear() -> None:
    """Return every free block to the system (and start the high-water mark of blocks
    in use and the headroom afresh)."""
    global _peak_live_bytes, _headroom_bytes
    with _lock:
        _release(0)
        _peak_live_bytes, _headroom_bytes = _live_bytes, 0
