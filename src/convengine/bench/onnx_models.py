"""ResNet-50 and MobileNetV2 (:mod:`convengine.bench.models`, torchvision's architectures
with a width factor for small test models), a net of the other operators exporters
emit, and their ONNX export (both exporters) and ``quantize_static`` versions.
Needs the ``torch`` and ``onnx`` extras (onnxruntime for quantization)."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from convengine.bench import models


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
        torch.onnx.export(model, (x,), buf,  # type: ignore[arg-type]  # a file object
                          dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return buf.getvalue()


def quantize(model_bytes: bytes, shape: tuple[int, ...], *, qdq: bool, per_channel: bool,
             samples: int = 4, seed: int = 0, reduce_range: bool = False) -> bytes:
    """``onnxruntime.quantization.quantize_static`` (uint8 activations, int8 weights;
    7-bit weights with ``reduce_range``)."""
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
                          weight_type=q.QuantType.QInt8, reduce_range=reduce_range)
        with open(dst, "rb") as quantized:
            return quantized.read()


MODELS: dict[str, Callable[[float], nn.Module]] = {
    "resnet50": lambda width: models.resnet50(width=width),
    "mobilenet_v2": lambda width: models.mobilenet_v2(width=width),
}
