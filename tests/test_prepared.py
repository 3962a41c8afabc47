"""PreparedConv (constant weights packed once) and FusedConv2d built on it, against
the float64 reference and PyTorch."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import convengine as ce
from convengine.algorithms.blocked import forward as blocked
from oracle import assert_close, random, reference


def PreparedConv(w, **kw):  # noqa: N802 - the cases here are channels-last
    return ce.PreparedConv(w, layout="NHWC", **kw)

# each picks another algorithm: blocked, Winograd F(4x4), F(2x2), im2col / 1x1
# (output channels not a multiple of 16), grouped (direct)
CASES = [
    ("blocked-stem", (2, 17, 15, 3), (32, 7, 7, 3), dict(stride=2, padding=3)),
    ("winograd4", (2, 16, 16, 32), (32, 3, 3, 32), dict(padding=1)),
    ("winograd", (1, 8, 8, 32), (32, 3, 3, 32), dict(padding=1)),
    ("o24-gemm", (2, 6, 6, 16), (24, 1, 1, 16), {}),
    ("grouped", (1, 9, 9, 8), (8, 3, 3, 4), dict(padding=1, groups=2)),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_matches_reference_on_every_call(x_shape, w_shape, kw):
    rng = np.random.default_rng(2)
    w = random(rng, w_shape, "float32")
    prepared = PreparedConv(w, **kw)
    for batch in (x_shape[0], 1, x_shape[0]):  # a new shape, then the first again
        x = random(rng, (batch, *x_shape[1:]), "float32")
        expected = reference("forward", x, w, layout="NHWC", **kw)
        assert_close(prepared(x), expected, "float32", "prepared conv")


def test_nonfinite_weights_and_empty_batches_follow_conv():
    w = np.ones((16, 3, 3, 16), np.float32)
    w[0, 0, 0, 0] = np.nan
    x = np.ones((1, 5, 5, 16), np.float32)
    got = PreparedConv(w, padding=1)(x)
    np.testing.assert_array_equal(got, ce.conv(x, w, padding=1, layout="NHWC"))
    empty = PreparedConv(np.ones((16, 3, 3, 16), np.float32))(np.ones((0, 5, 5, 16),
                                                                      np.float32))
    assert empty.shape == (0, 3, 3, 16)


def test_fused_conv_sees_weights_changed_through_pytorch():
    """In-place changes of weight or bias (version counter), a new weight tensor and a
    loaded state prepare again;
    pickling and deep copies drop the prepared conv and rebuild it."""
    torch = pytest.importorskip("torch")
    import convengine.torch as cet

    torch.manual_seed(0)
    weight, bias = torch.randn(32, 16, 3, 3), torch.randn(32)
    fused = cet.FusedConv2d(weight, bias, padding=1, activation="relu")
    x = torch.randn(2, 16, 9, 9)

    def expected() -> torch.Tensor:
        return torch.relu(torch.nn.functional.conv2d(x, fused.weight, fused.bias, padding=1))

    def check(got: torch.Tensor) -> None:  # Winograd F(4x4): 1e-5 of the output scale
        want = expected()
        torch.testing.assert_close(got, want, rtol=0, atol=5e-5 * float(want.abs().max()))

    check(fused(x))
    with torch.no_grad():
        fused.weight.mul_(-2)
    check(fused(x))
    fused.weight = torch.randn(32, 16, 3, 3).contiguous(memory_format=torch.channels_last)
    check(fused(x))
    with torch.no_grad():  # the bias is prepared too (blocked adds it in its store)
        fused.bias.add_(3)
    check(fused(x))
    fused.load_state_dict({"weight": fused.weight, "bias": torch.randn(32)})
    check(fused(x))
    for twin in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
        check(twin(x))


def _epilogue_reference(y: np.ndarray, bias, residual, activation: str) -> np.ndarray:
    v = y + (0 if bias is None else bias.astype(np.float64))
    if residual is not None:
        v = v + residual
    if activation in ("relu", "relu6"):
        v = np.where(v < 0, 0, v)
    if activation == "relu6":
        v = np.where(v > 6, 6, v)
    if activation == "silu":
        v = v / (1 + np.exp(-v))
    return v


# blocked with 1 to 4 vectors per panel and output channels that fill no panel (the
# store masks the lanes beyond O); Winograd; a grouped conv (the pass after the conv);
# depthwise (in the store, 40 channels: a masked vector)
EPILOGUE_CASES = [
    ("blocked-o96", (2, 9, 7, 16), (96, 1, 1, 16), {}),
    ("blocked-o24", (1, 8, 9, 24), (24, 1, 1, 24), {}),
    ("blocked-o40-3x3", (2, 7, 7, 8), (40, 3, 3, 8), dict(padding=1, stride=2)),
    ("blocked-o100", (1, 5, 13, 32), (100, 1, 1, 32), {}),
    ("winograd", (1, 8, 8, 32), (32, 3, 3, 32), dict(padding=1)),
    ("grouped", (1, 9, 9, 8), (8, 3, 3, 4), dict(padding=1, groups=2)),
    ("depthwise", (2, 9, 11, 40), (40, 3, 3, 1), dict(padding=1, groups=40)),
    ("depthwise-s2", (1, 12, 10, 16), (16, 3, 3, 1), dict(padding=1, stride=2, groups=16)),
]


@pytest.mark.parametrize("activation", ["none", "relu", "relu6", "silu"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [c[1:] for c in EPILOGUE_CASES],
                         ids=[c[0] for c in EPILOGUE_CASES])
def test_epilogue_matches_reference(x_shape, w_shape, kw, with_bias, activation):
    """act(conv + bias [+ residual]) against the float64 reference, with and without
    a residual, and with an activation given per call."""
    rng = np.random.default_rng(5)
    x, w = random(rng, x_shape, "float32"), random(rng, w_shape, "float32")
    bias = random(rng, (w_shape[0],), "float32") * 4 if with_bias else None
    prepared = PreparedConv(w, bias=bias, activation=activation, **kw)
    conv = reference("forward", x, w, layout="NHWC", **kw) * 4  # values beyond 6 too
    prepared4 = PreparedConv(w * 4, bias=bias, activation=activation, **kw)
    residual = random(rng, conv.shape, "float32") * 4
    for res in (None, residual):
        want = _epilogue_reference(conv, bias, res, activation)
        assert_close(prepared4(x, res), want, "float32", f"epilogue {activation}")
    # another activation for one call; the prepared one afterwards
    plain = _epilogue_reference(conv / 4, bias, None, "none")
    assert_close(prepared(x, activation="none"), plain, "float32", "activation override")
    assert_close(prepared(x), _epilogue_reference(conv / 4, bias, None, activation),
                 "float32", "prepared activation")


def test_epilogue_keeps_nan_and_checks_its_operands():
    w = np.ones((24, 1, 1, 16), np.float32)
    x = np.ones((1, 3, 3, 16), np.float32)
    x[0, 1, 1, 0] = np.nan
    for activation in ("relu", "relu6"):
        y = PreparedConv(w, activation=activation)(x)
        assert np.isnan(y[0, 1, 1]).all() and not np.isnan(np.delete(y.reshape(9, 24), 4, 0)).any()
        depthwise = PreparedConv(np.ones((16, 1, 1, 1), np.float32), groups=16,
                                 activation=activation)(x)
        assert np.isnan(depthwise[0, 1, 1, 0]) and np.isnan(depthwise).sum() == 1
    prepared = PreparedConv(w)
    with pytest.raises(ValueError, match="residual must have the output's shape"):
        prepared(x, np.zeros((1, 3, 3, 16), np.float32))
    with pytest.raises(ValueError, match="residual must be C-contiguous float32"):
        prepared(x, np.zeros((1, 3, 3, 24), np.float64))
    with pytest.raises(ValueError, match="activation must be one of"):
        prepared(x, activation="gelu")
    with pytest.raises(ValueError, match="bias must have shape"):
        PreparedConv(w, bias=np.zeros(16, np.float32))
    with pytest.raises(ValueError, match="need a float32 conv; this one computes in float64"):
        PreparedConv(w.astype(np.float64), bias=np.zeros(24))(x.astype(np.float64))


def test_unknown_conv_arguments_are_named_at_construction():
    w = np.ones((16, 1, 1, 16), np.float32)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['strides'\]"):
        PreparedConv(w, strides=2)
    with pytest.raises(ce.ConvSetupError, match="layout"):
        ce.PreparedConv(w, layout="NCWH")


@pytest.mark.parametrize("kw", [{"padding": 1}, {"stride": 2, "groups": 4},
                                {"padding": "same", "dilation": 2}], ids=str)
def test_nchw_layout_as_conv(kw):
    """The default layout is conv's: NCHW x, w (O, C/g, *K), y and residual."""
    rng = np.random.default_rng(5)
    x = random(rng, (2, 16, 9, 9), "float32")
    w = random(rng, (8, 16 // kw.get("groups", 1), 3, 3), "float32")
    bias = random(rng, (8,), "float32")
    prepared = ce.PreparedConv(w, bias=bias, activation="relu", **kw)
    expected = reference("forward", x, w, layout="NCHW", **kw) + bias[:, None, None]
    assert_close(prepared(x), np.maximum(expected, 0), "float32", "NCHW prepared conv")
    residual = random(rng, expected.shape, "float32")
    got = prepared(x, residual, activation="none")
    assert_close(got, expected + residual, "float32", "NCHW prepared conv with residual")


@pytest.mark.parametrize("panel_by_panel", [False, True])
@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [c[1:] for c in EPILOGUE_CASES[:4]],
                         ids=[c[0] for c in EPILOGUE_CASES[:4]])
def test_streamed_outputs_match_reference(x_shape, w_shape, kw, panel_by_panel, monkeypatch):
    """blocked's non-temporal stores (outputs of STREAMING_BYTES or more whose pixels
    start a cache line, their lines written at once: panels of whole lines, or a
    pixel's panels one after another), made to serve these small outputs: the same
    results as the float64 reference, residual and ReLU6 included; other outputs keep
    the cached stores. ``panel_by_panel``: the tasks go one panel at a time."""
    monkeypatch.setattr(blocked, "STREAMING_BYTES", 0)
    if panel_by_panel:
        monkeypatch.setattr(blocked, "BLOCKS_INSIDE_BYTES", 0)
    chosen = []
    driver = blocked._gather_driver
    monkeypatch.setattr(blocked, "_gather_driver",
                        lambda nvec, streaming=False: chosen.append(streaming) or
                        driver(nvec, streaming))
    rng = np.random.default_rng(6)
    x, w = random(rng, x_shape, "float32"), random(rng, w_shape, "float32") * 4
    bias = random(rng, (w_shape[0],), "float32") * 4
    conv = reference("forward", x, w, layout="NHWC", **kw)
    residual = random(rng, conv.shape, "float32") * 4
    got = PreparedConv(w, bias=bias, activation="relu6", **kw)(x, residual)
    assert_close(got, _epilogue_reference(conv, bias, residual, "relu6"), "float32",
                 "streamed epilogue")
    o, line = w_shape[0], 64 // 4
    panel = blocked.VEC * blocked.panel_vectors(o)
    assert chosen == [o % line == 0 and (panel % line == 0 or not panel_by_panel)]
