"""Quantized convolutions for PyTorch: ``QConv2d`` on convengine's int8 kernels, and
``replace_quantized_convs`` for FX-/eager-quantized models.

No per-call copies: quantized activations are read through uint8/int8 views of their
memory (a uint8/int8 tensor set on their storage, not ``int_repr()``), weights are held
channels-last so the kernels' prepacked form stays valid, and results are written
straight into a channels-last quantized tensor. Only a conv whose input is not
channels-last (the network's first) converts it. In an FX-quantized model, a ReLU6 /
Hardtanh / ReLU module that alone reads a conv's output becomes that conv's clamp
(PyTorch runs it as a separate copy and clamp: MobileNetV2 has 35).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch  # absolute import: PyTorch, not this package
from torch import nn

from ..errors import ConvSetupError
from ..quant import cpu
from ..quant.layout import nhwc_copy
from ..quant.plan import bind, cached_plan

__all__ = ["QConv2d", "replace_quantized_convs"]

_INT_VIEWS = {torch.quint8: torch.uint8, torch.qint8: torch.int8}

def _quantized_classes() -> tuple[type[nn.Module], type[nn.Module]]:
    """PyTorch's quantized Conv2d and ConvReLU2d (imported late: a deprecated namespace)."""
    import torch.ao.nn.intrinsic.quantized as nniq
    import torch.ao.nn.quantized as nnq

    return nnq.Conv2d, nniq.ConvReLU2d


