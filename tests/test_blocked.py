"""The ``blocked`` micro-kernel conv against the float64 reference and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import convengine as ce
from convengine import registry
from convengine.algorithms import weight_cache
from convengine.algorithms.blocked import forward as blocked
from convengine.algorithms.blocked import strided
from convengine.algorithms.blocked import weight as blocked_weight
from convengine.problem import ConvProblem, make_problem
from oracle import assert_close, random, reference

# (id, x shape NHWC, w shape OHWI, conv args): stems, widths that are not a multiple
# of the micro-tile, every NR width (16, 32, 48 -> 16, 64, 128), output channels that
# are not a multiple of 16 (panels padded, output cropped), dilations that break the
# contiguous-row shortcut, asymmetric padding, 1-D.
CASES = [
    ("o24-padded-panels", (2, 7, 9, 16), (24, 3, 3, 16), dict(padding=1)),
    ("o7-1x1", (1, 5, 6, 32), (7, 1, 1, 32), {}),
    ("o100-strided", (1, 11, 10, 8), (100, 3, 3, 8), dict(stride=2, padding=1)),
    ("resnet-stem", (2, 29, 31, 3), (64, 7, 7, 3), dict(stride=2, padding=3)),
    ("mobilenet-stem", (1, 33, 30, 3), (32, 3, 3, 3), dict(stride=2, padding=1)),
    ("o48-width-tail", (2, 7, 13, 5), (48, 3, 3, 5), dict(padding=1)),
    ("o128-two-blocks", (1, 6, 8, 20), (128, 3, 3, 20), dict(padding=1)),
    ("o16-col-dilation", (2, 9, 14, 4), (16, 3, 3, 4), dict(padding=(1, 2), dilation=(1, 2))),
    ("asym-pad-row-dilation", (1, 10, 9, 3), (32, 3, 2, 3),
     dict(stride=(1, 2), padding=((2, 0), (0, 1)), dilation=(2, 1))),
    ("unpadded-1x1", (3, 5, 5, 16), (16, 1, 1, 16), {}),
    # one-vector panels take 8-pixel tiles (ONE_VECTOR_ROWS): tiles across rows and images
    ("o12-1x1-tiles-across-images", (3, 7, 9, 32), (12, 1, 1, 32), {}),
    ("1d", (2, 37, 3), (64, 5, 3), dict(stride=2, padding=2)),
    ("output-one-pixel", (1, 4, 4, 2), (16, 4, 4, 2), {}),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_matches_reference(x_shape, w_shape, kw, dtype):
    rng = np.random.default_rng(7)
    x, w = random(rng, x_shape, dtype), random(rng, w_shape, dtype)
    got = ce.conv(x, w, layout="NHWC", algo="blocked", **kw)
    assert got.dtype == x.dtype
    assert_close(got, reference("forward", x, w, layout="NHWC", **kw), dtype, "blocked")


def test_matches_torch_on_the_resnet_stem():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 64, 64), dtype=np.float32)
    w = rng.standard_normal((64, 3, 7, 7), dtype=np.float32)
    got = ce.conv(x, w, stride=2, padding=3, algo="blocked")
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=3)
    ref = ref.numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * float(np.abs(ref).max()))


@pytest.mark.parametrize(("x_shape", "w_shape", "kw", "reason"), [
    ((1, 8, 8, 4), (16, 3, 3, 2), dict(groups=2), "groups=2"),
    ((1, 4, 4, 4, 4), (16, 3, 3, 3, 4), dict(padding=1), "2-D only"),
])
def test_refuses_what_it_cannot_serve(x_shape, w_shape, kw, reason):
    x, w = np.ones(x_shape, np.float32), np.ones(w_shape, np.float32)
    with pytest.raises(ce.ConvSetupError, match=reason):
        ce.conv(x, w, layout="NHWC", algo="blocked", **kw)
    with pytest.raises(ce.ConvSetupError, match="float32 only"):
        ce.conv(np.ones((1, 8, 8, 4)), np.ones((16, 3, 3, 4)), layout="NHWC", algo="blocked")


def test_padded_input_places_x_and_zeros_the_border():
    x = np.arange(2 * 3 * 4 * 2, dtype=np.float32).reshape(2, 3, 4, 2) + 1
    w = np.zeros((16, 3, 3, 2), np.float32)
    problem = ce.explain(x, w, padding=((1, 2), (3, 0)), layout="NHWC").problem
    xp = blocked.padded_input(x, problem)
    expected = np.pad(x, ((0, 0), (1, 2), (3, 0), (0, 0)))
    np.testing.assert_array_equal(xp, expected)


@pytest.mark.parametrize("view", ["contiguous", "nchw-rgb", "nchw-5", "hcw", "w-sliced"])
@pytest.mark.parametrize("padding", [((1, 1), (1, 1)), ((0, 2), (3, 0)), ((2, 0), (0, 1))])
def test_pad_copies_any_strides(view, padding):
    # the row copy (C-contiguous x), the RGB planes of an NCHW array, and the strided
    # copy (NCHW of 5 channels, (N, H, C, W) memory, a W slice), against numpy's pad
    base = np.random.default_rng(1).standard_normal((2, 5, 7, 12)).astype(np.float32)

    def nchw(c):  # an NCHW array seen as NHWC
        return np.ascontiguousarray(base[..., :c].transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
    x = {"contiguous": base[..., :3].copy(), "nchw-rgb": nchw(3), "nchw-5": nchw(5),
         "hcw": base[..., :3].transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2),
         "w-sliced": base[:, :, ::2, :]}[view]
    assert x.flags.c_contiguous == (view == "contiguous")
    xp = blocked.pad(x, 2, padding)
    assert xp.flags.c_contiguous
    np.testing.assert_array_equal(xp, np.pad(x, ((0, 0), *padding, (0, 0))))


def test_stems_choose_blocked():
    x = np.zeros((1, 224, 224, 3), np.float32)
    assert ce.explain(x, np.zeros((64, 7, 7, 3), np.float32), stride=2, padding=3,
                      layout="NHWC").chosen == "blocked"


# backward-data through the stride-1 transpose rule: dy's channels are the forward
# conv's input channels, so C (here the last dim of x) must be a multiple of VEC; 128
# channels make two or more panels whatever the vector width (each panel's channels
# found at its own offset when the weights are read in place)
BWD_DATA_CASES = [
    ("3x3-pad1", (2, 9, 11, 32), (48, 3, 3, 32), dict(padding=1)),
    ("c128-several-panels", (1, 5, 6, 128), (16, 3, 3, 128), dict(padding=1)),
    ("c24-padded-panels", (2, 6, 7, 24), (32, 3, 3, 24), dict(padding=1)),
    ("1x1", (1, 7, 7, 64), (32, 1, 1, 64), {}),
    ("dilated-asym", (2, 10, 10, 16), (16, 3, 3, 16), dict(padding=(0, 2), dilation=2)),
    ("1d", (2, 20, 16), (32, 5, 16), dict(padding=2)),
]


@pytest.mark.parametrize("transient", [False, True], ids=["packed", "read-in-place"])
@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [c[1:] for c in BWD_DATA_CASES],
                         ids=[c[0] for c in BWD_DATA_CASES])
def test_backward_data_matches_reference(x_shape, w_shape, kw, transient):
    """Packed flipped panels, and (weights marked transient, as in a training step
    whose weights change every call) the weights read in place where C fills whole
    panels; the rest (24 channels) packs either way."""
    rng = np.random.default_rng(3)
    x, w = random(rng, x_shape, "float32"), random(rng, w_shape, "float32")
    dy = ce.conv(x, w, layout="NHWC", **kw)
    with weight_cache.transient(transient):
        got = ce.conv_backward_data(dy, w, x.shape, layout="NHWC", algo="blocked", **kw)
    expected = reference("backward_data", dy, w, x.shape, layout="NHWC", **kw)
    assert_close(got, expected, "float32", "blocked backward-data")


# strided backward-data by phases: every phase reached by 1, 2 or 4 taps (3x3 s2),
# phases no tap reaches (kernel 2 < stride 4), padding beyond the kernel (dy cropped),
# unequal strides and padding per dim, 1-D, stride 3 with a 7x7 kernel
BWD_DATA_STRIDED_CASES = [
    ("3x3-s2-pad1", (2, 9, 11, 16), (32, 3, 3, 16), dict(stride=2, padding=1)),
    ("1x1-s2", (1, 8, 8, 32), (16, 1, 1, 32), dict(stride=2)),
    ("k2-s4-empty-phases", (2, 5, 6, 16), (16, 2, 2, 16), dict(stride=4)),
    ("pad-beyond-kernel", (1, 4, 4, 16), (16, 5, 5, 16), dict(stride=2, padding=4)),
    ("unequal-asym", (2, 10, 9, 16), (16, 3, 2, 16),
     dict(stride=(2, 3), padding=((2, 0), (0, 1)))),
    ("7x7-s3", (1, 15, 15, 16), (16, 7, 7, 16), dict(stride=3, padding=3)),
    ("1d-s2", (2, 37, 16), (16, 5, 16), dict(stride=2, padding=2)),
]


# strided backward-data with fewer than 8 input channels (the stems): dot products
# along O (narrow.py), any stride, padding and dilation, 1-D too
BWD_DATA_NARROW_CASES = [
    ("resnet-stem", (2, 30, 30, 3), (64, 7, 7, 3), dict(stride=2, padding=3)),
    ("mobilenet-stem", (1, 17, 17, 3), (32, 3, 3, 3), dict(stride=2, padding=1)),
    ("k2-s4-empty-phases", (1, 9, 10, 3), (16, 2, 2, 3), dict(stride=4)),
    ("c1-s2", (2, 20, 19, 1), (16, 5, 5, 1), dict(stride=2, padding=2)),
    ("c4-dilated", (1, 19, 19, 4), (24, 5, 5, 4), dict(stride=2, padding=2, dilation=2)),
    ("c7-unequal-asym", (1, 12, 11, 7), (20, 5, 5, 7),
     dict(stride=(2, 3), padding=((2, 0), (0, 1)))),
    ("1d-c3", (2, 41, 3), (16, 9, 3), dict(stride=2, padding=4)),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"),
                         [c[1:] for c in BWD_DATA_STRIDED_CASES + BWD_DATA_NARROW_CASES],
                         ids=[c[0] for c in BWD_DATA_STRIDED_CASES + BWD_DATA_NARROW_CASES])
def test_strided_backward_data_matches_reference(x_shape, w_shape, kw):
    rng = np.random.default_rng(4)
    x, w = random(rng, x_shape, "float32"), random(rng, w_shape, "float32")
    dy = ce.conv(x, w, layout="NHWC", **kw)
    assert ce.explain(dy, w, x.shape, layout="NHWC", pass_="backward_data",
                      **kw).chosen == "blocked"
    got = ce.conv_backward_data(dy, w, x.shape, layout="NHWC", algo="blocked", **kw)
    expected = reference("backward_data", dy, w, x.shape, layout="NHWC", **kw)
    assert_close(got, expected, "float32", "blocked strided backward-data")


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [c[1:] for c in BWD_DATA_STRIDED_CASES],
                         ids=[c[0] for c in BWD_DATA_STRIDED_CASES])
@pytest.mark.parametrize(("gather", "transient"), [(0, False), (1, False), (1, True)],
                         ids=["rows", "gathered", "gathered-read-in-place"])
def test_both_ways_to_run_the_phases_match_the_reference(x_shape, w_shape, kw, gather,
                                                         transient):
    """Along the phases' output rows into dx, or gathered across rows then copied (the
    weights packed, or, transient, each phase's taps read in place)."""
    rng = np.random.default_rng(5)
    x, w = random(rng, x_shape, "float32"), random(rng, w_shape, "float32")
    dy = ce.conv(x, w, layout="NHWC", **kw)
    with weight_cache.transient(transient):
        got = ce.conv_backward_data(dy, w, x.shape, layout="NHWC",
                                    algo=f"blocked[gather={gather}]", **kw)
    expected = reference("backward_data", dy, w, x.shape, layout="NHWC", **kw)
    assert_close(got, expected, "float32", f"phases, gather={gather}")


