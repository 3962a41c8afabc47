"""Float convolutions for PyTorch: autograd Functions, ``nn`` modules, ``replace_convs``.

CUDA tensors (and ``algo="gpu_*"``) go to :mod:`convengine.gpu.autograd`'s Functions.
CPU tensors reach the engine as numpy views (no copy); results come
back through ``torch.from_numpy`` (no copy). 2-D and 3-D convs run channels-last
and return channels-last memory (``torch.channels_last``/``channels_last_3d``), as
PyTorch's channels-last convs do; gradients keep the memory format of what they are
gradients of.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch  # absolute import: PyTorch, not this module
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from .. import api, builders, devices
from ..algorithms.weight_cache import transient

# ------------------------------------------------------------------ tensor <-> numpy


def _device_function(kind: str) -> Any:
    """The autograd Function for device tensors, "conv" or "conv_transpose" (the GPU
    backend: imported on the first device call)."""
    from ..gpu import autograd

    return autograd.ConvFn if kind == "conv" else autograd.ConvTransposeFn


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
        import ml_dtypes  # ~0.6 s to import: only where a bfloat16 tensor arrives

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing the memory of a numpy array (bfloat16 via ml_dtypes)."""
    if a.dtype.name == "bfloat16":  # an ml_dtypes array: ml_dtypes is loaded already
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _channels_last(t: torch.Tensor) -> bool:
    """True when the tensor is channels-last in memory and not also plain contiguous."""
    perm = (0, *range(2, t.dim()), 1)
    return t.permute(perm).is_contiguous() and not t.is_contiguous()


def _layout(x: torch.Tensor) -> str:
    """NHWC for 2-D/3-D convs (their results are channels-last whatever the input's
    memory format); 1-D convs follow the input's memory."""
    return "NHWC" if x.dim() in (4, 5) or _channels_last(x) else "NCHW"


_TO_LAST = {n: (0, *range(2, n), 1) for n in range(3, 6)}  # axis 1 moved last


def _view(t: torch.Tensor, layout: str, name: str) -> np.ndarray:
    """numpy view of an NCHW-ordered tensor in ``layout`` (a transposed view for NHWC)."""
    a = to_numpy(t, name)
    return a.transpose(_TO_LAST[a.ndim]) if layout == "NHWC" else a


def _back(a: np.ndarray, layout: str) -> torch.Tensor:
    """The engine's result in ``layout`` -> tensor with PyTorch's NCHW dim order."""
    t = from_numpy(a)
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1)) if layout == "NHWC" else t


