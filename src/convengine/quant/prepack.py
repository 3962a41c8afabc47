"""Weights prepared once per (weights, zero points, groups, path) and cached.

An entry is found by the weight array's address and confirmed by comparing its
bytes with the copy saved at packing time (a vectorised pass, far cheaper than
packing), so an array changed in place is never served stale. Canonical weights
are ``w (O, KD, KH, KW, C // g)``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._kernel_cache import kernel
from .dense.avx2 import NR as AVX2_NR
from .dense.vnni import NR
from .depthwise import kernels as depthwise

#: packed weights kept (least recently used dropped): on AVX2 hosts a layer can hold
#: two (int16 and u8s8), and ResNet-50 has 53 convs
CACHE_SIZE = 128


@dataclass(frozen=True)
class Packed:
    """``data``: VNNI/AMX (g * nb * kc4 * 64 * 4,) int8 (AMX: kc4 a multiple of 16),
    AVX2 (g * nb * kc4 * 16 * 2,) int16 ``w - wzp`` (there ``kc4`` counts pairs),
    AVX2 u8s8 (nb * kc4 * 16 * 4,) int8 and its :func:`pair_fixes` in ``fixes``,
    portable (O, Kc) int16 ``w - wzp``,
    depthwise (taps, C) float32 ``w - wzp``, depthwise_vnni the int8 ``wq`` of
    :func:`.depthwise.pack_weights`. ``wzp`` (O,) int64 signed-weight zero
    points (depthwise_vnni: int32, padded to C16); ``col_sum`` (O,) int64
    ``sum_k w_signed[o, k]``. depthwise_vnni only: ``dw_term`` (C16,) int32
    ``taps * wzp - sum_k w_signed`` and ``dw_raw`` (weights packed without their
    zero points)."""

    data: np.ndarray
    wzp: np.ndarray
    col_sum: np.ndarray
    kc: int
    kc4: int
    nb: int
    dw_term: np.ndarray | None = None
    dw_raw: bool = False
    fixes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


_cache: OrderedDict[tuple, tuple[np.ndarray, Packed]] = OrderedDict()


def _signed(w: np.ndarray, wzp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 weights -> int8 by -128, zero points alike; the differences are unchanged."""
    if w.dtype == np.uint8:
        return (w.astype(np.int16) - 128).astype(np.int8), wzp - 128
    return w, wzp


