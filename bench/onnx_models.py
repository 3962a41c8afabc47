"""torchvision's ResNet-50 and MobileNetV2 architectures, written out (the torchvision
wheel does not load with the CPU torch here), with a width factor for small test
models, and their ONNX export (both exporters) and ``quantize_static`` versions.
Needs the ``torch`` and ``onnx`` extras (onnxruntime for quantization)."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import torch
from torch import nn


def _make_divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """torchvision.models.resnet50; ``width`` scales every channel count (1.0: the
    original)."""

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        base = max(int(64 * width), 4)
        self.inplanes = base
        self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(base, 3, 1)
        self.layer2 = self._layer(base * 2, 4, 2)
        self.layer3 = self._layer(base * 4, 6, 2)
        self.layer4 = self._layer(base * 8, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(base * 8 * 4, num_classes)

    def _layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        down = None
        if stride != 1 or self.inplanes != planes * 4:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False),
                                 nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, down)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _conv_bn_relu6(inp: int, oup: int, kernel: int = 3, stride: int = 1,
                   groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inp, oup, kernel, stride, (kernel - 1) // 2, groups=groups,
                                   bias=False),
                         nn.BatchNorm2d(oup), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand))
        self.use_res = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_relu6(inp, hidden, 1))
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, hidden),
                   nn.Conv2d(hidden, oup, 1, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision.models.mobilenet_v2 with ``width_mult``."""

    def __init__(self, width_mult: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        settings = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                    [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]
        inp = _make_divisible(32 * width_mult)
        last = _make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [_conv_bn_relu6(3, inp, stride=2)]
        for t, c, n, s in settings:
            out = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(inp, out, s if i == 0 else 1, t))
                inp = out
        features.append(_conv_bn_relu6(inp, last, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class OpZoo(nn.Module):
    """A small net with the other operators exporters emit for MobileNetV3,
    EfficientNet and U-Net: HardSwish, depthwise conv + SiLU, squeeze-excitation
    (ReduceMean, HardSigmoid, Mul), MaxPool, LeakyReLU, ConvTranspose, Concat, nearest
    and bilinear Resize, AveragePool, Sigmoid, Gemm, Softmax; two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False),
                                nn.BatchNorm2d(16), nn.SiLU())
        self.se1, self.se2 = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                                  nn.LeakyReLU(0.1))
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.head = nn.Sequential(nn.AvgPool2d(2), nn.Conv2d(32, 8, 1), nn.Sigmoid())
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.dw(self.stem(x))
        scale = self.se2(torch.relu(self.se1(x.mean((2, 3), keepdim=True))))
        x = x * nn.functional.hardsigmoid(scale)
        d = self.down(x)
        u = nn.functional.interpolate(torch.cat([self.up(d), x], 1), scale_factor=2,
                                      mode="nearest")
        probs = torch.softmax(self.fc(self.head(u).mean((2, 3))), -1)
        return probs, nn.functional.interpolate(d, scale_factor=2, mode="bilinear")


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` in eval mode with random BatchNorm statistics (so folding matters)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.eval()


def export(model: nn.Module, shape: tuple[int, ...], *, dynamo: bool,
           opset: int = 20) -> bytes:
    """The ONNX bytes of ``model`` for an input of ``shape`` (batch dim dynamic)."""
    x = torch.randn(*shape)
    buf = io.BytesIO()
    with torch.no_grad():
        if dynamo:
            program = torch.onnx.export(model, (x,), dynamo=True, opset_version=opset,
                                        input_names=["input"], output_names=["logits"],
                                        dynamic_shapes=({0: torch.export.Dim("batch")},))
            assert program is not None
            return program.model_proto.SerializeToString()
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return buf.getvalue()


def quantize(model_bytes: bytes, shape: tuple[int, ...], *, qdq: bool, per_channel: bool,
             samples: int = 4, seed: int = 0) -> bytes:
    """``onnxruntime.quantization.quantize_static`` (uint8 activations, int8 weights)."""
    import os
    import tempfile

    from onnxruntime import quantization as q

    rng = np.random.default_rng(seed)
    data = iter([{"input": rng.standard_normal(shape).astype(np.float32)}
                 for _ in range(samples)])

    class Reader(q.CalibrationDataReader):
        def get_next(self) -> dict | None:
            return next(data, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "f.onnx"), os.path.join(tmp, "q.onnx")
        with open(src, "wb") as f:
            f.write(model_bytes)
        q.quantize_static(src, dst, Reader(),
                          quant_format=q.QuantFormat.QDQ if qdq else q.QuantFormat.QOperator,
                          per_channel=per_channel, activation_type=q.QuantType.QUInt8,
                          weight_type=q.QuantType.QInt8)
        with open(dst, "rb") as f:
            return f.read()


MODELS: dict[str, Callable[[float], nn.Module]] = {
    "resnet50": lambda width: ResNet50(width),
    "mobilenet_v2": lambda width: MobileNetV2(width),
}
