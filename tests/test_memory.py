"""convengine.memory: pooled arrays come back to the pool only when nothing uses them."""

from __future__ import annotations

import gc
import pickle
import threading

import numpy as np
import pytest

import convengine as ce
from convengine import memory


@pytest.fixture(autouse=True)
def empty_pool():
    memory.clear()
    yield
    memory.clear()


def test_large_arrays_are_aligned_and_reused_after_their_last_view_dies():
    a = memory.empty((4, 300, 300), np.float32)
    assert a.flags.c_contiguous and a.ctypes.data % memory.ALIGN == 0
    address, view = a.ctypes.data, a[1:3, ::2]
    del a
    gc.collect()
    assert memory.free_bytes() == 0  # the view still holds the block
    view[...] = 7
    del view
    assert memory.free_bytes() >= 4 * 300 * 300 * 4
    b = memory.empty((4, 300, 300), np.float32)
    assert b.ctypes.data == address and memory.free_bytes() == 0


def test_a_request_takes_the_most_recently_freed_block_that_fits():
    big, exact, small = (memory.empty(n, np.uint8) for n in (3 << 20, 2 << 20, 1 << 20))
    addresses = {name: a.ctypes.data for name, a in
                 (("big", big), ("exact", exact), ("small", small))}
    del exact, small, big  # freed in this order: the 3 MiB block last
    taken = memory.empty(2 << 20, np.uint8)  # 3 MiB fits (up to FIT times the size)
    assert taken.ctypes.data == addresses["big"]
    again = memory.empty(2 << 20, np.uint8)  # next: the 1 MiB block is too small
    assert again.ctypes.data == addresses["exact"]


def test_every_array_starts_on_a_cache_line_and_keeps_dtype_and_shape():
    for shape in ((10, 10), (3,), (7, 3, 5)):
        small = memory.empty(shape, np.float64)
        assert small.ctypes.data % memory.ALIGN == 0 and small.shape == shape
        assert small.flags.c_contiguous and small.flags.writeable
    small[...] = 2.5
    assert (small == 2.5).all()
    big = memory.zeros(1 << 19, np.float64)
    assert big.dtype == np.float64 and big.shape == (1 << 19,) and not big.any()


def test_an_allocator_hands_out_a_new_aligned_array_per_call():
    for shape, dtype in (((3, 5), np.float32), ((2, 512, 512), np.float32), (7, np.uint8)):
        alloc = memory.allocator(shape, dtype)
        a, b = alloc(), alloc()
        expected = (shape,) if isinstance(shape, int) else shape
        assert a.shape == b.shape == expected and a.dtype == b.dtype == dtype
        assert a.ctypes.data % memory.ALIGN == 0 and b.ctypes.data % memory.ALIGN == 0
        a[...] = 1
        b[...] = 2
        assert (a == 1).all()  # distinct memory while both live


def test_a_torch_tensor_sharing_the_memory_keeps_the_block():
    torch = pytest.importorskip("torch")
    a = memory.empty((1024, 1024), np.float32)
    a[...] = 1
    t = torch.from_numpy(a)
    del a
    gc.collect()
    assert memory.free_bytes() == 0
    reused = memory.empty((1024, 1024), np.float32)
    reused[...] = 2  # a different block: the tensor's values stay
    assert float(t.sum()) == 1024 * 1024
    del t
    assert memory.free_bytes() > 0


def test_pickled_arrays_are_plain_copies():
    a = memory.empty((512, 1024), np.float32)
    a[...] = 3
    b = pickle.loads(pickle.dumps(a))
    del a
    assert memory.free_bytes() > 0  # b holds a copy, not the block
    assert float(b.sum()) == 3 * 512 * 1024


def test_free_blocks_beyond_the_bound_are_released(monkeypatch):
    monkeypatch.setattr(memory, "POOL_BYTES", 3 << 20)
    arrays = [memory.empty(1 << 20, np.uint8) for _ in range(5)]
    del arrays
    assert memory.free_bytes() <= 3 << 20


def test_threads_allocating_and_freeing_at_once_get_distinct_blocks():
    errors = []

    def work(k: int) -> None:
        for i in range(50):
            a = memory.empty((1 << 18,), np.float32)
            a[...] = k * 1000 + i
            if not (a == k * 1000 + i).all():
                errors.append((k, i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_convolution_outputs_from_the_pool_stay_correct_when_reused():
    """Outputs reuse blocks of dropped outputs; a kept output is never overwritten."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 64, 64, 64)).astype(np.float32)
    w = rng.standard_normal((64, 3, 3, 64)).astype(np.float32)
    kept = ce.conv(x, w, padding=1, layout="NHWC")
    first = kept.copy()
    for _ in range(3):
        ce.conv(x, -w, padding=1, layout="NHWC")  # dropped at once: its block is reused
    np.testing.assert_array_equal(kept, first)


def test_smaller_requests_reuse_larger_free_blocks_up_to_the_fit():
    a = memory.empty(3 << 20, np.uint8)
    address = a.ctypes.data
    del a
    assert memory.empty(2 << 20, np.uint8).ctypes.data == address  # within FIT = 2
    del_me = memory.empty(3 << 20, np.uint8)
    address = del_me.ctypes.data
    del del_me
    small = memory.empty(1 << 20, np.uint8)  # a third: a block of its own
    assert small.ctypes.data != address


def test_a_miss_beyond_the_peak_releases_free_blocks_beyond_the_slack(monkeypatch):
    """A request larger than everything free (not a matter of sizes): the pool would
    hold more than its peak in use, so it keeps at most SLACK_BYTES free."""
    monkeypatch.setattr(memory, "SLACK_BYTES", 4 << 20)
    memory.clear()
    blocks = [memory.empty(2 << 20, np.uint8) for _ in range(4)]
    del blocks
    assert memory.free_bytes() >= 8 << 20
    kept = memory.empty(20 << 20, np.uint8)  # fits none of the free blocks
    assert memory.free_bytes() <= 4 << 20 and kept.size == 20 << 20


def test_repeated_passes_find_their_blocks_when_sizes_do_not_fit_each_other(monkeypatch):
    """A pass of an 8 MiB then a 3 MiB array (never alive together, and too different
    to share a block): the 3 MiB miss finds 8 MiB free but of the wrong size, so the
    pool keeps the 8 MiB block (its headroom grows) instead of releasing it, and
    later passes reuse both blocks. No slack beyond that (SLACK_BYTES 0)."""
    monkeypatch.setattr(memory, "SLACK_BYTES", 0)
    memory.clear()
    addresses = []
    for _ in range(3):
        big = memory.empty(8 << 20, np.uint8)
        small = None
        addresses.append(big.ctypes.data)
        del big
        small = memory.empty(3 << 20, np.uint8)
        addresses.append(small.ctypes.data)
        del small
    assert addresses[2:4] == addresses[4:6] == addresses[0:2]
    memory.clear()
    assert memory.free_bytes() == 0
