"""One ResNet-50 training step (96x96, batch 2, BatchNorm frozen) in float64, eager
float32 and through ``replace_convs``: the first conv's weight gradient against
float64, and every ReLU call whose inputs change sign against float64's. Lab script.

    python flips.py SEED
"""

from __future__ import annotations

import copy
import sys

import torch

import convengine as ce
import convengine.torch as cet
from convengine.bench import models


def network(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = models.resnet50(width=1.0)
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
    net.train()
    for m in net.modules():
        if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.Dropout)):
            m.eval()
    return net


def step(net: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the first conv's weight gradient, the input of every ReLU call in order)."""
    inputs: list[torch.Tensor] = []
    for m in net.modules():
        if isinstance(m, torch.nn.ReLU):
            m.register_forward_pre_hook(lambda _m, a: inputs.append(a[0].detach().double().clone()))
    net.zero_grad(set_to_none=True)
    net(x.to(next(iter(net.parameters())).dtype)).square().mean().backward()
    return next(iter(net.parameters())).grad.detach().double(), inputs


def main() -> None:
    seed = int(sys.argv[1])
    ce.set_num_threads(2)
    net = network(seed)
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(seed))
    ours = cet.replace_convs(copy.deepcopy(net))  # copies made before any hook
    exact = step(copy.deepcopy(net).double(), x)
    for name, n in (("eager", net), ("convengine", ours)):
        grad, inputs = step(n, x)
        rel = float((grad - exact[0]).abs().max() / exact[0].abs().max())
        flips = []
        for i, (a, b) in enumerate(zip(inputs, exact[1], strict=True)):
            flipped = (a > 0) != (b > 0)
            if flipped.any():
                flips.append(f"call {i}: {int(flipped.sum())} at {float(b[flipped].abs().max()):.1e}"
                             f" (max {float(b.abs().max()):.1e})")
        print(f"seed {seed} {name}: conv1 grad rel {rel:.1e}; sign flips: {flips or 'none'}")


if __name__ == "__main__":
    main()
