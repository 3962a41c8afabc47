"""Each ``blocked`` micro-kernel variant against :mod:`convengine.algorithms.blocked.reference`.

The micro-kernels are intrinsics (callable only from jitted code): each is called
through a tiny jitted harness that passes its arguments through, compiled as a kernel
module (:mod:`convengine._kernel_cache`), so on disk after the first run. Variants:

- forward, gathered (the drivers' inference epilogue): every tile shape of this ISA
  level (``forward.NVECS``, ``gather_rows(nvec)`` pixels), streaming stores on and off,
  every activation of ``CPU_STORE``, with and without residual and bias, whole and short
  tiles (``m < MR``), whole and partial panels (``lanes < NR``), each with the packed
  walk, the packed walk with a kernel row fused into one run, and the flipped walk
  (negative tap strides) of backward-data's weights read in place;
- forward, contiguous (strided backward-data's kernel): every ``nvec``,
  ``ACCUMULATORS // nvec`` pixels, whole and short tiles;
- backward-weight: every ``weight.NVECS``, whole and short tiles, storing and adding;
- ``narrow``'s scatter (strided stems' backward-data): strides, padding, dilation,
  1-D, dy rows that are not whole tiles, weights in more than one block;
- ``pack_weight``, ``packed_walk``, ``flipped_walk``: exactly the index formulas.

Tolerance: a stored value is the float32 sum of n products (one rounding per fused
multiply-add) plus the bias and the residual (one rounding each), so with u = 2^-24
``|got - want| <= gamma(n + 2) * (sum |x w| + |bias| + |res|)``, ``gamma(k) = k u /
(1 - k u)`` (Higham, Accuracy and Stability, 3.1; ReLU and ReLU6 move values by no
more than they move them apart); 30 products: 1.9e-6 of that magnitude. Backward-weight:
``gamma(P + 1) * (sum |d x| + |y|)``. What a call does not store must be unchanged.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

from convengine._host import ACCUMULATORS, ISA, VECTOR_REGISTERS
from convengine._kernel_cache import Source, load
from convengine.algorithms._transforms import flipped_view
from convengine.algorithms.blocked import forward, reference, weight
from convengine.epilogue_codes import CPU_STORE, Activation

VEC = forward.VEC
U = 2.0**-24  # float32's unit roundoff
KH, KW, C = 2, 3, 5  # the forward tiles' taps and reduction channels
HS, WS = 41, 9  # tap row and column steps of x (a dilated, padded input's)
SENTINEL_ROWS = 2  # output rows beyond the tile that must stay untouched


def _skip_unless(nvec: int, offered: tuple[int, ...]) -> None:
    if nvec not in offered:
        pytest.skip(f"{ISA} ({VECTOR_REGISTERS} vector registers) offers {offered} vectors "
                    f"per tile, not {nvec}: the accumulators and loads would spill")


def _aligned(rng: np.random.Generator, size: int) -> np.ndarray:
    """(size,) random float32 starting on a 64-byte line (non-temporal stores need it)."""
    raw = np.empty(size + 16, np.float32)
    start = -raw.ctypes.data % 64 // 4
    out = raw[start:start + size]
    out[:] = rng.standard_normal(size)
    return out


def _assert_stored(got: np.ndarray, want: np.ndarray, magnitude: np.ndarray, n: int,
                   what: str = "") -> None:
    """got (float32) against the float64 reference: within gamma(n) * magnitude where
    stored (magnitude: the reference on |operands| with y zero, so 0 elsewhere: equal
    there); NaN exactly where the reference has NaN. ``what``: named in a failure."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, f"{what}: NaN where the reference has none")
    gamma = n * U / (1 - n * U)
    err = np.abs(got[~nan] - want[~nan])
    bad = np.flatnonzero(err > gamma * magnitude[~nan])
    assert bad.size == 0, (f"{what}: {bad.size} values off, first at {np.flatnonzero(~nan)[bad[0]]}: "
                           f"got {got[~nan][bad[0]]}, want {want[~nan][bad[0]]}, bound "
                           f"{gamma * magnitude[~nan][bad[0]]:.3g}")


# ---------------------------------------------------------------- harnesses