def test_phases_gather_where_rows_leave_tiles_part_empty():
    """7-pixel phase rows in 6-pixel tiles fill 7 of 12 rows: gathered; 28 of 30: not."""
    def problem(size: int) -> ConvProblem:
        return make_problem("backward_data", (8, size, size, 512), (512, 3, 3, 512),
                            dtype="float32", layout="NHWC", stride=2, padding=1)
    assert strided.row_fill(problem(14), 6) == pytest.approx(7 / 12)
    assert strided.gathers(problem(14), 6) and not strided.gathers(problem(56), 6)


def test_backward_data_refuses_strided_dilation_and_odd_channels():
    x_shape, w_shape = (1, 16, 9, 9), (16, 16, 3, 3)
    why = ce.explain(np.ones((1, 16, 3, 3), np.float32), np.ones(w_shape, np.float32),
                     x_shape, stride=2, dilation=2, pass_="backward_data").refused["blocked"]
    assert "dilation" in why
    x_shape, w_shape = (1, 12, 9, 9), (16, 12, 3, 3)  # 12: not a vector, not narrow
    why = ce.explain(np.ones((1, 16, 5, 5), np.float32), np.ones(w_shape, np.float32),
                     x_shape, padding=1, stride=2, pass_="backward_data").refused["blocked"]
    assert f"multiple of {blocked.VEC}" in why


