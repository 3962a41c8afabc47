"""Layer-shape suites from real networks, for benchmarks and pre-tuning.

Each suite is a list of :class:`Layer`: the distinct convolutions of one network,
with shapes as PyTorch writes them (``layout="NCHW"``: x ``(N, C, *S)``, w
``(O, C // groups, *K)``) and ``count``, how many times the network runs that
layer. ``suite(name, batch=...)`` returns them at a chosen batch size.

- ``resnet50``: torchvision ResNet-50 (v1.5, stride on the 3x3) at 224x224.
- ``mobilenet_v2``: torchvision MobileNetV2 (width 1.0) at 224x224; depthwise layers
  have ``groups == C``.
- ``unet3d``: a 3-D U-Net (Cicek et al. 2016: two 3x3x3 convs per level, c -> w/2 -> w,
  widths 32..256, half the paper's) on a 32^3 single-channel volume; the 2x2x2
  up-convolutions (transposed) are left out, the decoder convs take the concatenated
  skip channels.
- ``conv1d``: the wav2vec 2.0 feature encoder on 1 s of 16 kHz audio, a Conformer
  convolution module (pointwise + depthwise k=31) and a dilated WaveNet-style layer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import ConvSetupError
from ..problem import ConvProblem, make_problem


@dataclass(frozen=True)
class Layer:
    """One convolution layer of a network, forward shapes in ``layout``."""

    name: str
    x: tuple[int, ...]
    w: tuple[int, ...]
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] = 0
    groups: int = 1
    dilation: int | tuple[int, ...] = 1
    layout: str = "NCHW"
    count: int = 1

    def conv_args(self) -> dict[str, Any]:
        """Keyword arguments for ``convengine.conv`` (and ``torch.nn.functional.convNd``
        except ``layout``)."""
        return {
            "stride": self.stride,
            "padding": self.padding,
            "dilation": self.dilation,
            "groups": self.groups,
            "layout": self.layout,
        }

    def problem(
        self, pass_: str = "forward", dtype: str = "float32", layout: str | None = None
    ) -> ConvProblem:
        """The :class:`ConvProblem` of this layer for one pass (optionally re-laid out)."""
        problem = make_problem(
            pass_, self.x, self.w, dtype=dtype, stride=self.stride,
            padding=self.padding, dilation=self.dilation, groups=self.groups,
            layout=self.layout,
        )
        return problem if layout is None else dataclasses.replace(problem, layout=layout)

    def with_batch(self, batch: int) -> Layer:
        return dataclasses.replace(self, x=(batch, *self.x[1:]))


def _c(name: str, c: int, o: int, size: int, k: int, stride: int = 1,
       groups: int = 1, count: int = 1, ndim: int = 2) -> Layer:
    """A square conv: c -> o channels on a size^ndim input, k^ndim kernel, 'same'-style
    padding k // 2."""
    return Layer(
        name, (1, c, *(size,) * ndim), (o, c // groups, *(k,) * ndim),
        stride=stride, padding=k // 2, groups=groups, count=count,
    )


def _resnet50() -> list[Layer]:
    """conv1, then four stages of bottleneck blocks (1x1 c -> width, 3x3 width ->
    width carrying the stage's stride, 1x1 width -> 4 * width, a strided 1x1 c ->
    4 * width downsample on the first block); the blocks after the first repeat one
    shape each, counted."""
    layers = [_c("conv1", 3, 64, 224, 7, stride=2)]
    c, size = 64, 56
    # (width, blocks n, stride s) per stage, as in the paper's table 1
    stages = [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]
    for stage, (width, n, s) in enumerate(stages, start=1):
        out, pre = width * 4, f"l{stage}."
        layers.append(_c(pre + "conv1_first", c, width, size, 1))
        if s == 1:  # the first block's 3x3 is the shape of the others'
            layers.append(_c(pre + "conv2", width, width, size, 3, count=n))
        else:
            layers.append(_c(pre + "conv2_s2", width, width, size, 3, stride=s))
        layers.append(_c(pre + "conv3", width, out, size // s, 1, count=n))
        layers.append(_c(pre + "downsample", c, out, size, 1, stride=s))
        layers.append(_c(pre + "conv1", out, width, size // s, 1, count=n - 1))
        if s != 1:
            layers.append(_c(pre + "conv2", width, width, size // s, 3, count=n - 1))
        c, size = out, size // s
    return layers


RESNET50 = _resnet50()


def _mbv2() -> list[Layer]:
    layers = [_c("conv_stem", 3, 32, 224, 3, stride=2),
              _c("b0.dw", 32, 32, 112, 3, groups=32),
              _c("b0.project", 32, 16, 112, 1)]
    # (expansion t, out channels, repeats n, first stride s), as in the paper's table 2
    settings = [(6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]
    c, size = 16, 112
    for stage, (t, o, n, s) in enumerate(settings, start=1):
        e = c * t
        layers.append(_c(f"s{stage}.expand_first", c, e, size, 1))
        layers.append(_c(f"s{stage}.dw_first", e, e, size, 3, stride=s, groups=e))
        size //= s
        layers.append(_c(f"s{stage}.project_first", e, o, size, 1))
        if n > 1:
            e = o * t
            layers.append(_c(f"s{stage}.expand", o, e, size, 1, count=n - 1))
            layers.append(_c(f"s{stage}.dw", e, e, size, 3, groups=e, count=n - 1))
            layers.append(_c(f"s{stage}.project", e, o, size, 1, count=n - 1))
        c = o
    layers.append(_c("conv_head", 320, 1280, 7, 1))
    return layers


MOBILENET_V2 = _mbv2()


def _unet3d() -> list[Layer]:
    layers, c, size = [], 1, 32
    widths = [32, 64, 128, 256]
    for level, w in enumerate(widths):  # encoder: c -> w // 2 -> w
        layers.append(_c(f"enc{level}.conv1", c, w // 2, size, 3, ndim=3))
        layers.append(_c(f"enc{level}.conv2", w // 2, w, size, 3, ndim=3))
        c = w
        if level < len(widths) - 1:
            size //= 2
    for level in range(len(widths) - 2, -1, -1):  # decoder: concat(up, skip) -> w -> w
        size *= 2
        w = widths[level]
        layers.append(_c(f"dec{level}.conv1", c + w, w, size, 3, ndim=3))
        layers.append(_c(f"dec{level}.conv2", w, w, size, 3, ndim=3))
        c = w
    layers.append(_c("head", c, 3, size, 1, ndim=3))
    return layers


UNET3D = _unet3d()

CONV1D = [
    Layer("w2v.conv0", (1, 1, 16000), (512, 1, 10), stride=5),
    Layer("w2v.conv1", (1, 512, 3199), (512, 512, 3), stride=2),
    Layer("w2v.conv2", (1, 512, 1599), (512, 512, 3), stride=2),
    Layer("w2v.conv3", (1, 512, 799), (512, 512, 3), stride=2),
    Layer("w2v.conv4", (1, 512, 399), (512, 512, 3), stride=2),
    Layer("w2v.conv5", (1, 512, 199), (512, 512, 2), stride=2),
    Layer("w2v.conv6", (1, 512, 99), (512, 512, 2), stride=2),
    Layer("conformer.pw1", (1, 256, 250), (512, 256, 1)),
    Layer("conformer.dw", (1, 256, 250), (256, 1, 31), padding=15, groups=256),
    Layer("conformer.pw2", (1, 256, 250), (256, 256, 1)),
    Layer("wavenet.dilated", (1, 64, 4096), (128, 64, 2), dilation=8, padding=4),
]

SUITES: dict[str, list[Layer]] = {
    "resnet50": RESNET50,
    "mobilenet_v2": MOBILENET_V2,
    "unet3d": UNET3D,
    "conv1d": CONV1D,
}
# Batch sizes suites are run at unless told otherwise: large enough to be a
# realistic throughput job, small enough for a 2-core benchmark.
DEFAULT_BATCH = {"resnet50": 4, "mobilenet_v2": 4, "unet3d": 1, "conv1d": 1}


def suite_names() -> list[str]:
    return list(SUITES)


def suite(name: str, batch: int | None = None) -> list[Layer]:
    """The layers of suite ``name`` at ``batch`` (default: ``DEFAULT_BATCH[name]``).

    ``name="all"`` concatenates every suite, each at its own default batch unless
    ``batch`` is given; layer names are then prefixed with the suite name.
    """
    if name == "all":
        return [
            dataclasses.replace(layer, name=f"{n}/{layer.name}")
            for n in SUITES
            for layer in suite(n, batch)
        ]
    if name not in SUITES:
        raise ConvSetupError(f"unknown suite {name!r}; expected 'all' or one of {suite_names()}")
    if batch is not None and (isinstance(batch, bool) or int(batch) < 1):
        raise ConvSetupError(f"batch must be an int >= 1, got {batch!r}")
    n = DEFAULT_BATCH[name] if batch is None else int(batch)
    return [layer.with_batch(n) for layer in SUITES[name]]
