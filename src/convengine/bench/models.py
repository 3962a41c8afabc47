"""torchvision's ResNet-50 and MobileNetV2, written out in plain torch.

The torchvision wheel does not load with the CPU torch here, so the two architectures
are copied (same modules, same order, same state_dict keys as torchvision 0.2x):

    from convengine.bench.models import resnet50, mobilenet_v2   # needs the torch extra
    net = resnet50().eval()          # input (N, 3, 224, 224) -> logits (N, 1000)

``width`` scales every channel count (``width=1/8`` builds a tiny net for tests);
weights are initialised as torchvision initialises them; parameter counts match
torchvision (25,557,032 and 3,504,872 at width 1). :func:`randomized` gives a model
random BatchNorm statistics, so that folding them matters in a benchmark.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["Bottleneck", "InvertedResidual", "MobileNetV2", "ResNet", "mobilenet_v2",
           "randomized", "resnet50"]


def _scaled(channels: int, width: float) -> int:
    return max(1, int(round(channels * width)))


# ------------------------------------------------------------------ ResNet-50


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride) -> 1x1 (x4 channels), BN after each, ``out += identity``."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet with Bottleneck blocks: (N, 3, H, W) -> (N, num_classes)."""

    def __init__(self, layers: tuple[int, int, int, int], num_classes: int = 1000,
                 width: float = 1.0) -> None:
        super().__init__()
        self.inplanes = _scaled(64, width)
        self.conv1 = nn.Conv2d(3, self.inplanes, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(_scaled(64, width), layers[0])
        self.layer2 = self._make_layer(_scaled(128, width), layers[1], stride=2)
        self.layer3 = self._make_layer(_scaled(256, width), layers[2], stride=2)
        self.layer4 = self._make_layer(_scaled(512, width), layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(_scaled(512, width) * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride=stride,
                          bias=False),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes: int = 1000, width: float = 1.0) -> ResNet:
    """torchvision's ``resnet50()`` (53 convs, 25.6 M parameters at width 1)."""
    return ResNet((3, 4, 6, 3), num_classes=num_classes, width=width)


# ------------------------------------------------------------------ MobileNetV2


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class ConvBNActivation(nn.Sequential):
    """Conv (no bias) -> BatchNorm -> ReLU6, as torchvision's Conv2dNormActivation."""

    def __init__(self, inp: int, oup: int, kernel_size: int = 3, stride: int = 1,
                 groups: int = 1,
                 activation: Callable[..., nn.Module] | None = nn.ReLU6) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(inp, oup, kernel_size, stride, (kernel_size - 1) // 2,
                      groups=groups, bias=False),
            nn.BatchNorm2d(oup),
        ]
        if activation is not None:
            layers.append(activation(inplace=True))
        super().__init__(*layers)


class InvertedResidual(nn.Module):
    """1x1 expand -> 3x3 depthwise (stride) -> 1x1 project, ``x + conv(x)`` when shapes
    allow."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNActivation(inp, hidden, kernel_size=1))
        layers += [
            ConvBNActivation(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, oup, 1, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2: (N, 3, H, W) -> (N, num_classes)."""

    def __init__(self, num_classes: int = 1000, width: float = 1.0,
                 dropout: float = 0.2) -> None:
        super().__init__()
        settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
        input_channel = _make_divisible(32 * width)
        self.last_channel = _make_divisible(1280 * max(1.0, width))
        features: list[nn.Module] = [ConvBNActivation(3, input_channel, stride=2)]
        for t, c, n, s in settings:
            output_channel = _make_divisible(c * width)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel,
                                                 s if i == 0 else 1, t))
                input_channel = output_channel
        features.append(ConvBNActivation(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout),
                                        nn.Linear(self.last_channel, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes: int = 1000, width: float = 1.0) -> MobileNetV2:
    """torchvision's ``mobilenet_v2()`` (52 convs, 3.5 M parameters at width 1)."""
    return MobileNetV2(num_classes=num_classes, width=width)


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """``model`` in eval mode with random BatchNorm statistics (so folding matters)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.eval()
