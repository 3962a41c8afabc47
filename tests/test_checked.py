"""Checked mode (CONVENGINE_CHECKED=1): a kernel call reaching outside its buffers is
skipped and raises BoundsError naming the kernel, the buffer and the range; the memory
pool's guards catch a write past a pooled array; off, the checks are compiled out.
Each case runs in a fresh process (the mode is fixed at import)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import convengine as ce
from convengine import checked
from convengine.errors import ConvSetupError


def _run(code: str, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, checked.CHECKED_ENV: mode}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


# a gather-driver call whose 5x5 output needs a 7x7 input but gets a 6x6 one: the last
# tiles' input rows run past x (y itself is whole)
OVERREACH = """
    import numpy as np
    from convengine.algorithms.blocked import forward
    nvec = forward.NVECS[-1]
    nr = forward.VEC * nvec
    xp = np.ones((1, 6, 6, 8), np.float32)
    wp = np.ones((1, 3, 3, 8, nr), np.float32)
    y = np.full((1, 5, 5, nr), -7.0, np.float32)
    bias = np.zeros(nr, np.float32)
    run = forward._gather_driver(nvec)
    try:
        run(xp, wp.reshape(-1), y, bias, y, False, 0, 1, 1, 1, 1, 1, True, 0, 0,
            *forward.packed_walk(wp, 1))
    except IndexError as exc:
        print(type(exc).__name__, "|", exc, "|", int((y == -7.0).all(axis=-1).sum()))
    else:
        print("no error")
