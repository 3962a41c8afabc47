"""Fused against unfused graph engines on ResNet-50 layers, fp32 and int8, one process.

Each layer runs the epilogue ResNet-50 puts after it, as one graph:

- fp32: ``relu(conv(x, w) + bias + residual)`` (a bottleneck's last conv with its
  folded batch-norm bias and the skip connection);
- int8: PyTorch's quantized cuDNN recipe ``requant(relu(conv(x_q, w_q) + bias'))``.

The engines run the same conv algorithm (the heuristic's choice) in interleaved
rounds (fused, partly_fused, unfused, fused, ...; int8 adds kernel_fused, the
epilogue in the int8 kernel's store), threads fixed to ``--threads``; the medians
and the ratios ``unfused / fused``, ``unfused / kernel_fused`` and
``unfused / plan`` are printed (above 1: faster than the unfused chain; ``plan``
is the engine the heuristic picks, what a user of ``g.build()`` gets). Every
engine's output is first checked against the unfused one (bit-exact for int8).

    python bench/bench_graph.py --batch 4 --rounds 7 --layers l1.conv3,l2.conv2
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import convengine as ce
from convengine.bench import suites
from convengine.graph import Candidate, recipes
from convengine.graph import engines as eng
from convengine.graph.plan import random_inputs
from convengine.graph.program import Program

DEFAULT_LAYERS = "l1.conv3,l2.conv2,l3.conv1,l3.conv3,l4.conv2"


def graph_for(layer: suites.Layer, kind: str):
    args = dict(stride=layer.stride, padding=layer.padding, groups=layer.groups,
                layout="NHWC")
    x = (layer.x[0], *layer.x[2:], layer.x[1])
    w = (layer.w[0], *layer.w[2:], layer.w[1])
    if kind == "fp32":
        return recipes.conv_bias_act(x, w, activation="relu", residual=True, **args)[0]
    return recipes.quantized_conv_cudnn(x, w, x_scale=0.02, w_scale=0.004, y_scale=0.3,
                                        **args)[0]


def measure(layer: suites.Layer, kind: str, rounds: int) -> dict[str, float]:
    g = graph_for(layer, kind)
    g.validate()
    prog = Program.from_graph(g)
    plan = g.build()
    algo = plan.candidate.algo
    names = (eng.KERNEL_FUSED, *eng.ENGINES) if kind == "int8" else eng.ENGINES
    built = {e: eng.build(Candidate(e, algo), prog, False, False) for e in names}
    vals = random_inputs(prog)
    if kind == "int8":  # a realistic bias in the accumulator's units
        vals["bias"] = (vals["bias"] * 0.02 * 0.004 * 200).astype(np.float32)
    outs = {e: b.run(vals)[prog.outputs[0]] for e, b in built.items()}  # warm-up + check
    for e, out in outs.items():
        if kind == "int8":
            assert np.array_equal(out, outs["unfused"]), e
        else:
            np.testing.assert_allclose(out, outs["unfused"], rtol=1e-4, atol=1e-4)
    times: dict[str, list[float]] = {e: [] for e in built}
    for _ in range(rounds):
        for e, b in built.items():
            t0 = time.perf_counter()
            b.run(vals)
            times[e].append(time.perf_counter() - t0)
    med = {e: statistics.median(ts) for e, ts in times.items()}
    problem = prog.problems["conv"]
    med["gflops"] = problem.flops / med[plan.candidate.engine] / 1e9
    med["algo"] = algo  # type: ignore[assignment]
    med["plan"] = plan.candidate.engine  # type: ignore[assignment]
    med["tiles"] = len(eng.tiles(problem, ce.get_num_threads()))
    return med


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", default=DEFAULT_LAYERS, help="comma-separated ResNet-50 names")
    p.add_argument("--kinds", default="fp32,int8")
    a = p.parse_args()
    ce.set_num_threads(a.threads)
    wanted = a.layers.split(",")
    layers = [la for la in suites.suite("resnet50", a.batch) if la.name in wanted]
    print(f"{'layer':<12}{'kind':<6}{'algo':<12}{'tiles':>6}{'kernel ms':>10}{'fused ms':>10}"
          f"{'partly ms':>10}{'unfused ms':>11}{'unf/fused':>10}{'unf/kern':>9}"
          f"{'plan':>14}{'unf/plan':>9}{'GOPS':>7}")
    ratios: dict[str, list[float]] = {}
    chosen: dict[str, list[float]] = {}
    for kind in a.kinds.split(","):
        for layer in layers:
            m = measure(layer, kind, a.rounds)
            r1, r3 = m["unfused"] / m["fused"], m["unfused"] / m[m["plan"]]
            kern = m.get(eng.KERNEL_FUSED)
            kern_ms = "-" if kern is None else f"{kern * 1e3:.2f}"
            kern_ratio = "-" if kern is None else f"{m['unfused'] / kern:.2f}"
            ratios.setdefault(kind, []).append(r1)
            chosen.setdefault(kind, []).append(r3)
            print(f"{layer.name:<12}{kind:<6}{m['algo']:<12}{m['tiles']:>6}{kern_ms:>10}"
                  f"{m['fused'] * 1e3:>10.2f}{m['partly_fused'] * 1e3:>10.2f}"
                  f"{m['unfused'] * 1e3:>11.2f}{r1:>10.2f}{kern_ratio:>9}"
                  f"{m['plan']:>14}{r3:>9.2f}{m['gflops']:>7.0f}", flush=True)
    for kind, rs in ratios.items():
        geo = float(np.exp(np.mean(np.log(rs))))
        cg = float(np.exp(np.mean(np.log(chosen[kind]))))
        print(f"{kind}: unfused/fused geomean {geo:.2f} (min {min(rs):.2f}, max {max(rs):.2f});"
              f" unfused/plan geomean {cg:.2f} (min {min(chosen[kind]):.2f})")


if __name__ == "__main__":
    main()
