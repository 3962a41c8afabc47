"""convengine.torch's channels-last results and ``optimize`` (BatchNorm folded, residual
add and activation fused) against PyTorch's unfused model run in float64."""

from __future__ import annotations

import copy
import io

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import convengine.torch as cet  # noqa: E402

CL = torch.channels_last


def _bench_models():
    from convengine.bench import models

    return models


def _randomize_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """BatchNorm statistics and affine parameters away from identity (else folding
    would be a no-op the test could not see)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=g) - 0.5)
    return model.eval()


def _check(model: nn.Module, x: torch.Tensor, fused_convs: int) -> nn.Module:
    """optimize(model) agrees with the float64 unfused model to float32 rounding."""
    opt = cet.optimize(model)
    assert sum(isinstance(m, cet.FusedConv2d) for m in opt.modules()) == fused_convs
    assert not any(isinstance(m, nn.BatchNorm2d) for m in opt.modules())
    with torch.no_grad():
        want = model.double()(x.double())
        model.float()
        got = opt(x)
    assert got.dtype == torch.float32 and got.shape == want.shape
    err = (got.double() - want).abs().max().item()
    assert err <= 1e-5 * max(1.0, want.abs().max().item()), f"max error {err:.3g}"
    return opt


# ---------------------------------------------------------------- memory format


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_results_channels_last_gradients_keep_their_format(fmt):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 7, 6, generator=g).contiguous(memory_format=fmt).requires_grad_()
    w = torch.randn(6, 2, 3, 3, generator=g).contiguous(memory_format=fmt).requires_grad_()
    b = torch.randn(6, generator=g, requires_grad=True)
    y = cet.conv(x, w, b, stride=1, padding=1, groups=2)
    assert y.is_contiguous(memory_format=CL) and not y.is_contiguous()
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    want = F.conv2d(xd, wd, bd, padding=1, groups=2)
    assert torch.allclose(y.double(), want, rtol=1e-5, atol=1e-5)
    dy = torch.randn(want.shape, generator=g, dtype=torch.float64)
    (y * dy.float()).sum().backward()
    (want * dy).sum().backward()
    assert x.grad.is_contiguous(memory_format=fmt)
    assert w.grad.is_contiguous(memory_format=fmt)
    for got, ref in ((x.grad, xd.grad), (w.grad, wd.grad), (b.grad, bd.grad)):
        assert torch.allclose(got.double(), ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_and_3d_results_channels_last():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 4, 5, 5, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=g)
    y = cet.conv_transpose(x, w, stride=2, padding=1)
    assert y.is_contiguous(memory_format=CL)
    assert torch.allclose(y, F.conv_transpose2d(x, w, stride=2, padding=1), atol=1e-5)
    y.sum().backward()
    assert x.grad.is_contiguous()
    x3 = torch.randn(1, 2, 4, 4, 4, generator=g)
    w3 = torch.randn(3, 2, 2, 2, 2, generator=g)
    y3 = cet.conv(x3, w3)
    assert y3.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.allclose(y3, F.conv3d(x3, w3), atol=1e-5)


# ---------------------------------------------------------------- optimize


class Block(nn.Module):
    """A small ResNet Bottleneck: 1x1 -> 3x3 (stride) -> 1x1, downsample, out += identity."""

    def __init__(self, c: int = 8, mid: int = 4, out: int = 16, stride: int = 2) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = nn.Sequential(nn.Conv2d(c, out, 1, stride=stride, bias=False),
                                        nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += self.downsample(identity)
        return self.relu(out)


class Inverted(nn.Module):
    """MobileNetV2's inverted residual (ReLU6, depthwise) with ``x + conv(x)``; a conv
    with a bias, no BatchNorm, and functional SiLU in front."""

    def __init__(self, c: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.conv = nn.Sequential(
            nn.Conv2d(c, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        x = F.silu(self.stem(x))
        return x + self.conv(x)


def test_optimize_resnet_bottleneck_matches_pytorch():
    model = _randomize_bn(Block())
    x = torch.randn(2, 8, 8, 8, generator=torch.Generator().manual_seed(3))
    opt = _check(model, x, fused_convs=4)
    fused = {m.activation: m.residual for m in opt.modules() if isinstance(m, cet.FusedConv2d)
             if m.residual}
    assert fused == {"relu": True}  # conv3 + bn3 + add + relu is one conv
    y = opt(x)
    assert y.is_contiguous(memory_format=CL)
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # model untouched
    buf = io.BytesIO()
    torch.save(opt, buf)  # plans (compiled code) are left behind, rebuilt on use
    buf.seek(0)
    assert torch.equal(torch.load(buf, weights_only=False)(x), y)
    assert torch.equal(copy.deepcopy(opt)(x), y)


def test_optimize_inverted_residual_matches_pytorch():
    model = _randomize_bn(Inverted(), seed=4)
    x = torch.randn(1, 3, 9, 7, generator=torch.Generator().manual_seed(5))
    opt = _check(model, x, fused_convs=4)
    acts = sorted(m.activation for m in opt.modules() if isinstance(m, cet.FusedConv2d))
    assert acts == ["none", "relu6", "relu6", "silu"]


class Shifted(nn.Module):
    """conv -> bn -> + a broadcast (1, C, 1, 1) parameter -> relu: the add matches the
    residual pattern but only PyTorch's broadcasting add can do it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.shift = nn.Parameter(torch.randn(1, 4, 1, 1, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)) + self.shift)


