"""convengine.torch against PyTorch: forward values, gradcheck in float64, modules,
replace_convs, and a small CNN trained side by side."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import convengine.torch as cet  # noqa: E402
from oracle import INT8_WEIGHTS  # noqa: E402

TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TORCH_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def assert_close(actual, expected, rtol, atol):
    """Raise unless every element agrees; works on tensors of any dtype."""
    a, e = actual.detach().double(), expected.detach().double()
    assert a.shape == e.shape, f"shape {tuple(a.shape)} != {tuple(e.shape)}"
    err = (a - e).abs()
    bound = atol + rtol * e.abs()
    worst = err.max().item()
    assert bool((err <= bound).all()), f"max error {worst:.3g} (atol {atol}, rtol {rtol})"


def test_assert_close_can_fail():
    with pytest.raises(AssertionError):
        assert_close(torch.zeros(3), torch.tensor([0.0, 0.0, 1e-3]), 1e-6, 1e-6)


# rank, x spatial, kernel, stride, padding, dilation, groups, channels in/out
CASES = [
    pytest.param(1, (9,), 3, 1, 0, 1, 1, (3, 4), id="1d-plain"),
    pytest.param(1, (10,), 4, 2, 1, 2, 2, (4, 6), id="1d-stride-dil-groups"),
    pytest.param(1, (7,), 3, 1, ((2, 0),), 1, 1, (2, 3), id="1d-asym-pad"),
    pytest.param(2, (6, 5), (3, 2), 1, 1, 1, 1, (3, 4), id="2d-pad1"),
    pytest.param(2, (7, 8), 3, (2, 3), (1, 2), (2, 1), 2, (4, 4), id="2d-stride-dil-groups"),
    pytest.param(2, (5, 6), 3, 1, "same", 1, 4, (4, 8), id="2d-depthwise-same"),
    pytest.param(2, (6, 6), 3, 1, "valid", 1, 1, (2, 3), id="2d-valid"),
    pytest.param(2, (6, 5), 2, 1, ((1, 0), (0, 2)), 1, 1, (2, 2), id="2d-asym-pad"),
    pytest.param(2, (5, 5), 1, 2, 0, 1, 1, (3, 5), id="2d-1x1-stride2"),
    pytest.param(3, (4, 5, 4), 2, 1, 1, 1, 1, (2, 3), id="3d-pad1"),
    pytest.param(3, (5, 4, 5), (3, 2, 2), (2, 1, 2), 0, (1, 2, 1), 2, (2, 4), id="3d-mixed"),
]


def _operands(rank, size, kernel, groups, channels, dtype, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    c_in, c_out = channels
    k = (kernel,) * rank if isinstance(kernel, int) else kernel
    x = torch.randn(batch, c_in, *size, generator=g, dtype=dtype)
    w = torch.randn(c_out, c_in // groups, *k, generator=g, dtype=dtype)
    b = torch.randn(c_out, generator=g, dtype=dtype)
    return x, w, b


def _torch_padding(padding, x, rank):
    """PyTorch cannot take (lo, hi) pairs: pad x explicitly for the comparison."""
    if isinstance(padding, tuple) and isinstance(padding[0], tuple):
        flat = [p for lo_hi in reversed(padding) for p in lo_hi]
        return F.pad(x, flat), 0
    return x, padding


@pytest.mark.parametrize("rank,size,kernel,stride,padding,dilation,groups,channels", CASES)
def test_forward_matches_pytorch(rank, size, kernel, stride, padding, dilation, groups, channels):
    x, w, b = _operands(rank, size, kernel, groups, channels, torch.float32)
    y = cet.conv(x, w, b, stride, padding, dilation, groups)
    xt, pt = _torch_padding(padding, x, rank)
    if pt == "same" and stride != 1:
        pytest.skip("PyTorch has no padding='same' with stride > 1")
    expected = TORCH_CONV[rank](xt.double(), w.double(), b.double(), stride, pt, dilation, groups)
    assert y.dtype == torch.float32
    assert_close(y, expected, 1e-5, 1e-5)


@pytest.mark.parametrize("rank,size,kernel,stride,padding,dilation,groups,channels", CASES)
def test_gradcheck_float64(rank, size, kernel, stride, padding, dilation, groups, channels):
    x, w, b = _operands(rank, size, kernel, groups, channels, torch.float64, batch=1)
    for t in (x, w, b):
        t.requires_grad_()

    def f(x, w, b):
        return cet.conv(x, w, b, stride, padding, dilation, groups)

    assert torch.autograd.gradcheck(f, (x, w, b))


# rank, x spatial, kernel, stride, padding, output_padding, dilation, groups, (C_in, C_out)
T_CASES = [
    pytest.param(1, (5,), 3, 2, 1, 1, 1, 1, (3, 2), id="1d-stride2-outpad"),
    pytest.param(2, (3, 4), 3, (2, 3), (1, 0), (1, 2), 1, 2, (4, 6), id="2d-groups-outpad"),
    pytest.param(2, (4, 3), 2, 1, 0, 0, 2, 1, (2, 3), id="2d-dilated"),
    pytest.param(3, (2, 3, 2), 2, 2, 1, (1, 0, 1), 1, 1, (2, 2), id="3d-stride2"),
]


@pytest.mark.parametrize("rank,size,kernel,stride,padding,out_pad,dilation,groups,channels",
                         T_CASES)
def test_conv_transpose_value_and_gradcheck(rank, size, kernel, stride, padding, out_pad,
                                            dilation, groups, channels):
    g = torch.Generator().manual_seed(1)
    c_in, c_out = channels
    x = torch.randn(1, c_in, *size, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(c_in, c_out // groups, *(kernel,) * rank, generator=g,
                    dtype=torch.float64, requires_grad=True)
    b = torch.randn(c_out, generator=g, dtype=torch.float64, requires_grad=True)

    def f(x, w, b):
        return cet.conv_transpose(x, w, b, stride, padding, out_pad, groups, dilation)

    expected = TORCH_CONV_T[rank](x, w, b, stride, padding, out_pad, groups, dilation)
    assert_close(f(x, w, b), expected, 1e-12, 1e-12)
    assert torch.autograd.gradcheck(f, (x, w, b))


def test_channels_last_stays_channels_last_and_grads_match():
    x, w, b = _operands(2, (6, 7), 3, 2, (4, 6), torch.float32, seed=3)
    x = x.to(memory_format=torch.channels_last).requires_grad_()
    w.requires_grad_()
    y = cet.conv(x, w, b, 1, 1, 1, 2)
    assert y.is_contiguous(memory_format=torch.channels_last)
    x_ref = x.detach().double().requires_grad_()
    w_ref = w.detach().double().requires_grad_()
    y_ref = F.conv2d(x_ref, w_ref, b.double(), 1, 1, 1, 2)
    assert_close(y, y_ref, 1e-5, 1e-5)
    dy = torch.randn_like(y_ref)
    (y * dy.float()).sum().backward()
    (y_ref * dy).sum().backward()
    assert_close(x.grad, x_ref.grad, 1e-4, 1e-4)
    assert_close(w.grad, w_ref.grad, 1e-4, 1e-4)


def test_tensors_cross_without_copies():
    t = torch.randn(2, 3, 4)
    a = cet.to_numpy(t)
    assert a.__array_interface__["data"][0] == t.data_ptr()
    back = cet.from_numpy(a)
    assert back.data_ptr() == t.data_ptr()
    bf = torch.randn(3, 4).bfloat16()
    assert cet.to_numpy(bf).__array_interface__["data"][0] == bf.data_ptr()
    assert torch.equal(cet.from_numpy(cet.to_numpy(bf)), bf)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_half_precision_inputs(dtype, tol):
    x, w, b = _operands(2, (6, 6), 3, 1, (8, 4), torch.float32, seed=4)
    x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    y = cet.conv(x, w, b, padding=1)
    assert y.dtype == dtype
    expected = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    assert_close(y, expected, tol, tol * expected.abs().max().item())


def test_unbatched_input():
    x, w, b = _operands(1, (8,), 3, 1, (2, 3), torch.float32)
    assert_close(cet.conv(x[0], w, b, padding=1), F.conv1d(x[0], w, b, padding=1), 1e-5, 1e-5)


def test_errors_name_the_problem():
    w = torch.randn(4, 3, 3, 3)
    with pytest.raises(ValueError, match="device meta"):
        cet.conv(torch.empty(1, 3, 5, 5, device="meta"), w)
    with pytest.raises(TypeError, match="torch.Tensor"):
        cet.conv(np.zeros((1, 3, 5, 5), np.float32), w)
    with pytest.raises(ValueError, match="channel mismatch"):
        cet.conv(torch.randn(1, 2, 5, 5), w)


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "circular", "replicate"])
def test_conv2d_module_is_a_drop_in(padding_mode):
    torch.manual_seed(0)
    ref = nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=2,
                    padding_mode=padding_mode)
    mine = cet.Conv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=2,
                      padding_mode=padding_mode)
    mine.load_state_dict(ref.state_dict())
    assert list(mine.state_dict()) == list(ref.state_dict())
    x = torch.randn(2, 4, 9, 8)
    assert_close(mine(x), ref(x), 1e-5, 1e-5)


def test_conv_transpose_module_output_size():
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1)
    mine = cet.ConvTranspose2d(3, 4, 3, stride=2, padding=1, algo="reference")
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(1, 3, 5, 5)
    assert_close(mine(x, output_size=[10, 10]), ref(x, output_size=[10, 10]), 1e-5, 1e-5)
    assert "algo='reference'" in repr(mine)


class SmallNet(nn.Module):
    """Every conv flavour the modules cover, in a network small enough to train."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=4, bias=False)
        self.c3 = nn.ConvTranspose2d(8, 6, 2, stride=2)
        self.c4 = nn.Conv1d(6, 4, 3, padding="same", dilation=2)
        self.c5 = nn.Conv3d(1, 2, (1, 3, 3), padding=(0, 1, 1))
        self.head = nn.Linear(2 * 4 * 64, 5)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.c3(x))  # (N, 6, 8, 8)
        x = self.c4(x.flatten(2))  # (N, 4, 64)
        x = self.c5(x[:, None, None])  # a (1, 4, 64) volume -> (N, 2, 1, 4, 64)
        return self.head(x.flatten(1))


