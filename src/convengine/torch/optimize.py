"""``optimize(model)``: an inference copy of a float model with its convs fused.

Every ``nn.Conv2d`` (float32, zero padding) becomes a :class:`FusedConv2d` that also
does what follows it, when only it uses the values in between:

    conv -> [BatchNorm2d] -> [+ residual] -> [ReLU | ReLU6 | SiLU]

BatchNorm (running statistics) is folded into the conv's weight and bias; the residual
add (ResNet's ``out += identity``, MobileNetV2's ``x + conv(x)``) and the activation run
in the conv's epilogue. The pattern is found on the ``torch.fx`` trace; a model that
does not trace gets the same fusion inside its ``nn.Sequential`` containers (conv, BN,
activation in a row). Other convs go through :func:`replace_convs`.
"""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch  # absolute import: PyTorch, not this package
import torch.nn.functional as F
from torch import fx, nn

from .convs import replace_convs
from .fused import FusedConv2d

__all__ = ["fold_batchnorm", "optimize"]

_ADDS = (operator.add, operator.iadd, torch.add)
_ACT_MODULES: dict[type[nn.Module], str] = {nn.ReLU: "relu", nn.ReLU6: "relu6",
                                            nn.SiLU: "silu"}
_ACT_FUNCTIONS: dict[Any, str] = {F.relu: "relu", torch.relu: "relu", F.relu6: "relu6",
                                  F.silu: "silu"}


def optimize(model: nn.Module) -> nn.Module:
    """A fused inference copy of ``model`` (in eval mode); ``model`` is left unchanged.

    Returns a ``torch.fx.GraphModule`` when the model traces, else a copy of the model.
    Results equal the model's to float32 rounding; outputs of fused convs are
    channels-last.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if any(m.training for m in model.modules()):
        raise ValueError("optimize(model) is for inference: it folds BatchNorm's running "
                         "statistics, so the model must be in eval mode (call model.eval())")
    model = copy.deepcopy(model)
    try:
        gm = fx.symbolic_trace(model)
    except Exception:  # data-dependent control flow, untraceable calls, ...
        _fuse_sequentials(model)
        return replace_convs(model)
    _fuse_graph(gm)
    return replace_convs(gm)


def fold_batchnorm(conv: nn.Conv2d, bn: nn.BatchNorm2d | None) -> tuple[torch.Tensor,
                                                                        torch.Tensor]:
    """(weight, bias) of ``bn(conv(x))`` as one conv, computed in float64, float32 out."""
    w = conv.weight.detach().double()
    b = (torch.zeros(w.shape[0], dtype=torch.float64) if conv.bias is None
         else conv.bias.detach().double())
    if bn is not None:
        assert bn.running_mean is not None and bn.running_var is not None
        scale = torch.rsqrt(bn.running_var.double() + bn.eps)
        if bn.weight is not None:
            scale = scale * bn.weight.detach().double()
        w = w * scale.reshape(-1, 1, 1, 1)
        b = (b - bn.running_mean.double()) * scale
        if bn.bias is not None:
            b = b + bn.bias.detach().double()
    return w.float(), b.float()


def _fusable_conv(m: Any) -> bool:
    return (type(m) is nn.Conv2d and m.padding_mode == "zeros"
            and m.weight.dtype == torch.float32)


def _foldable_bn(m: Any, channels: int) -> bool:
    return (type(m) is nn.BatchNorm2d and m.track_running_stats
            and m.running_mean is not None and m.num_features == channels)


def _make(conv: nn.Conv2d, bn: nn.BatchNorm2d | None, activation: str,
          residual: bool) -> FusedConv2d:
    w, b = fold_batchnorm(conv, bn)
    return FusedConv2d(w, b, stride=conv.stride, padding=conv.padding,
                       dilation=conv.dilation, groups=conv.groups,
                       activation=activation, residual=residual)


# ---------------------------------------------------------------- on the fx graph


def _module(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    if node.op != "call_module":
        return None
    return gm.get_submodule(str(node.target))


def _activation(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """The fusable activation ``node`` computes, or None."""
    m = _module(gm, node)
    if m is not None:
        if type(m) is nn.Hardtanh and (m.min_val, m.max_val) == (0.0, 6.0):
            return "relu6"
        return _ACT_MODULES.get(type(m))
    if node.op == "call_function" and len(node.args) == 1:
        return _ACT_FUNCTIONS.get(node.target)
    return None


def _residual(node: fx.Node, cur: fx.Node) -> fx.Node | None:
    """The other operand when ``node`` is ``cur + other`` (either order), else None."""
    if node.op != "call_function" or node.target not in _ADDS or node.kwargs:
        return None
    if len(node.args) != 2:
        return None
    a, b = node.args
    other = b if a is cur else a if b is cur else None
    return other if isinstance(other, fx.Node) and other is not cur else None


def _sole_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _fuse_graph(gm: fx.GraphModule) -> None:
    """Replace each fusable conv chain of the trace by one FusedConv2d call."""
    graph = gm.graph
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[str(node.target)] = calls.get(str(node.target), 0) + 1
    for node in list(graph.nodes):
        conv = _module(gm, node)
        if (not _fusable_conv(conv) or calls[str(node.target)] != 1
                or len(node.args) != 1 or node.kwargs):
            continue
        assert isinstance(conv, nn.Conv2d)
        chain, bn, residual, activation = [node], None, None, "none"
        nxt = _sole_user(node)
        if nxt is not None and _foldable_bn(_module(gm, nxt), conv.out_channels) \
                and calls[str(nxt.target)] == 1:
            bn = _module(gm, nxt)
            chain.append(nxt)
            nxt = _sole_user(nxt)
        if nxt is not None and (other := _residual(nxt, chain[-1])) is not None:
            residual = other
            chain.append(nxt)
            nxt = _sole_user(nxt)
        if nxt is not None and (act := _activation(gm, nxt)) is not None:
            activation = act
            chain.append(nxt)
        fused = _make(conv, bn, activation, residual is not None)  # type: ignore[arg-type]
        gm.add_submodule(str(node.target), fused)  # the conv's name, now fused
        args = (node.args[0],) if residual is None else (node.args[0], residual)
        with graph.inserting_before(chain[-1]):
            new = graph.call_module(str(node.target), args)
        chain[-1].replace_all_uses_with(new)
        for done in reversed(chain):
            graph.erase_node(done)
    graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()


# ---------------------------------------------------------------- without a trace


def _fuse_sequentials(model: nn.Module) -> None:
    """Inside every ``nn.Sequential``: conv, [BN], [activation] in a row -> one
    FusedConv2d followed by ``nn.Identity`` placeholders (indices are kept)."""
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        names = list(seq._modules)
        i = 0
        while i < len(names):
            conv = seq._modules[names[i]]
            if not _fusable_conv(conv):
                i += 1
                continue
            assert isinstance(conv, nn.Conv2d)
            j, bn, activation = i + 1, None, "none"
            if j < len(names) and _foldable_bn(seq._modules[names[j]], conv.out_channels):
                bn = seq._modules[names[j]]
                j += 1
            if j < len(names):
                act = seq._modules[names[j]]
                activation = _ACT_MODULES.get(type(act), "none")
                j += activation != "none"
            seq._modules[names[i]] = _make(conv, bn, activation, False)  # type: ignore[arg-type]
            for k in range(i + 1, j):
                seq._modules[names[k]] = nn.Identity()
            i = j
