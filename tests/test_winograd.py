"""Winograd F(2x2,3x3) / F(4x4,3x3) (and 1-D F(2,3) / F(4,3)) against the float64
reference: error bounds, multiply counts, refusals and the weight-transform cache."""

from __future__ import annotations

import numpy as np
import pytest

import convengine as ce
from convengine.algorithms import fma, weight_cache
from convengine.algorithms.winograd import kernels as winograd
from convengine.registry import get


def weight_transform(w: np.ndarray, m: int) -> np.ndarray:
    """The oracle: w (O, [3,] 3, C) -> U (alpha^ndim, C, O) = G g G^T by two float64
    tensordots, rounded to w's dtype."""
    ndim = w.ndim - 2
    _, _, gh, gw, _, _ = winograd._matrices(ndim, m)
    w4 = w.reshape(w.shape[0], 1, *w.shape[1:]) if ndim == 1 else w
    t = np.tensordot(gw, w4.astype(np.float64), axes=([1], [2]))  # (j, o, k, s)
    u = np.tensordot(gh, t, axes=([1], [2]))  # (i, j, o, s)
    return np.ascontiguousarray(u.transpose(0, 1, 3, 2).reshape(-1, w.shape[-1], w.shape[0]),
                                dtype=w.dtype)


def pack_weights(u: np.ndarray) -> np.ndarray:
    """U (alpha^ndim, C, O) -> the micro-kernel's panels (ceil(O / NR), alpha^ndim, C, NR)."""
    alpha2, c, o = u.shape
    width = winograd.nr(u.itemsize)
    nkb = -(-o // width)
    up = np.zeros((alpha2, c, nkb * width), dtype=u.dtype)
    up[:, :, :o] = u
    return np.ascontiguousarray(up.reshape(alpha2, c, nkb, width).transpose(2, 0, 1, 3))


# max |got - ref| / max |ref| for float32 inputs with unit-normal data; measured
# worst cases over these shapes were about 3e-7 (F2) and 3e-6 (F4)
TOLERANCE = {"winograd": 2e-6, "winograd4": 2e-5}

CASES = [
    ("2d-pad1", (2, 5, 9, 11), 6, 1),
    ("2d-valid", (2, 5, 9, 11), 6, 0),
    ("2d-asym-pad", (1, 3, 10, 7), 4, ((2, 0), (1, 2))),
    ("2d-one-tile", (1, 4, 3, 3), 2, 1),
    ("2d-wide", (3, 16, 6, 17), 24, 1),
    ("1d-pad1", (2, 8, 17), 4, 1),
    ("1d-valid-short", (1, 3, 3), 5, 0),
    # channel counts with whole 512-bit groups, partial groups and several 64-wide
    # output panels (vector transforms, scalar tails, zero-padded weight panels)
    ("2d-vector-tails", (2, 40, 13, 11), 72, 1),
    ("1d-vector-tails", (3, 48, 29), 80, ((1, 2),)),
]


def assert_rel_close(got: np.ndarray, ref: np.ndarray, tol: float) -> None:
    """Fail unless max |got - ref| <= tol * max |ref|."""
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g}"


def test_assert_rel_close_can_fail() -> None:
    with pytest.raises(AssertionError):
        assert_rel_close(np.ones(3) * 1.001, np.ones(3), 1e-4)


