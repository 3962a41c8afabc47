"""qconv against an int64 numpy reference (every kernel path) and PyTorch's engines.

PyTorch: fbgemm computes the float32 formula of convengine.quant.numerics; the x86
engine runs fbgemm when weight zero points are nonzero (symmetric weights go to
oneDNN, whose float op order differs by 1 LSB on rare ties: tested apart, bounded).
fbgemm's depthwise kernel saturates at 16 bits, so depthwise is compared with torch
only on inputs small enough for torch to be exact; full range against int64.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import convengine
from convengine import ConvSetupError, qconv
from convengine.quant import HAS_AMX, HAS_VNNI, cpu
from convengine.quant.cpu import HAS_AVX2
from convengine.quant.depthwise import avx2 as depthwise_avx2
from convengine.quant.depthwise import kernels as depthwise_kernels


@pytest.fixture
def force_int8_path():
    """A function that forces the int8 path for this test (undone after it)."""
    previous = convengine.config.set(int8_path=None)
    yield lambda path: convengine.config.set(int8_path=path)
    convengine.config.set(**previous)


PATHS = (["portable"] + (["avx2"] if HAS_AVX2 else []) + (["vnni"] if HAS_VNNI else [])
         + (["amx"] if HAS_AMX else []))


# ----------------------------------------------------------------- int64 reference


def ref_acc(x, xzp, w, wzp, stride, padding, dilation, groups):
    """Exact sum (x - xzp)(w - wzp) in int64, NCHW, any spatial rank."""
    nd = x.ndim - 2
    xd = x.astype(np.int64) - int(xzp)
    wd = w.astype(np.int64) - np.broadcast_to(np.asarray(wzp), (w.shape[0],)).reshape(
        -1, *(1,) * (nd + 1))
    xd = np.pad(xd, ((0, 0), (0, 0), *[(p, p) for p in padding]))
    n, c = xd.shape[:2]
    o, cg = wd.shape[:2]
    og = o // groups
    out = [(xd.shape[2 + i] - dilation[i] * (wd.shape[2 + i] - 1) - 1) // stride[i] + 1
           for i in range(nd)]
    acc = np.zeros((n, o, *out), np.int64)
    for off in itertools.product(*(range(k) for k in wd.shape[2:])):
        sl = tuple(slice(k * d, k * d + s * (m - 1) + 1, s)
                   for k, d, s, m in zip(off, dilation, stride, out, strict=True))
        patch = xd[(slice(None), slice(None), *sl)]
        for g in range(groups):
            acc[:, g * og:(g + 1) * og] += np.einsum(
                "nc...,oc->no...", patch[:, g * cg:(g + 1) * cg],
                wd[(slice(g * og, (g + 1) * og), slice(None), *off)])
    return acc


def _f32(v):
    """Round float64 values to float32 (overflow to inf), back as float64.

    Each float32 operation below is the float64 operation on float32 operands rounded
    once to float32: exact for +, *, / (float64 holds more than twice float32's bits).
    """
    with np.errstate(over="ignore"):
        return np.asarray(v, np.float64).astype(np.float32).astype(np.float64)


def ref_requant(acc, x_scale, w_scale, y_scale, y_zp, bias=None, *, out_dtype=np.uint8,
                relu=False, bias_mode="float", axis=-1):
    """The requantization definition, written from the formula (not convengine's code).

    ``acc`` integer sums ``sum (x_q - x_zp)(w_q - w_zp[c])``, channel ``c`` on ``axis``;
    ``s = f32(x_scale) * f32(w_scale[c])`` and ``m = s / f32(y_scale)``, each rounded
    to float32. ``bias_mode="float"`` (PyTorch/fbgemm, all float32)::

        y = rint((f32(acc) + f32(bias[c]) / s) * m) + y_zp

    ``"int32"`` (ONNX QLinearConv): ``y = rint((acc + bias[c]) * m + y_zp)`` in float64,
    the sum an int32 one (it wraps). Then ReLU clamps at ``y_zp`` and the result
    saturates to ``out_dtype``; ``rint`` rounds half to even.
    """
    acc = np.asarray(acc, np.int64)
    o = acc.shape[axis]
    shape = [1] * acc.ndim
    shape[axis] = o
    per_c = lambda v: np.broadcast_to(np.asarray(v, np.float64), (o,)).reshape(shape)  # noqa: E731
    s = _f32(_f32(x_scale) * _f32(per_c(w_scale)))
    m = _f32(s / _f32(y_scale))
    if bias_mode == "float":
        term = 0.0 if bias is None else _f32(_f32(per_c(bias)) / s)
        v = np.rint(_f32(_f32(_f32(acc) + term) * m)) + y_zp
    else:
        total = acc + (0 if bias is None else np.asarray(bias, np.int64).reshape(shape))
        total = (total + 2**31) % 2**32 - 2**31  # an int32 sum wraps
        v = np.rint(total.astype(np.float64) * m + y_zp)
    info = np.iinfo(out_dtype)
    lo = max(info.min, y_zp) if relu else info.min
    return np.clip(v, lo, info.max).astype(out_dtype)


def assert_equal_q(got, want, what=""):
    """Bit-exact comparison that names the first mismatch."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.argwhere(got.astype(np.int64) != want.astype(np.int64))
    assert bad.size == 0, (
        f"{what}: {len(bad)} of {got.size} differ; first at {tuple(bad[0])}: "
        f"{got[tuple(bad[0])]} != {want[tuple(bad[0])]}")


def test_assert_equal_q_can_fail():
    with pytest.raises(AssertionError):
        assert_equal_q(np.array([1, 2], np.uint8), np.array([1, 3], np.uint8))


# ----------------------------------------------------------------- sampled problems

CASES = [
    # ndim, N, C, O, size, kernel, stride, pad, dil, groups, x dtype, w dtype, per_channel
    (2, 2, 16, 24, 9, 3, 1, 1, 1, 1, "uint8", "int8", True),
    (2, 1, 12, 70, 8, 3, 2, 1, 2, 1, "int8", "uint8", False),
    (2, 2, 8, 8, 7, 3, 1, 1, 1, 8, "uint8", "int8", True),
    (2, 1, 48, 48, 9, 3, 2, 1, 1, 48, "int8", "int8", True),
    (2, 1, 40, 40, 8, 3, 1, 2, 2, 40, "uint8", "uint8", False),
    (2, 1, 12, 6, 6, 1, 1, 0, 1, 3, "int8", "int8", True),
    (2, 1, 7, 9, 5, 2, 1, 0, 1, 1, "uint8", "int8", False),
    (2, 1, 64, 130, 5, 1, 1, 0, 1, 1, "uint8", "int8", True),
    (2, 2, 128, 70, 7, 1, 1, 0, 1, 1, "uint8", "int8", True),  # x read in place, 98 rows
    (2, 1, 130, 40, 6, 3, 1, 1, 1, 1, "uint8", "int8", True),  # K = 1170: several K chunks
    (1, 3, 10, 20, 11, 3, 2, 2, 1, 2, "uint8", "int8", True),
    (1, 2, 6, 6, 9, 5, 1, 2, 2, 6, "int8", "int8", False),
    (3, 1, 8, 12, 5, 3, 1, 1, 1, 1, "uint8", "int8", True),
    (3, 2, 6, 6, 4, 2, 2, 1, 1, 6, "uint8", "uint8", True),
    (3, 1, 4, 8, 5, (1, 3, 2), (1, 2, 1), 1, (2, 1, 1), 2, "int8", "int8", False),
]


def _make(case, rng):
    nd, n, c, o, size, k, s, p, d, g, xdt, wdt, per_channel = case
    tup = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)  # noqa: E731
    xi, wi = np.iinfo(xdt), np.iinfo(wdt)
    x = rng.integers(xi.min, xi.max + 1, (n, c, *tup(size))).astype(xdt)
    w = rng.integers(wi.min, wi.max + 1, (o, c // g, *tup(k))).astype(wdt)
    xzp = int(rng.integers(xi.min, xi.max + 1))
    lo, hi = (-20, 20) if wdt == "int8" else (100, 160)
    wzp = rng.integers(lo, hi, o) if per_channel else int(rng.integers(lo, hi))
    ws = rng.uniform(1e-3, 2e-2, o) if per_channel else float(rng.uniform(1e-3, 2e-2))
    conv_args = dict(stride=tup(s), padding=tup(p), dilation=tup(d), groups=g)
    return x, xzp, w, wzp, ws, conv_args


def _case_id(c):
    return f"{c[0]}d-C{c[2]}-O{c[3]}-g{c[9]}-{c[10]}x{c[11]}"


def _slow_but(values, fast, ids=None):
    """``values`` as pytest params, those not at the indices ``fast`` marked slow."""
    return [pytest.param(v, id=None if ids is None else ids(v),
                         marks=() if i in fast else pytest.mark.slow)
            for i, v in enumerate(values)]


@pytest.mark.parametrize("case", _slow_but(CASES, (0, 3, 10), _case_id))
@pytest.mark.parametrize("path", PATHS + ["depthwise"])
def test_against_int64_reference(case, path):
    rng = np.random.default_rng(hash(case) % 2**32)
    x, xzp, w, wzp, ws, conv_args = _make(case, rng)
    g, c, o = conv_args["groups"], x.shape[1], w.shape[0]
    if path == "depthwise" and not (g == c == o):
        pytest.skip("depthwise kernel serves groups == C == O only")
    acc = ref_acc(x, xzp, w, wzp, **{k: v for k, v in conv_args.items()})
    raw = qconv(x, 0.02, xzp, w, ws, wzp, out_dtype=np.int32, algo=path, **conv_args)
    assert_equal_q(raw, acc, "raw accumulator")
    bias = rng.normal(0, 50, o).astype(np.float32)
    for relu, out_dtype, mode in [(False, np.uint8, "float"), (True, np.int8, "float"),
                                  (True, np.uint8, "int32")]:
        b = bias if mode == "float" else np.round(bias * 100).astype(np.int32)
        want = ref_requant(acc, 0.02, ws, 0.7, 3, b, out_dtype=out_dtype, relu=relu,
                           bias_mode=mode, axis=1)
        y = qconv(x, 0.02, xzp, w, ws, wzp, b, out_scale=0.7, out_zero_point=3,
                  out_dtype=out_dtype, relu=relu, bias_mode=mode, algo=path, **conv_args)
        assert y.dtype == out_dtype
        assert_equal_q(y, want, f"requantized relu={relu} {mode}")


def test_nhwc_layout_matches_nchw():
    rng = np.random.default_rng(3)
    x, xzp, w, wzp, ws, conv_args = _make(CASES[0], rng)
    args = dict(out_scale=0.5, out_zero_point=100, **conv_args)
    y = qconv(x, 0.02, xzp, w, ws, wzp, **args)
    y_nhwc = qconv(np.moveaxis(x, 1, -1), 0.02, xzp, np.moveaxis(w, 1, -1), ws, wzp,
                   layout="NHWC", **args)
    assert_equal_q(np.moveaxis(y_nhwc, -1, 1), y, "NHWC vs NCHW")


def test_full_range_depthwise_is_exact():
    """Inputs where fbgemm's 16-bit depthwise saturates: we stay exact."""
    rng = np.random.default_rng(4)
    x = np.where(rng.random((2, 32, 10, 10)) < 0.5, 0, 255).astype(np.uint8)
    w = np.full((32, 1, 3, 3), -128, np.int8)
    w[:, :, 1, 1] = 127
    for path in PATHS + ["depthwise"]:
        raw = qconv(x, 0.1, 0, w, 0.1, 0, out_dtype=np.int32, padding=1, groups=32, algo=path)
        assert_equal_q(raw, ref_acc(x, 0, w, 0, (1, 1), (1, 1), (1, 1), 32), path)


DEPTHWISE_CASES = [
    # ndim, N, C, size, kernel, stride, pad, dil, x dtype, w range, w zero points
    (2, 2, 144, (7, 9), 3, 1, 1, 1, "uint8", (-128, 128), 0),  # 64 + 64 + 16 channels
    (2, 1, 100, 6, 3, 2, 1, 1, "int8", (-40, 40), "per-channel"),  # w - wzp fits int8
    (2, 1, 83, (5, 4), 3, (2, 1), (0, 2), 2, "uint8", (-128, 128), "per-channel"),
    (2, 1, 16, 3, 3, 1, 3, 1, "int8", (-128, 128), 7),  # padding wider than the input
    (2, 1, 24, 8, (5, 3), 1, 2, 1, "uint8", (-128, 128), 0),  # 5 kernel rows: 2 groups
    (2, 1, 64, 9, (4, 2), 1, (2, 1), 1, "int8", (-128, 128), "per-channel"),  # a full group
    (2, 1, 18, 9, (1, 7), 3, (0, 3), 1, "uint8", (-128, 128), "per-channel"),
    (1, 2, 40, 13, 5, 2, 2, 1, "int8", (-128, 128), 3),
    (3, 1, 20, (3, 4, 5), 3, 1, 1, (1, 2, 1), "uint8", (-20, 20), "per-channel"),
    # whole vectors of 8 channels (the AVX2 kernel): dilated, 3-D, int8 input
    (2, 2, 48, (9, 11), 3, (1, 2), 2, 2, "uint8", (-128, 128), "per-channel"),
    # 3-wide kernel rows at stride 2 (each input column widened once), 16 + 16 + 8
    (2, 2, 40, (7, 12), 3, 2, 1, 1, "uint8", (-128, 128), "per-channel"),
    (3, 1, 24, (3, 4, 6), 3, (1, 1, 2), 1, (1, 1, 2), "int8", (-128, 128), 5),
]


@pytest.mark.parametrize("case", _slow_but(
    DEPTHWISE_CASES, (3, 9), lambda c: f"{c[0]}d-C{c[2]}-k{c[4]}-{c[8]}-wzp{c[10]}"))
@pytest.mark.parametrize("int8_path, serial_max", [("auto", None), ("auto", 0),
                                                   ("avx2", 10**12), ("avx2", 0),
                                                   ("portable", None)],
                         ids=["vnni-serial", "vnni-parallel", "avx2-serial", "avx2-parallel",
                              "portable"])
def test_depthwise_kernels_against_int64_reference(case, int8_path, serial_max, monkeypatch,
                                                   force_int8_path):
    """Every depthwise kernel (VNNI where the CPU has it, on the calling thread and in
    parallel; AVX2's register blocks where channels come in whole vectors of 8; the
    float one on the portable path): channel blocks of 64 and 16 and a ragged tail,
    padding on every side, kernel rows in groups of four, weights that fit int8 after
    their zero point and that do not."""
    if int8_path == "avx2" and not HAS_AVX2:
        pytest.skip("no AVX2 on this CPU")
    nd, n, c, size, k, s, p, d, xdt, (wlo, whi), wzp_kind = case
    tup = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)  # noqa: E731
    rng = np.random.default_rng(c)
    xi = np.iinfo(xdt)
    x = rng.integers(xi.min, xi.max + 1, (n, c, *tup(size))).astype(xdt)
    w = rng.integers(wlo, whi, (c, 1, *tup(k))).astype(np.int8)
    wzp = rng.integers(-60, 60, c) if wzp_kind == "per-channel" else wzp_kind
    xzp = int(rng.integers(xi.min, xi.max + 1))
    ws = rng.uniform(1e-3, 2e-2, c)
    conv_args = dict(stride=tup(s), padding=tup(p), dilation=tup(d), groups=c)
    force_int8_path(int8_path)
    if serial_max is not None:
        monkeypatch.setattr(depthwise_kernels, "SERIAL_MAX_MACS", serial_max)
        monkeypatch.setattr(depthwise_avx2, "SERIAL_MAX_MACS", serial_max)
    acc = ref_acc(x, xzp, w, wzp, **conv_args)
    raw = qconv(x, 0.02, xzp, w, ws, wzp, out_dtype=np.int32, algo="depthwise", **conv_args)
    assert_equal_q(raw, acc, "raw accumulator")
    bias = rng.normal(0, 50, c).astype(np.float32)
    for relu, out_dtype, mode in [(False, np.uint8, "float"), (True, np.int8, "float"),
                                  (False, np.int8, "int32")]:
        b = bias if mode == "float" else np.round(bias * 100).astype(np.int32)
        want = ref_requant(acc, 0.02, ws, 0.3, -5 if out_dtype == np.int8 else 9, b,
                           out_dtype=out_dtype, relu=relu, bias_mode=mode, axis=1)
        y = qconv(x, 0.02, xzp, w, ws, wzp, b, out_scale=0.3,
                  out_zero_point=-5 if out_dtype == np.int8 else 9, out_dtype=out_dtype,
                  relu=relu, bias_mode=mode, algo="depthwise", **conv_args)
        assert_equal_q(y, want, f"requantized relu={relu} {mode}")


@pytest.mark.parametrize("c", [32, 40])
def test_depthwise_requantization_ties_and_saturation(c):
    """The vectorised epilogues (clamp before rounding; float32 bias, and int32 bias in
    float64) against the scalar formula on exact .5 ties, on int32 sums that wrap and
    on values far outside the output range, both signs; 40 channels: a ragged block."""
    x = np.zeros((1, c, 1, 1), np.uint8)
    x[0, :, 0, 0] = np.arange(c) * 6
    w = np.ones((c, 1, 1, 1), np.int8)
    biases = {"float": np.resize(np.array([0.5, 1.5, -0.5, -2.5, 1e6, -1e6, 3e38, -3e38],
                                          np.float32), c),
              "int32": np.resize(np.array([1, 3, -1, -5, 2**31 - 2, -(2**31), 10**9, -(10**9)],
                                          np.int32), c)}
    for (mode, bias), (out_dtype, zp) in itertools.product(
            biases.items(), [(np.uint8, 0), (np.uint8, 200), (np.int8, -3)]):
        scale = 1.0 if mode == "float" else 0.5
        for relu in (False, True):
            acc = np.moveaxis(ref_acc(x, 0, w, 0, (1, 1), (0, 0), (1, 1), c), 1, -1)
            want = ref_requant(acc, 1.0, np.full(c, scale), 1.0, zp, bias,
                               out_dtype=out_dtype, relu=relu, bias_mode=mode)
            y = qconv(x, 1.0, 0, w, np.full(c, scale), 0, bias, out_scale=1.0,
                      out_zero_point=zp, out_dtype=out_dtype, relu=relu, bias_mode=mode,
                      groups=c, algo="depthwise")
            assert_equal_q(np.moveaxis(y, 1, -1), want,
                           f"{mode} {np.dtype(out_dtype)} zp={zp}")


@pytest.mark.parametrize("data", ["below-128", "5%-high", "40%-high", "all-saturating"])
@pytest.mark.parametrize("c,o,size,k,stride,pad", [
    pytest.param(64, 32, 9, 3, 1, 1, id="3x3", marks=pytest.mark.slow),
    pytest.param(5, 16, 8, 3, 2, 0, id="3x3-s2-K45"),
    pytest.param(130, 48, 6, 3, 1, 1, id="3x3-K1170", marks=pytest.mark.slow),
    pytest.param(64, 64, 7, 1, 1, 0, id="1x1-in-place", marks=pytest.mark.slow),
    pytest.param(6, 16, 5, 1, 1, 0, id="1x1-C6")])
def test_avx2_u8s8_path(c, o, size, k, stride, pad, data, monkeypatch):
    """AVX2's vpmaddubsw tiles on raw bytes, their saturated pairs found and added back:
    exact against the int64 reference for x below 128 (nothing to add back), a few and
    many bytes at 128 or more against full-range weights, and every pair saturated
    (x all 255, weights all 127 or -128), for PyTorch's and ONNX's requantization and
    both 8-bit outputs; taken while few_heavy_pairs passes, else the int16 tiles run."""
    from convengine.quant.dense import kernels

    if not HAS_AVX2:
        pytest.skip("no avx2 on this CPU")
    monkeypatch.setattr(kernels, "u8s8_share", lambda *a: 1)  # any share of high bytes
    calls = []
    real = kernels.conv_avx2_u8s8
    monkeypatch.setattr(kernels, "conv_avx2_u8s8", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(c * o + k)
    x = rng.integers(0, 128, (2, c, size, size)).astype(np.uint8)
    w = rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
    if data == "all-saturating":
        x[:] = 255
        w[:] = np.where(rng.random(w.shape) < 0.5, 127, -128)
    elif data != "below-128":
        high = rng.random(x.shape) < float(data.split("%")[0]) / 100
        x[high] = rng.integers(128, 256, high.sum())
    ws, xzp = rng.uniform(1e-3, 2e-2, o) / (64 if data == "all-saturating" else 1), 9
    acc = np.moveaxis(ref_acc(x, xzp, w, 0, (stride,) * 2, (pad,) * 2, (1, 1), 1), 1, -1)
    bias = rng.normal(0, 50, o).astype(np.float32)
    for out_dtype, mode, relu in [(np.uint8, "float", True), (np.int8, "float", False),
                                  (np.uint8, "int32", False)]:
        b = bias if mode == "float" else np.round(bias * 100).astype(np.int32)
        want = ref_requant(acc, 0.02, ws, 0.7, 3, b, out_dtype=out_dtype, relu=relu,
                           bias_mode=mode)
        y = qconv(x, 0.02, xzp, w, ws, 0, b, out_scale=0.7, out_zero_point=3,
                  out_dtype=out_dtype, relu=relu, bias_mode=mode, stride=stride,
                  padding=pad, algo="avx2")
        assert_equal_q(np.moveaxis(y, 1, -1), want, f"{np.dtype(out_dtype)} {mode}")
    assert len(calls) == 3


def test_avx2_u8s8_gate():
    """Where most bytes of x are 128 or more and the weights large, the fixes would
    cost more than the vpmaddubsw tiles save: few_heavy_pairs turns the call to the
    int16 tiles (both exact)."""
    from convengine.quant.dense import kernels
    from convengine.quant.prepack import pair_fixes

    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (64, 576)).astype(np.int8)
    ptr, col, _ = pair_fixes(w, 288)
    share = kernels.u8s8_share(64, col.size / 288)
    x = rng.integers(0, 256, 10_000).astype(np.uint8)
    assert not kernels.few_heavy_pairs(x, share)
    x[x >= 128] -= 128
    assert kernels.few_heavy_pairs(x, share)


def test_avx2_int16_weights_packed_on_first_fallback(monkeypatch):
    """On the AVX2 path a call that takes the byte tiles packs no int16 weights; a later
    call whose x has many heavy pairs packs them and runs the int16 tiles, both exact
    against the int64 reference."""
    from convengine.quant import plan, prepack

    if not HAS_AVX2:
        pytest.skip("no avx2 on this CPU")
    monkeypatch.setattr(cpu, "int8_path", lambda: "avx2")
    prepack.clear_cache()
    packed_paths = []
    real = plan.packed_weights
    monkeypatch.setattr(plan, "packed_weights",
                        lambda *a: packed_paths.append(a[-1]) or real(*a))
    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, (32, 16, 3, 3)).astype(np.int8)
    ws = rng.uniform(1e-3, 2e-2, 32)
    for x, paths in [(rng.integers(0, 128, (1, 16, 9, 9)), ["avx2_u8s8"]),
                     (rng.integers(0, 256, (1, 16, 9, 9)), ["avx2_u8s8", "avx2"])]:
        packed_paths.clear()
        x = x.astype(np.uint8)
        acc = np.moveaxis(ref_acc(x, 7, w, 0, (1, 1), (1, 1), (1, 1), 1), 1, -1)
        want = ref_requant(acc, 0.02, ws, 0.7, 3, None, out_dtype=np.uint8)
        y = qconv(x, 0.02, 7, w, ws, 0, None, out_scale=0.7, out_zero_point=3, padding=1)
        assert_equal_q(np.moveaxis(y, 1, -1), want, str(paths))
        assert packed_paths == paths


@pytest.mark.parametrize("k,path", [(1, "vnni"), (3, "vnni"), (1, "avx2"), (3, "avx2")])
def test_int32_bias_requantization_ties_and_saturation(k, path, monkeypatch):
    """ONNX's float64 epilogue in the micro-kernels (VNNI 1x1: conv_vnni; 3x3: implicit
    GEMM; AVX2: conv_avx2) against the numpy form on exact .5 ties (multiplier 0.5, odd
    sums), sums that wrap int32 and values far outside the output range, a ragged last
    column block."""
    from convengine.quant import plan
    from convengine.quant.dense import kernels

    if not {"vnni": HAS_VNNI, "avx2": HAS_AVX2}[path]:
        pytest.skip(f"no {path} on this CPU")
    monkeypatch.setattr(cpu, "int8_path", lambda: path)
    monkeypatch.setattr(plan, "IMPLICIT_MIN_WIDTH", 1)
    calls = []
    real = kernels.conv_vnni_taps
    monkeypatch.setattr(kernels, "conv_vnni_taps", lambda *a: calls.append(1) or real(*a))
    o = 70
    x = np.zeros((1, 4, 1, 1), np.uint8)
    x[0, 0, 0, 0] = 1
    w = np.zeros((o, 4, k, k), np.int8)
    w[:, 0, k // 2, k // 2] = np.arange(o) % 7 - 3
    bias = np.array([1, 3, -1, -5, 2**31 - 2, -(2**31), 10**9, -(10**9), 255, 511] * 7,
                    np.int32)
    acc = np.moveaxis(ref_acc(x, 0, w, 0, (1, 1), (k // 2,) * 2, (1, 1), 1), 1, -1)
    for out_dtype, zp in [(np.uint8, 0), (np.uint8, 200), (np.int8, -3)]:
        for relu in (False, True):
            want = ref_requant(acc, 1.0, np.full(o, 0.5), 1.0, zp, bias, out_dtype=out_dtype,
                               relu=relu, bias_mode="int32")
            y = qconv(x, 1.0, 0, w, np.full(o, 0.5), 0, bias, out_scale=1.0,
                      out_zero_point=zp, out_dtype=out_dtype, relu=relu, bias_mode="int32",
                      padding=k // 2, algo=path, layout="NCHW")
            assert_equal_q(np.moveaxis(y, 1, -1), want, f"{np.dtype(out_dtype)} zp={zp}")
    assert len(calls) == (6 if k == 3 and path == "vnni" else 0)


@pytest.mark.parametrize("path", ["vnni", "avx2"])
def test_int32_bias_requantization_where_float32_misrounds(path, monkeypatch):
    """Sums beyond 2**24 (float32 rounds them) whose float64 value lies just off a
    half-integer: the micro-kernels' float32 first pass (VNNI's 16 lanes, AVX2's 8) must
    hand these lanes to float64. The case is checked to tell the two apart (float32
    alone gets some lanes wrong)."""
    if not {"vnni": HAS_VNNI, "avx2": HAS_AVX2}[path]:
        pytest.skip(f"no {path} on this CPU")
    monkeypatch.setattr(cpu, "int8_path", lambda: path)
    o, mult = 40, 2.0 ** -18
    x = np.zeros((1, 4, 1, 1), np.uint8)
    x[0, 0, 0, 0] = 1
    w = np.zeros((o, 4, 1, 1), np.int8)
    w[:, 0, 0, 0] = np.arange(o) % 5 - 2
    halves = 129 + 2 * (np.arange(o) % 60)  # odd: s * mult = halves / 2 (+ the offset)
    sums = halves * 2**17 + np.resize([1, -1, 3, -3, 0], o)
    bias = (sums - w[:, 0, 0, 0]).astype(np.int32)
    want = ref_requant(w[:, 0, 0, 0][None], 1.0, np.full(o, mult), 1.0, 0, bias,
                       bias_mode="int32")  # + bias: sums
    float32_alone = np.clip(np.rint(sums.astype(np.float32) * np.float32(mult)), 0, 255)
    assert np.any(float32_alone != want)  # the case tells float32 from float64
    y = qconv(x, 1.0, 0, w, np.full(o, mult), 0, bias, out_scale=1.0, out_zero_point=0,
              bias_mode="int32", algo=path, layout="NCHW")
    assert_equal_q(y[0, :, 0, 0], want[0], "near-tie lanes")


@pytest.mark.parametrize("path", ["vnni", "avx2"])
@pytest.mark.parametrize("zp", [0, 255])
def test_int32_bias_requantization_just_beyond_the_tie_margin(path, zp, monkeypatch):
    """Values 1-3 ``TIE_MARGIN`` off a half-integer, from sums up to 2**30 (float32's
    accumulator off by up to 32) and output zero points at both ends: the float32
    pass alone rounds these (no float64 recompute), so the margin must exceed its
    error; every lane as numpy's float64."""
    from convengine.quant._ir import TIE_MARGIN

    if not {"vnni": HAS_VNNI, "avx2": HAS_AVX2}[path]:
        pytest.skip(f"no {path} on this CPU")
    monkeypatch.setattr(cpu, "int8_path", lambda: path)
    rng = np.random.default_rng(zp + len(path))
    o = 320
    mult = rng.uniform(2.0 ** -23, 2.0 ** -21, o).astype(np.float32)
    side = rng.choice([-1.0, 1.0], o) * rng.uniform(1.0, 3.0, o) * TIE_MARGIN
    target = rng.integers(2, 250, o) + 0.5 + side - zp  # v - zp
    sums = np.rint(target / mult.astype(np.float64)).astype(np.int64)
    assert np.count_nonzero(np.abs(sums) > 2**24) > o // 2 and np.all(np.abs(sums) < 2**31)
    x = np.zeros((1, 4, 1, 1), np.uint8)
    x[0, 0, 0, 0] = 1
    w = np.ones((o, 4, 1, 1), np.int8)
    bias = (sums - 1).astype(np.int32)
    want = ref_requant(np.ones((1, o)), 1.0, mult, 1.0, zp, bias, bias_mode="int32")
    v = sums * mult.astype(np.float64) + zp
    off = np.abs(v - np.floor(v) - 0.5)
    assert np.all(off > TIE_MARGIN) and np.all(off < 4 * TIE_MARGIN)  # the band tested
    y = qconv(x, 1.0, 0, w, mult, 0, bias, out_scale=1.0, out_zero_point=zp,
              bias_mode="int32", algo=path, layout="NCHW")
    assert_equal_q(y[0, :, 0, 0], want[0], "lanes just beyond the margin")


def test_weights_changed_in_place_are_repacked():
    rng = np.random.default_rng(5)
    x, xzp, w, wzp, ws, conv_args = _make(CASES[0], rng)
    first = qconv(x, 0.02, xzp, w, ws, wzp, out_dtype=np.int32, **conv_args)
    w[0, 0, 0, 0] ^= 0x55
    second = qconv(x, 0.02, xzp, w, ws, wzp, out_dtype=np.int32, **conv_args)
    assert_equal_q(second, ref_acc(x, xzp, w, wzp, **conv_args), "after in-place change")
    assert not np.array_equal(first, second)


def test_bias_and_scales_changed_in_place_are_seen():
    """Per-argument constants are cached by value, never by identity."""
    rng = np.random.default_rng(6)
    x, xzp, w, wzp, ws, conv_args = _make(CASES[0], rng)
    o = w.shape[0]
    bias = rng.normal(0, 50, o).astype(np.float32)
    acc = np.moveaxis(ref_acc(x, xzp, w, wzp, **conv_args), 1, -1)
    for _ in range(2):
        y = qconv(x, 0.02, xzp, w, ws, wzp, bias, out_scale=0.7, out_zero_point=3, **conv_args)
        want = ref_requant(acc, 0.02, ws, 0.7, 3, bias)
        assert_equal_q(np.moveaxis(y, 1, -1), want, "after changing bias and w_scale")
        bias += 40
        ws *= 1.5


def test_forced_portable_path(force_int8_path):
    cpu.set_int8_path("portable")
    try:
        assert cpu.int8_path() == "portable"
        assert convengine.quant.plan.choose_algo(
            convengine.quant.plan.make_problem("forward", (1, 4, 5, 5), (4, 4, 3, 3),
                                              dtype="uint8"), "auto") == "portable"
    finally:
        cpu.set_int8_path("auto")
    with pytest.raises(ConvSetupError, match="int8.path"):
        cpu.set_int8_path("fast")


def test_env_var_forces_portable(tmp_path):
    import os
    import subprocess
    import sys
    env = dict(os.environ, CONVENGINE_INT8_PATH="portable")
    code = "import convengine.quant as q; print(q.int8_path())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "portable"


# ----------------------------------------------------------------- errors


def _ok_args():
    x = np.zeros((1, 4, 5, 5), np.uint8)
    w = np.zeros((6, 4, 3, 3), np.int8)
    return [x, 0.1, 0, w, 0.1, 0], dict(out_scale=0.2, out_zero_point=0)


@pytest.mark.parametrize("change, match", [
    ((1, -0.1), "x_scale must be finite and > 0"),
    ((1, float("nan")), "x_scale must be finite"),
    ((2, 256), r"x_zero_point must lie in \[0, 255\]"),
    ((4, np.ones(5)), "w_scale must be a scalar or 6 values"),
    ((5, np.zeros(7, np.int64)), "w_zero_point must be a scalar or 6 values"),
    ((5, 200), r"w_zero_point must lie in \[-128, 127\]"),
    ((0, np.zeros((1, 4, 5, 5), np.float32)), "x_q must be an integer array"),
    ((3, np.zeros((6, 4, 3, 3), np.int16)), "w_q must be an integer array of dtype int8"),
    ((3, np.zeros((6, 3, 3, 3), np.int8)), "channel mismatch"),
])
def test_errors_name_the_argument(change, match):
    args, kwargs = _ok_args()
    args[change[0]] = change[1]
    with pytest.raises(ConvSetupError, match=match):
        qconv(*args, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(out_scale=0.0), "out_scale must be finite and > 0"),
    (dict(out_zero_point=-1), "out_zero_point must lie in"),
    (dict(out_dtype=np.float32), "out_dtype must be one of"),
    (dict(out_dtype=np.int32, relu=True), "relu=True needs an 8-bit out_dtype"),
    (dict(bias_mode="double"), "bias_mode must be one of"),
    (dict(algo="fast"), "unknown algo"),
    (dict(algo="depthwise"), "algo='depthwise' needs groups"),
    (dict(out_scale=None), "out_scale and out_zero_point are required"),
])
def test_option_errors(kwargs, match):
    args, base = _ok_args()
    with pytest.raises(ConvSetupError, match=match):
        qconv(*args, **{**base, **kwargs})


def test_bias_errors():
    args, kwargs = _ok_args()
    with pytest.raises(ConvSetupError, match="bias must be a float array"):
        qconv(*args, np.zeros(6, np.int32), **kwargs)
    with pytest.raises(ConvSetupError, match="bias must be an int32 array"):
        qconv(*args, np.zeros(6, np.float32), bias_mode="int32", **kwargs)
    with pytest.raises(ConvSetupError, match=r"bias has shape \(5,\), expected \(6,\)"):
        qconv(*args, np.zeros(5, np.float32), **kwargs)


def test_empty_batch():
    args, kwargs = _ok_args()
    args[0] = np.zeros((0, 4, 5, 5), np.uint8)
    assert qconv(*args, **kwargs).shape == (0, 6, 3, 3)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_nhwc_copy(dtype):
    from convengine.quant.layout import nhwc_copy

    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (2, 3, 5, 7)).astype(np.int16).astype(dtype)
    view = np.moveaxis(x, 1, -1)  # NCHW memory seen as (N, H, W, C)
    got = nhwc_copy(view)
    assert got.flags.c_contiguous and got.dtype == x.dtype
    assert np.array_equal(got, view)


@pytest.mark.skipif(not HAS_VNNI, reason="the implicit-GEMM kernel is a VNNI kernel")
@pytest.mark.parametrize("n,c,o,h,w,k,pad,s,threads", [
    (1, 8, 72, 9, 13, 3, 1, 1, 2),     # ragged width (13 = 2 x 6 + 1), ragged O
    *[pytest.param(*case, marks=pytest.mark.slow) for case in [
        (2, 16, 130, 7, 7, 3, 1, 1, 2),    # three column blocks, column parts, batch 2
        (1, 4, 64, 6, 11, (1, 3), (0, 2), 1, 1),
        (1, 12, 70, 8, 9, 5, 2, 1, 2),
        (1, 12, 64, 8, 9, 5, 2, 1, 2),
        (1, 32, 64, 5, 5, 3, 0, 1, 2),     # no padding
        (1, 8, 64, 15, 16, 3, 1, 2, 2),    # stride 2, odd height
        (2, 4, 100, 9, 12, (3, 2), (1, 0), (1, 3), 2),
        (1, 3, 64, 20, 17, 7, 3, 2, 2),    # a 3-channel stem: channels padded to 4
        (1, 6, 64, 9, 14, 3, 1, 2, 1),
    ]],
])
def test_implicit_gemm_against_int64_reference(n, c, o, h, w, k, pad, s, threads,
                                               monkeypatch):
    """Ungrouped convs on uint8 with weight zero points 0 run conv_vnni_taps (no im2col):
    the same bytes as the int64 reference, padding, strides, ragged runs and all."""
    from convengine.quant import plan
    from convengine.quant.dense import kernels

    monkeypatch.setattr(cpu, "int8_path", lambda: "vnni")
    monkeypatch.setattr(plan, "get_num_threads", lambda: threads)
    monkeypatch.setattr(plan, "IMPLICIT_MIN_WIDTH", 1)  # narrow outputs too, for the test
    calls = []
    real = kernels.conv_vnni_taps
    monkeypatch.setattr(kernels, "conv_vnni_taps", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(n * c + o)
    kk = (k, k) if isinstance(k, int) else k
    pp = (pad, pad) if isinstance(pad, int) else pad
    x = rng.integers(0, 256, (n, c, h, w)).astype(np.uint8)
    wq = rng.integers(-128, 128, (o, c, *kk)).astype(np.int8)
    ws = rng.uniform(1e-3, 2e-2, o)
    bias = rng.normal(0, 50, o).astype(np.float32)
    ss = (s, s) if isinstance(s, int) else s
    args = dict(stride=ss, padding=pp, dilation=(1, 1), groups=1)
    acc = ref_acc(x, 37, wq, np.zeros(o, np.int64), **args)
    for relu, out_dtype, mode in [(False, np.uint8, "float"), (True, np.int8, "float"),
                                  (False, np.uint8, "int32"), (True, np.int8, "int32")]:
        b = bias if mode == "float" else np.round(bias * 100).astype(np.int32)
        want = ref_requant(acc, 0.02, ws, 0.7, 3, b, out_dtype=out_dtype, relu=relu,
                           bias_mode=mode, axis=1)
        y = qconv(x, 0.02, 37, wq, ws, 0, b, out_scale=0.7, out_zero_point=3,
                  out_dtype=out_dtype, relu=relu, bias_mode=mode, algo="vnni", **args)
        assert_equal_q(y, want, f"relu={relu} {mode}")
    assert len(calls) == 4


@pytest.fixture
def zen4_panels(monkeypatch):
    """The int8 panels of a 1 MiB L2 (384 KiB, host_params.vnni_panel_bytes on Zen 4),
    whatever this host's L2: the tile counts below are worked out for them (2 MiB
    L2s, as on Emerald Rapids, make 768 KiB panels and other counts)."""
    from convengine.quant.dense import kernels

    def clear():
        kernels.work_split.cache_clear()
        if hasattr(kernels.panel_rows, "cache_clear"):
            kernels.panel_rows.cache_clear()

    clear()
    monkeypatch.setattr(kernels, "PANEL_BYTES", 384 << 10)
    yield kernels
    monkeypatch.undo()
    clear()


def test_work_split_prefers_rows_at_near_equal_tiles(zen4_panels):
    """Column parts only where they save the busiest thread a twentieth of its tiles:
    at about equal counts the threads take row panels (each reads its own rows of x)."""
    kernels = zen4_panels

    assert kernels.work_split(3136, 64, 256, 2)[1] == 1  # 1046 vs 1048 tiles: rows
    assert kernels.work_split(49, 512, 512, 2)[1] == 2  # 7 x 7: 5 + 4 row blocks: columns
    assert kernels.work_split(196, 4608, 512, 2)[1] == 2  # 132 vs 144 tiles: columns
