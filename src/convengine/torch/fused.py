"""``FusedConv2d``: an inference conv with its epilogue in one pass.

``y = act(conv(x, w) + b [+ r])`` for float32 NCHW-shaped tensors: the conv runs on
the heuristic's algorithm, and its epilogue (bias, residual, activation) runs in the
kernel's store (``blocked``) or in one parallel pass over its channels-last output
(:mod:`convengine.fused_epilogue`), where PyTorch eager runs BatchNorm, the add and
the activation as three passes. Results come back
channels-last (NCHW shape, ``torch.channels_last`` strides). Built by
:func:`convengine.torch.optimize` (BatchNorm folded into ``w`` and ``b``).

The weights are prepared once (:class:`convengine.prepared.PreparedConv`: packed for
the algorithm, no comparison of them on every call), as PyTorch's own prepacked
inference modules do, and prepared again when ``weight`` is replaced or changed in
place through PyTorch (its version counter moves); a change written behind PyTorch's
back (through ``.data`` or a numpy view) is not seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch  # absolute import: PyTorch, not this package
import torch.nn.functional as F
from torch import nn

from .. import fused_epilogue
from ..errors import ConvSetupError
from ..prepared import PreparedConv
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
        self._prepared_for: tuple[int, ...] | None = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.dtype != torch.float32:
            raise TypeError(f"input must be a 4-D float32 tensor (N, C, H, W), got "
                            f"{getattr(x, 'dtype', type(x))} of shape "
                            f"{tuple(getattr(x, 'shape', ()))}")
        if (residual is not None) != self.residual:
            raise TypeError(f"this FusedConv2d takes {'a' if self.residual else 'no'} "
                            f"residual operand")
        conv = self._prepared()
        xv = to_numpy(x, "input").transpose(0, 2, 3, 1)  # an NHWC view
        if residual is None:
            return from_numpy(conv(xv)).permute(0, 3, 1, 2)
        rv = to_numpy(residual, "residual").transpose(0, 2, 3, 1)
        if rv.shape == conv.out_shape(xv) and rv.dtype == np.float32:
            return from_numpy(conv(xv, np.ascontiguousarray(rv))).permute(0, 3, 1, 2)
        # broadcasting or type promotion (the trace knew no shapes): PyTorch's own add
        # and activation after the conv, so that the model's semantics stay
        out = from_numpy(conv(xv, activation="none")).permute(0, 3, 1, 2)
        return _TORCH_ACTS[self.activation](out + residual)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled and deep-copied without the prepared conv (made again on first use)."""
        state = dict(super().__getstate__())
        for key in ("_conv", "_weight_ref"):
            state.pop(key, None)
        state["_prepared_for"] = None
        return state

    def _prepared(self) -> PreparedConv:
        """The prepared conv of the current weight and bias (made again when either
        changed)."""
        w, b = self.weight, self.bias
        stamp = (id(w), w._version, w.data_ptr(), id(b), b._version, b.data_ptr())
        if self._prepared_for != stamp:
            wv = np.ascontiguousarray(to_numpy(w, "weight").transpose(0, 2, 3, 1))
            self._conv = PreparedConv(wv, bias=to_numpy(b, "bias"),
                                      activation=self.activation, stride=self.stride,
                                      padding=self.padding, dilation=self.dilation,
                                      groups=self.groups, layout="NHWC")
            # w and b kept: their ids stay their own
            self._prepared_for, self._weight_ref = stamp, (w, b)
        return self._conv

    def extra_repr(self) -> str:
        o, c, kh, kw = self.weight.shape
        return (f"{c * self.groups}, {o}, kernel_size=({kh}, {kw}), stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"activation={self.activation!r}, residual={self.residual}")