@pytest.mark.parametrize("algo", ["winograd", "winograd4"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(("xs", "o", "pad"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_forward_and_backward_data(xs, o, pad, layout, algo) -> None:
    rng = np.random.default_rng(len(xs) * 100 + o)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((o, xs[1], *(3,) * (len(xs) - 2))).astype(np.float32)
    if layout == "NHWC":
        x, w = np.moveaxis(x, 1, -1), np.moveaxis(w, 1, -1)
    kw = dict(padding=pad, layout=layout)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = ce.conv(x64, w64, algo="reference", **kw)
    got = ce.conv(x, w, algo=algo, **kw)
    assert got.dtype == np.float32
    assert_rel_close(got, ref, TOLERANCE[algo])
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ref = ce.conv_backward_data(dy.astype(np.float64), w64, x.shape, algo="reference", **kw)
    assert_rel_close(ce.conv_backward_data(dy, w, x.shape, algo=algo, **kw), ref, TOLERANCE[algo])


@pytest.mark.slow
def test_float64_is_near_exact() -> None:
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 6, 13, 10)), rng.standard_normal((5, 6, 3, 3))
    ref = ce.conv(x, w, padding=1, algo="reference")
    for algo in TOLERANCE:
        assert_rel_close(ce.conv(x, w, padding=1, algo=algo), ref, 1e-13)


@pytest.mark.parametrize(
    ("shape", "m", "per_tile", "direct_per_tile"),
    [((8, 8), 2, 16, 36), ((8, 8), 4, 36, 144), ((8,), 2, 4, 6), ((8,), 4, 6, 12)],
)
def test_multiply_count_saving(shape, m, per_tile, direct_per_tile) -> None:
    """The GEMM stage does (m + 2)^d multiplies per output tile and channel pair,
    against 3^d m^d for direct convolution (2.25x fewer for F(2x2,3x3), 4x for F(4x4))."""
    c, o = 5, 7
    ndim = len(shape)
    x, w = np.zeros((1, c, *shape), np.float32), np.zeros((o, c, *(3,) * ndim), np.float32)
    problem = ce.explain(x, w, padding=1).problem
    tiles = (8 // m) ** ndim
    assert winograd.multiplies(problem, m) == tiles * per_tile * c * o
    direct = problem.flops // 2  # multiply-adds of the direct convolution
    assert direct == tiles * direct_per_tile * c * o
    assert direct / winograd.multiplies(problem, m) == direct_per_tile / per_tile


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (dict(w=(4, 3, 5, 5)), "not 3x3"),
        (dict(stride=2), "stride"),
        (dict(dilation=2, padding=2), "dilation"),
        (dict(w=(6, 1, 3, 3), groups=3), "groups"),
        (dict(x=(1, 3, 6, 6, 6), w=(4, 3, 3, 3, 3)), "3-D"),
    ],
)
def test_refuses_with_reason(args, why) -> None:
    args = dict(args)
    x = np.zeros(args.pop("x", (1, 3, 8, 8)), np.float32)
    w = np.zeros(args.pop("w", (4, 3, 3, 3)), np.float32)
    explanation = ce.explain(x, w, **args)
    for algo in TOLERANCE:
        assert why in explanation.refused[algo]
        with pytest.raises(ce.ConvSetupError, match=why):
            ce.conv(x, w, algo=algo, **args)


def test_not_exact_and_reports_workspace() -> None:
    for algo in TOLERANCE:
        assert get(algo, "forward").exact is False
    x, w = np.zeros((2, 8, 10, 10), np.float32), np.zeros((16, 8, 3, 3), np.float32)
    space = ce.explain(x, w, padding=1).workspace_bytes
    assert space["winograd"] >= 16 * 8 * 16 * 4  # at least U, alpha^2 x C x O floats
    assert space["winograd4"] >= 36 * 8 * 16 * 4


def test_weight_cache_reuses_and_never_serves_stale() -> None:
    winograd.WEIGHT_CACHE.clear()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    first = ce.conv(x, w, padding=1, algo="winograd")
    again = ce.conv(x, w.copy(), padding=1, algo="winograd")  # same values, new array
    assert winograd.WEIGHT_CACHE.hits == 1 and winograd.WEIGHT_CACHE.misses == 1
    np.testing.assert_array_equal(first, again)
    w[2, 3, 1, 1] += 1.0  # in place, one element: an id/sample key alone would miss it
    changed = ce.conv(x, w, padding=1, algo="winograd")
    ref = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1, algo="reference")
    assert_rel_close(changed, ref, TOLERANCE["winograd"])
    assert winograd.WEIGHT_CACHE.misses == 2
    dy = rng.standard_normal(changed.shape).astype(np.float32)
    for _ in range(2):  # backward-data caches the flipped transform against w itself
        dx = ce.conv_backward_data(dy, w, x.shape, padding=1, algo="winograd")
    assert winograd.WEIGHT_CACHE.misses == 3 and winograd.WEIGHT_CACHE.hits == 2
    ref = ce.conv_backward_data(dy.astype(np.float64), w.astype(np.float64), x.shape,
                                padding=1, algo="reference")
    assert_rel_close(dx, ref, TOLERANCE["winograd"])


