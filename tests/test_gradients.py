"""Gradients by the adjoint identity <conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)>,
for every algorithm, in float64, and the transposed conv as the adjoint of conv."""

import numpy as np
import pytest

import convengine as ce
from oracle import assert_close

PROBLEMS = {
    "1d-stride3-dil2-asym": ((2, 4, 17), (6, 4, 3), dict(stride=3, dilation=2, padding=((2, 1),))),
    "2d-stride2-same": ((2, 3, 9, 7), (4, 3, 3, 3), dict(stride=2, padding="same")),
    "2d-grouped-mixed-stride": ((1, 6, 8, 9), (4, 3, 2, 3), dict(stride=(1, 2), groups=2, padding=1)),
    "2d-depthwise-nhwc": ((2, 7, 6, 4), (8, 3, 3, 1), dict(groups=4, padding=1, layout="NHWC")),
    "3d-stride-1-pad-2": ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), dict(padding=2)),
    "2d-pointwise": ((3, 5, 4, 4), (7, 5, 1, 1), {}),
}


@pytest.mark.parametrize("name", PROBLEMS)
def test_adjoint_identity_every_algorithm(name):
    x_shape, w_shape, kw = PROBLEMS[name]
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y = ce.conv(x, w, **kw, algo="reference")
    dy = rng.standard_normal(y.shape)
    checked = 0
    for algo in ce.list_algorithms("forward"):
        try:
            y = ce.conv(x, w, **kw, algo=algo)
            dx = ce.conv_backward_data(dy, w, x.shape, **kw, algo=algo)
            dw = ce.conv_backward_weight(x, dy, w.shape, **kw, algo=algo)
        except ce.ConvSetupError:
            continue
        lhs = float(np.vdot(y, dy))
        assert lhs == pytest.approx(float(np.vdot(x, dx)), rel=1e-10), algo
        assert lhs == pytest.approx(float(np.vdot(w, dw)), rel=1e-10), algo
        checked += 1
    assert checked >= 2


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    kw = dict(stride=2, padding=((1, 0), (0, 2)), dilation=(1, 2))
    dy = rng.standard_normal(ce.conv(x, w, **kw).shape)
    dx = ce.conv_backward_data(dy, w, x.shape, **kw)
    dw = ce.conv_backward_weight(x, dy, w.shape, **kw)
    eps = 1e-6
    probes = {"x": [(0, 1, 2, 3), (0, 0, 0, 0), (0, 1, 4, 4)], "w": [(2, 1, 2, 0), (0, 0, 1, 2)]}
    for arr, grad, name in ((x, dx, "x"), (w, dw, "w")):
        for index in probes[name]:
            bumped = arr.copy()
            bumped[index] += eps
            args = (bumped, w) if name == "x" else (x, bumped)
            numeric = (np.vdot(ce.conv(*args, **kw), dy) - np.vdot(ce.conv(x, w, **kw), dy)) / eps
            assert grad[index] == pytest.approx(numeric, rel=1e-4, abs=1e-6), (name, index)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_transpose_is_adjoint_of_conv(layout, dtype):
    """<conv(z, w), x> == <z, conv_transpose(x, w)> for the transpose's output z."""
    rng = np.random.default_rng(5)
    kw = dict(stride=(2, 3), padding=((1, 0), (2, 1)), dilation=(1, 2), groups=2)
    w = rng.standard_normal((4, 3, 3, 2)).astype(dtype)  # (C_in, C_out // g, *K)
    x = rng.standard_normal((2, 4, 5, 4)).astype(dtype)
    if layout == "NHWC":
        w, x = np.moveaxis(w, 1, -1), np.moveaxis(x, 1, -1)
    out = ce.conv_transpose(x, w, output_padding=(1, 0), layout=layout, **kw)
    z = rng.standard_normal(out.shape)
    y = ce.conv(z, w.astype(np.float64), layout=layout, **kw)
    assert y.shape == x.shape
    assert float(np.vdot(y, x)) == pytest.approx(float(np.vdot(z, out)), rel=1e-5)
    assert_close(out, ce.conv_backward_data(x.astype(np.float64), w.astype(np.float64), z.shape,
                                            layout=layout, algo="reference", **kw), dtype)
