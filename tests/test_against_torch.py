"""Forward, both gradients and the transposed conv against PyTorch (torch extra)."""

import numpy as np
import pytest

import convengine as ce
from oracle import assert_close

torch = pytest.importorskip("torch")
F = torch.nn.functional

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}

CASES = {
    "1d-s2-asym-d2-g2": ((3, 4, 19), (6, 2, 3), dict(stride=2, padding=((2, 1),), dilation=2, groups=2)),
    "2d-s1-pad1": ((2, 8, 10, 9), (5, 8, 3, 3), dict(stride=1, padding=1)),
    "2d-s-mixed-asym-depthwise": ((2, 4, 11, 8), (8, 1, 3, 2),
                                  dict(stride=(2, 1), padding=((0, 2), (1, 1)), groups=4)),
    "2d-same-s3": ((1, 3, 13, 10), (4, 3, 4, 3), dict(stride=3, padding="same", dilation=(1, 2))),
    "3d-s2-pad1-g3": ((2, 6, 6, 5, 7), (6, 2, 3, 2, 3), dict(stride=2, padding=1, groups=3)),
}


def _torch_padding(problem):
    """F.pad takes (lo, hi) pairs of the last dim first."""
    return [p for pair in reversed(problem.padding) for p in pair]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", CASES)
def test_forward_and_gradients_match_torch(name, layout):
    x_shape, w_shape, kw = CASES[name]
    rng = np.random.default_rng(11)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(w_shape[0])
    problem = ce.explain(x, w, **kw).problem
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    yt = CONV[problem.ndim](F.pad(xt, _torch_padding(problem)), wt, torch.tensor(b), stride=problem.stride,
                            dilation=problem.dilation, groups=problem.groups)
    dy = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(dy))
    if layout == "NHWC":
        to_last = lambda a: np.moveaxis(a, 1, -1)  # noqa: E731
        x, w, dy = to_last(x), to_last(w), to_last(dy)
    for dtype in ("float64", "float32"):
        xs, ws, dys = x.astype(dtype), w.astype(dtype), dy.astype(dtype)
        y = ce.conv(xs, ws, b.astype(dtype), layout=layout, **kw)
        dx = ce.conv_backward_data(dys, ws, xs.shape, layout=layout, **kw)
        dw = ce.conv_backward_weight(xs, dys, ws.shape, layout=layout, **kw)
        back = (lambda a: np.moveaxis(a, -1, 1)) if layout == "NHWC" else (lambda a: a)
        assert_close(back(y), yt.detach().numpy(), dtype, "forward")
        assert_close(back(dx), xt.grad.numpy(), dtype, "backward_data")
        assert_close(back(dw), wt.grad.numpy(), dtype, "backward_weight")


TRANSPOSE_CASES = {
    "1d": ((2, 4, 7), (4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    "2d-groups-dilation": ((2, 4, 5, 6), (4, 2, 3, 2),
                           dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=2,
                                dilation=(2, 1))),
    "2d-output-padding-below-dilation": ((1, 4, 5, 5), (4, 2, 3, 3),
                                          dict(stride=(1, 2), dilation=(3, 1), output_padding=(2, 1),
                                               padding=(1, 2))),
    "3d": ((1, 3, 3, 4, 2), (3, 2, 2, 3, 3), dict(stride=2, padding=(0, 1, 1), output_padding=(1, 0, 1))),
}


@pytest.mark.parametrize("name", TRANSPOSE_CASES)
def test_transpose_matches_torch(name):
    x_shape, w_shape, kw = TRANSPOSE_CASES[name]
    rng = np.random.default_rng(13)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[1] * kw.get("groups", 1))
    expected = CONV_T[len(x_shape) - 2](torch.tensor(x), torch.tensor(w), torch.tensor(b), **kw).numpy()
    for dtype in ("float64", "float32"):
        out = ce.conv_transpose(x.astype(dtype), w.astype(dtype), b.astype(dtype), **kw)
        assert_close(out, expected, dtype, f"transpose {dtype}")
