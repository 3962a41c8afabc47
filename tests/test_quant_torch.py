"""Bit-exactness against PyTorch's quantized CPU engines (torch extra).

- quantize / quantize_per_channel / dequantize against torch's own, ties included.
- qconv against torch.ops.quantized.conv{1,2,3}d[_relu] on engine fbgemm, and on
  engine x86 with nonzero weight zero points (x86 then runs fbgemm). With symmetric
  weights x86/onednn run oneDNN, whose float op order differs: that comparison only
  bounds the difference (1 LSB on at most 1e-4 of the outputs).
- Depthwise: fbgemm saturates its 16-bit partial sums on full-range input, so the
  depthwise cases here use inputs small enough for torch to be exact. Its dense
  kernels do too where the CPU lacks VNNI: weights then come from
  ``oracle.INT8_WEIGHTS``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from convengine import dequantize, qconv, quantize, quantize_per_channel
from oracle import INT8_WEIGHTS

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TORCH_DTYPES = {"uint8": torch.quint8, "int8": torch.qint8, "int32": torch.qint32}


def assert_equal_q(got, want, what=""):
    got, want = np.asarray(got).astype(np.int64), np.asarray(want).astype(np.int64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{what}: {len(bad)} of {got.size} differ; first at "
                           f"{tuple(bad[0])}: {got[tuple(bad[0])]} != {want[tuple(bad[0])]}")


def _ties(rng, n, scale):
    """Half the values exactly on (k + 1/2) * scale in float32: rounding ties."""
    x = rng.normal(0, 3, n).astype(np.float32)
    x[: n // 2] = ((rng.integers(-300, 300, n // 2) + 0.5) * np.float32(scale)).astype(np.float32)
    return x


@pytest.mark.parametrize("n", [7, 33, 4099])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])  # torch's qint32 path rounds otherwise
def test_quantize_matches_torch(n, dtype):
    rng = np.random.default_rng(n)
    for _ in range(4):
        scale = float(rng.uniform(1e-3, 0.2))
        zp = int(rng.integers(0, 256)) if dtype == "uint8" else int(rng.integers(-100, 100))
        x = _ties(rng, n, scale)
        want = torch.quantize_per_tensor(torch.from_numpy(x), scale, zp, TORCH_DTYPES[dtype])
        assert_equal_q(quantize(x, scale, zp, dtype), want.int_repr().numpy(), "quantize")
        assert np.array_equal(dequantize(want.int_repr().numpy(), scale, zp),
                              want.dequantize().numpy())


def test_quantize_per_channel_matches_torch():
    rng = np.random.default_rng(1)
    scales = rng.uniform(1e-3, 0.1, 6)
    zps = rng.integers(-20, 20, 6)
    x = rng.normal(0, 2, (6, 5, 3, 3)).astype(np.float32)
    x[:, 0] = (rng.integers(-50, 50, (6, 3, 3)) + 0.5) * scales.astype(np.float32)[:, None, None]
    for axis in (0, 1):
        s, z = (scales, zps) if axis == 0 else (scales[:5], zps[:5])
        want = torch.quantize_per_channel(torch.from_numpy(x), torch.from_numpy(s),
                                          torch.from_numpy(z), axis, torch.qint8)
        got = quantize_per_channel(x, s, z, axis, np.int8)
        assert_equal_q(got, want.int_repr().numpy(), f"axis {axis}")
        deq = dequantize(got, s, z, axis=axis)
        assert np.array_equal(deq, want.dequantize().numpy())


def torch_qconv(engine, x, xs, xzp, w, ws, wzp, bias, ys, yzp, relu, stride, padding,
                dilation, groups):
    torch.backends.quantized.engine = engine
    nd = x.ndim - 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), xs, xzp)
        if np.ndim(ws):
            tw = torch._make_per_channel_quantized_tensor(
                torch.from_numpy(w), torch.from_numpy(np.asarray(ws, np.float64)),
                torch.from_numpy(np.asarray(wzp, np.int64)), 0)
        else:
            tw = torch._make_per_tensor_quantized_tensor(torch.from_numpy(w), ws, int(wzp))
    tb = None if bias is None else torch.from_numpy(bias)
    packed = getattr(torch.ops.quantized, f"conv{nd}d_prepack")(
        tw, tb, list(stride), list(padding), list(dilation), groups)
    if nd == 2:
        tx = tx.contiguous(memory_format=torch.channels_last)
    elif nd == 3:
        tx = tx.contiguous(memory_format=torch.channels_last_3d)
    op = getattr(torch.ops.quantized, f"conv{nd}d{'_relu' if relu else ''}")
    return op(tx, packed, ys, yzp).int_repr().numpy()


CASES = [
    # ndim, N, C, O, size, K, stride, pad, dil, groups, per_channel
    (2, 2, 32, 48, 10, 3, 1, 1, 1, 1, True),
    (2, 1, 24, 40, 9, 3, 2, 1, 1, 1, False),
    (2, 2, 16, 32, 8, 1, 1, 0, 1, 1, True),
    (2, 1, 16, 64, 11, 3, 1, 2, 2, 4, True),
    (2, 3, 64, 70, 7, 1, 2, 0, 1, 1, False),
    (1, 2, 16, 24, 20, 3, 1, 1, 1, 1, True),
    (1, 1, 12, 12, 15, 5, 2, 2, 1, 3, False),
    (3, 1, 8, 16, 6, 3, 1, 1, 1, 1, True),
    (3, 2, 16, 8, 5, 2, 2, 0, 1, 2, False),
]


def _sample(case, rng, weight_zp=True):
    nd, n, c, o, size, k, s, p, d, g, per_channel = case
    x = rng.integers(0, 256, (n, c, *(size,) * nd)).astype(np.uint8)
    w = rng.integers(*INT8_WEIGHTS, (o, c // g, *(k,) * nd)).astype(np.int8)
    if per_channel:
        ws = rng.uniform(1e-3, 2e-2, o)
        wzp = rng.integers(-10, 10, o) if weight_zp else np.zeros(o, np.int64)
    else:
        ws = float(rng.uniform(1e-3, 2e-2))
        wzp = int(rng.integers(1, 10)) if weight_zp else 0
    bias = rng.normal(0, 2, o).astype(np.float32)
    params = dict(xs=float(rng.uniform(0.01, 0.1)), xzp=int(rng.integers(0, 256)),
                  ys=float(rng.uniform(0.05, 0.5)), yzp=int(rng.integers(0, 256)))
    geo = dict(stride=(s,) * nd, padding=(p,) * nd, dilation=(d,) * nd, groups=g)
    return x, w, ws, wzp, bias, params, geo


def _both(engine, x, w, ws, wzp, bias, params, geo, relu):
    want = torch_qconv(engine, x, params["xs"], params["xzp"], w, ws, wzp, bias,
                       params["ys"], params["yzp"], relu, **geo)
    got = qconv(x, params["xs"], params["xzp"], w, ws, wzp, bias, out_scale=params["ys"],
                out_zero_point=params["yzp"], relu=relu, **geo)
    return got, want


@pytest.mark.parametrize("engine", ["fbgemm", "x86"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}d-C{c[2]}-O{c[3]}-k{c[5]}-g{c[9]}")
def test_qconv_matches_torch(engine, case):
    rng = np.random.default_rng(abs(hash(case)) % 2**32)
    x, w, ws, wzp, bias, params, geo = _sample(case, rng)
    for relu, b in [(False, bias), (True, bias), (False, None)]:
        got, want = _both(engine, x, w, ws, wzp, b, params, geo, relu)
        assert_equal_q(got, want, f"{engine} relu={relu} bias={b is not None}")


@pytest.mark.parametrize("engine", ["fbgemm", "x86", "onednn"])
def test_depthwise_matches_torch_where_torch_is_exact(engine):
    rng = np.random.default_rng(7)
    x = rng.integers(100, 156, (2, 32, 12, 12)).astype(np.uint8)  # |x - zp| < 32
    w = rng.integers(-30, 30, (32, 1, 3, 3)).astype(np.int8)
    ws = rng.uniform(1e-3, 2e-2, 32)
    wzp = np.zeros(32, np.int64)
    bias = rng.normal(0, 2, 32).astype(np.float32)
    params = dict(xs=0.03, xzp=128, ys=0.02, yzp=100)
    geo = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=32)
    got, want = _both(engine, x, w, ws, wzp, bias, params, geo, True)
    if engine == "fbgemm":
        assert_equal_q(got, want, "depthwise")
    else:  # oneDNN's float op order: at most 1 LSB on rare ties
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3


def test_round_half_even_ties_match_torch():
    """acc * multiplier lands exactly on k + 1/2: ties go to even, as fbgemm's."""
    x = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    w = np.ones((2, 1, 1, 1), np.int8)
    bias = np.array([0.0, 0.25], np.float32)  # exact: 0.25 / (0.5 * 1) = 0.5
    params = dict(xs=0.5, xzp=128, ys=1.0, yzp=128)  # multiplier 0.5, acc = x - 128
    geo = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    got, want = _both("fbgemm", x, w, 1.0, 0, bias, params, geo, False)
    assert_equal_q(got, want, "ties")
    acc = np.arange(256) - 128
    assert_equal_q(got[0, 0].ravel(), np.clip(np.rint(acc * 0.5) + 128, 0, 255), "ties ch0")
    assert_equal_q(got[0, 1].ravel(), np.clip(np.rint((acc + 0.5) * 0.5) + 128, 0, 255),
                   "ties ch1")


def test_symmetric_weights_onednn_within_one_lsb():
    rng = np.random.default_rng(11)
    x, w, ws, wzp, bias, params, geo = _sample(CASES[0], rng, weight_zp=False)
    for engine in ("x86", "onednn"):
        got, want = _both(engine, x, w, ws, wzp, bias, params, geo, False)
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3, engine