def test_packed_weights_are_reused_and_never_stale():
    """Repeated calls reuse the packed weights; weights changed in place (a training
    step) are packed again: the result always matches the float64 reference."""
    rng = np.random.default_rng(11)
    x, w = random(rng, (1, 6, 7, 16), "float32"), random(rng, (32, 3, 3, 16), "float32")
    blocked.PACKED.clear()
    for step in range(3):
        for _ in range(2):
            got = ce.conv(x, w, layout="NHWC", algo="blocked", padding=1)
            assert_close(got, reference("forward", x, w, layout="NHWC", padding=1), "float32",
                         f"blocked step {step}")
        w += np.float32(0.25)  # in place, as an optimizer step
    assert blocked.PACKED.misses == 3 and blocked.PACKED.hits == 3


# backward-weight: input channels (the last dim of x) a multiple of 16; output channels
# that are not a multiple of the 6-channel register block; strides, dilations,
# asymmetric padding and 1-D; every NR width (16, 32, 64)
BWD_WEIGHT_CASES = [
    ("3x3-pad1", (2, 9, 11, 64), (48, 3, 3, 64), dict(padding=1)),
    ("o20-stride2", (1, 7, 8, 32), (20, 3, 3, 32), dict(stride=2, padding=1)),
    ("asym-pad-dilation-c48", (2, 10, 9, 48), (7, 3, 2, 48),
     dict(stride=(1, 2), padding=((2, 0), (0, 1)), dilation=(2, 1))),
    ("1x1-c16", (3, 5, 5, 16), (16, 1, 1, 16), {}),
    ("1d", (2, 37, 16), (64, 5, 16), dict(stride=2, padding=2)),
    # few input channels: the turned kernel over runs of a kernel row's taps
    ("rows-resnet-stem", (2, 23, 21, 3), (64, 7, 7, 3), dict(stride=2, padding=3)),
    ("rows-c8-o32-row-dilation", (1, 11, 9, 8), (32, 3, 3, 8),
     dict(padding=(2, 1), dilation=(2, 1))),
    ("rows-c16-o64", (2, 6, 7, 16), (64, 3, 3, 16), dict(padding=1)),
    ("rows-1d", (2, 30, 5), (16, 7, 5), dict(stride=3, padding=1)),
]