"""


@pytest.mark.slow
def test_a_call_outside_its_buffer_raises_naming_kernel_buffer_and_range() -> None:
    res = _run(OVERREACH, "1")
    assert res.returncode == 0, res.stderr[-3000:]
    kind, message, untouched = res.stdout.strip().splitlines()[-1].split(" | ")
    assert kind == "BoundsError"
    assert "blocked gather kernel" in message and "would access x[" in message
    assert "outside its 288 elements" in message  # 6 * 6 * 8
    assert int(untouched) >= 1  # the offending tile was skipped, not run


def test_bounds_error_message_and_type() -> None:
    exc = checked.BoundsError("k", "y", 10, 20, 15)
    assert isinstance(exc, IndexError)
    assert str(exc) == "convengine checked mode: k would access y[10:20], outside its 15 elements"


def test_the_setting_is_read_at_import_and_refused_at_run_time() -> None:
    assert ce.config.get("checked") is checked.CHECKED
    with pytest.raises(ConvSetupError, match=r"checked is fixed at import: set \$CONVENGINE_CHECKED"):
        ce.config.set(checked=True)
    with pytest.raises(ValueError, match="CONVENGINE_CHECKED='maybe'"):
        checked._parse("maybe")


GUARD = """
    import numpy as np
    from convengine import memory
    from convengine.checked import BoundsError
    a = memory.empty(2 << 20, np.uint8)
    # write 3 bytes past the array through its block (as a kernel's stray store would)
    lease = a.base
    while not hasattr(lease, "block"):
        lease = lease.base
    lease.block[lease.end:lease.end + 3] = 0
    del a, lease
    try:
        memory.empty(2 << 20, np.float32)  # the next allocation reports it
    except BoundsError as exc:
        print("caught |", exc)
    memory.check()  # once
    c = memory.empty((2 << 20) // 4, np.float32)  # the freed block, poisoned
    print("poisoned |", bool(np.isnan(c).all()))
"""


@pytest.mark.slow
def test_the_pool_guards_and_poisons_in_checked_mode() -> None:
    res = _run(GUARD, "1")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    caught = [ln for ln in lines if ln.startswith("caught")]
    assert caught and "3 of the 4096 guard bytes" in caught[0], res.stdout
    assert "poisoned | True" in lines, res.stdout


NORMAL = """
    from convengine import checked, memory
    from convengine.algorithms.blocked import forward
    import numpy as np
    run = forward._gather_driver(forward.NVECS[-1])
    nr = forward.VEC * forward.NVECS[-1]
    xp, wp = np.ones((1, 4, 4, 8), np.float32), np.ones((1, 3, 3, 8, nr), np.float32)
    y = np.zeros((1, 2, 2, nr), np.float32)
    run(xp, wp.reshape(-1), y, np.zeros(nr, np.float32), y, False, 0, 1, 1, 1, 1, 1, True, 0, 0,
        *forward.packed_walk(wp, 1))
    ir = "".join(run.inspect_llvm().values())
    print(checked.CHECKED, memory.allocator(2 << 20, np.uint8).args[0], "BoundsError" in ir,
          float(y[0, 0, 0, 0]))
"""


@pytest.mark.slow
def test_off_the_checks_are_compiled_out() -> None:
    res = _run(NORMAL, "0")
    assert res.returncode == 0, res.stderr[-3000:]
    flag, block, in_ir, value = res.stdout.split()[-4:]
    from convengine import memory
    assert (flag, in_ir, value) == ("False", "False", "72.0")  # 3 * 3 * 8 ones
    assert int(block) == memory.size_class((2 << 20) + memory.ALIGN)  # no guard


# ---------------------------------------------------- the depthwise and Winograd families

# Buffers that end where memory does: a load or store past one faults, so a kernel that
# did not skip a call reaching outside its buffer would kill the process (the cases
# below check the return code, hence that the offending calls were skipped).
GUARDED = """
    import ctypes
    import mmap
    import numpy as np

    def guarded(shape, dtype):
        dtype, count, page = np.dtype(dtype), int(np.prod(shape)), mmap.PAGESIZE
        pages = -(-count * dtype.itemsize // page) + 1
        block = mmap.mmap(-1, pages * page)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        start = ctypes.addressof(ctypes.c_char.from_buffer(block))
        assert libc.mprotect(start + (pages - 1) * page, page, 0) == 0  # PROT_NONE
        end = (pages - 1) * page
        return np.frombuffer(block, dtype, count, end - count * dtype.itemsize).reshape(shape)
"""

# depthwise forward, 3x3 on 5x5 (pad 1): a legitimate call whose 10 channels fill an odd
# number of vectors (wk ends after them: no block may load the next vector's weights),
# then 4 vectors of channels with the taps laid out for 2 (wk too small: the blocks of
# the last two vectors would read past it), serial and on 2 row tasks
DEPTHWISE_FORWARD = """
    from convengine.algorithms.depthwise import forward
    parallel, serial = forward.depthwise2d_kernel(3, 3, 1, 1, 1)
    lanes = forward.VECTOR_BYTES // 4
    no_bias = np.zeros(0, np.float32)
    wk = guarded((-(-10 // lanes), 9, lanes), np.float32)
    wk[...] = 1
    y = serial(np.ones((1, 5, 5, 10), np.float32), wk, 5, 5, 1, 1, 1, 1, 1,
               np.empty(0, np.float32), no_bias, 0)
    print("legit |", float(y[0, 2, 2, 9]), float(y[0, 0, 0, 0]))
    c = 4 * lanes
    small = guarded((2, 9, lanes), np.float32)
    small[...] = 1
    for run, parts in ((serial, 1), (parallel, 2)):
        raw = np.full(25 * c + 64, -7.0, np.float32)
        try:
            run(np.ones((1, 5, 5, c), np.float32), small, 5, 5, 1, 1, 1, parts, 1, raw,
                no_bias, 0)
        except IndexError as exc:
            print(type(exc).__name__, "|", exc, "|", int((raw == -7).sum()), "|", lanes)
        else:
            print("no error")
"""


@pytest.mark.slow
def test_depthwise_forward_blocks_outside_wk_are_skipped_and_reported() -> None:
    res = _run(GUARDED + DEPTHWISE_FORWARD, "1")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "legit | 9.0 4.0", res.stdout  # nothing flagged, nothing read past wk
    assert len(lines) == 3, res.stdout
    for line in lines[1:]:
        kind, message, untouched, lanes = line.split(" | ")
        assert kind == "BoundsError"
        assert "depthwise forward kernel would access wk[" in message
        assert f"outside its {2 * 9 * int(lanes)} elements" in message
        # the last two vectors' blocks were skipped: their channels of y never written
        assert int(untouched) >= 25 * 2 * int(lanes)


# depthwise backward-weight, 3x3 stride 1 pad 1: a legitimate call (dy guarded), then dy
# with 24 channels for x's 40 (its rows read at x's pixel stride run past it), serial
# and in 2 parts; dw must keep what it held (the kernel raises before summing into it)
DEPTHWISE_WEIGHT = """
    from convengine.algorithms.depthwise import weight
    parallel, serial = weight.weight_kernel(3, 3, 1, 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 6, 40)).astype(np.float32)
    dy = guarded((2, 6, 6, 40), np.float32)
    dy[...] = rng.standard_normal(dy.shape)
    dw = np.empty((40, 9), np.float32)
    serial(x, dy, dw, 1, 1, 1, 1, 2, 1)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.stack([np.einsum("nhwc,nhwc->c", dy, xp[:, i:i + 6, j:j + 6])
                     for i in range(3) for j in range(3)], axis=1)
    print("legit |", bool(np.allclose(dw, want, rtol=1e-4, atol=1e-4)))
    small = guarded((2, 6, 6, 24), np.float32)
    small[...] = 1
    for run, parts in ((serial, 1), (parallel, 2)):
        dw[...] = -7
        try:
            run(x, small, dw, 1, 1, 1, 1, 2, parts)
        except IndexError as exc:
            print(type(exc).__name__, "|", exc, "|", bool((dw == -7).all()))
        else:
            print("no error")
"""


@pytest.mark.slow
def test_depthwise_weight_calls_outside_dy_are_skipped_and_reported() -> None:
    res = _run(GUARDED + DEPTHWISE_WEIGHT, "1")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "legit | True", res.stdout
    assert len(lines) == 3, res.stdout
    for line in lines[1:]:
        kind, message, kept = line.split(" | ")
        assert kind == "BoundsError"
        assert "depthwise backward-weight kernel would access dy[" in message
        assert "outside its 1728 elements" in message  # 2 * 6 * 6 * 24
        assert kept == "True"


# Winograd F(2x2, 3x3) on 6x6x16 (pad 1): a legitimate call (up guarded), then up packed
# for 8 input channels (x has 16: the GEMMs of the later transformed positions would read
# the weights past up's end)
WINOGRAD = """
    from convengine.algorithms.winograd import kernels
    fused = kernels.kernel(2, 2, np.float32)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 6, 16)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 16)).astype(np.float32)

    def run(packed):
        up = guarded(packed.shape, np.float32)
        up[...] = packed
        y = np.zeros((1, 6, 6, 8), np.float32)
        width = up.shape[-1]
        fused(x, up, y, 1, 1, 3, 3, 6, 1, np.empty((1, up.shape[1], 6, 16), np.float32),
              np.empty((1, up.shape[1], 6, width), np.float32),
              np.zeros((1, width), np.float32), 8)
        return y

    want = np.zeros((1, 6, 6, 8))
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    for i in range(3):
        for j in range(3):
            want += np.einsum("nhwc,oc->nhwo", xp[:, i:i + 6, j:j + 6], w[:, i, j])
    print("legit |", bool(np.allclose(run(kernels.packed_transform(w, 2)), want, atol=1e-3)))
    half = kernels.packed_transform(w[..., :8], 2)
    try:
        run(half)
    except IndexError as exc:
        print(type(exc).__name__, "|", exc, "|", half.size)
    else:
        print("no error")
"""


def _assert_legit_then_reported(code: str, access: str) -> None:
    """``code`` prints "legit | True" for its legitimate call, then "kind | message |
    size" for the call cut short: a BoundsError whose message names ``access`` (kernel
    and buffer) and the buffer's size."""
    res = _run(code, "1")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "legit | True", res.stdout
    kind, message, size = lines[1].split(" | ")
    assert kind == "BoundsError"
    assert f"{access}[" in message
    assert f"outside its {size} elements" in message