def _like(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Give a gradient the memory format of what it is the gradient of (a contiguous
    input or weight gets a contiguous gradient; channels-last stays channels-last)."""
    return grad.contiguous() if param.is_contiguous() else grad


# ------------------------------------------------------------------ autograd


def _pairs(problem_padding: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    return tuple((int(lo), int(hi)) for lo, hi in problem_padding)


# (id(weight), pass) -> (weak reference to the weight, its version at the last call)
_VERSIONS: dict[tuple[int, str], tuple[weakref.ref, int]] = {}


def _changing(w: torch.Tensor, pass_: str) -> bool:
    """Whether ``w`` changed (its PyTorch version moved) since the last ``pass_`` of a
    conv with it: a training step's parameter. Only a hint to the engine's weight
    caches not to store what they derive from it (``weight_cache.transient``); what
    they compute stays exact either way."""
    key, version = (id(w), pass_), w._version
    last = _VERSIONS.get(key)
    if last is not None and last[0]() is w:
        if last[1] == version:
            return False
        _VERSIONS[key] = (last[0], version)
        return True
    _VERSIONS[key] = (weakref.ref(w, lambda ref: _forget(ref, key)), version)
    return False


def _forget(ref: weakref.ref, key: tuple[int, str]) -> None:
    if _VERSIONS.get(key, (None,))[0] is ref:
        del _VERSIONS[key]


def _conv_forward(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                  conf: dict[str, Any], layout: str) -> torch.Tensor:
    """y = conv(x, w) + b on the engine, without autograd."""
    xv, wv = _view(x, layout, "input"), _view(w, layout, "weight")
    bv = None if bias is None else to_numpy(bias, "bias")
    return _back(api.conv(xv, wv, bv, layout=layout, algo=conf["algo"], **_geom(conf)),
                 layout)


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
        layout = _layout(x)
        ctx.save_for_backward(x, w)
        ctx.conf, ctx.layout = conf, layout  # type: ignore[attr-defined]
        with transient(_changing(w, "forward")):
            return _conv_forward(x, w, bias, conf, layout)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        layout, conf = ctx.layout, ctx.conf
        if isinstance(conf["padding"], str):
            # "same" / "valid" as (lo, hi) pairs, resolved against the forward input
            # here rather than on every forward call (inference never needs it); numeric
            # padding is passed on as it is (building the problem again cost ~17 us a
            # conv, 0.9 ms of a MobileNetV2 training step)
            problem = builders.forward_problem(_view(x, layout, "input"),
                                          _view(w, layout, "weight"), None, layout=layout,
                                          **_geom(conf))
            conf = {**conf, "padding": _pairs(problem.padding)}
        return (*_grads(ctx, dy, conf, transposed=False), None)


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
        layout = _layout(x)
        xv, wv = _view(x, layout, "input"), _view(w, layout, "weight")
        problem = builders.transpose_problem(
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
        return (*_grads(ctx, dy, ctx.conf, transposed=True), None, None)


def _grads(ctx: Any, dy: torch.Tensor, conf: dict[str, Any],
           transposed: bool) -> tuple[Any, Any, Any]:
    """(dx, dw, db) as ``ctx`` needs them (``conf`` with its padding numeric). A conv F:
    dx the backward-data pass of (dy, w), dw the backward-weight pass of (x, dy). A
    transposed conv is the backward-data pass of the conv F mapping y to x: dx = F(dy),
    dw = F's backward-weight of (dy, x). db: the sum of dy over all but its channel dim."""
    x, w = ctx.saved_tensors
    layout = ctx.layout
    args = {"layout": layout, "algo": conf["algo"], **_geom(conf)}
    dyv = _view(dy, layout, "grad_output")
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        wv = _view(w, layout, "weight")
        if transposed:
            dxv = api.conv(dyv, wv, **args)
        else:
            with transient(_changing(w, "backward")):
                dxv = api.conv_backward_data(dyv, wv, _view(x, layout, "input").shape, **args)
        dx = _like(_back(dxv, layout), x)
    if ctx.needs_input_grad[1]:
        xv = _view(x, layout, "input")
        a, b = (dyv, xv) if transposed else (xv, dyv)
        dw = _like(_back(api.conv_backward_weight(
            a, b, _view(w, layout, "weight").shape, **args), layout), w)
    if ctx.needs_input_grad[2]:
        db = dy.sum(dim=(0, *range(2, dy.dim())))
    return dx, dw, db


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
    if devices.wanted(algo, x, weight):  # CUDA: Triton
        y = _device_function("conv").apply(x, weight, bias, conf)
    elif _differentiable(x, weight, bias):
        y = _ConvFn.apply(x, weight, bias, conf)
    else:  # inference: no autograd Function to build (some 10 us a call)
        y = _conv_forward(x, weight, bias, conf, _layout(x))
    return y if batched else y.squeeze(0)


def _differentiable(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records this call: gradients on and some operand requires one."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


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
    fn = (_device_function("conv_transpose") if devices.wanted(algo, x, weight)
          else _ConvTransposeFn)
    y = fn.apply(x, weight, bias, conf, output_padding)
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
    fused, user-defined) are left alone. The 2-D and 3-D weights are made
    channels-last in memory (same values and shape, as ``model.to(memory_format=
    torch.channels_last)`` would make them): the channels-last kernels then read them
    in place, where an NCHW weight would be copied on every call.
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
            _weight_channels_last(module)
    return model


def _weight_channels_last(module: nn.Module) -> None:
    """Give a conv module's 4-D/5-D weight channels-last memory, in place."""
    weight = getattr(module, "weight", None)
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    if isinstance(weight, torch.Tensor) and weight.dim() in formats:
        with torch.no_grad():
            weight.data = weight.data.contiguous(memory_format=formats[weight.dim()])