@pytest.mark.parametrize("chunk_bytes", [blocked_weight.CHUNK_BYTES, 1, 9000],
                         ids=["chunk-default", "chunk-one-row", "chunk-few-rows"])
@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [c[1:] for c in BWD_WEIGHT_CASES],
                         ids=[c[0] for c in BWD_WEIGHT_CASES])
def test_backward_weight_matches_reference(x_shape, w_shape, kw, chunk_bytes, monkeypatch):
    """Against float64, with the pixels in one chunk, in chunks of one output row, and
    in chunks of several rows or several images."""
    monkeypatch.setattr(blocked_weight, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(5)
    x, w = random(rng, x_shape, "float32"), random(rng, w_shape, "float32")
    dy = ce.conv(x, w, layout="NHWC", **kw)
    got = ce.conv_backward_weight(x, dy, w.shape, layout="NHWC", algo="blocked", **kw)
    expected = reference("backward_weight", x, dy, w.shape, layout="NHWC", **kw)
    assert got.shape == w.shape
    assert_close(got, expected, "float32", "blocked backward-weight")


def test_backward_weight_matches_torch_on_a_resnet_layer():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 64, 28, 28), dtype=np.float32)
    dy = rng.standard_normal((2, 64, 14, 14), dtype=np.float32)
    got = ce.conv_backward_weight(x, dy, (64, 64, 3, 3), stride=2, padding=1, algo="blocked")
    ref = torch.ops.aten.convolution_backward(
        torch.from_numpy(dy), torch.from_numpy(x), torch.zeros(64, 64, 3, 3), None, (2, 2),
        (1, 1), (1, 1), False, (0, 0), 1, (False, False, True))[1].numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * float(np.abs(ref).max()))


