"""``replace_quantized_convs`` on FX-quantized models (prepare_fx / convert_fx, fbgemm
and x86 engines, per-channel weights) against PyTorch's own quantized model."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import convengine.torch as cet  # noqa: E402
from convengine.torch.quantized import _nhwc  # noqa: E402
from test_torch_optimize import Block, Inverted, _bench_models, _randomize_bn  # noqa: E402

CL = torch.channels_last


@pytest.fixture(autouse=True)
def _seeded():
    """The models' initial weights drawn the same on every run: x86's oneDNN rounds
    rare ties 1 LSB apart from fbgemm's formula (about 1 output in 10^5-10^6, see
    docs/quantized.md), which an unseeded draw hit once in some twenty runs."""
    torch.manual_seed(0)


@pytest.fixture(params=["fbgemm", "x86"])
def engine(request, monkeypatch):
    monkeypatch.setattr(torch.backends.quantized, "engine", request.param)
    return request.param


def _fx_quantized(model: nn.Module, shape: tuple[int, ...], engine: str) -> nn.Module:
    """PyTorch's FX post-training quantization, calibrated on four random batches."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    g = torch.Generator().manual_seed(11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping(engine),
                              example_inputs=(torch.randn(shape),))
        with torch.no_grad():
            for _ in range(4):
                prepared(torch.randn(shape, generator=g))
        return convert_fx(prepared)


def _quantized_convs(model: nn.Module) -> int:
    import torch.ao.nn.quantized as nnq

    return sum(isinstance(m, nnq.Conv2d) for m in model.modules())


def _check_bit_exact(model: nn.Module, shape: tuple[int, ...], engine: str) -> None:
    q = _fx_quantized(_randomize_bn(model), shape, engine)
    convs = _quantized_convs(q)
    assert convs > 0
    ours = cet.replace_quantized_convs(copy.deepcopy(q))
    assert _quantized_convs(ours) == 0
    assert sum(isinstance(m, cet.QConv2d) for m in ours.modules()) == convs
    layouts, converted = [], set()

    def hook(mod, args, out):
        layouts.append(out.is_contiguous(memory_format=CL))
        if not args[0].is_contiguous(memory_format=CL):
            converted.add(args[0].data_ptr())

    for m in ours.modules():
        if isinstance(m, cet.QConv2d):
            m.register_forward_hook(hook)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        want, got = q(x), ours(x)
    assert layouts == [True] * convs
    assert len(converted) == 1  # only the quantized network input is not channels-last
    assert torch.equal(got, want), f"max difference {(got - want).abs().max().item():.3g}"


def test_resnet_block_bit_exact(engine):
    _check_bit_exact(Block(), (2, 8, 8, 8), engine)


def test_inverted_residual_bit_exact(engine):
    _check_bit_exact(Inverted(), (2, 3, 9, 7), engine)


@pytest.mark.parametrize("name,width", [("resnet50", 1 / 16), ("mobilenet_v2", 0.25)])
def test_bench_models_bit_exact(name, width, monkeypatch):
    monkeypatch.setattr(torch.backends.quantized, "engine", "x86")
    model = getattr(_bench_models(), name)(num_classes=10, width=width)
    _check_bit_exact(model, (1, 3, 32, 32), "x86")


def test_no_int_repr_copies_and_weights_stay_packed(monkeypatch):
    monkeypatch.setattr(torch.backends.quantized, "engine", "fbgemm")
    q = _fx_quantized(_randomize_bn(Block()), (1, 8, 6, 6), "fbgemm")
    ours = cet.replace_quantized_convs(q)
    conv = ours.conv1
    assert isinstance(conv, cet.QConv2d)
    w = _nhwc(conv.weight)
    assert w.flags.c_contiguous and np.shares_memory(w, conv.weight.numpy())
    x = torch.quantize_per_tensor(torch.rand(1, 8, 6, 6), 0.01, 0, torch.quint8)
    assert _nhwc(x).__array_interface__["data"][0] == x.data_ptr()  # a view, no copy

    def boom(self):
        raise AssertionError("int_repr() copies the activations")

    monkeypatch.setattr(torch.Tensor, "int_repr", boom)
    y = conv(x.contiguous(memory_format=CL))
    assert y.is_quantized and y.is_contiguous(memory_format=CL)


