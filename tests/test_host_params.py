"""Cache sizes from the OS (_host.read_cache_sizes) and the parameters derived from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from convengine import _host, host_params
from convengine._host import CacheSizes, read_cache_sizes

ZEN4 = CacheSizes(32 << 10, 1 << 20, 32 << 20, ())


def _fake_sysfs(root: Path, caches: list[tuple[int, str, str, str]],
                siblings: str | None = "0") -> Path:
    """``root/cpu0/cache/index<i>/{level,type,size,shared_cpu_list}`` from
    ``(level, type, size, shared_cpu_list)`` rows."""
    for i, (level, kind, size, shared) in enumerate(caches):
        d = root / "cpu0" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
        (d / "shared_cpu_list").write_text(f"{shared}\n")
    if siblings is not None:
        (root / "cpu0" / "topology").mkdir(parents=True)
        (root / "cpu0" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    return root


def _no_sysconf(name):
    raise AssertionError(f"sysconf asked for {name} although sysfs had every size")


def test_sysfs_tree(tmp_path):
    root = _fake_sysfs(tmp_path, [(1, "Data", "48K", "0,64"), (1, "Instruction", "32K", "0,64"),
                                  (2, "Unified", "2048K", "0,64"),
                                  (3, "Unified", "105M", "0-63,64-127")], siblings="0,64")
    sizes = read_cache_sizes(root, sysconf=_no_sysconf)
    assert (sizes.l1d, sizes.l2, sizes.l3) == (48 << 10, 2 << 20, 105 << 20)
    assert dict(sizes.sources) == {"l1d": "sysfs", "l2": "sysfs", "l3": "sysfs"}


def test_shared_l2_is_divided_among_its_cores(tmp_path):
    # four cores (no SMT) sharing a 4 MiB L2, as Intel's E-core clusters: 1 MiB a core
    root = _fake_sysfs(tmp_path, [(1, "Data", "32K", "0"), (2, "Unified", "4096K", "0-3"),
                                  (3, "Unified", "32768K", "0-15")])
    sizes = read_cache_sizes(root, sysconf=_no_sysconf)
    assert (sizes.l1d, sizes.l2, sizes.l3) == (32 << 10, 1 << 20, 32 << 20)


def test_sysconf_fills_what_sysfs_lacks(tmp_path):
    root = _fake_sysfs(tmp_path, [(1, "Data", "32K", "0")])
    values = {"SC_LEVEL2_CACHE_SIZE": 1 << 20, 191: 1 << 20,
              "SC_LEVEL3_CACHE_SIZE": 0, 194: 0}  # 0: glibc does not know

    def sysconf(name):
        if name in values:
            return values[name]
        raise ValueError(name)

    sizes = read_cache_sizes(root, sysconf=sysconf)
    how = dict(sizes.sources)
    assert (sizes.l1d, sizes.l2) == (32 << 10, 1 << 20)
    assert how["l1d"] == "sysfs"
    if how["l2"] == "sysconf":  # glibc, or a Python that names the constant
        assert sizes.l3 == _host.CACHE_DEFAULTS["l3"] and how["l3"].startswith("default")
    else:  # not glibc: sysconf is not asked by number
        assert how["l2"].startswith("default")


def test_defaults_with_the_reason(tmp_path):
    def broken(name):
        raise OSError(name)

    sizes = read_cache_sizes(tmp_path / "missing", sysconf=broken)
    assert (sizes.l1d, sizes.l2, sizes.l3) == (32 << 10, 512 << 10, 8 << 20)
    assert all("neither sysfs nor sysconf" in how for _, how in sizes.sources)
    assert "default" in sizes.describe()


def test_unreadable_entries_are_skipped(tmp_path):
    root = _fake_sysfs(tmp_path, [(1, "Data", "garbage", "0"), (2, "Unified", "512K", "0")],
                       siblings=None)
    sizes = read_cache_sizes(root, sysconf=lambda name: 0)
    assert sizes.l2 == 512 << 10 and dict(sizes.sources)["l2"] == "sysfs"
    assert sizes.l1d == 32 << 10 and dict(sizes.sources)["l1d"].startswith("default")


def test_this_host():
    sizes = _host.CACHES
    assert 4 << 10 <= sizes.l1d <= sizes.l2 <= max(sizes.l2, sizes.l3)
    assert {name for name, _ in sizes.sources} == {"l1d", "l2", "l3"}


def test_values_of_the_host_they_were_measured_on():
    """Zen 4 (32 KiB L1d, 1 MiB L2, 32 MiB L3) gives the constants set there by hand."""
    assert host_params.derived(ZEN4) == {
        "blocks_inside_bytes": 32 << 10, "vnni_panel_bytes": 384 << 10, "vnni_k_block": 64,
        "winograd_block_bytes": 512 << 10, "weight_chunk_bytes": 384 << 10,
        "fused_tile_bytes": 1 << 20, "streaming_bytes": 8 << 20}


@pytest.mark.parametrize("caches", [
    CacheSizes(48 << 10, 2 << 20, 105 << 20, ()),    # Sapphire Rapids core
    CacheSizes(32 << 10, 512 << 10, 32 << 20, ()),   # Zen 3
    CacheSizes(48 << 10, 1280 << 10, 54 << 20, ()),  # Ice Lake server: 1.25 MiB L2
    CacheSizes(1 << 10, 3 << 10, 5 << 10, ()),       # absurdly small: still usable
])
def test_values_scale_and_stay_usable(caches):
    values = host_params.derived(caches)
    for name, value in values.items():
        assert isinstance(value, int) and value > 0, name
        if name.endswith("_bytes"):
            assert value % host_params.PAGE == 0, name
    k = values["vnni_k_block"]
    assert k >= 16 and k & (k - 1) == 0 and 64 * 4 * k <= max(caches.l1d, 16 * 256)
    assert values["weight_chunk_bytes"] <= max(caches.l2, host_params.PAGE)
    assert values["winograd_block_bytes"] <= max(caches.l2, host_params.PAGE)
    if caches.l2 == 2 << 20:  # twice Zen 4's L2: twice its L2 budgets
        assert values["vnni_panel_bytes"] == 768 << 10
        assert values["fused_tile_bytes"] == 2 << 20


def test_kernel_modules_use_the_derived_values():
    from convengine.algorithms.blocked import forward as blocked
    from convengine.algorithms.blocked import weight as blocked_weight
    from convengine.algorithms.depthwise import forward as depthwise
    from convengine.algorithms.winograd import kernels as winograd
    from convengine.graph import engines
    from convengine.quant.dense import kernels

    d = host_params.derived()
    assert blocked.BLOCKS_INSIDE_BYTES == d["blocks_inside_bytes"]
    assert blocked.STREAMING_BYTES == depthwise.STREAMING_BYTES == d["streaming_bytes"]
    assert winograd.BLOCK_BYTES == d["winograd_block_bytes"]
    assert blocked_weight.CHUNK_BYTES == d["weight_chunk_bytes"]
    assert kernels.PANEL_BYTES == d["vnni_panel_bytes"]
    assert kernels.KC4_BLOCK == d["vnni_k_block"]
    assert engines.TILE_BYTES == d["fused_tile_bytes"]
    assert all(f"{name}={value}" in host_params.key() for name, value in d.items())


def test_reduction_pieces_fit_l1d():
    """``blocked``'s reduction pieces: two thirds of L1d in whole pages (a run-time
    parameter, not frozen into machine code, so not part of :func:`host_params.key`)."""
    from convengine.algorithms.blocked import forward as blocked

    assert host_params.reduction_chunk_bytes(ZEN4) == 20 << 10
    assert host_params.reduction_chunk_bytes(CacheSizes(48 << 10, 2 << 20, 105 << 20, ())) \
        == 32 << 10
    assert host_params.reduction_chunk_bytes(CacheSizes(1 << 10, 3 << 10, 5 << 10, ())) \
        == host_params.PAGE
    assert blocked.REDUCTION_CHUNK_BYTES == host_params.reduction_chunk_bytes()
    assert "reduction_chunk_bytes" not in host_params.key()