def test_backward_weight_of_an_empty_batch_is_zero():
    x = np.ones((0, 6, 6, 16), np.float32)
    dy = np.ones((0, 6, 6, 32), np.float32)
    got = ce.conv_backward_weight(x, dy, (32, 3, 3, 16), padding=1, layout="NHWC",
                                  algo="blocked")
    np.testing.assert_array_equal(got, np.zeros((32, 3, 3, 16), np.float32))


def test_backward_weight_refuses_odd_input_channels_and_groups():
    why = ce.explain(np.ones((1, 4, 6, 6), np.float32), np.ones((1, 20, 6, 6), np.float32),
                     (20, 4, 3, 3), padding=1, pass_="backward_weight").refused["blocked"]
    assert f"input channels must be a multiple of {blocked.VEC}" in why
    dy = np.ones((1, 32, 6, 6), np.float32)
    why = ce.explain(np.ones((1, 3, 9, 9), np.float32), np.ones((1, 16, 9, 9), np.float32),
                     (16, 3, 3, 3), padding=(1, 2), dilation=(1, 2),
                     pass_="backward_weight").refused["blocked"]
    assert "unit column dilation" in why
    why = ce.explain(np.ones((1, 32, 6, 6), np.float32), dy, (32, 16, 3, 3), padding=1,
                     groups=2, pass_="backward_weight").refused["blocked"]
    assert "groups=2" in why


def test_same_bits_finds_a_difference_in_the_head_and_in_the_tail():
    """The early look at the first words never decides equality on its own."""
    from convengine.algorithms.weight_cache import HEAD_WORDS, same_bits

    a = np.arange(4 * HEAD_WORDS, dtype=np.float32)
    for where in (0, HEAD_WORDS * 2 - 1, a.size - 1):
        b = a.copy()
        b[where] = -1
        assert not same_bits(a, b)
    assert same_bits(a, a.copy())


def test_transient_backward_data_reads_the_weights_in_place(monkeypatch):
    """Weights marked transient are not packed for the stride-1 backward-data (nor
    stored); the same weights unmarked are packed once."""
    packs = []
    pack = blocked.pack_weight
    monkeypatch.setattr(blocked, "pack_weight", lambda *a, **k: packs.append(1) or pack(*a, **k))
    rng = np.random.default_rng(4)
    w = random(rng, (48, 3, 3, 32), "float32")
    dy = random(rng, (2, 9, 11, 48), "float32")
    with weight_cache.transient(True):
        ce.conv_backward_data(dy, w, (2, 9, 11, 32), layout="NHWC", algo="blocked", padding=1)
    assert packs == []
    ce.conv_backward_data(dy, w, (2, 9, 11, 32), layout="NHWC", algo="blocked", padding=1)
    assert packs == [1]


def test_compiled_drivers_are_built_once_per_panel_width():
    """The kernel modules are loaded once (a driver rebuilt per call cost 0.8 ms)."""
    for nvec in (1, 2, 3, 4):
        assert blocked._gather_driver(nvec) is blocked._gather_driver(nvec)
        assert blocked._driver(nvec) is blocked._driver(nvec)


