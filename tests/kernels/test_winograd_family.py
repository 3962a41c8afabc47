"""The Winograd family's variants against :mod:`convengine.algorithms.winograd.reference`
(numpy float64, matrices derived by Cook-Toom, independent of the kernels):
the transform matrices, the weight transform and its packing, the fused F(m, 3) kernel
per variant (m x 1-D/2-D x float32/float64 x whole and partial channel panels and
vector groups x partial edge tiles and register blocks), and the ``gemm_6xnr``
micro-kernel per panel width of this ISA level. The reference itself is checked
against a direct sliding-window correlation."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from convengine._host import VECTOR_BYTES
from convengine.algorithms import fma
from convengine.algorithms.winograd import kernels, reference

RNG = np.random.default_rng(7)
MS = sorted(kernels.MATRICES)
DTYPES = [np.float32, np.float64]
# Error bounds of the fused kernel, max |y - y64| / max |y64| for unit-normal data:
# float32 as documented and asserted for the algorithms (docs/design/kernels.md,
# "Accuracy"; tests/test_winograd.py TOLERANCE); float64 as tests/test_winograd.py's
# test_float64_is_near_exact asserts.
TOLERANCE = {(np.float32, 2): 2e-6, (np.float32, 4): 2e-5,
             (np.float64, 2): 1e-13, (np.float64, 4): 1e-13}
BLOCK = 2 * fma.MR  # tiles per block of the variant tests: two register blocks


def direct(x: np.ndarray, w: np.ndarray, padding: tuple) -> np.ndarray:
    """Float64 correlation of channels-last x (N, *S, C) by w (O, *K, C), zero-padded."""
    ndim = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0), *padding, (0, 0)])
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[1:-1], axis=tuple(range(1, ndim + 1)))
    return np.tensordot(win, w.astype(np.float64), axes=([ndim + 1, *range(ndim + 2, 2 * ndim + 2)],
                                                          [ndim + 1, *range(1, ndim + 1)]))


def pack(u: np.ndarray, width: int, dtype) -> np.ndarray:
    """U (O, C, A) -> the documented panels (ceil(O / width), A, C, width), zero-padded."""
    o, c, a = u.shape
    up = np.zeros((-(-o // width) * width, a, c), dtype)
    up[:o] = u.transpose(0, 2, 1)
    return np.ascontiguousarray(up.reshape(-1, width, a, c).transpose(0, 2, 3, 1))


def channel_cases(dtype) -> dict[str, tuple[int, int]]:
    """(C, O) per case, from this level's vector width and panel width NR."""
    lanes, width = fma.lanes(np.dtype(dtype).itemsize), fma.nr(np.dtype(dtype).itemsize)
    return {"whole": (2 * lanes, width),  # whole vector groups, one whole panel
            "partial": (lanes + 3, width + lanes + 3),  # scalar tails, a partial panel
            "narrow": (3, 5),  # tails only
            "chained": (kernels.CHAIN + 3, 4)}  # GEMM partial sums over CHAIN channels


# --------------------------------------------------------------------- the reference


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("m", MS)
def test_reference_conv_is_the_correlation(m, ndim) -> None:
    x = RNG.standard_normal((2, *(7, 8)[-ndim:], 3))
    w = RNG.standard_normal((4, *(3,) * ndim, 3))
    padding = ((1, 1), (0, 1))[-ndim:]
    ref = direct(x, w, padding)
    np.testing.assert_allclose(reference.conv(x, w, m, padding), ref, rtol=0,
                               atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("source", ["reference", "kernels"])
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("m", MS)
def test_tile_identity(m, ndim, source) -> None:
    """A^T [(G g G^T) . (B^T d B)] A is the valid 3x3 correlation of the tile (float64)."""
    bt, g, at = (reference.matrices(m) if source == "reference"
                 else (np.array(a, np.float64) for a in kernels.MATRICES[m]))
    d = RNG.standard_normal((m + 2,) * ndim)
    gg = RNG.standard_normal((3,) * ndim)
    if ndim == 1:
        y = at @ ((g @ gg) * (bt @ d))
    else:
        y = at @ ((g @ gg @ g.T) * (bt @ d @ bt.T)) @ at.T
    ref = direct(d[None, ..., None], gg[None, ..., None], ((0, 0),) * ndim)[0, ..., 0]
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-12)
    if source == "reference":
        np.testing.assert_allclose(reference.tile(d, gg, m), ref, rtol=0, atol=1e-12)