def test_replace_convs_keeps_parameters_and_values():
    torch.manual_seed(0)
    net = SmallNet()
    params = [id(p) for p in net.parameters()]
    x = torch.randn(2, 3, 8, 8)
    before = net(x)
    assert cet.replace_convs(net) is net
    assert isinstance(net.c3, cet.ConvTranspose2d) and isinstance(net.c5, cet.Conv3d)
    assert [id(p) for p in net.parameters()] == params
    assert_close(net(x), before, 1e-5, 1e-5)


def test_replace_convs_makes_weights_channels_last_with_the_same_values():
    """2-D/3-D weights get channels-last memory (read in place by the kernels); their
    values, the state_dict and loading it into an untouched model are unchanged."""
    torch.manual_seed(0)
    net = SmallNet()
    original = copy.deepcopy(net.state_dict())
    cet.replace_convs(net)
    assert net.c1.weight.is_contiguous(memory_format=torch.channels_last)
    assert net.c3.weight.is_contiguous(memory_format=torch.channels_last)
    assert net.c5.weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert net.c4.weight.is_contiguous()  # 1-D: as it was
    for key, value in net.state_dict().items():
        assert torch.equal(value, original[key]), key
    fresh = SmallNet()
    fresh.load_state_dict(net.state_dict())
    x = torch.randn(2, 3, 8, 8)
    assert_close(fresh(x), net(x), 1e-5, 1e-5)