GATHERED = ("x, offsets, x0, hs, ws, kh, kw, c, w, w_off, was, wbs, wks, mr, y, y_off, ys, "
            "bias, b_off, res, has_res, act, valid, part, ahead")
CONTIGUOUS = "x, x_off, ps, hs, ws, kh, kw, c, w, w_off, mr, y, y_off, ys"
WEIGHT = "d, d_off, dn, dh, dw, nn, nh, nw, x, x_off, xn, xh, xw, mr, y, y_off, ys, add"


def _harness(home: str, tag: str, ukernel: str, args: str) -> Any:
    """``call(args)``: the intrinsic made by the expression ``ukernel`` (in the module
    ``home``), called with the same arguments, compiled in a kernel module."""
    src = Source(home, tag)
    src.expr("ukernel", ukernel)
    src.code(f"def call({args}):\n    ukernel({args})\n", "call")
    src.jit("call")
    return load(src).call


@cache
def _forward_ukernel(mr: int, nvec: int, gather: bool, streaming: bool) -> Any:
    """``forward._make_ukernel(mr, nvec, gather, streaming)`` as a jitted function of
    the same arguments."""
    return _harness(forward.__name__,
                    f"test_blocked_ukernel_{mr}x{nvec}_{int(gather)}{int(streaming)}",
                    f"_make_ukernel({mr}, {nvec}, gather={gather}, streaming={streaming})",
                    GATHERED if gather else CONTIGUOUS)


@cache
def _weight_ukernel(nvec: int) -> Any:
    """``weight._make_ukernel(nvec)`` as a jitted function of the same arguments."""
    return _harness(weight.__name__, f"test_blocked_wgrad_ukernel_{nvec}",
                    f"_make_ukernel({nvec})", WEIGHT)


# ---------------------------------------------------------------- forward micro-kernel


def _walks(rng: np.random.Generator, nr: int) -> list[tuple[str, np.ndarray, tuple, int, int]]:
    """(name, flat weights, (w_off, was, wbs, wks), kw, c) of the second output-channel
    block (so w_off > 0): packed panels, the same with a kernel row fused (taps 1, run
    KW * C), and O x KH x KW x 2 NR weights read flipped in place (reduction O = C)."""
    panels = rng.standard_normal((2, KH, KW, C, nr)).astype(np.float32)
    pw = forward.packed_walk(panels, 1)
    w = rng.standard_normal((C, KH, KW, 2 * nr)).astype(np.float32)
    fw = forward.flipped_walk(w, nr)
    assert pw.fused and not fw.fused
    return [("packed", panels.reshape(-1), (pw.first + pw.block, pw.row, pw.col, pw.step), KW, C),
            ("fused", panels.reshape(-1), (pw.first + pw.block, pw.row, 0, pw.step), 1, KW * C),
            ("flipped", w.reshape(-1), (fw.first + fw.block, fw.row, fw.col, fw.step), KW, C)]


TILE_CASES = ("whole", "one-pixel", "partial-lanes", "short-partial")


