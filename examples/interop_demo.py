"""Interop demo: a PyTorch CNN on convengine in one line, and an ONNX model run by
convengine.onnx. Needs the torch and onnx extras.

1. Trains the same small CNN twice, with PyTorch's convolutions and after
   ``convengine.torch.replace_convs``; prints both losses per step and the time per
   training step, measured interleaved (A B A B ...), median of the rounds, 2 threads.
2. Runs the ONNX backend's pytorch-converted Conv2d models through
   ``convengine.onnx.run_model`` and prints the largest error against the stored outputs.

Exits non-zero if the losses or the ONNX outputs disagree.

    python examples/interop_demo.py
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests
from torch import nn

import convengine as ce
import convengine.onnx as ceo
import convengine.torch as cet

THREADS = 2


def make_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1, groups=64), nn.ReLU(),
        nn.Conv2d(64, 64, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )


def train_side_by_side(steps: int = 8, batch: int = 16) -> bool:
    torch.manual_seed(0)
    ref = make_cnn().to(memory_format=torch.channels_last)
    ours = cet.replace_convs(copy.deepcopy(ref))
    models = {"pytorch": ref, "convengine": ours}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    g = torch.Generator().manual_seed(1)
    ok = True
    print(f"{'step':>4} {'loss pytorch':>14} {'loss convengine':>16}")
    for step in range(steps):
        x = torch.randn(batch, 3, 32, 32, generator=g).to(memory_format=torch.channels_last)
        label = torch.randint(0, 10, (batch,), generator=g)
        losses = {}
        for key, model in models.items():  # interleaved: A B, A B, ...
            start = time.perf_counter()
            opts[key].zero_grad()
            loss = F.cross_entropy(model(x), label)
            loss.backward()
            opts[key].step()
            times[key].append(time.perf_counter() - start)
            losses[key] = loss.item()
        print(f"{step:>4} {losses['pytorch']:>14.6f} {losses['convengine']:>16.6f}")
        ok &= bool(np.isclose(losses["pytorch"], losses["convengine"], rtol=1e-4))
    # the first step compiles convengine's kernels: leave it out of the medians
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    print(f"median train step: pytorch {med['pytorch'] * 1e3:.1f} ms, convengine "
          f"{med['convengine'] * 1e3:.1f} ms (pytorch / convengine = "
          f"{med['pytorch'] / med['convengine']:.2f})")
    return ok


def onnx_conformance_sample() -> bool:
    ok = True
    for case in load_model_tests(kind="pytorch-converted"):
        if not case.name.startswith("test_Conv2d"):
            continue
        model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
        folder = os.path.join(case.model_dir, "test_data_set_0")
        x = numpy_helper.to_array(onnx.load_tensor(os.path.join(folder, "input_0.pb")))
        y = numpy_helper.to_array(onnx.load_tensor(os.path.join(folder, "output_0.pb")))
        (out,) = ceo.run_model(model, [x])
        err = float(np.abs(out - y).max())
        ok &= bool(np.allclose(out, y, rtol=case.rtol, atol=case.atol))
        print(f"{case.name:<40} max |error| {err:.2e}")
    return ok


def main() -> int:
    torch.set_num_threads(THREADS)
    ce.set_num_threads(THREADS)
    ok = train_side_by_side()
    ok &= onnx_conformance_sample()
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