class QConv2d(nn.Module):
    """Quantized 2-D convolution on :func:`convengine.qconv`'s kernels, bit-exact with PyTorch's
    quantized ``Conv2d`` / ``ConvReLU2d`` on its fbgemm and x86 engines (float bias,
    per-tensor or per-channel int8 weights).

    ``forward``: a per-tensor quantized tensor ``(N, C, H, W)`` (quint8 or qint8) ->
    a quantized tensor of the same dtype with this module's ``scale``/``zero_point``,
    channels-last in memory. Build it with :meth:`from_quantized` or :meth:`from_float`.
    ``clamps`` ({output dtype: (lo, hi)}, set when a following ReLU6 is fused): the
    output's 8-bit values are clamped to ``[lo, hi]`` after the requantization.
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
        # channels-last memory: its (O, kH, kW, C // g) numpy view is C-contiguous
        self.register_buffer(
            "weight", weight.detach().clone().contiguous(memory_format=torch.channels_last))
        self.register_buffer("w_scale", torch.as_tensor(w_scale, dtype=torch.float64))
        self.register_buffer("w_zero_point", torch.as_tensor(w_zero_point, dtype=torch.int64))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.scale, self.zero_point = groups, float(scale), int(zero_point)
        self.relu, self.algo = relu, algo
        # set by replace_quantized_convs for a fused ReLU6 / Hardtanh: output dtype ->
        # the (lo, hi) its 8-bit values are clamped to after the requantization
        self.clamps: dict[torch.dtype, tuple[int, int]] | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not isinstance(input, torch.Tensor) or not input.is_quantized:
            raise TypeError(
                "QConv2d takes a quantized tensor (e.g. torch.quantize_per_tensor(x, scale, "
                f"zero_point, torch.quint8)), got {getattr(input, 'dtype', type(input))}"
            )
        if input.qscheme() != torch.per_tensor_affine:
            raise ConvSetupError(f"input must be quantized per tensor, got {input.qscheme()}")
        if input.dtype not in _INT_VIEWS or input.dim() != 4:
            raise ConvSetupError(f"input must be a 4-D quint8 or qint8 tensor (N, C, H, W), "
                                 f"got {input.dtype} of shape {tuple(input.shape)}")
        launch, shape = self._bound(input)
        out = torch._empty_affine_quantized(
            shape, scale=self.scale, zero_point=self.zero_point, dtype=input.dtype,
            memory_format=torch.channels_last)
        launch(input, out)
        return out

    def _bound(self, input: torch.Tensor) -> tuple[Any, tuple[int, ...]]:
        """The kernel launcher for this input's shape and quantization,
        ``launch(input, out)`` (``out`` channels-last), and the output's NCHW shape.
        Bound once (:func:`convengine.quant.plan.bind`) and kept while the module's tensors
        are the same objects at the same versions (PyTorch counts in-place changes) and
        its other attributes are unchanged."""
        buffers = self._buffers  # (faster than four Module.__getattr__ calls)
        clamp = None if self.clamps is None else self.clamps[input.dtype]
        tensors = (buffers["weight"], buffers["w_scale"], buffers["w_zero_point"],
                   buffers["bias"])
        key = (input.shape, input.dtype, input.q_scale(), input.q_zero_point(),
               cpu.int8_path(), self.algo, self.scale, self.zero_point, self.relu, clamp,
               self.stride, self.padding, self.dilation, self.groups,
               *(id(t) for t in tensors), *(-1 if t is None else t._version for t in tensors))
        bound = self.__dict__.get("_launcher")
        if bound is not None and bound[0] == key:
            return bound[2], bound[3]
        x, w = _nhwc(input), _nhwc(self.weight)
        bias = None if self.bias is None else self.bias.numpy()
        plan = cached_plan((
            x.shape, x.dtype, w.shape, w.dtype, input.q_scale(), input.q_zero_point(),
            self.w_scale.numpy(), self.w_zero_point.numpy(), bias, self.scale,
            self.zero_point, x.dtype, self.relu, "float", self.stride, self.padding,
            self.dilation, self.groups, "NHWC", self.algo))
        if clamp is not None:  # one clamp: the saturation's, then [lo, hi]
            rq = plan.requant
            plan = dataclasses.replace(plan, requant=dataclasses.replace(
                rq, lo=max(rq.lo, clamp[0]), hi=min(rq.hi, clamp[1])))
        kernel = bind(plan, w, x.dtype)
        n, *size, o = plan.problem.y_shape("NHWC")
        rows = n * math.prod(size)
        typestr = x.dtype.str

        def launch(inp: torch.Tensor, out: torch.Tensor) -> None:
            if rows * o == 0:
                return
            nb, c, h, wd = inp.shape
            sn, sc, sh, sw = inp.stride()
            xv = _view(inp, (nb, 1, h, wd, c), (sn, 0, sh, sw, sc), typestr)
            if not xv.flags.c_contiguous:  # an input that is not channels-last
                xv = nhwc_copy(xv[:, 0]).reshape(nb, 1, h, wd, c)
            kernel(xv, _view(out, (rows, o), (o, 1), typestr))

        # the tensors are held, so that their ids stay theirs while the entry lives
        self.__dict__["_launcher"] = (key, tensors, launch, (n, o, *size))
        return launch, (n, o, *size)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_launcher", None)  # a closure: bound again after unpickling or copying
        return state

    def extra_repr(self) -> str:
        return (f"{tuple(self.weight.shape)}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, groups={self.groups}, scale={self.scale}, "
                f"zero_point={self.zero_point}, relu={self.relu}, "
                f"{'' if self.clamps is None else 'clamped (a fused ReLU6), '}algo={self.algo!r}")

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


def _nhwc(t: torch.Tensor) -> np.ndarray:
    """A (N, H, W, C) numpy view of an NCHW-shaped quantized or int8 tensor (its 8-bit
    values, no copy; C-contiguous when ``t`` is channels-last)."""
    if t.is_quantized:  # (Tensor.view(torch.uint8) keeps the quantized flag: unusable)
        n, c, h, w = t.shape
        sn, sc, sh, sw = t.stride()
        return _view(t, (n, h, w, c), (sn, sh, sw, sc),
                     "|u1" if t.dtype == torch.quint8 else "|i1")
    return t.permute(0, 2, 3, 1).numpy()


def _view(t: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...],
          typestr: str) -> np.ndarray:
    """A numpy view of the 8-bit values of quantized ``t`` with the given shape and
    strides (in elements = bytes), through ``__array_interface__``: about 1 us, a third
    of going through a uint8 tensor set on the same storage."""
    if not t.numel():
        return np.empty(shape, typestr)
    return np.asarray(_Values(t, shape, strides, typestr))


class _Values:
    """The ``__array_interface__`` of :func:`_view`; the array keeps this object, and
    through it the tensor, alive."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...],
                 typestr: str) -> None:
        self.tensor = t
        self.__array_interface__ = {"shape": shape, "strides": strides, "typestr": typestr,
                                    "data": (t.data_ptr(), False), "version": 3}


