"""``FusedConv2d``: an inference conv with its epilogue, on the graph API's plans.

``y = act(conv(x, w) + b [+ r])`` for float32 NCHW-shaped tensors; the graph engine
applies the bias, the residual add and the activation to each output tile of the conv
(``fused``) or in one pass over its output (``partly_fused``), whichever the plan's
heuristic picks. Weights are held channels-last once; results come back channels-last
(NCHW shape, ``torch.channels_last`` strides). Built by :func:`convengine.torch.optimize`
(BatchNorm folded into ``w`` and ``b``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch  # absolute import: PyTorch, not this package
import torch.nn.functional as F
from torch import nn

from ..errors import ConvSetupError
from ..graph import Graph, Plan
from ..problem import make_problem
from .convs import from_numpy, to_numpy

__all__ = ["ACTIVATIONS", "FusedConv2d"]

ACTIVATIONS = ("none", "relu", "relu6", "silu")
ALIGNMENT = 4  # torch views (slices) need not be more aligned than a float32
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
        self._plans: dict[tuple[tuple[int, ...], bool], Plan] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the plans behind (they hold compiled code)."""
        state = super().__getstate__()
        return {**state, "_plans": {}}

    def _plan(self, x_shape: tuple[int, ...], epilogue: bool = True) -> Plan:
        """The cached plan for an NHWC input of ``x_shape``: conv + bias, and with
        ``epilogue`` the residual add and the activation."""
        plan = self._plans.get((x_shape, epilogue))
        if plan is None:
            g = Graph(io_dtype="float32", compute_dtype="float32", layout="NHWC")
            o, c, kh, kw = self.weight.shape
            x = g.tensor("x", x_shape, alignment=ALIGNMENT)
            w = g.tensor("w", (o, kh, kw, c), alignment=ALIGNMENT)
            v = g.conv_fprop(x, w, stride=self.stride, padding=self.padding,
                             dilation=self.dilation, groups=self.groups, name="conv")
            v = g.bias(v, g.tensor("b", (o,), alignment=ALIGNMENT), name="bias")
            if self.residual and epilogue:
                y_shape = make_problem(
                    "forward", x_shape, (o, kh, kw, c), dtype="float32", stride=self.stride,
                    padding=self.padding, dilation=self.dilation, groups=self.groups,
                    layout="NHWC").y_shape("NHWC")
                v = g.add(v, g.tensor("r", y_shape, alignment=ALIGNMENT), name="residual")
            if self.activation == "relu" and epilogue:
                v = g.relu(v, name="act")
            elif self.activation == "relu6" and epilogue:
                v = g.clamp(v, 0.0, 6.0, name="act")
            elif self.activation == "silu" and epilogue:
                v = g.silu(v, name="act")
            v.set_output()
            plan = self._plans[(x_shape, epilogue)] = g.build()
        return plan

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.dtype != torch.float32:
            raise TypeError(f"input must be a 4-D float32 tensor (N, C, H, W), got "
                            f"{getattr(x, 'dtype', type(x))} of shape "
                            f"{tuple(getattr(x, 'shape', ()))}")
        if (residual is not None) != self.residual:
            raise TypeError(f"this FusedConv2d takes {'a' if self.residual else 'no'} "
                            f"residual operand")
        xv = to_numpy(x, "input").transpose(0, 2, 3, 1)  # NHWC view
        plan = self._plan(xv.shape)
        if residual is None:
            return self._run(plan, xv)
        rv = to_numpy(residual, "residual").transpose(0, 2, 3, 1)
        if rv.shape == plan.program.tensors["r"].shape and rv.dtype == np.float32:
            return self._run(plan, xv, rv)
        # broadcasting or type promotion (the trace knew no shapes): PyTorch's own add
        # and activation after the conv, so that the model's semantics stay
        y = self._run(self._plan(xv.shape, epilogue=False), xv) + residual
        return _TORCH_ACTS[self.activation](y)

    def _run(self, plan: Plan, xv: np.ndarray, rv: np.ndarray | None = None) -> torch.Tensor:
        """Execute ``plan`` on NHWC views -> (N, O, OH, OW) channels-last."""
        bindings = {"x": xv, "w": to_numpy(self.weight, "weight").transpose(0, 2, 3, 1),
                    "b": to_numpy(self.bias, "bias")}
        if rv is not None:
            bindings["r"] = rv
        y = plan.execute(bindings)[plan.program.outputs[0]]
        return from_numpy(y).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        o, c, kh, kw = self.weight.shape
        return (f"{c * self.groups}, {o}, kernel_size=({kh}, {kw}), stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"activation={self.activation!r}, residual={self.residual}")