def _tile_shape(case: str, mr: int, nr: int, nvec: int) -> tuple[int, int]:
    """(stored pixels m, stored lanes) of a case; partial panels end inside a vector
    and, past two vectors, leave whole vectors unstored."""
    partial = 3 + VEC * (nvec // 2)
    return {"whole": (mr, nr), "one-pixel": (1, nr), "partial-lanes": (mr, partial),
            "short-partial": (mr - 1, partial)}[case]


@pytest.mark.parametrize("case", TILE_CASES)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("residual", [False, True], ids=["no-res", "res"])
@pytest.mark.parametrize("act", CPU_STORE, ids=lambda a: a.label)
@pytest.mark.parametrize("streaming", [False, True], ids=["cached", "streaming"])
@pytest.mark.parametrize("nvec", [1, 2, 3, 4])
def test_gathered_tile(nvec: int, streaming: bool, act: Activation, residual: bool,
                       bias: bool, case: str) -> None:
    _skip_unless(nvec, forward.NVECS)
    mr, nr = forward.gather_rows(nvec), VEC * nvec
    m, lanes = _tile_shape(case, mr, nr, nvec)
    call = _forward_ukernel(mr, nvec, True, streaming)
    rng = np.random.default_rng([nvec, streaming, act, residual, bias, TILE_CASES.index(case)])
    x = rng.standard_normal(400).astype(np.float32)
    offsets = rng.choice(200, mr, replace=False).astype(np.intp)  # pixels of any rows
    # non-temporal stores need every whole vector aligned: y_off, ys multiples of VEC
    y_off, ys = (VEC, nr + VEC) if streaming else (VEC + 3, nr + VEC + 1)
    size = y_off + ys * (mr + SENTINEL_ROWS)
    b = rng.standard_normal(nr + 2).astype(np.float32) if bias else np.zeros(nr + 2, np.float32)
    res = rng.standard_normal(size).astype(np.float32)
    for name, w, (w_off, was, wbs, wks), kw, c in _walks(rng, nr):
        y = _aligned(rng, size)
        want = reference.tile(x, offsets[:m], HS, WS, KH, kw, c, w, w_off, was, wbs, wks, y,
                              y_off, ys, lanes, b if bias else None, 2, res if residual else None,
                              act)
        magnitude = reference.tile(np.abs(x), offsets[:m], HS, WS, KH, kw, c, np.abs(w), w_off,
                                   was, wbs, wks, np.zeros_like(y), y_off, ys, lanes, np.abs(b), 2,
                                   np.abs(res))
        call(x, offsets, 0, HS, WS, KH, kw, c, w, w_off, was, wbs, wks, m, y, y_off, ys, b, 2,
             res, residual, int(act), lanes, forward.WHOLE, forward.WEIGHT_AHEAD)
        _assert_stored(y, want, magnitude, KH * KW * C + 2, f"{name} walk")


@pytest.mark.parametrize("ahead", [0, 3])
@pytest.mark.parametrize("nvec", [1, 2, 3, 4])
def test_gathered_tile_in_pieces(nvec: int, ahead: int) -> None:
    """The reduction's run in three pieces (FIRST, MIDDLE, LAST: x0 and w_off moved to
    each piece's start), the partial sums kept in y, partial lanes and the epilogue
    (bias, residual, ReLU6) on the last piece only: the whole tile's result; any
    prefetch distance."""
    _skip_unless(nvec, forward.NVECS)
    mr, nr = forward.gather_rows(nvec), VEC * nvec
    m, lanes = _tile_shape("short-partial", mr, nr, nvec)
    call = _forward_ukernel(mr, nvec, True, False)
    rng = np.random.default_rng([nvec, ahead, 9])
    x = rng.standard_normal(400).astype(np.float32)
    offsets = rng.choice(200, mr, replace=False).astype(np.intp)
    y_off, ys = VEC + 3, nr + VEC + 1
    size = y_off + ys * (mr + SENTINEL_ROWS)
    b = rng.standard_normal(nr + 2).astype(np.float32)
    res = rng.standard_normal(size).astype(np.float32)
    parts = (forward.FIRST, forward.MIDDLE, forward.LAST)
    for name, w, (w_off, was, wbs, wks), kw, c in _walks(rng, nr):
        y = _aligned(rng, size)
        want = reference.tile(x, offsets[:m], HS, WS, KH, kw, c, w, w_off, was, wbs, wks, y,
                              y_off, ys, lanes, b, 2, res, Activation.RELU6)
        magnitude = reference.tile(np.abs(x), offsets[:m], HS, WS, KH, kw, c, np.abs(w), w_off,
                                   was, wbs, wks, np.zeros_like(y), y_off, ys, lanes, np.abs(b), 2,
                                   np.abs(res))
        cuts = (0, c // 3, c // 3 + 1, c)  # a middle piece of one value
        for part, k0, k1 in zip(parts, cuts[:-1], cuts[1:], strict=True):
            call(x, offsets, k0, HS, WS, KH, kw, k1 - k0, w, w_off + k0 * wks, was, wbs, wks, m,
                 y, y_off, ys, b, 2, res, True, int(Activation.RELU6), lanes, part, ahead)
        _assert_stored(y, want, magnitude, KH * KW * C + 2, f"{name} walk in pieces")


@pytest.mark.parametrize("act", [Activation.RELU, Activation.RELU6], ids=lambda a: a.label)
def test_gathered_tile_passes_nan(act: Activation) -> None:
    """NaN in x, in the bias, in the residual: stored NaN through ReLU and ReLU6."""
    nvec = forward.NVECS[-1]
    mr, nr = forward.gather_rows(nvec), VEC * nvec
    call = _forward_ukernel(mr, nvec, True, False)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(400).astype(np.float32)
    offsets = np.arange(mr, dtype=np.intp) * 17
    x[offsets[0]] = np.nan  # pixel 0, every lane
    b = rng.standard_normal(nr).astype(np.float32)
    b[1] = np.nan  # lane 1, every pixel
    res = rng.standard_normal(mr * nr).astype(np.float32)
    res[2 * nr + 3] = np.nan  # pixel 2, lane 3
    panels = rng.standard_normal((1, KH, KW, C, nr)).astype(np.float32)
    pw = forward.packed_walk(panels, 1)
    y = np.zeros(mr * nr, np.float32)
    call(x, offsets, 0, HS, WS, KH, KW, C, panels.reshape(-1), 0, pw.row, pw.col, pw.step, mr, y,
         0, nr, b, 0, res, True, int(act), nr, forward.WHOLE, forward.WEIGHT_AHEAD)
    want = reference.tile(x, offsets, HS, WS, KH, KW, C, panels.reshape(-1), 0, pw.row, pw.col,
                          pw.step, np.zeros(mr * nr), 0, nr, nr, b, 0, res, act)
    assert np.isnan(want).sum() == nr + mr  # pixel 0, lane 1, (2, 3)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))


@pytest.mark.parametrize("case", ["whole", "short"])
@pytest.mark.parametrize("nvec", [1, 2, 3, 4])
def test_contiguous_tile(nvec: int, case: str) -> None:
    _skip_unless(nvec, forward.NVECS)
    mr, nr = ACCUMULATORS // nvec, VEC * nvec
    m = mr if case == "whole" else mr - 1
    call = _forward_ukernel(mr, nvec, False, False)
    rng = np.random.default_rng([nvec, m])
    x = rng.standard_normal(400).astype(np.float32)
    w = rng.standard_normal(2 * KH * KW * C * nr).astype(np.float32)
    x_off, ps, w_off, y_off, ys = 7, 2 * C, KH * KW * C * nr, 3, nr + 5  # stride 2
    y = rng.standard_normal(y_off + ys * (mr + SENTINEL_ROWS)).astype(np.float32)
    want = reference.strided_tile(x, x_off, ps, HS, WS, KH, KW, C, w, w_off, m, y, y_off, ys, nr)
    magnitude = reference.strided_tile(np.abs(x), x_off, ps, HS, WS, KH, KW, C, np.abs(w), w_off,
                                       m, np.zeros_like(y), y_off, ys, nr)
    call(x, x_off, ps, HS, WS, KH, KW, C, w, w_off, m, y, y_off, ys)
    _assert_stored(y, want, magnitude, KH * KW * C)


# ---------------------------------------------------------------- backward-weight micro-kernel


@pytest.mark.parametrize("add", [False, True], ids=["store", "add"])
@pytest.mark.parametrize("case", ["whole", "short"])
@pytest.mark.parametrize("nvec", [1, 2, 4])
def test_weight_tile(nvec: int, case: str, add: bool) -> None:
    _skip_unless(nvec, weight.NVECS)
    nr, m = VEC * nvec, weight.MR if case == "whole" else weight.MR - 2
    call = _weight_ukernel(nvec)
    rng = np.random.default_rng([nvec, m, add])
    nn, nh, nw = 2, 3, 4  # images x rows x columns of a chunk of pixels
    d = rng.standard_normal(600).astype(np.float32)  # dy (or x, turned): broadcast
    d_off, dn, dh, dw = 5, 211, 53, 11
    x = rng.standard_normal(3000).astype(np.float32)  # x (or dy): vectors
    x_off, xn, xh, xw = 7, 1003, 301, 67
    y_off, ys = 3, nr + 5
    y = rng.standard_normal(y_off + ys * (weight.MR + SENTINEL_ROWS)).astype(np.float32)
    want = reference.weight_tile(d, d_off, dn, dh, dw, nn, nh, nw, x, x_off, xn, xh, xw, m, nr,
                                 y, y_off, ys, add)
    magnitude = reference.weight_tile(np.abs(d), d_off, dn, dh, dw, nn, nh, nw, np.abs(x), x_off,
                                      xn, xh, xw, m, nr, np.zeros_like(y), y_off, ys, False)
    if add:  # the stored values (magnitude > 0) add y
        magnitude += np.where(magnitude > 0, np.abs(y), 0)
    call(d, d_off, dn, dh, dw, nn, nh, nw, x, x_off, xn, xh, xw, m, y, y_off, ys, int(add))
    _assert_stored(y, want, magnitude, nn * nh * nw + add)


# ---------------------------------------------------------------- weight layouts


def _panel_widths() -> list[int]:
    return [VEC * v for v in forward.NVECS]


@pytest.mark.parametrize("nr", _panel_widths())
def test_pack_weight_is_the_panel_formula(nr: int) -> None:
    rng = np.random.default_rng(nr)
    w = rng.standard_normal((2 * nr - 3, 3, 2, 5)).astype(np.float32)  # last panel partial
    np.testing.assert_array_equal(forward.pack_weight(w, 2, nr), reference.packed(w, nr))
    w1 = w[:, 0]  # 1-D: (O, K, C) as (O, 1, K, C)
    np.testing.assert_array_equal(forward.pack_weight(w1, 1, nr), reference.packed(w1[:, None], nr))
    # a flipped view (contiguous in its output channels) is read lanes innermost
    v = rng.standard_normal((5, 3, 2, 2 * nr - 3)).astype(np.float32)
    np.testing.assert_array_equal(forward.pack_weight(flipped_view(v), 2, nr),
                                  reference.packed(reference.flipped(v), nr))
    np.testing.assert_array_equal(forward.unpack_weight(reference.packed(w, nr), w.shape), w)


@pytest.mark.parametrize("nr", _panel_widths())
def test_walks_address_the_weights_of_each_block(nr: int) -> None:
    """A walk's block ``ob`` reads tap (a, b), reduction k, lane j where the layout puts
    w of output channel ``ob*nr + j``: packed panels (and their fused kernel rows at unit
    column dilation), and the flipped weights of backward-data read in place."""
    rng = np.random.default_rng(nr)
    kh, kw, c, o = 3, 2, 5, 2 * nr
    w = rng.standard_normal((o, kh, kw, c)).astype(np.float32)
    wp = reference.packed(w, nr)
    for dilation in (1, 2):
        walk = forward.packed_walk(wp, dilation)
        assert walk.fused == (dilation == 1)
        assert (walk.kh, walk.kw) == (kh, kw)
        for ob in range(2):
            first = walk.first + ob * walk.block
            got = reference.walked(wp.reshape(-1), first, walk.row, walk.col, walk.step, kh, kw,
                                   c, nr)
            np.testing.assert_array_equal(got, wp[ob])
            run = reference.walked(wp.reshape(-1), first, walk.row, 0, walk.step, kh, 1, kw * c, nr)
            np.testing.assert_array_equal(run.reshape(kh, kw, c, nr), wp[ob])  # one run per row
    wide = rng.standard_normal((c, kh, kw, o)).astype(np.float32)  # O = 5, C = 2 nr
    flip = forward.flipped_walk(wide, nr)  # reduction over O, output channels C
    assert (flip.kh, flip.kw, flip.fused) == (kh, kw, False)
    fp = reference.packed(reference.flipped(wide), nr)
    for ob in range(2):
        got = reference.walked(wide.reshape(-1), flip.first + ob * flip.block, flip.row, flip.col,
                               flip.step, kh, kw, c, nr)
        np.testing.assert_array_equal(got, fp[ob])
    # one phase of a strided backward-data: the taps first + stride * k, flipped
    big = rng.standard_normal((c, 5, 4, o)).astype(np.float32)
    for taps, first, stride in [((3, 2), (0, 0), (2, 2)), ((2, 1), (1, 2), (2, 3)),
                                ((1, 2), (4, 1), (1, 2))]:
        walk = forward.flipped_walk(big, nr, taps, first, stride)
        sub = big[:, first[0]::stride[0], first[1]::stride[1]][:, :taps[0], :taps[1]]
        sp = reference.packed(reference.flipped(sub), nr)
        for ob in range(2):
            got = reference.walked(big.reshape(-1), walk.first + ob * walk.block, walk.row,
                                   walk.col, walk.step, *taps, c, nr)
            np.testing.assert_array_equal(got, sp[ob], err_msg=f"{taps} {first} {stride}")


@pytest.mark.parametrize(("dx_shape", "o", "kernel", "stride", "pad", "dilation"), [
    ((2, 15, 14, 3), 32, (7, 7), (2, 2), (3, 3), (1, 1)),   # a stem: several blocks
    ((1, 13, 11, 1), 16, (5, 4), (2, 3), (2, 0), (1, 1)),   # unequal strides, one side
    ((1, 12, 12, 4), 24, (3, 3), (2, 2), (2, 2), (2, 2)),   # dilated: a tap a run
    ((1, 1, 21, 7), 8, (1, 9), (1, 2), (0, 4), (1, 1)),     # a 1-D problem as 2-D
    ((3, 9, 23, 5), 40, (5, 5), (3, 2), (1, 2), (1, 1)),    # 5 channels, rows over blocks
])
def test_narrow_scatter(dx_shape, o, kernel, stride, pad, dilation) -> None:
    """``narrow.scatter``: dx[n, i, j, c] = sum over the taps reaching (i, j) of dy's row
    times the tap's weights, within the float32 bound of that many products; every dx
    value no tap reaches stays zero."""
    from convengine.algorithms.blocked import narrow

    n, h, w_, c = dx_shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, pad, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w_ + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    rng = np.random.default_rng(7)
    dy = rng.standard_normal((n, oh, ow, o)).astype(np.float32)
    w = rng.standard_normal((o, kh, kw, c)).astype(np.float32)
    want, magnitude = np.zeros(dx_shape), np.zeros(dx_shape)
    for a in range(kh):
        for b in range(kw):
            for p in range(oh):
                for q in range(ow):
                    i, j = p * sh - ph + a * dh, q * sw - pw + b * dw
                    if 0 <= i < h and 0 <= j < w_:
                        prod = dy[:, p, q, :, None].astype(np.float64) * w[:, a, b]
                        want[:, i, j] += prod.sum(-2)
                        magnitude[:, i, j] += np.abs(prod).sum(-2)
    packed, runs, starts = narrow.pack(w, dw)
    got = np.zeros(dx_shape, np.float32)
    narrow.scatter(dy, packed, runs, starts, got, np.array([sh, sw, ph, pw, dh, dw]),
                   narrow.band_rows(kh, sh, dh))
    u = 2.0 ** -24
    terms = kh * kw * o
    assert np.all(np.abs(got - want) <= terms * u / (1 - terms * u) * magnitude + 1e-30)


def test_narrow_pack_keeps_runs_whole_and_bands_apart() -> None:
    """``narrow.pack``: each weight column once, at its block and column; a run never
    crosses a block; ``band_rows``: bands two apart write disjoint dx rows."""
    from convengine.algorithms.blocked import narrow

    rng = np.random.default_rng(3)
    for o, kh, kw, c, dw in [(8, 7, 7, 3, 1), (4, 3, 11, 7, 1), (4, 3, 3, 4, 2)]:
        w = rng.standard_normal((o, kh, kw, c)).astype(np.float32)
        packed, runs, starts = narrow.pack(w, dw)
        seen = np.zeros((kh, kw), int)
        for k in range(starts.size - 1):
            for col, a, b, taps in runs[starts[k]:starts[k + 1]]:
                assert col + taps * c <= narrow.NR and (taps == 1 or dw == 1)
                np.testing.assert_array_equal(packed[k, :, col:col + taps * c],
                                              w[:, a, b:b + taps].reshape(o, -1))
                seen[a, b:b + taps] += 1
        assert (seen == 1).all()
    for kh, sh, dh in [(7, 2, 1), (3, 2, 1), (5, 3, 2), (1, 2, 1), (11, 2, 1)]:
        band = narrow.band_rows(kh, sh, dh)
        last_of_band_k = (band - 1) * sh + (kh - 1) * dh  # ph = 0, band k = 0
        assert last_of_band_k < 2 * band * sh  # the first dx row of band k + 2
