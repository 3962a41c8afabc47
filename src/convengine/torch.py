"""PyTorch interop: convengine's convolutions as autograd Functions and ``nn`` modules.

    import convengine.torch as cet
    y = cet.conv(x, w, b, stride=2, padding=1)   # differentiable, like F.conv2d
    cet.replace_convs(model)                      # every nn.Conv* now runs on convengine

CPU tensors only. Tensors reach the engine as numpy views (no copy); results come
back through ``torch.from_numpy`` (no copy). Channels-last tensors
(``torch.channels_last``/``channels_last_3d``) run in NHWC and stay channels-last.
Needs the ``torch`` extra (torch==2.13.0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch  # absolute import: PyTorch, not this module
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from . import api
from .errors import ConvSetupError
from .quant import qconv

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "QConv2d",
    "conv",
    "conv_transpose",
    "from_numpy",
    "replace_convs",
    "to_numpy",
]

# ------------------------------------------------------------------ tensor <-> numpy


def to_numpy(t: torch.Tensor, name: str = "tensor") -> np.ndarray:
    """A numpy view of a CPU tensor, sharing its memory (bfloat16 via ml_dtypes)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(
            f"{name} is on device {t.device}; convengine.torch runs on CPU tensors only "
            f"(move it with .cpu())"
        )
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing the memory of a numpy array (bfloat16 via ml_dtypes)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _channels_last(t: torch.Tensor) -> bool:
    """True when the tensor is channels-last in memory and not also plain contiguous."""
    perm = (0, *range(2, t.dim()), 1)
    return t.permute(perm).is_contiguous() and not t.is_contiguous()


def _view(t: torch.Tensor, layout: str, name: str) -> np.ndarray:
    """numpy view of an NCHW-ordered tensor in ``layout`` (a transposed view for NHWC)."""
    a = to_numpy(t, name)
    return np.moveaxis(a, 1, -1) if layout == "NHWC" else a


def _back(a: np.ndarray, layout: str) -> torch.Tensor:
    """The engine's result in ``layout`` -> tensor with PyTorch's NCHW dim order."""
    t = from_numpy(a)
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1)) if layout == "NHWC" else t


def _like(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Give a gradient the memory format of its parameter (contiguous weights stay so)."""
    return grad.contiguous() if param.is_contiguous() else grad


# ------------------------------------------------------------------ autograd


def _pairs(problem_padding: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    return tuple((int(lo), int(hi)) for lo, hi in problem_padding)


class _ConvFn(torch.autograd.Function):
    """y = conv(x, w) + b; backward runs convengine's backward-data and backward-weight."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        conf: dict[str, Any],
    ) -> torch.Tensor:
        layout = "NHWC" if _channels_last(x) else "NCHW"
        xv, wv = _view(x, layout, "input"), _view(w, layout, "weight")
        problem = api.forward_problem(xv, wv, bias, layout=layout, **_geom(conf))
        conf = {**conf, "padding": _pairs(problem.padding)}
        bv = None if bias is None else to_numpy(bias, "bias")
        y = api.conv(xv, wv, bv, layout=layout, algo=conf["algo"], **_geom(conf))
        ctx.save_for_backward(x, w)
        ctx.conf, ctx.layout = conf, layout  # type: ignore[attr-defined]
        return _back(y, layout)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        conf, layout = ctx.conf, ctx.layout
        geom, algo = _geom(conf), conf["algo"]
        dyv = _view(dy, layout, "grad_output")
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            wv = _view(w, layout, "weight")
            dx = _back(api.conv_backward_data(
                dyv, wv, _view(x, layout, "input").shape, layout=layout, algo=algo, **geom
            ), layout)
        if ctx.needs_input_grad[1]:
            xv = _view(x, layout, "input")
            dw = _like(_back(api.conv_backward_weight(
                xv, dyv, _view(w, layout, "weight").shape, layout=layout, algo=algo, **geom
            ), layout), w)
        if ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, *range(2, dy.dim())))
        return dx, dw, db, None