def _scales(mine: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """s with mine[i] == s[i] * ref[i] for every row i (fails unless rows are proportional)."""
    s = np.einsum("ij,ij->i", mine, ref) / np.einsum("ij,ij->i", ref, ref)
    np.testing.assert_allclose(mine, s[:, None] * ref, rtol=0, atol=1e-15)
    return s


@pytest.mark.parametrize("m", MS)
def test_matrices_are_cook_toom(m) -> None:
    """The module's (B^T, G, A^T) are the Cook-Toom matrices of the points 0, 1, -1, 2,
    -2, infinity, up to the one freedom of the algorithm: product ``i`` may be scaled in
    B^T's row, G's row and A^T's column by factors whose product is 1."""
    bt, g, at = (np.array(a, np.float64) for a in kernels.MATRICES[m])
    rbt, rg, rat = reference.matrices(m)
    assert (bt.shape, g.shape, at.shape) == (rbt.shape, rg.shape, rat.shape)
    np.testing.assert_allclose(_scales(bt, rbt) * _scales(g, rg) * _scales(at.T, rat.T), 1.0,
                               rtol=1e-15)


# ----------------------------------------------------------------- weight transform


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("panels", ["partial", "narrow"])
def test_packed_transform(m, ndim, dtype, panels) -> None:
    """packed_transform(w) == U = G g G^T in the panels (O / NR, alpha^ndim, C, NR),
    padding zero, for w and a flipped (strided) view. U is the reference's with G's rows
    scaled as the module's (the factors test_matrices_are_cook_toom checks);
    |error| <= (u + 16 u_64) |G| |g| |G|^T: one rounding to dtype after a float64 sum."""
    c, o = channel_cases(dtype)[panels]
    w = RNG.standard_normal((o, *(3,) * ndim, c)).astype(dtype)
    width = fma.nr(np.dtype(dtype).itemsize)
    g_ref = reference.matrices(m)[1]
    scale = _scales(np.array(kernels.MATRICES[m][1], np.float64), g_ref)
    if ndim == 2:
        scale = np.multiply.outer(scale, scale)
    bound = np.finfo(dtype).eps / 2 + 8 * np.finfo(np.float64).eps
    for view in (w, w[:, ::-1, ::-1] if ndim == 2 else w[:, ::-1]):
        g = np.moveaxis(view, -1, 1)  # (O, C, *(3,) * ndim)
        u = (reference.weight_transform(g, m, ndim) * scale).reshape(o, c, -1)
        u_abs = np.abs(g).astype(np.float64)
        for axis in range(2, 2 + ndim):  # |G| |g| |G|^T
            u_abs = np.moveaxis(np.tensordot(np.abs(g_ref), u_abs, axes=([1], [axis])), 0, axis)
        got = kernels.packed_transform(view, m)
        assert got.dtype == dtype and got.shape == (-(-o // width), (m + 2) ** ndim, c, width)
        err = np.abs(got - pack(u, width, np.float64))
        assert (err <= bound * pack(u_abs.reshape(o, c, -1), width, np.float64)).all()


# ---------------------------------------------------------------- the fused kernel


def run_fused(x: np.ndarray, up: np.ndarray, o: int, m: int, padding: tuple,
              parts: int = 1, parts_k: int = 1, block: int = BLOCK, tails: bool = True) -> tuple:
    """The fused kernel (with scalar tails, or the variant without) on channels-last x
    (N, *S, C) and packed weights: (y, check); y starts NaN, so an output the kernel
    does not write fails the comparison."""
    ndim = x.ndim - 2
    out = [n + lo + hi - 2 for n, (lo, hi) in zip(x.shape[1:-1], padding)]
    x4 = x.reshape(x.shape[0], 1, *x.shape[1:]) if ndim == 1 else x
    y = np.full((x.shape[0], *out, o), np.nan, x.dtype)
    y4 = y.reshape(y.shape[0], 1, *y.shape[1:]) if ndim == 1 else y
    tiles_h = -(-out[0] // m) if ndim == 2 else 1
    pad_h = padding[0][0] if ndim == 2 else 0
    alpha2, width = up.shape[1], up.shape[-1]
    v = np.empty((parts, alpha2, block, x.shape[-1]), x.dtype)
    prod = np.empty((parts, alpha2, block, width), x.dtype)
    check = np.zeros((parts, width), x.dtype)
    kernels.kernel(ndim, m, x.dtype, tails)(x4, up, y4, pad_h, padding[-1][0], tiles_h,
                                     -(-out[-1] // m), block, parts_k, v, prod, check,
                                     fma.WEIGHT_AHEAD)
    return y, check


def fused_case(m: int, ndim: int, dtype, c: int, o: int) -> tuple:
    """x, w, padding: 2-D 7 x 8 padded ((1, 1), (0, 1)), 1-D 9 padded (2, 0); outputs
    7 x 7 and 9: partial edge tiles for m = 2 and 4, and blocks of BLOCK tiles ending in
    a partial register block (2-D: 32 or 8 tiles, 1-D: 15 or 9)."""
    shape, padding = ((2, 7, 8), ((1, 1), (0, 1))) if ndim == 2 else ((3, 9), ((2, 0),))
    x = RNG.standard_normal((*shape, c)).astype(dtype)
    w = RNG.standard_normal((o, *(3,) * ndim, c)).astype(dtype)
    return x, w, padding


def assert_rel_close(got: np.ndarray, ref: np.ndarray, tol: float) -> None:
    """max |got - ref| <= tol * max |ref| (NaN in got fails)."""
    err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("case", ["whole", "partial", "narrow", "chained"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("m", MS)
def test_fused_kernel(m, ndim, dtype, case) -> None:
    """kernel(ndim, m, dtype) with packed_transform's weights (checked above) == the
    reference conv within TOLERANCE, every output written, check left 0."""
    c, o = channel_cases(dtype)[case]
    x, w, padding = fused_case(m, ndim, dtype, c, o)
    y, check = run_fused(x, kernels.packed_transform(w, m), o, m, padding)
    assert_rel_close(y, reference.conv(x, w, m, padding), TOLERANCE[dtype, m])
    assert (check == 0).all()


@pytest.mark.parametrize("m", MS)
def test_fused_kernel_without_tails(m) -> None:
    """The variant without scalar tails, on channel counts of whole vectors (one whole
    panel; a panel and a vector): the same bits as the kernel with tails, the reference
    conv within TOLERANCE."""
    lanes, width = fma.lanes(4), fma.nr(4)
    for c, o in ((2 * lanes, width), (lanes, width + lanes)):
        x, w, padding = fused_case(m, 2, np.float32, c, o)
        up = kernels.packed_transform(w, m)
        y, check = run_fused(x, up, o, m, padding, tails=False)
        np.testing.assert_array_equal(y, run_fused(x, up, o, m, padding)[0])
        assert_rel_close(y, reference.conv(x, w, m, padding), TOLERANCE[np.float32, m])
        assert (check == 0).all()


def test_fused_kernel_without_tails_refuses_part_vectors() -> None:
    """Input or output channels that end in part of a vector: a ValueError from the
    variant without tails, never a conv with channels left out."""
    lanes = fma.lanes(4)
    for c, o in ((lanes + 3, lanes), (lanes, lanes + 3)):
        x, w, padding = fused_case(2, 2, np.float32, c, o)
        with pytest.raises(ValueError, match="no scalar tails"):
            run_fused(x, kernels.packed_transform(w, 2), o, 2, padding, tails=False)


def test_the_fused_kernel_needs_tails_for_part_vectors() -> None:
    """needs_tails: a channel count, in or out, that is not a whole number of vectors."""
    from convengine.problem import make_problem
    lanes = fma.lanes(4)

    def needs(c: int, o: int) -> bool:
        problem = make_problem("forward", (1, 8, 8, c), (o, 3, 3, c), layout="NHWC",
                               dtype=np.float32, padding=1)
        return kernels.needs_tails(problem)
    assert (needs(lanes, 2 * lanes), needs(lanes + 1, lanes), needs(lanes, 3)) == (
        False, True, True)


@pytest.mark.parametrize(("parts", "parts_k", "block"),
                         [(2, 1, fma.MR), (3, 3, BLOCK), (4, 2, fma.MR)])
def test_fused_kernel_plans(parts, parts_k, block) -> None:
    """Tiles shared over parts, output-channel panels shared over parts_k (three panels),
    blocks of one register block: every plan computes the same conv."""
    width = fma.nr(4)
    x, w, padding = fused_case(2, 2, np.float32, 5, 2 * width + 3)
    y, _ = run_fused(x, kernels.packed_transform(w, 2), w.shape[0], 2, padding, parts, parts_k, block)
    assert_rel_close(y, reference.conv(x, w, 2, padding), TOLERANCE[np.float32, 2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ndim", [1, 2])
def test_fused_kernel_flags_nonfinite(ndim, dtype) -> None:
    """check gains NaN when an output is not finite (a NaN input here)."""
    c, o = channel_cases(dtype)["partial"]
    for m in MS:
        x, w, padding = fused_case(m, ndim, dtype, c, o)
        x[(1, *(2,) * ndim, c - 1)] = np.nan
        _, check = run_fused(x, kernels.packed_transform(w, m), o, m, padding)
        assert np.isnan(check).any()


# ------------------------------------------------------------------ the micro-kernel


@njit
def _gemm(a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc, add):
    fma.gemm_6xnr(a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc, add, fma.WEIGHT_AHEAD)


def test_panel_width_is_documented() -> None:
    """NR: 64 float32 / 32 float64 columns with AVX-512, 16 / 8 with AVX2."""
    assert (fma.nr(4), fma.nr(8)) == {64: (64, 32), 32: (16, 8)}[VECTOR_BYTES]


@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("kc", [1, 7, 130])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_6xnr(dtype, kc, add) -> None:
    """Rows 1..MR at offsets and strides wider than the block, against the reference
    contract: |error| <= gamma_{kc+1} ((|c| if add) + |a| |b|) on the rows written, the
    rest of c untouched. (Columns are always the whole panel of NR: no partial lanes.)"""
    width = fma.nr(np.dtype(dtype).itemsize)
    a_off, lda, b_off, c_off, ldc = 3, kc + 2, 5, 4, width + 3
    a = RNG.standard_normal(a_off + fma.MR * lda).astype(dtype)
    b = RNG.standard_normal(b_off + kc * width + 2).astype(dtype)
    n = kc + 1
    gamma = n * np.finfo(dtype).eps / 2 / (1 - n * np.finfo(dtype).eps / 2)
    for mr in range(1, fma.MR + 1):
        c = RNG.standard_normal(c_off + (fma.MR + 1) * ldc).astype(dtype)
        got = c.copy()
        _gemm(a, a_off, lda, b, b_off, kc, mr, got, c_off, ldc, add)
        ref = reference.gemm_6xnr(a, a_off, lda, b, b_off, kc, mr, c, c_off, ldc, add, width)
        mag = reference.gemm_6xnr(np.abs(a), a_off, lda, np.abs(b), b_off, kc, mr, np.abs(c),
                                  c_off, ldc, add, width)
        written = np.zeros(c.shape, bool)
        for r in range(mr):
            written[c_off + r * ldc:c_off + r * ldc + width] = True
        np.testing.assert_array_equal(got[~written], c[~written])
        assert (np.abs(got - ref)[written] <= gamma * mag[written]).all(), mr