def test_replace_quantized_convs_errors():
    with pytest.raises(TypeError, match="nn.Module"):
        cet.replace_quantized_convs("model")
    with pytest.raises(TypeError, match="algo"):
        cet.replace_quantized_convs(nn.Sequential(), algo=3)


def test_bound_kernel_follows_changes_and_copies(monkeypatch):
    """QConv2d keeps its kernel bound between calls: weights or bias changed in place
    through PyTorch, new tensors, another input quantization and copies all give what a
    freshly built module gives."""
    import pickle

    monkeypatch.setattr(torch.backends.quantized, "engine", "fbgemm")
    q = _fx_quantized(_randomize_bn(Block()), (1, 8, 6, 6), "fbgemm")
    conv = cet.replace_quantized_convs(q).conv1
    assert isinstance(conv, cet.QConv2d)

    def fresh(x):
        m = cet.QConv2d(conv.weight, conv.w_scale, conv.w_zero_point, conv.bias,
                        stride=conv.stride, padding=conv.padding, groups=conv.groups,
                        scale=conv.scale, zero_point=conv.zero_point, relu=conv.relu)
        return m(x).int_repr()

    g = torch.Generator().manual_seed(5)
    x = torch.quantize_per_tensor(torch.rand(1, 8, 6, 6, generator=g), 0.01, 3, torch.quint8)
    x = x.contiguous(memory_format=CL)
    first = conv(x).int_repr()
    assert torch.equal(first, fresh(x))
    with torch.no_grad():
        conv.weight.neg_()
    assert torch.equal(conv(x).int_repr(), fresh(x))
    assert not torch.equal(conv(x).int_repr(), first)
    conv.bias = conv.bias + 3
    assert torch.equal(conv(x).int_repr(), fresh(x))
    x2 = torch.quantize_per_tensor(torch.rand(1, 8, 6, 6, generator=g), 0.02, 7, torch.quint8)
    assert torch.equal(conv(x2.contiguous(memory_format=CL)).int_repr(), fresh(x2))
    for clone in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
        assert torch.equal(clone(x).int_repr(), conv(x).int_repr())


def _relu6_nodes(model: nn.Module) -> int:
    return sum(n.op == "call_module" and isinstance(model.get_submodule(n.target), nn.ReLU6)
               for n in model.graph.nodes)


def test_relu6_after_a_conv_becomes_its_clamp(engine):
    """PyTorch runs each ReLU6 after a quantized conv as a copy and a clamp of its own;
    replace_quantized_convs folds it into the conv's requantized store, bit-exact."""
    q = _fx_quantized(_randomize_bn(Inverted()), (2, 3, 9, 7), engine)
    assert _relu6_nodes(q) == 2
    ours = cet.replace_quantized_convs(copy.deepcopy(q))
    assert _relu6_nodes(ours) == 0
    clamped = [m for m in ours.modules() if isinstance(m, cet.QConv2d) and m.clamps]
    assert len(clamped) == 2 and "clamped" in repr(clamped[0])
    x = torch.randn(2, 3, 9, 7, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(ours(x), q(x))


class _TwoReaders(nn.Module):
    """A conv whose output feeds a ReLU6 and an add: the ReLU6 cannot become its clamp."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.act = nn.ReLU6()

    def forward(self, x):
        y = self.conv(x)
        return self.act(y) + y


def test_a_relu6_beside_other_readers_stays(engine):
    q = _fx_quantized(_TwoReaders(), (1, 4, 6, 6), engine)
    assert _relu6_nodes(q) == 1
    ours = cet.replace_quantized_convs(copy.deepcopy(q))
    assert _relu6_nodes(ours) == 1
    assert not any(isinstance(m, cet.QConv2d) and m.clamps for m in ours.modules())
    x = torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(ours(x), q(x))