def test_small_cnn_trains_like_pytorch():
    torch.manual_seed(0)
    ref = SmallNet()
    mine = cet.replace_convs(copy.deepcopy(ref))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref, mine)]
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g))
            for _ in range(6)]
    losses = {"ref": [], "mine": []}
    for x, label in data:
        for key, model, opt in (("ref", ref, opts[0]), ("mine", mine, opts[1])):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), label)
            loss.backward()
            opt.step()
            losses[key].append(loss.item())
    np.testing.assert_allclose(losses["mine"], losses["ref"], rtol=1e-4)
    assert losses["ref"][-1] != losses["ref"][0]  # it did train
    for p_ref, p_mine in zip(ref.parameters(), mine.parameters(), strict=True):
        assert_close(p_mine, p_ref, 1e-4, 1e-5)


def test_training_steps_do_not_fill_the_weight_caches():
    """A parameter whose version moves between steps is marked transient: the packed
    weights of its steps are not stored (one entry from the first step stays), and
    every step matches PyTorch."""
    from convengine.algorithms.blocked import forward as blocked
    from convengine.algorithms.winograd import kernels as winograd

    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3,
                                                                             padding=1))
    mine = cet.replace_convs(copy.deepcopy(ref))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ref, mine)]
    blocked.PACKED.clear()
    winograd.WEIGHT_CACHE.clear()
    x = torch.randn(2, 16, 12, 12)
    for _ in range(4):
        for model, opt in zip((ref, mine), opts):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        for p_ref, p_mine in zip(ref.parameters(), mine.parameters(), strict=True):
            assert_close(p_mine, p_ref, 1e-4, 1e-5)
    entries = len(blocked.PACKED.entries) + len(winograd.WEIGHT_CACHE.entries)
    assert entries <= 4  # the first step's forward and backward-data entries only


# ------------------------------------------------------------------ quantized

