"""The kernels' cache-sized parameters, derived from the host's caches.

Each function below turns the data-cache sizes the OS reports (:data:`convengine._host.CACHES`:
L1d and L2 per core, L3 shared) into one parameter of one kernel family, and its
docstring says what must fit in which cache and why that fraction. The kernels read
the results as module-level constants, computed once at import (numba freezes them
into the machine code)::

    PANEL_BYTES = host_params.vnni_panel_bytes()

The fractions were chosen so that on the host the constants were first measured on
(AMD EPYC Zen 4: 32 KiB L1d, 1 MiB L2 per core, 32 MiB L3) each gives the value
measured there; on another CPU they scale with its caches instead of staying at Zen
4's. :func:`key` names the values, for caches of compiled code shared between hosts.
"""

from __future__ import annotations

from ._host import CACHES, CacheSizes

PAGE = 4096  # byte budgets are whole pages


def _pages(size: int) -> int:
    """``size`` rounded down to whole pages (one page at least)."""
    return max(PAGE, size // PAGE * PAGE)


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def blocks_inside_bytes(caches: CacheSizes = CACHES) -> int:
    """``blocked`` forward: packed weights up to this size are all used by every task
    (each pixel's output channels written at once), larger ones block by block. All
    of L1d: weights that fit there stay in it while the tiles' input rows stream
    past; larger ones, read whole per tile, would come from L2 at every tile (Zen 4,
    32 KiB L1d: ResNet-50's 256 -> 128 1x1 at 56x56 0.87x PyTorch at a 256 KiB
    threshold, 1.08x at 32 KiB)."""
    return _pages(caches.l1d)


def reduction_chunk_bytes(caches: CacheSizes = CACHES) -> int:
    """``blocked`` forward: bytes of weights per piece of a reduction split so that a
    task's tiles reuse them. Two thirds of L1d: the piece stays in L1 while the tiles'
    input rows (a few hundred bytes each) and partial sums stream past (32 KiB on a
    48 KiB L1d: 128 input channels of a 64-channel panel, what ONNX Runtime's NCHWc
    pointwise kernel takes at a time; 20 KiB on a 32 KiB L1d). A run-time argument
    of the kernel, not frozen into its machine code: not among :func:`derived`."""
    return max(PAGE, caches.l1d * 2 // 3 // PAGE * PAGE)


def vnni_panel_bytes(caches: CacheSizes = CACHES) -> int:
    """int8 VNNI/AMX/AVX2 kernels: bytes of one im2col panel (rows x K). Three eighths
    of L2: the panel stays in L2 while every 64-column weight block streams past it,
    beside the panel's int32 partial tiles (up to as large again for short rows) and
    the weight blocks in flight; the rest is the margin for the output rows stored
    and L2's limited associativity (384 KiB on a 1 MiB L2)."""
    return _pages(caches.l2 * 3 // 8)


def vnni_k_block(caches: CacheSizes = CACHES) -> int:
    """int8 VNNI kernel: groups of 4 K values per chunk of a 64-column weight block
    (64 x 4 bytes a group). Half of L1d for the block, a power of two: it stays in L1
    across the panel's row blocks while the other half holds the rows' input bytes
    and the int32 partial tile (64 groups, 16 KiB, on a 32 KiB L1d)."""
    return max(16, _floor_pow2(caches.l1d // 2 // (64 * 4)))


def winograd_block_bytes(caches: CacheSizes = CACHES) -> int:
    """Winograd: bytes of transformed tiles plus their products per block of tiles
    (per thread). Half of L2: the block's tiles are written, multiplied and
    transformed back while in L2, the other half holding the thread's share of the
    transformed weights as they stream through (512 KiB on a 1 MiB L2)."""
    return _pages(caches.l2 // 2)


def weight_chunk_bytes(caches: CacheSizes = CACHES) -> int:
    """``blocked`` backward-weight: x and dy bytes of one chunk of pixels. Three
    eighths of L2: every task of a thread (kernel tap x channel blocks) passes over
    the chunk, so it must stay in L2 across them, beside the weight-gradient blocks
    being summed and the padded input rows the taps overlap (384 KiB on a 1 MiB L2)."""
    return _pages(caches.l2 * 3 // 8)


def fused_tile_bytes(caches: CacheSizes = CACHES) -> int:
    """Fused graphs: output bytes of one tile of a conv chain. One core's L2: the
    tile written by one step is read by the next (epilogue, the next conv) from L2
    rather than from memory (1 MiB on a 1 MiB L2, as measured on Zen 4)."""
    return _pages(caches.l2)


def streaming_bytes(caches: CacheSizes = CACHES) -> int:
    """``blocked`` and ``depthwise`` forward: outputs from this size are stored
    non-temporally (bypassing the caches). A quarter of L3: a smaller output is
    still in L3 when the next layer reads it, beside the input it was computed from
    and the other cores' data; a larger one would be evicted before being read and
    only costs the read of each line before it is written (32 MiB L3: 1.5-4.6 MiB
    outputs are held for the next reader, 9-14 MiB ones gain 1.3-1.5x streamed;
    8 MiB)."""
    return _pages(caches.l3 // 4)


def derived(caches: CacheSizes = CACHES) -> dict[str, int]:
    """Every derived parameter by function name, for ``caches``."""
    functions = (blocks_inside_bytes, vnni_panel_bytes, vnni_k_block, winograd_block_bytes,
                 weight_chunk_bytes, fused_tile_bytes, streaming_bytes)
    return {f.__name__: f(caches) for f in functions}


def key(caches: CacheSizes = CACHES) -> str:
    """The derived values as one string (``name=value,...``): a cache of compiled
    kernels shared by hosts whose caches differ must key on it."""
    return ",".join(f"{name}={value}" for name, value in derived(caches).items())
