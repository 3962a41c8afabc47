"""PreparedConv (constant weights packed once) and FusedConv2d built on it, against
the float64 reference and PyTorch."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import convengine as ce
from convengine.prepared import PreparedConv
from oracle import assert_close, random, reference

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
    """In-place changes (version counter) and a new weight tensor prepare again;
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
    for twin in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
        check(twin(x))