def test_weight_cache_is_bounded() -> None:
    cache = weight_cache.WeightCache(max_bytes=10_000)
    rng = np.random.default_rng(0)
    for _ in range(20):
        w = rng.standard_normal((8, 3, 3, 8)).astype(np.float32)
        cache.get(w, (2, "forward"), lambda w: weight_transform(w, 2))
    held = sum(a.nbytes + u.nbytes for v in cache.entries.values() for a, u, _ in v)
    assert cache.bytes == held
    assert held <= 10_000 or len(cache.entries) == 1


def test_transient_weights_are_computed_but_not_stored() -> None:
    cache = weight_cache.WeightCache(max_bytes=1 << 20)
    w = np.random.default_rng(0).standard_normal((8, 3, 3, 8)).astype(np.float32)
    with weight_cache.transient(True):
        u, _ = cache.get(w, (2, "forward"), lambda w: weight_transform(w, 2))
    np.testing.assert_array_equal(u, weight_transform(w, 2))
    assert not cache.entries and cache.bytes == 0
    cache.get(w, (2, "forward"), lambda w: weight_transform(w, 2))
    assert len(cache.entries) == 1


@pytest.mark.parametrize("special", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["x", "w"])
def test_specials_propagate_as_direct(special, where) -> None:
    """A NaN/inf must reach exactly the outputs it reaches in direct arithmetic,
    not the whole Winograd tile."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 3, 10, 10)).astype(np.float32)
    w = np.abs(rng.standard_normal((2, 3, 3, 3))).astype(np.float32)
    (x if where == "x" else w)[0, 1, 2, 2] = special
    expected = ce.conv(x, w, padding=1, algo="direct")
    for algo in TOLERANCE:
        got = ce.conv(x, w, padding=1, algo=algo)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))


def _threads(n: int):
    """Context: convengine runs ``n`` threads inside, the old count restored after."""
    import contextlib

    @contextlib.contextmanager
    def scope():
        old = ce.get_num_threads()
        ce.set_num_threads(n)
        try:
            yield
        finally:
            ce.set_num_threads(old)

    return scope()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kc", [1, 7, 33])
@pytest.mark.parametrize("add", [False, True])
def test_micro_kernel_against_float64_matmul(dtype, kc, add) -> None:
    """gemm_6xnr: c[r, :] = (c[r, :] if add else 0) + a[r, :kc] @ b for r < mr, rows
    from mr on left untouched."""
    from numba import njit

    @njit
    def call(a, b, c, kc, mr, add):
        fma.gemm_6xnr(a, 2, a.shape[1], b, 0, kc, mr, c, c.shape[1], c.shape[1], add,
                      fma.WEIGHT_AHEAD)

    width = fma.nr(np.dtype(dtype).itemsize)
    rng = np.random.default_rng(kc)
    a = rng.standard_normal((fma.MR, kc + 2)).astype(dtype)
    b = rng.standard_normal((kc, width)).astype(dtype)
    for mr in range(1, fma.MR + 1):
        c = np.full((fma.MR + 1, width), -7.0, dtype)
        call(a, b, c, kc, mr, add)
        ref = a[:mr, 2:].astype(np.float64) @ b.astype(np.float64) - (7 if add else 0)
        np.testing.assert_allclose(c[1:mr + 1], ref, rtol=0, atol=1e-5 * max(1, kc))
        assert (c[0] == -7).all() and (c[mr + 1:] == -7).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("batch", "size", "channels"), [(1, 6, 144), (3, 30, 24)])
def test_plans_agree_with_reference(threads, batch, size, channels) -> None:
    """Few tiles and many output channels (split over threads) and many tiles in
    several blocks per thread both match the float64 reference."""
    rng = np.random.default_rng(size)
    x = rng.standard_normal((batch, size, size, channels)).astype(np.float32)
    w = rng.standard_normal((channels, 3, 3, channels)).astype(np.float32)
    ref = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1, layout="NHWC",
                  algo="reference")
    with _threads(threads):
        problem = ce.explain(x, w, padding=1, layout="NHWC").problem
        parts, parts_k, block = winograd._plan(problem, 4)
        assert parts == threads and block % fma.MR == 0
        tiles = batch * (-(-size // 4)) ** 2
        assert parts_k == (threads if batch == 1 else 1)
        assert block < tiles or batch == 1  # several blocks where tiles are many
        for algo in TOLERANCE:
            got = ce.conv(x, w, padding=1, layout="NHWC", algo=algo)
            assert_rel_close(got, ref, TOLERANCE[algo])


def test_float64_vector_path_is_near_exact() -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 40, 9, 12)), rng.standard_normal((36, 40, 3, 3))
    ref = ce.conv(x, w, padding=1, algo="reference")
    for algo in TOLERANCE:
        assert_rel_close(ce.conv(x, w, padding=1, algo=algo), ref, 1e-13)


def test_overflow_in_the_transforms_falls_back_to_direct() -> None:
    """Finite inputs whose transforms overflow (3e38 + 3e38, 4 * 3e38) give direct's
    (finite) result."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    w = (rng.standard_normal((16, 16, 3, 3)) * 1e-4).astype(np.float32)
    x[0, 3, 2:7, 2:7] = 3e38
    expected = ce.conv(x, w, padding=1, algo="direct")
    assert np.isfinite(expected).all()
    for algo in TOLERANCE:
        np.testing.assert_array_equal(ce.conv(x, w, padding=1, algo=algo), expected)


