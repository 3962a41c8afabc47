"""``convengine.torch``'s autograd Functions for device tensors: the same arguments
as its CPU Functions (``apply(x, w, bias, conf[, output_padding])``, NCHW tensors),
every pass on the GPU kernels, results and gradients on the device."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

from .. import builders
from . import dispatch


def _geom(conf: dict[str, Any]) -> dict[str, Any]:
    return {k: conf[k] for k in ("stride", "padding", "dilation", "groups")}


def _pairs(padding: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    return tuple((int(lo), int(hi)) for lo, hi in padding)


def _save(ctx: Any, x: torch.Tensor, w: torch.Tensor, conf: dict[str, Any],
          padding: tuple[tuple[int, int], ...]) -> dict[str, Any]:
    """Keep x, w and ``conf`` with its padding resolved ("same" once) for backward."""
    conf = {**conf, "padding": _pairs(padding)}
    ctx.save_for_backward(x, w)
    ctx.conf = conf
    return conf


def _grads(ctx: Any, dy: torch.Tensor, transposed: bool) -> tuple[Any, Any, Any]:
    """(dx, dw, db) as ``ctx`` needs them. A conv F: dx the backward-data pass of (dy, w),
    dw the backward-weight pass of (x, dy). A transposed conv is the backward-data
    pass of the conv F mapping y to x: dx = F(dy), dw = F's backward-weight of (dy, x).
    db: the sum of dy over all but its channel dim."""
    x, w = ctx.saved_tensors
    args = {"algo": ctx.conf["algo"], **_geom(ctx.conf)}
    dx = dw = db = None
    if ctx.needs_input_grad[0] and transposed:
        dx = dispatch.conv(dy, w, **args)
        if tuple(dx.shape) != tuple(x.shape):  # output_padding below the dilation
            dx = dx[tuple(slice(0, n) for n in x.shape)]
    elif ctx.needs_input_grad[0]:
        dx = dispatch.conv_backward_data(dy, w, x.shape, **args)
    if ctx.needs_input_grad[1]:
        a, b = (dy, x) if transposed else (x, dy)
        dw = dispatch.conv_backward_weight(a, b, w.shape, **args)
    if ctx.needs_input_grad[2]:
        db = dy.sum(dim=(0, *range(2, dy.dim())))
    return dx, dw, db


class ConvFn(torch.autograd.Function):
    """y = conv(x, w) + b on the GPU; backward: the GPU backward-data and backward-weight."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, w: torch.Tensor,
                bias: torch.Tensor | None, conf: dict[str, Any]) -> torch.Tensor:
        problem = builders.forward_problem(dispatch.meta(x), dispatch.meta(w), bias, **_geom(conf))
        conf = _save(ctx, x, w, conf, problem.padding)
        return dispatch.conv(x, w, bias, algo=conf["algo"], **_geom(conf))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        return (*_grads(ctx, dy, transposed=False), None)


class ConvTransposeFn(torch.autograd.Function):
    """y = conv_transpose(x, w) + b on the GPU: the backward-data pass of the conv F
    mapping y to x (see :func:`_grads`)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, w: torch.Tensor,
                bias: torch.Tensor | None, conf: dict[str, Any],
                output_padding: Any) -> torch.Tensor:
        problem = builders.transpose_problem(dispatch.meta(x), dispatch.meta(w), bias,
                                             output_padding=output_padding, **_geom(conf))
        conf = _save(ctx, x, w, conf, problem.padding)
        return dispatch.conv_transpose(x, w, bias, output_padding=output_padding,
                                       algo=conf["algo"], **_geom(conf))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        return (*_grads(ctx, dy, transposed=True), None, None)