def pack(w: np.ndarray, wzp: np.ndarray, groups: int, path: str) -> Packed:
    """Canonical weights ``w (O, KD, KH, KW, C // g)`` packed for ``path`` (no cache)."""
    o = w.shape[0]
    kc = int(np.prod(w.shape[1:]))
    ws, zs = _signed(w, wzp)
    mat = ws.reshape(o, kc)
    col_sum = mat.sum(axis=1, dtype=np.int64)
    if path == "depthwise_vnni":
        kd, kh, kw = w.shape[1:4]
        dw = depthwise.pack_weights(ws.reshape(o, kd * kh, kw), zs)
        return Packed(dw["wq"], dw["wzp"], col_sum, kc, 0, 0, dw["wterm"], dw["has_wzp"])
    if path == "depthwise":
        taps = (mat.astype(np.float32) - zs.astype(np.float32)[:, None]).T.copy()
        return Packed(taps, zs, col_sum, kc, 0, 0)
    if path == "portable":
        diff = (mat.astype(np.int16) - zs.astype(np.int16)[:, None]).copy()
        return Packed(diff, zs, col_sum, kc, 0, 0)
    if path == "avx2":  # int16 differences in pairs
        kc2 = -(-kc // 2)
        diff = mat.astype(np.int16) - zs.astype(np.int16)[:, None]
        data, nb = _panels(diff, groups, AVX2_NR, kc2, 2)
        return Packed(data, zs, col_sum, kc, kc2, nb)
    kc4 = -(-kc // 64) * 16 if path == "amx" else -(-kc // 4)
    if path == "avx2_u8s8":
        data, nb = _panels(mat, groups, AVX2_NR, kc4, 4)
        return Packed(data, zs, col_sum, kc, kc4, nb, fixes=pair_fixes(mat, kc4 * 2))
    data, nb = _panels(mat, groups, NR, kc4, 4)
    return Packed(data, zs, col_sum, kc, kc4, nb)


#: a pair of weights whose positive (or negative) parts add up to this much or more
#: can saturate ``vpmaddubsw``'s int16 sum for uint8 x: 255 * 129 > 32767, 255 * 128
#: (and -255 * 128 >= -32768) cannot
RISKY_PAIR = 129


def pair_fixes(mat: np.ndarray, pairs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The weight pairs of int8 ``mat (O, Kc)`` (K zero-padded to ``2 * pairs``) that
    can saturate ``vpmaddubsw``: for pair p, the columns ``col[ptr[p]:ptr[p + 1]]``
    (int32, ascending) and their weights ``w[same range] = (w[o, 2p], w[o, 2p + 1])``
    (int32). ``ptr (pairs + 1,)`` int64."""
    o, kc = mat.shape
    padded = np.zeros((o, 2 * pairs), np.int32)
    padded[:, :kc] = mat
    w = padded.reshape(o, pairs, 2)
    risky = ((np.maximum(w, 0).sum(axis=2) >= RISKY_PAIR)
             | (np.maximum(-w, 0).sum(axis=2) >= RISKY_PAIR))  # (O, pairs)
    pair_idx, col = np.nonzero(risky.T)  # ordered by pair, then column
    ptr = np.zeros(pairs + 1, np.int64)
    np.cumsum(np.bincount(pair_idx, minlength=pairs), out=ptr[1:])
    return ptr, col.astype(np.int32), np.ascontiguousarray(w[col, pair_idx])


def _panels(mat: np.ndarray, groups: int, nr: int, k_steps: int, k_group: int
            ) -> tuple[np.ndarray, int]:
    """``mat (O, Kc)`` as the flat ``(g, nb, k_steps, nr, k_group)`` panels of the
    micro-kernels, zero-padded to ``nb * nr`` columns per group and ``k_steps *
    k_group`` reduction values; and ``nb``."""
    o, kc = mat.shape
    og = o // groups
    nb = -(-og // nr)
    padded = np.zeros((groups, nb * nr, k_steps * k_group), mat.dtype)
    padded[:, :og, :kc] = mat.reshape(groups, og, kc)
    data = padded.reshape(groups, nb, nr, k_steps, k_group).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(data).ravel(), nb


@kernel()
def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two equally long uint8 vectors are equal (a vectorised OR of XORs)."""
    diff = np.uint8(0)
    for i in range(a.shape[0]):
        diff |= a[i] ^ b[i]
    return diff == 0


def _unchanged(saved: np.ndarray, w: np.ndarray) -> bool:
    if w.flags.c_contiguous:
        return bool(_same_bytes(saved.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8)))
    return bool(np.array_equal(saved, w))


def packed_weights(
    w: np.ndarray,
    canonical: Callable[[np.ndarray], np.ndarray],
    wzp: np.ndarray,
    groups: int,
    path: str,
) -> Packed:
    """The packed form of the caller's weights ``w`` for ``path`` ("amx", "vnni",
    "avx2", "avx2_u8s8", "portable", "depthwise", "depthwise_vnni"); ``canonical(w)``
    gives ``(O, KD, KH, KW, C // g)``.

    Looked up by the array's data address, layout and zero points, then confirmed by
    an exact comparison of ``w`` with the copy saved at packing time: weights changed
    in place (or a new array at a reused address) are repacked, never served stale.
    """
    wzp = np.ascontiguousarray(wzp, dtype=np.int64)
    address = w.__array_interface__["data"][0]  # views of one buffer share an entry
    key = (path, groups, address, w.shape, w.strides, w.dtype.str, wzp.tobytes())
    hit = _cache.get(key)
    if hit is not None and _unchanged(hit[0], w):
        _cache.move_to_end(key)
        return hit[1]
    packed = pack(np.ascontiguousarray(canonical(w)), wzp, groups, path)
    _cache[key] = (np.array(w, copy=True), packed)
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return packed


def clear_cache() -> None:
    """Drop every prepacked weight."""
    _cache.clear()
