"""``FusedConv2d``: an inference conv with its epilogue in one pass.

``y = act(conv(x, w) + b [+ r])`` for float32 NCHW-shaped tensors: the conv runs as
any convengine conv (``auto``: tuned or heuristic algorithm), then one parallel pass
over its channels-last output adds the bias and the residual and applies the
activation in place (:mod:`convengine.fused_epilogue`), where PyTorch eager runs
BatchNorm, the add and the activation as three passes. Weights are held channels-last
once; results come back channels-last (NCHW shape, ``torch.channels_last`` strides).
Built by :func:`convengine.torch.optimize` (BatchNorm folded into ``w`` and ``b``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch  # absolute import: PyTorch, not this package
import torch.nn.functional as F
from torch import nn

from .. import api, fused_epilogue
from ..errors import ConvSetupError
from .convs import from_numpy, to_numpy

__all__ = ["ACTIVATIONS", "FusedConv2d"]

ACTIVATIONS = fused_epilogue.ACTIVATIONS
_TORCH_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda t: t, "relu": torch.relu, "relu6": F.relu6, "silu": F.silu}


class FusedConv2d(nn.Module):
    """``act(conv2d(x, weight) + bias [+ residual])``, inference only.

    weight ``(O, C // groups, kH, kW)`` float32, bias ``(O,)``; ``forward(x)`` or
    ``forward(x, residual)`` with x ``(N, C, H, W)`` and residual of the output's shape
    ``(N, O, OH, OW)``, any memory format; returns ``(N, O, OH, OW)`` channels-last.
    A residual of another shape (broadcast) or dtype is added by PyTorch after the
    conv, with the activation.
    """

    weight: torch.Tensor
    bias: torch.Tensor

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor,
        *,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        activation: str = "none",
        residual: bool = False,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if weight.dim() != 4 or bias.shape != (weight.shape[0],):
            raise ConvSetupError(
                f"weight must be (O, C // groups, kH, kW) and bias (O,), got "
                f"{tuple(weight.shape)} and {tuple(bias.shape)}")
        w = weight.detach().float().contiguous(memory_format=torch.channels_last)
        self.register_buffer("weight", w)
        self.register_buffer("bias", bias.detach().float().contiguous())
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.activation, self.residual = groups, activation, residual

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.dtype != torch.float32:
            raise TypeError(f"input must be a 4-D float32 tensor (N, C, H, W), got "
                            f"{getattr(x, 'dtype', type(x))} of shape "
                            f"{tuple(getattr(x, 'shape', ()))}")
        if (residual is not None) != self.residual:
            raise TypeError(f"this FusedConv2d takes {'a' if self.residual else 'no'} "
                            f"residual operand")
        xv = to_numpy(x, "input").transpose(0, 2, 3, 1)  # NHWC views
        wv = to_numpy(self.weight, "weight").transpose(0, 2, 3, 1)
        y = api.conv(xv, wv, stride=self.stride, padding=self.padding,
                     dilation=self.dilation, groups=self.groups, layout="NHWC")
        bias, rows = to_numpy(self.bias, "bias"), y.reshape(-1, y.shape[-1])  # a view
        out = from_numpy(y).permute(0, 3, 1, 2)
        if residual is None:
            fused_epilogue.apply(rows, bias, None, self.activation)
            return out
        rv = to_numpy(residual, "residual").transpose(0, 2, 3, 1)
        if rv.shape == y.shape and rv.dtype == np.float32:
            fused_epilogue.apply(rows, bias, rv.reshape(rows.shape), self.activation)
            return out
        # broadcasting or type promotion (the trace knew no shapes): PyTorch's own add
        # and activation after the conv, so that the model's semantics stay
        fused_epilogue.apply(rows, bias, None, "none")
        return _TORCH_ACTS[self.activation](out + residual)

    def extra_repr(self) -> str:
        o, c, kh, kw = self.weight.shape
        return (f"{c * self.groups}, {o}, kernel_size=({kh}, {kw}), stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"activation={self.activation!r}, residual={self.residual}")