class _ConvTransposeFn(torch.autograd.Function):
    """y = conv_transpose(x, w) + b: the backward-data pass of the conv F mapping y to x.
    Its gradients: dx = F(dy) (a forward conv), dw = F's backward-weight of (dy, x)."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        conf: dict[str, Any],
        output_padding: Any,
    ) -> torch.Tensor:
        layout = "NHWC" if _channels_last(x) else "NCHW"
        xv, wv = _view(x, layout, "input"), _view(w, layout, "weight")
        problem = api.transpose_problem(
            xv, wv, bias, layout=layout, output_padding=output_padding, **_geom(conf)
        )
        conf = {**conf, "padding": _pairs(problem.padding)}
        bv = None if bias is None else to_numpy(bias, "bias")
        y = api.conv_transpose(xv, wv, bv, output_padding=output_padding, layout=layout,
                               algo=conf["algo"], **_geom(conf))
        ctx.save_for_backward(x, w)
        ctx.conf, ctx.layout = conf, layout  # type: ignore[attr-defined]
        return _back(y, layout)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        conf, layout = ctx.conf, ctx.layout
        geom, algo = _geom(conf), conf["algo"]
        dyv = _view(dy, layout, "grad_output")
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            wv = _view(w, layout, "weight")
            dx = _back(api.conv(dyv, wv, layout=layout, algo=algo, **geom), layout)
        if ctx.needs_input_grad[1]:
            xv = _view(x, layout, "input")
            dw = _like(_back(api.conv_backward_weight(
                dyv, xv, _view(w, layout, "weight").shape, layout=layout, algo=algo, **geom
            ), layout), w)
        if ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, *range(2, dy.dim())))
        return dx, dw, db, None, None


def _geom(conf: dict[str, Any]) -> dict[str, Any]:
    return {k: conf[k] for k in ("stride", "padding", "dilation", "groups")}


def _batched(x: torch.Tensor, w: torch.Tensor) -> bool:
    """PyTorch accepts unbatched input (C, *S); True when x has a batch dim."""
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise TypeError(
            f"input and weight must be torch.Tensors, got {type(x).__name__} and "
            f"{type(w).__name__} (use convengine.conv for numpy arrays)"
        )
    return bool(x.dim() != w.dim() - 1)


# ------------------------------------------------------------------ functional


def conv(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    *,
    algo: str = "auto",
) -> torch.Tensor:
    """``F.conv1d/2d/3d`` on convengine, differentiable in input, weight and bias.

    input ``(N, C, *S)`` or unbatched ``(C, *S)``, weight ``(O, C // groups, *K)``,
    bias ``(O,)``; padding as in PyTorch (int, tuple, "same", "valid") or one
    ``(lo, hi)`` pair per spatial dim.
    """
    batched = _batched(input, weight)
    x = input if batched else input.unsqueeze(0)
    conf = {"stride": stride, "padding": padding, "dilation": dilation,
            "groups": groups, "algo": algo}
    y = _ConvFn.apply(x, weight, bias, conf)
    return y if batched else y.squeeze(0)


def conv_transpose(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
    *,
    algo: str = "auto",
) -> torch.Tensor:
    """``F.conv_transpose1d/2d/3d`` on convengine (same argument order), differentiable.

    input ``(N, C_in, *S)``, weight ``(C_in, C_out // groups, *K)``, bias ``(C_out,)``.
    """
    batched = _batched(input, weight)
    x = input if batched else input.unsqueeze(0)
    conf = {"stride": stride, "padding": padding, "dilation": dilation,
            "groups": groups, "algo": algo}
    y = _ConvTransposeFn.apply(x, weight, bias, conf, output_padding)
    return y if batched else y.squeeze(0)


# ------------------------------------------------------------------ modules


class _AlgoChoice:
    """The modules' extra constructor argument: ``algo`` ("auto" by default), the
    convengine algorithm every call uses; the rest goes to the nn module."""

    algo: str = "auto"  # also for modules converted in place by replace_convs

    def __init__(self, *args: Any, algo: str = "auto", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.algo = algo


class _ConvMixin(_AlgoChoice):
    """``_conv_forward`` of nn.Conv1d/2d/3d, routed to :func:`conv`."""

    def _conv_forward(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        m: Any = self
        padding = m.padding
        if m.padding_mode != "zeros":
            input = F.pad(input, m._reversed_padding_repeated_twice, mode=m.padding_mode)
            padding = 0
        return conv(input, weight, bias, m.stride, padding, m.dilation, m.groups,
                    algo=self.algo)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, algo={self.algo!r}"  # type: ignore[misc]


class Conv1d(_ConvMixin, nn.Conv1d):
    """``nn.Conv1d`` (same constructor and state_dict) computed by convengine;
    ``algo`` picks the algorithm ("auto" by default)."""


class Conv2d(_ConvMixin, nn.Conv2d):
    """``nn.Conv2d`` (same constructor and state_dict) computed by convengine."""


class Conv3d(_ConvMixin, nn.Conv3d):
    """``nn.Conv3d`` (same constructor and state_dict) computed by convengine."""


class _ConvTransposeMixin(_AlgoChoice):
    """``forward`` of nn.ConvTranspose1d/2d/3d, routed to :func:`conv_transpose`."""

    def forward(self, input: torch.Tensor, output_size: Sequence[int] | None = None
                ) -> torch.Tensor:
        m: Any = self
        if m.padding_mode != "zeros":
            raise ValueError(
                f"padding_mode={m.padding_mode!r}: only 'zeros' is supported for "
                f"{type(self).__name__} (as in PyTorch)"
            )
        ndim = len(m.kernel_size)
        output_padding = m._output_padding(
            input, output_size, m.stride, m.padding, m.kernel_size, ndim, m.dilation
        )
        return conv_transpose(input, m.weight, m.bias, m.stride, m.padding,
                              output_padding, m.groups, m.dilation, algo=self.algo)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, algo={self.algo!r}"  # type: ignore[misc]


class ConvTranspose1d(_ConvTransposeMixin, nn.ConvTranspose1d):
    """``nn.ConvTranspose1d`` (same constructor and state_dict) computed by convengine."""


class ConvTranspose2d(_ConvTransposeMixin, nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` (same constructor and state_dict) computed by convengine."""


class ConvTranspose3d(_ConvTransposeMixin, nn.ConvTranspose3d):
    """``nn.ConvTranspose3d`` (same constructor and state_dict) computed by convengine."""


_REPLACEMENTS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Conv1d: Conv1d,
    nn.Conv2d: Conv2d,
    nn.Conv3d: Conv3d,
    nn.ConvTranspose1d: ConvTranspose1d,
    nn.ConvTranspose2d: ConvTranspose2d,
    nn.ConvTranspose3d: ConvTranspose3d,
}


def replace_convs(model: nn.Module, *, algo: str = "auto") -> nn.Module:
    """Swap every ``nn.Conv*``/``nn.ConvTranspose*`` of ``model`` (itself included) for
    its convengine twin, in place, and return ``model``.

    The modules keep their identity, parameters (so optimizers stay valid), hooks and
    state_dict keys; only their class changes. Subclasses of ``nn.Conv*`` (quantized,
    fused, user-defined) are left alone.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(algo, str):
        raise TypeError(f"algo must be a string ('auto' or an algorithm name), got {algo!r}")
    for module in model.modules():
        twin = _REPLACEMENTS.get(type(module))
        if twin is not None:
            module.__class__ = twin
            module.algo = algo  # type: ignore[assignment]
    return model


# ------------------------------------------------------------------ quantized


def _quantized_classes() -> tuple[type[nn.Module], type[nn.Module]]:
    """PyTorch's quantized Conv2d and ConvReLU2d (imported late: a deprecated namespace)."""
    import torch.ao.nn.intrinsic.quantized as nniq
    import torch.ao.nn.quantized as nnq

    return nnq.Conv2d, nniq.ConvReLU2d


class QConv2d(nn.Module):
    """Quantized 2-D convolution on :func:`convengine.qconv`, bit-exact with PyTorch's
    quantized ``Conv2d`` / ``ConvReLU2d`` on its fbgemm and x86 engines (float bias,
    per-tensor or per-channel int8 weights).

    ``forward``: a per-tensor quantized tensor ``(N, C, H, W)`` (quint8 or qint8) ->
    a quantized tensor of the same dtype with this module's ``scale``/``zero_point``.
    Build it with :meth:`from_quantized` or :meth:`from_float`.
    """

    weight: torch.Tensor
    w_scale: torch.Tensor
    w_zero_point: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        w_scale: Any,
        w_zero_point: Any,
        bias: torch.Tensor | None = None,
        *,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        scale: float = 1.0,
        zero_point: int = 0,
        relu: bool = False,
        algo: str = "auto",
    ) -> None:
        super().__init__()
        if weight.dtype not in (torch.int8, torch.uint8) or weight.dim() != 4:
            raise ConvSetupError(
                f"weight must be a 4-D int8 tensor of quantized values (O, C // groups, "
                f"kH, kW), got dtype {weight.dtype} and shape {tuple(weight.shape)}"
            )
        self.register_buffer("weight", weight.detach().clone())
        self.register_buffer("w_scale", torch.as_tensor(w_scale, dtype=torch.float64))
        self.register_buffer("w_zero_point", torch.as_tensor(w_zero_point, dtype=torch.int64))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.scale, self.zero_point = groups, float(scale), int(zero_point)
        self.relu, self.algo = relu, algo

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not isinstance(input, torch.Tensor) or not input.is_quantized:
            raise TypeError(
                "QConv2d takes a quantized tensor (e.g. torch.quantize_per_tensor(x, scale, "
                f"zero_point, torch.quint8)), got {getattr(input, 'dtype', type(input))}"
            )
        if input.qscheme() != torch.per_tensor_affine:
            raise ConvSetupError(f"input must be quantized per tensor, got {input.qscheme()}")
        x = input.int_repr().numpy()  # a quantized tensor exports no buffer: one copy
        bias = None if self.bias is None else self.bias.numpy()
        y = qconv(
            x, input.q_scale(), input.q_zero_point(), self.weight.numpy(),
            self.w_scale.numpy(), self.w_zero_point.numpy(), bias,
            out_scale=self.scale, out_zero_point=self.zero_point, out_dtype=x.dtype,
            relu=self.relu, bias_mode="float", stride=self.stride, padding=self.padding,
            dilation=self.dilation, groups=self.groups, algo=self.algo,
        )
        return torch._make_per_tensor_quantized_tensor(
            torch.from_numpy(y), self.scale, self.zero_point
        )

    def extra_repr(self) -> str:
        return (f"{tuple(self.weight.shape)}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, groups={self.groups}, scale={self.scale}, "
                f"zero_point={self.zero_point}, relu={self.relu}, algo={self.algo!r}")

    @classmethod
    def from_quantized(cls, module: nn.Module, *, algo: str = "auto") -> QConv2d:
        """From PyTorch's quantized ``Conv2d`` or ``ConvReLU2d`` (same weights, bias,
        scales, zero points and geometry)."""
        conv_cls, conv_relu_cls = _quantized_classes()
        if not isinstance(module, conv_cls):
            raise TypeError(f"module must be a torch.ao.nn.quantized.Conv2d or ConvReLU2d, "
                            f"got {type(module).__name__}")
        m: Any = module
        if m.padding_mode != "zeros":
            raise ConvSetupError(f"padding_mode={m.padding_mode!r}: QConv2d supports 'zeros'")
        w = m.weight()
        if w.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            w_scale, w_zp = w.q_scale(), w.q_zero_point()
        elif w.q_per_channel_axis() == 0:
            w_scale, w_zp = w.q_per_channel_scales(), w.q_per_channel_zero_points()
        else:
            raise ConvSetupError(f"per-channel weights must be quantized along axis 0 "
                                 f"(output channels), got axis {w.q_per_channel_axis()}")
        return cls(
            w.int_repr(), w_scale, w_zp, m.bias(), stride=m.stride, padding=m.padding,
            dilation=m.dilation, groups=m.groups, scale=m.scale, zero_point=m.zero_point,
            relu=isinstance(module, conv_relu_cls), algo=algo,
        )

    @classmethod
    def from_float(
        cls,
        module: nn.Module,
        *,
        scale: float | None = None,
        zero_point: int | None = None,
        relu: bool = False,
        per_channel: bool = True,
        algo: str = "auto",
    ) -> QConv2d:
        """From a float ``nn.Conv2d``.

        An observed module (after ``torch.ao.quantization.prepare`` and calibration,
        plain or fused with ReLU) is converted exactly as PyTorch's ``convert`` would
        convert it. Otherwise give the output ``scale`` and ``zero_point``; weights are
        then quantized to int8 by PyTorch's symmetric min/max observer (per output
        channel unless ``per_channel=False``).
        """
        conv_cls, conv_relu_cls = _quantized_classes()
        if hasattr(module, "activation_post_process"):
            fused = not isinstance(module, nn.Conv2d)  # torch.ao.nn.intrinsic.ConvReLU2d
            target: Any = conv_relu_cls if fused else conv_cls
            return cls.from_quantized(target.from_float(module), algo=algo)
        if not isinstance(module, nn.Conv2d):
            raise TypeError(f"module must be an nn.Conv2d, got {type(module).__name__}")
        if scale is None or zero_point is None:
            raise ConvSetupError(
                "from_float on an unobserved nn.Conv2d needs the output scale and "
                "zero_point (or prepare and calibrate it with torch.ao.quantization first)"
            )
        from torch.ao.quantization import MinMaxObserver, PerChannelMinMaxObserver

        observer: Any = (
            PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8,
                                     qscheme=torch.per_channel_symmetric)
            if per_channel
            else MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
        )
        weight = module.weight.detach().float()
        observer(weight)
        w_scale, w_zp = observer.calculate_qparams()
        if per_channel:
            wq = torch.quantize_per_channel(weight, w_scale.double(), w_zp, 0, torch.qint8)
        else:
            wq = torch.quantize_per_tensor(weight, float(w_scale), int(w_zp), torch.qint8)
        q: Any = (conv_relu_cls if relu else conv_cls)(
            module.in_channels, module.out_channels, module.kernel_size, module.stride,
            module.padding, module.dilation, module.groups, module.bias is not None,
            module.padding_mode,
        )
        q.set_weight_bias(wq, None if module.bias is None else module.bias.detach().float())
        q.scale, q.zero_point = float(scale), int(zero_point)
        return cls.from_quantized(q, algo=algo)