def replace_quantized_convs(model: nn.Module, *, algo: str = "auto") -> nn.Module:
    """Swap every PyTorch quantized ``Conv2d`` / ``ConvReLU2d`` inside ``model`` (an
    FX- or eager-quantized model, fbgemm or x86 engine) for :meth:`QConv2d.from_quantized`,
    in place, and return ``model`` (or the QConv2d, when ``model`` is such a conv).

    Quantized convs QConv2d cannot serve (non-zero padding modes) are left as they are.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(algo, str):
        raise TypeError(f"algo must be a string ('auto' or an int8 algorithm), got {algo!r}")
    conv_cls, conv_relu_cls = _quantized_classes()
    kinds = (conv_cls, conv_relu_cls)
    if type(model) in kinds and model.padding_mode == "zeros":
        return QConv2d.from_quantized(model, algo=algo)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in kinds and child.padding_mode == "zeros":
                setattr(parent, name, QConv2d.from_quantized(child, algo=algo))
    if isinstance(model, torch.fx.GraphModule):
        _fuse_clamps(model)
    return model


_CLAMPS = (nn.ReLU, nn.ReLU6, nn.Hardtanh)


def _fuse_clamps(model: torch.fx.GraphModule) -> None:
    """Each ReLU / ReLU6 / Hardtanh module of the graph that alone reads a QConv2d's
    output becomes that conv's ``clamps`` (the module's node is removed). The bounds are
    read off the module itself, applied to every 8-bit value at the conv's output
    scale and zero point, and the fusion is made only where that is a clamp."""
    changed = False
    for node in list(model.graph.nodes):
        act = model.get_submodule(str(node.target)) if node.op == "call_module" else None
        if not isinstance(act, _CLAMPS):
            continue
        conv_node = node.args[0] if len(node.args) == 1 and not node.kwargs else None
        if not isinstance(conv_node, torch.fx.Node) or conv_node.op != "call_module" \
                or len(conv_node.users) != 1:
            continue
        conv = model.get_submodule(str(conv_node.target))
        if not isinstance(conv, QConv2d) or conv.clamps is not None:
            continue
        clamps = _as_clamps(act, conv)
        if clamps is None:
            continue
        conv.clamps = clamps
        node.replace_all_uses_with(conv_node)
        model.graph.erase_node(node)
        changed = True
    if changed:
        model.graph.lint()
        model.recompile()


def _as_clamps(module: nn.Module, conv: QConv2d
               ) -> dict[torch.dtype, tuple[int, int]] | None:
    """For each 8-bit quantized dtype, ``(lo, hi)`` where ``module`` applied to a tensor
    of that dtype at the conv's output scale and zero point clamps every 8-bit value
    to ``[lo, hi]`` (and keeps the scale and zero point); None where it does not."""
    clamps = {}
    for qdtype, int_dtype in _INT_VIEWS.items():
        info = torch.iinfo(int_dtype)
        values = torch.arange(info.min, info.max + 1, dtype=torch.int64)
        probe = torch._make_per_tensor_quantized_tensor(
            values.to(int_dtype).reshape(1, -1, 1, 1), conv.scale, conv.zero_point)
        with torch.no_grad():
            out = module(probe.clone())  # (inplace modules write into the clone)
        if (not isinstance(out, torch.Tensor) or not out.is_quantized or out.dtype != qdtype
                or out.q_scale() != conv.scale or out.q_zero_point() != conv.zero_point):
            return None
        got = out.int_repr().reshape(-1).to(torch.int64)
        lo, hi = int(got.min()), int(got.max())
        if not torch.equal(got, values.clamp(lo, hi)):
            return None
        clamps[qdtype] = (lo, hi)
    return clamps