@pytest.mark.slow
def test_winograd_calls_outside_up_are_skipped_and_reported() -> None:
    _assert_legit_then_reported(GUARDED + WINOGRAD, "winograd fused kernel would access up")


# blocked's narrow backward-data (the stems): a legitimate call, then one whose packed
# weights lack their last block's last row of columns (the call reads o rows a block)
NARROW = """
    import numpy as np
    from convengine.algorithms.blocked import narrow
    rng = np.random.default_rng(0)
    dy = rng.standard_normal((1, 4, 4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    packed, runs, starts = narrow.pack(w, 1)
    geometry = np.array([2, 2, 1, 1, 1, 1])
    band = narrow.band_rows(3, 2, 1)
    dx = np.zeros((1, 8, 8, 3), np.float32)
    narrow.scatter(dy, packed, runs, starts, dx, geometry, band)
    print("legit |", bool(np.isfinite(dx).all() and (dx != 0).any()))
    short = packed.reshape(-1)[:-narrow.NR]
    try:
        narrow.scatter(dy, short, runs, starts, np.zeros_like(dx), geometry, band)
    except IndexError as exc:
        print(type(exc).__name__, "|", exc, "|", short.size)
    else:
        print("no error")
"""


@pytest.mark.slow
def test_narrow_backward_data_call_outside_its_weights_is_reported() -> None:
    _assert_legit_then_reported(
        NARROW, "blocked narrow backward-data kernel would access packed weights")