QUANT_CASES = [
    pytest.param(dict(stride=1, padding=1, dilation=1, groups=1), "per_tensor", False,
                 id="per-tensor"),
    pytest.param(dict(stride=2, padding=(1, 0), dilation=1, groups=2), "per_channel", True,
                 id="per-channel-groups-relu"),
    pytest.param(dict(stride=(1, 2), padding=2, dilation=2, groups=1), "per_channel", False,
                 id="per-channel-dilated"),
]


def _torch_qconv(geometry, scheme, relu, seed=0):
    """PyTorch's quantized Conv2d/ConvReLU2d with random int8 weights and float bias."""
    import torch.ao.nn.intrinsic.quantized as nniq
    import torch.ao.nn.quantized as nnq

    g = torch.Generator().manual_seed(seed)
    c_in, c_out, groups = 8, 6, geometry["groups"]
    w = torch.randn(c_out, c_in // groups, 3, 3, generator=g) * 0.2
    limit = INT8_WEIGHTS[1] - 1  # int8 values PyTorch multiplies exactly here
    if scheme == "per_tensor":
        wq = torch.quantize_per_tensor(w.clamp(-limit * 0.004, limit * 0.004), 0.004, 0,
                                       torch.qint8)
    else:
        scales = torch.rand(c_out, generator=g, dtype=torch.float64) * 0.004 + 0.001
        bound = (limit * scales).float().view(-1, 1, 1, 1)
        wq = torch.quantize_per_channel(torch.maximum(torch.minimum(w, bound), -bound),
                                        scales, torch.zeros(c_out, dtype=torch.long), 0,
                                        torch.qint8)
    mod = (nniq.ConvReLU2d if relu else nnq.Conv2d)(c_in, c_out, 3, **geometry)
    mod.set_weight_bias(wq, torch.randn(c_out, generator=g))
    mod.scale, mod.zero_point = 0.07, 60
    x = torch.quantize_per_tensor(torch.randn(2, c_in, 9, 10, generator=g), 0.03, 120,
                                  torch.quint8)
    return mod, x


@pytest.mark.parametrize("engine", ["x86", "fbgemm"])
@pytest.mark.parametrize("geometry,scheme,relu", QUANT_CASES)
def test_qconv2d_bit_exact_with_pytorch(engine, geometry, scheme, relu):
    if engine not in torch.backends.quantized.supported_engines:
        pytest.skip(f"PyTorch lacks the {engine} quantized engine here")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        mod, x = _torch_qconv(geometry, scheme, relu)
        expected = mod(x)
    finally:
        torch.backends.quantized.engine = previous
    mine = cet.QConv2d.from_quantized(mod)
    y = mine(x)
    assert (y.q_scale(), y.q_zero_point(), y.dtype) == (0.07, 60, torch.quint8)
    assert torch.equal(y.int_repr(), expected.int_repr()), (
        f"{int((y.int_repr() != expected.int_repr()).sum())} of {y.numel()} values differ"
    )
    assert expected.int_repr().float().std() > 5  # a test on non-trivial output


def test_qconv2d_from_observed_float_model_matches_convert():
    from torch.ao.quantization import DeQuantStub, QuantStub, convert, fuse_modules, prepare

    torch.manual_seed(0)
    model = nn.Sequential(QuantStub(), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), DeQuantStub())
    model.eval()
    model = fuse_modules(model, [["1", "2"]])
    model.qconfig = torch.ao.quantization.get_default_qconfig("x86")
    prepared = prepare(model)
    for _ in range(3):
        prepared(torch.randn(2, 4, 8, 8))
    mine = cet.QConv2d.from_float(prepared[1])
    converted = convert(copy.deepcopy(prepared))
    xq = converted[0](torch.randn(2, 4, 8, 8))
    assert mine.relu
    assert torch.equal(mine(xq).int_repr(), converted[1](xq).int_repr())


def test_qconv2d_from_plain_float_conv_and_errors():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3)
    with pytest.raises(ValueError, match="scale and zero_point"):
        cet.QConv2d.from_float(conv)
    mine = cet.QConv2d.from_float(conv, scale=0.05, zero_point=10)
    x = torch.randn(1, 3, 6, 6)
    xq = torch.quantize_per_tensor(x, 0.02, 128, torch.quint8)
    y = mine(xq).dequantize()
    # int8 weights, 8-bit activations: the float conv within a few output steps
    assert_close(y, conv(xq.dequantize()).detach().clamp(-0.5, 12.25), 0, 0.2)
    with pytest.raises(TypeError, match="quantized tensor"):
        mine(x)