# the reduction in pieces (the tunable ``chunk``): a first, middle and shorter last
# piece, output channels that leave a panel's lanes unused, the epilogue (bias,
# residual, ReLU6) on the last piece only; a 3x3 whose kernel rows' runs are split
# across taps (fused), and a column-dilated one split along its channels
CHUNK_CASES = [
    ("1x1-four-pieces", (2, 5, 7, 400), (72, 1, 1, 400), {}, 128),
    ("3x3-fused-run", (1, 9, 9, 64), (40, 3, 3, 64), dict(padding=1), 48),
    ("3x3-col-dilated", (1, 12, 12, 48), (32, 3, 3, 48), dict(padding=2, dilation=2), 16),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kw", "chunk"), [c[1:] for c in CHUNK_CASES],
                         ids=[c[0] for c in CHUNK_CASES])
def test_a_reduction_in_pieces_matches_the_reference(x_shape, w_shape, kw, chunk):
    rng = np.random.default_rng(8)
    x, w = random(rng, x_shape, "float32"), random(rng, w_shape, "float32")
    bias = random(rng, (w_shape[0],), "float32")
    p = make_problem("forward", x.shape, w.shape, dtype="float32", layout="NHWC", **kw)
    nr = blocked.VEC * blocked.panel_vectors(p.out_channels)
    wp = blocked.pack_weight(w, 2, nr)
    padded_bias = np.zeros(wp.shape[0] * nr, np.float32)
    padded_bias[:p.out_channels] = bias
    conv = reference("forward", x, w, layout="NHWC", **kw)
    residual = random(rng, conv.shape, "float32")
    expected = np.clip(conv + bias + residual, 0, 6)
    results = {}
    for pieces in (chunk, 0):  # by_block: one task over every tile, so pieces are used
        run = blocked.bind_forward(p, wp, padded_bias,
                                   params={"inside": 0, "by_block": 1, "chunk": pieces})
        results[pieces] = run(x, residual, "relu6")
        assert_close(results[pieces], expected, "float32", f"chunk={pieces}")
    if w_shape[1:3] == (1, 1):  # one tap: the same sums in the same order
        assert np.array_equal(results[chunk], results[0])


def test_the_tuner_may_split_long_reductions():
    """``chunk`` is offered (off first) where a block's weights exceed the piece's
    bytes and the run is two pieces long, and each value runs right, backward-data's
    read-in-place weights too; not for a short reduction nor a stem."""
    fwd = make_problem("forward", (1, 7, 7, 1024), (128, 1, 1, 1024), dtype="float32",
                       layout="NHWC")
    space = registry.get("blocked", "forward").space(fwd)
    assert space["chunk"][0] == 0 and space["chunk"][1] >= blocked.VEC
    for short in (make_problem("forward", (1, 7, 7, 64), (128, 1, 1, 64), dtype="float32",
                               layout="NHWC"),
                  make_problem("forward", (1, 32, 32, 3), (64, 7, 7, 3), stride=2,
                               padding=3, dtype="float32", layout="NHWC")):
        assert "chunk" not in registry.get("blocked", "forward").space(short)
    rng = np.random.default_rng(9)
    x, w = random(rng, (1, 7, 7, 1024), "float32"), random(rng, (128, 1, 1, 1024), "float32")
    expected = reference("forward", x, w, layout="NHWC")
    dy = random(rng, (1, 7, 7, 1024), "float32")
    wt = random(rng, (1024, 1, 1, 128), "float32")  # backward-data: 1024 -> 128 reversed
    expected_dx = reference("backward_data", dy, wt, (1, 7, 7, 128), layout="NHWC")
    for value in space["chunk"]:
        label = f"blocked[chunk={value}]"
        assert_close(ce.conv(x, w, layout="NHWC", algo=label), expected, "float32", label)
        for transient in (False, True):
            with weight_cache.transient(transient):
                dx = ce.conv_backward_data(dy, wt, (1, 7, 7, 128), layout="NHWC", algo=label)
            assert_close(dx, expected_dx, "float32", f"{label} backward-data")