def test_optimize_broadcast_residual_keeps_pytorch_semantics():
    model = _randomize_bn(Shifted(), seed=10)
    x = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(11))
    opt = _check(model, x, fused_convs=1)
    assert [m.residual for m in opt.modules() if isinstance(m, cet.FusedConv2d)] == [True]


class Untraceable(nn.Module):
    """Data-dependent control flow: fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6),
                                  nn.SiLU(), nn.Conv2d(6, 4, 1), nn.ReLU())

    def forward(self, x):
        y = self.body(x)
        return y if float(y.sum()) > 0 else -y


def test_optimize_falls_back_to_sequential_folding():
    model = _randomize_bn(Untraceable(), seed=6)
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(7))
    opt = _check(model, x, fused_convs=2)
    assert not isinstance(opt, torch.fx.GraphModule)


def test_optimize_refuses_training_mode_and_non_modules():
    with pytest.raises(ValueError, match="eval"):
        cet.optimize(Block().train())
    with pytest.raises(TypeError, match="nn.Module"):
        cet.optimize(lambda x: x)


@pytest.mark.parametrize("name,width", [("resnet50", 1 / 16), ("mobilenet_v2", 0.25)])
def test_optimize_bench_models_match_pytorch(name, width):
    model = _randomize_bn(getattr(_bench_models(), name)(num_classes=10, width=width))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    _check(model, x, fused_convs=convs)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


def test_replace_convs_network_trains_channels_last():
    """A tiny ResNet-50 in training mode: NCHW input, every conv after the first gets
    channels-last input; output and gradients agree with PyTorch run in float64 as
    closely as PyTorch's own float32 run does (within 5x; BatchNorm over few values
    amplifies float32 rounding)."""
    torch.manual_seed(0)
    model = _bench_models().resnet50(num_classes=5, width=1 / 16)
    ref, f32 = copy.deepcopy(model).double(), copy.deepcopy(model)
    cet.replace_convs(model)
    seen = []
    for m in model.modules():
        if isinstance(m, cet.Conv2d):
            m.register_forward_hook(
                lambda mod, args, out: seen.append(args[0].is_contiguous(memory_format=CL)))
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 3, 64, 64, generator=g)
    dy = torch.randn(4, 5, generator=g, dtype=torch.float64)
    runs = []
    for net, dtype in ((model, torch.float32), (f32, torch.float32), (ref, torch.float64)):
        xi = x.detach().to(dtype).requires_grad_()
        y = net(xi)
        (y * dy.to(dtype)).sum().backward()
        runs.append((y, xi.grad, [p.grad for p in net.parameters()]))
    assert seen.count(False) == 1 and len(seen) == 53
    (y, dx, grads), (yt, dxt, gradst), (yd, dxd, gradsd) = runs
    assert dx.is_contiguous()
    assert _rel(y, yd) <= 5 * max(_rel(yt, yd), 1e-6)
    assert _rel(dx, dxd) <= 5 * max(_rel(dxt, dxd), 1e-6)
    worst = max(_rel(a, r) for a, r in zip(grads, gradsd, strict=True))
    assert worst <= 5 * max(max(_rel(a, r) for a, r in zip(gradst, gradsd, strict=True)), 1e-6)
