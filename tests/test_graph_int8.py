"""Integer graphs: PyTorch's quantized cuDNN recipe. Every engine bit-exact with the
others and with the recipe composed in numpy over the float64 reference conv."""

from __future__ import annotations

import numpy as np
import pytest

from convengine import ConvSetupError
from convengine.graph import Candidate, Graph, PlanCache, recipes
from convengine.graph import engines as eng
from convengine.graph.plan import engine_order
from convengine.graph.program import Program
from oracle import reference

rng = np.random.default_rng(7)


def cudnn_numpy(x, w, bias, sx, sw, sy, zp, relu, **args):
    """The recipe in numpy: exact accumulator (float64 reference of int data), then
    float32 arithmetic as cuDNN's graph (bias * f32(1/(sx*sw)), relu, * f32(sx*sw/sy))."""
    acc = reference("forward", x, w, **args)
    assert np.array_equal(acc, np.round(acc)) and np.abs(acc).max() < 2**31
    v = acc.astype(np.int32).astype(np.float32)
    if bias is not None:
        scaled = bias.astype(np.float32) * np.float32(1.0 / (sx * sw))
        v = v + scaled.reshape(1, -1, *(1,) * (x.ndim - 2))
    if relu:
        v = np.maximum(v, np.float32(0))
    v = v * np.float32(sx * sw / sy)
    return np.clip(np.rint(v) + np.float32(zp), -128, 127).astype(np.int8)


CASES = [
    # x shape, w shape, conv args, bias, relu, zero point, x dtype
    ((2, 16, 9, 9), (32, 16, 3, 3), dict(padding=1), True, True, 0, "int8"),
    ((1, 8, 12, 10), (16, 4, 3, 3), dict(stride=2, padding=1, groups=2), True, False, -5, "int8"),
    ((3, 12, 7, 7), (24, 12, 1, 1), {}, False, True, 10, "uint8"),
    ((2, 6, 30), (8, 6, 5), dict(dilation=2, padding=4), True, True, 3, "int8"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[0]) - 2}d-{c[6]}-zp{c[5]}")
def test_int8_engines_bit_exact(case, monkeypatch):
    xs, ws, args, has_bias, relu, zp, x_dtype = case
    lo = 0 if x_dtype == "uint8" else -128
    x = rng.integers(lo, lo + 256, xs).astype(x_dtype)
    w = rng.integers(-128, 128, ws).astype(np.int8)
    sx, sw = 0.05, 0.002
    real = sx * sw * float(np.abs(reference("forward", x, w, **args)).max())
    sy = real / 150  # the outputs span the int8 range (and saturate a little)
    bias = (rng.standard_normal(ws[0]) * real / 4).astype(np.float32) if has_bias else None
    g, t = recipes.quantized_conv_cudnn(
        xs, ws, x_scale=sx, w_scale=sw, y_scale=sy, y_zero_point=zp, bias=has_bias,
        relu=relu, x_dtype=x_dtype, **args
    )
    expect = cudnn_numpy(x, w, bias, sx, sw, sy, zp, relu, **args)
    assert len(np.unique(expect)) > 20  # the scales exercise the whole range
    bind = {"x": x, "w": w} | ({"bias": bias} if has_bias else {})
    g.validate()
    prog = Program.from_graph(g)
    monkeypatch.setattr(eng, "TILE_BYTES", 512)  # several tiles, row blocks included
    monkeypatch.setattr(eng, "MIN_TILE_PIXELS", 1)
    for engine in (eng.KERNEL_FUSED, *eng.ENGINES):
        built = eng.build(Candidate(engine, eng.INT_ALGO), prog, True, False)
        assert not isinstance(built, str), built
        got = built.run(bind)["requant.out"]
        assert got.dtype == np.int8 and got.shape == expect.shape
        mismatch = np.flatnonzero(got != expect)
        assert mismatch.size == 0, f"{engine}: {mismatch.size} values differ"
    plan = g.build(cache=PlanCache())
    usable = engine_order(prog)
    assert plan.engine_name == f"{usable[0]}[int8_exact]"
    np.testing.assert_array_equal(plan.execute(bind)[t["y"]], expect)
    np.testing.assert_array_equal(
        recipes.qconv_cudnn(x, w, bias, x_scale=sx, w_scale=sw, y_scale=sy, y_zero_point=zp,
                            relu=relu, **args), expect)


def test_int8_conv_with_float_algorithm_is_refused():
    g, _ = recipes.quantized_conv_cudnn((1, 4, 5, 5), (4, 4, 3, 3), x_scale=1.0, w_scale=1.0,
                                        y_scale=1.0)
    g.validate()
    reason = eng.build(Candidate("fused", "im2col"), Program.from_graph(g), False, False)
    assert reason == "conv 'conv': 'im2col' is a float algorithm; the int8 conv runs 'int8_exact'"


def test_requantize_range_checked():
    g, t = recipes.quantized_conv_cudnn((1, 4, 5, 5), (4, 4, 3, 3), x_scale=1.0, w_scale=1.0,
                                        y_scale=1.0, y_zero_point=200)
    with pytest.raises(ConvSetupError, match=r"node 'requant' \(requantize\): zero_point 200"):
        g.validate()


def test_other_int8_chains_fall_back_to_tiles():
    """A chain the kernel epilogue cannot express (a clamp before requantize) is
    refused by kernel_fused and served, bit-exactly, by the tiled engines."""
    g = Graph(io_dtype="int8", layout="NHWC")
    X, W = g.tensor("x", (2, 10, 10, 8)), g.tensor("w", (16, 3, 3, 8))
    y = g.requantize(g.clamp(g.conv_fprop(X, W, padding=1), -3000, 2000), 0.05, 1, "int8")
    y.set_output()
    x = rng.integers(-128, 128, (2, 10, 10, 8)).astype(np.int8)
    w = rng.integers(-128, 128, (16, 3, 3, 8)).astype(np.int8)
    plan = g.build("all", cache=PlanCache())
    assert "kernel_fused[int8_exact]     refused: kernel_fused needs the chain" in plan.describe()
    acc = reference("forward", x, w, padding=1, layout="NHWC").astype(np.float32)
    expect = np.clip(np.rint(np.clip(acc, -3000, 2000) * np.float32(0.05)) + 1, -128, 127)
    np.testing.assert_array_equal(plan.execute({X: x, W: w})[y], expect.astype(np.int8))