# Off, the three kernels hold no check: compiled here from their source (numba's cached
# code has no IR to inspect), the IR of each, with the callees it links in (the register
# blocks' masked loads and stores, gemm_6xnr's multiply-adds), names no BoundsError.
# The legitimate depthwise forward call of 10 channels reads nothing past wk here too.
NORMAL_FAMILIES = """
    from convengine import _kernel_cache, checked
    _kernel_cache._RobustCache.load_overload = lambda self, sig, target_context: None
    _kernel_cache._RobustCache.save_overload = lambda self, sig, data: None
    from convengine.algorithms.depthwise import forward, weight
    from convengine.algorithms.winograd import kernels

    def ir(dispatcher):
        return "".join(dispatcher.inspect_llvm().values())

    lanes = forward.VECTOR_BYTES // 4
    wk = guarded((-(-10 // lanes), 9, lanes), np.float32)
    wk[...] = 1
    serial = forward.depthwise2d_kernel(3, 3, 1, 1, 1)[1]
    y = serial(np.ones((1, 5, 5, 10), np.float32), wk, 5, 5, 1, 1, 1, 1, 1,
               np.empty(0, np.float32), np.zeros(0, np.float32), 0)
    text = ir(serial)
    print("depthwise forward |", "llvm.masked.store" in text, "BoundsError" in text,
          float(y[0, 2, 2, 9]))
    wserial = weight.weight_kernel(3, 3, 1, 1)[1]
    x = np.ones((1, 4, 4, 8), np.float32)
    wserial(x, x, np.empty((8, 9), np.float32), 1, 1, 1, 1, 1, 1)
    text = ir(wserial)
    print("depthwise weight |", "llvm.masked.load" in text, "BoundsError" in text)
    fused = kernels.kernel(2, 2, np.float32)
    up = kernels.packed_transform(np.ones((8, 3, 3, 16), np.float32), 2)
    width = up.shape[-1]
    fused(np.ones((1, 4, 4, 16), np.float32), up, np.empty((1, 4, 4, 8), np.float32), 1, 1,
          2, 2, 6, 1, np.empty((1, 16, 6, 16), np.float32),
          np.empty((1, 16, 6, width), np.float32), np.zeros((1, width), np.float32), 8)
    text = ir(fused)
    print("winograd fused |", "llvm.fma" in text, "BoundsError" in text, checked.CHECKED)
"""


@pytest.mark.slow
def test_off_the_family_checks_are_compiled_out() -> None:
    res = _run(GUARDED + NORMAL_FAMILIES, "0")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()[-3:]
    assert lines == ["depthwise forward | True False 9.0", "depthwise weight | True False",
                     "winograd fused | True False False"], res.stdout


