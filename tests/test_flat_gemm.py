"""``flat_gemm`` (one GEMM per kernel tap over the flat padded input) against the
float64 reference, all three passes."""

from __future__ import annotations

import numpy as np
import pytest

import convengine as ce
from convengine.algorithms.flat_gemm import Grid

# (id, x shape NCHW, w shape, conv args)
CASES = [
    ("3x3-pad1", (2, 5, 9, 11), (6, 5, 3, 3), dict(padding=1)),
    ("3x3-stride2", (2, 5, 9, 11), (6, 5, 3, 3), dict(stride=2, padding=1)),
    ("asym-pad-dil", (2, 5, 9, 12), (6, 5, 3, 2), dict(padding=((1, 0), (2, 1)), dilation=(1, 2))),
    ("1x1-stride2", (2, 5, 9, 11), (6, 5, 1, 1), dict(stride=2)),
    ("7x7-stride2-stem", (2, 3, 15, 15), (4, 3, 7, 7), dict(stride=2, padding=3)),
    ("1d-stride3-dil2", (1, 4, 13), (4, 4, 5), dict(stride=3, padding=2, dilation=2)),
    ("3d", (1, 3, 5, 6, 7), (4, 3, 3, 2, 3), dict(padding=1)),
    ("big-pad", (1, 2, 3, 3), (3, 2, 2, 2), dict(padding=1)),
]
TOLERANCE = {"float64": 1e-12, "float32": 2e-5}


def assert_close(got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    """Fail unless got matches ref to the dtype's tolerance, relative to max |ref|."""
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype), (got.shape, got.dtype)
    err = np.max(np.abs(got.astype(np.float64) - ref))
    assert err <= TOLERANCE[dtype] * (1 + np.max(np.abs(ref))), f"max error {err:.3g}"


def test_assert_close_can_fail() -> None:
    with pytest.raises(AssertionError):
        assert_close(np.full(3, 1.01), np.ones(3), "float64")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("xs", "ws", "args"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_flat_gemm_all_passes(xs, ws, args, dtype) -> None:
    rng = np.random.default_rng(len(xs) + ws[0])
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = ce.conv(x64, w64, algo="reference", **args)
    assert_close(ce.conv(x, w, algo="flat_gemm", **args), ref, dtype)
    dy = rng.standard_normal(ref.shape).astype(dtype)
    ref = ce.conv_backward_weight(x64, dy.astype(np.float64), ws, algo="reference", **args)
    assert_close(ce.conv_backward_weight(x, dy, ws, algo="flat_gemm", **args), ref, dtype)
    if ce.explain(dy, w, xs, pass_="backward_data", **args).refused.get("flat_gemm") is None:
        ref = ce.conv_backward_data(dy.astype(np.float64), w64, xs, algo="reference", **args)
        assert_close(ce.conv_backward_data(dy, w, xs, algo="flat_gemm", **args), ref, dtype)


def test_grid_rows_and_offsets() -> None:
    """3x3 pad 1 on 5x5, stride 1: padded 7x7, 49 virtual rows per image, taps 7 apart."""
    x, w = np.zeros((2, 1, 5, 5)), np.zeros((1, 1, 3, 3))
    grid = Grid.of(ce.explain(x, w, padding=1).problem)
    assert grid.padded == (7, 7) and grid.virtual == (7, 7)
    assert grid.offsets == (0, 1, 2, 7, 8, 9, 14, 15, 16)
    assert grid.rows(2) == 98


@pytest.mark.parametrize(("args", "why"), [(dict(groups=2), "groups"),
                                           (dict(stride=(1, 2)), "unequal strides")])
def test_refuses(args, why) -> None:
    x, w = np.zeros((1, 4, 6, 6)), np.zeros((4, 4 // args.get("groups", 1), 3, 3))
    assert why in ce.explain(x, w, **args).refused["flat_gemm"]


def test_backward_weight_specials_stay_where_ieee_puts_them() -> None:
    """A NaN in x's first column is never read by tap kw=2 of a 3x3 pad-1 conv; the
    virtual rows must not leak it there."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 6, 6))
    x[0, 0, 3, 0] = np.nan
    dy = rng.standard_normal((1, 3, 6, 6))
    ref = ce.conv_backward_weight(x, dy, (3, 2, 3, 3), padding=1, algo="reference")
    got = ce.conv_backward_weight(x, dy, (3, 2, 3, 3), padding=1, algo="flat_gemm")
    assert not np.isnan(ref[:, 0, :, 2]).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
