"""DLPack-capable arrays reach the core without a copy: numpy, torch CPU tensors (also
channels-last, requiring grad, bfloat16), JAX CPU arrays, any object with __dlpack__."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import convengine as ce
from convengine.problem import as_array


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_numpy_passes_through():
    a = np.ones((2, 3), np.float32)
    assert as_array(a, "x") is a


class DLPackOnly:
    """An array known to the engine only through the DLPack protocol."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class OffDevice:
    """What a GPU array looks like to a CPU library: DLPack refuses, no __array__."""

    def __dlpack__(self, **kwargs):
        raise BufferError("the array lives on a device numpy cannot reach")

    def __dlpack_device__(self):
        return (2, 0)


def test_any_dlpack_object_is_viewed():
    a = np.arange(12.0).reshape(3, 4)[:, ::2]  # strided: DLPack carries strides
    view = as_array(DLPackOnly(a), "x")
    assert np.shares_memory(view, a) and np.array_equal(view, a)


def test_unreachable_device_names_the_argument():
    with pytest.raises(TypeError, match=r"w \(OffDevice\) .* DLPack \(device cuda:0\)"):
        as_array(OffDevice(), "w")


def test_torch_tensors_come_in_without_copies():
    torch = pytest.importorskip("torch")
    t = torch.randn(2, 3, 4, 5)
    cases = {
        "contiguous": t,
        "channels_last": t.to(memory_format=torch.channels_last),
        "requires_grad": t.clone().requires_grad_(),
        "sliced": t[:, 1:, ::2],
        "expanded": torch.ones(3, 1, 1).expand(3, 4, 5),
    }
    for name, tensor in cases.items():
        a = as_array(tensor, "x")
        assert address(a) == tensor.data_ptr(), name
        assert a.shape == tuple(tensor.shape), name
        assert a.strides == tuple(s * tensor.element_size() for s in tensor.stride()), name
    bf = t.bfloat16()
    a = as_array(bf, "x")
    assert a.dtype == ml_dtypes.bfloat16 and address(a) == bf.data_ptr()
    assert np.array_equal(a.astype(np.float32), bf.float().numpy())


def test_core_conv_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 5, 4, generator=g).to(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    y = ce.conv(x, w, padding=1, groups=2)
    expected = torch.nn.functional.conv2d(x.double(), w.detach().double(), padding=1, groups=2)
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-5, atol=1e-5)
    # NHWC in memory: the engine's canonical form, viewed and used as it is
    x_nhwc = x.permute(0, 2, 3, 1)
    assert x_nhwc.is_contiguous() and as_array(x_nhwc, "x").flags.c_contiguous
    y_nhwc = ce.conv(x_nhwc, w.detach().permute(0, 2, 3, 1), padding=1, groups=2,
                     layout="NHWC")
    np.testing.assert_allclose(np.moveaxis(y_nhwc, -1, 1), y, rtol=1e-6, atol=1e-6)


def test_jax_arrays_come_in_without_copies():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(2 * 3 * 6 * 5, dtype=jnp.float32).reshape(2, 3, 6, 5) / 100
    w = jnp.ones((4, 3, 3, 3), dtype=jnp.float32)
    for arr in (x, w, x.astype(jnp.bfloat16)):
        a = as_array(arr, "x")
        assert address(a) == arr.unsafe_buffer_pointer()
        assert a.dtype == np.dtype(arr.dtype)
    y = ce.conv(x, w, padding=1)
    np.testing.assert_allclose(y, ce.conv(np.asarray(x), np.asarray(w), padding=1,
                                          algo="reference"), rtol=1e-5, atol=1e-5)