# ---------------------------------------------------------------- int8 kernel families
# Each case: a legitimate qconv on the path (nothing flagged, equal to the reference),
# then the same qconv whose compiled driver is called with one buffer cut short (the
# plan's arguments, that buffer's last elements dropped, all of them read by the legit
# call): BoundsError naming the driver and the buffer.
INT8 = """
    import numpy as np
    import convengine as ce
    from convengine.quant import HAS_VNNI, qconv
    from convengine.quant.dense import kernels, reference
    from convengine.quant.depthwise import avx2 as dw_avx2
    from convengine.quant.depthwise import kernels as dw_kernels
    from convengine.epilogue_codes import Epilogue

    rng = np.random.default_rng(3)

    def cut(module, name, index, seen, by=1):
        real = getattr(module, name)

        def call(*args):  # the buffer ``by`` elements short (a 2-D array: rows)
            seen.append((name, args[index].size - args[index][:-by].size))
            args = list(args)
            args[index] = args[index][:-by]
            return real(*args)
        setattr(module, name, call)
        return real

    def conv(path, x, w, groups, algo=None):
        o = w.shape[0]
        with ce.config.override(int8_path=path):
            return qconv(x, 0.05, 3, w, np.full(o, 0.01), np.zeros(o, np.int64),
                         np.zeros(o, np.float32), out_scale=0.9, out_zero_point=5,
                         out_dtype=np.uint8, stride=(1, 1), padding=(1, 1), groups=groups,
                         layout="NHWC", **({"algo": algo} if algo else {}))

    def case(path, x, w, groups, patches, algo=None, by=1):
        got = conv(path, x, w, groups, algo)
        want = conv("portable", x, w, groups, algo)
        print("legit |", path, bool(np.array_equal(got, want)))
        seen = []
        for module, name, index in patches:
            cut(module, name, index, seen, by)
        try:
            conv(path, x, w, groups, algo)
        except IndexError as exc:
            print(type(exc).__name__, "|", exc, "|", seen)
        else:
            print("no error |", seen)
"""
INT8_DENSE_VNNI = INT8 + """
    x = rng.integers(0, 256, (1, 7, 9, 24)).astype(np.uint8)
    w = rng.integers(-128, 128, (20, 3, 3, 24)).astype(np.int8)  # 20 columns: 8x32 tiles
    # wp's last K step of 64 columns (256 bytes) cut: the 8x32 tiles read its first 128
    # bytes (a byte less would go unnoticed, rightly: nothing reads it)
    case("vnni", x, w, 1, [(kernels, "conv_vnni", 3)], by=256)
"""
INT8_DENSE_AVX2 = INT8 + """
    x = rng.integers(-128, 128, (1, 7, 9, 24)).astype(np.int8)  # int8 x: the int16 tiles
    w = rng.integers(-128, 128, (32, 3, 3, 24)).astype(np.int8)
    case("avx2", x, w, 1, [(kernels, "conv_avx2", 3), (kernels, "conv_avx2_u8s8", 2)])
"""
INT8_DEPTHWISE = INT8 + """
    x = rng.integers(0, 256, (1, 7, 9, 40)).astype(np.uint8)
    w = rng.integers(-128, 128, (40, 3, 3, 1)).astype(np.int8)
    if HAS_VNNI:  # wq (flat) one byte short
        case("vnni", x, w, 40, [(dw_kernels, "conv_depthwise_vnni", 3),
                                (dw_kernels, "conv_depthwise_vnni_serial", 3)], "depthwise")
    # AVX2's register blocks: wf (taps, C) one tap short
    case("avx2", x, w, 40, [(dw_avx2, "conv_depthwise_avx2", 2),
                            (dw_avx2, "conv_depthwise_avx2_serial", 2)], "depthwise")
"""


def _int8_lines(code: str) -> list[str]:
    res = _run(code, "1")
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()


def _assert_flagged(line: str, kernel: str, buffer: str) -> None:
    kind, message, seen = line.split(" | ")
    assert kind == "BoundsError", line
    assert f"{kernel} would access {buffer}[" in message, line
    assert seen.startswith("[("), line  # the cut driver ran


@pytest.mark.slow
def test_int8_vnni_dense_call_outside_wp_is_reported() -> None:
    from convengine.quant import HAS_VNNI
    if not HAS_VNNI:
        pytest.skip("no AVX512-VNNI")
    lines = _int8_lines(INT8_DENSE_VNNI)
    assert lines[-2] == "legit | vnni True", lines
    _assert_flagged(lines[-1], "int8 VNNI dense kernel", "wp")


@pytest.mark.slow
def test_int8_avx2_dense_call_outside_wp_is_reported() -> None:
    from convengine.quant.cpu import HAS_AVX2
    if not HAS_AVX2:
        pytest.skip("no AVX2")
    lines = _int8_lines(INT8_DENSE_AVX2)
    assert lines[-2] == "legit | avx2 True", lines
    _assert_flagged(lines[-1], "int8 AVX2 dense kernel", "wp")


@pytest.mark.slow
def test_int8_depthwise_calls_outside_the_weights_are_reported() -> None:
    from convengine.quant import HAS_VNNI
    from convengine.quant.cpu import HAS_AVX2
    if not HAS_AVX2:
        pytest.skip("no AVX2")
    lines = _int8_lines(INT8_DEPTHWISE)
    if HAS_VNNI:
        assert lines[-4] == "legit | vnni True", lines
        _assert_flagged(lines[-3], "int8 VNNI depthwise kernel", "wq")
    assert lines[-2] == "legit | avx2 True", lines
    _assert_flagged(lines[-1], "int8 AVX2 depthwise kernel", "wf")