@pytest.mark.parametrize("size", [9, 10, 4097])  # 36 bytes: 32-bit words; else 64-bit
def test_same_bits_sees_one_flipped_bit(size) -> None:
    rng = np.random.default_rng(size)
    a = rng.standard_normal(size).astype(np.float32)
    assert weight_cache.same_bits(a, a.copy())
    for i in (0, size // 2, size - 1):
        b = a.copy()
        b.view(np.uint32)[i] ^= 1
        assert not weight_cache.same_bits(a, b)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("shape", [(70, 3, 3, 20), (64, 3, 3, 64), (33, 3, 17)],
                         ids=["o70-c20", "o64-c64", "1d"])
def test_packed_transform_matches_the_numpy_transform(shape, m):
    """The compiled transform-and-pack equals the float64 numpy form rounded to float32
    (F(2x2) bit for bit; F(4x4) to one rounding), also on the flipped view."""
    from convengine.algorithms._transforms import flipped_view, flipped_weight

    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    for src, view in ((w, w), (flipped_weight(w), flipped_view(w))):
        expected = pack_weights(weight_transform(src, m))
        got = winograd.packed_transform(view, m)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        if m == 2:
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got, expected, rtol=2 ** -23, atol=0)


def test_transient_weights_need_more_tiles_for_winograd() -> None:
    """Training steps (weights transformed anew on every call) keep Winograd for many
    tiles only; the tuner's cached-weight timings are not consulted then."""
    from convengine import select

    def chosen(batch: int, size: int) -> str:
        x = np.zeros((batch, size, size, 256), np.float32)
        w = np.zeros((256, 3, 3, 256), np.float32)
        return select.resolve(ce.explain(x, w, padding=1, layout="NHWC").problem).name

    previous = ce.set_tuning("off")
    try:
        assert chosen(1, 7) == "winograd"
        assert chosen(8, 28) == "winograd4"
        with weight_cache.transient(True):
            assert chosen(1, 7) == "blocked"
            assert chosen(8, 28) == "winograd4"  # 392 tiles of 4x4
    finally:
        ce.set_tuning(previous)
