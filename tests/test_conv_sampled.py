"""Every registered algorithm, every pass, against the float64 reference, over a
seeded sample of rank x stride x padding x dilation x groups x layout x dtype."""

from __future__ import annotations

import itertools
import random as pyrandom
from dataclasses import dataclass

import numpy as np
import pytest

import convengine as ce
from convengine import registry
from oracle import TOLERANCE, assert_close, random, reference

PADDINGS = ("zero", "one", "asym", "same", "same_lower", "valid")
GROUPINGS = ("dense", "grouped", "depthwise")


@dataclass(frozen=True)
class Case:
    ndim: int
    stride: str
    padding: str
    dilation: int
    grouping: str
    layout: str
    dtype: str
    seed: int

    @property
    def id(self) -> str:
        return (
            f"{self.ndim}d-s{self.stride}-p{self.padding}-d{self.dilation}-"
            f"{self.grouping}-{self.layout}-{self.dtype}"
        )

    def build(self):
        """(x, w, conv kwargs) for this case, shapes drawn from the case's seed."""
        rng = np.random.default_rng(self.seed)
        kernel = tuple(int(k) for k in rng.integers(1, 4, self.ndim))
        stride = {"1": (1,) * self.ndim, "2": (2,) * self.ndim,
                  "mixed": tuple(int(s) for s in rng.integers(1, 4, self.ndim))}[self.stride]
        dilation = (self.dilation,) * self.ndim
        extent = [self.dilation * (k - 1) + 1 for k in kernel]
        top = {1: 12, 2: 8, 3: 5}[self.ndim]
        size = tuple(int(rng.integers(e, max(e, top) + 1)) for e in extent)
        padding = {
            "zero": 0, "one": 1, "same": "same", "same_lower": "same_lower", "valid": "valid",
            "asym": tuple((int(lo), int(hi)) for lo, hi in rng.integers(0, 3, (self.ndim, 2))),
        }[self.padding]
        groups = {"dense": 1, "grouped": 2, "depthwise": 3}[self.grouping]
        cpg = 1 if self.grouping == "depthwise" else int(rng.integers(1, 4))
        opg = int(rng.integers(1, 3)) if self.grouping == "depthwise" else int(rng.integers(1, 4))
        c, o, n = groups * cpg, groups * opg, int(rng.integers(1, 3))
        x_shape = (n, c, *size) if self.layout == "NCHW" else (n, *size, c)
        w_shape = (o, cpg, *kernel) if self.layout == "NCHW" else (o, *kernel, cpg)
        kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=self.layout)
        return random(rng, x_shape, self.dtype), random(rng, w_shape, self.dtype), kw


def _sample(count: int) -> list[Case]:
    space = list(itertools.product(
        (1, 2, 3), ("1", "2", "mixed"), PADDINGS, (1, 2), GROUPINGS, ("NCHW", "NHWC"),
        ("float32", "float64", "float16", "bfloat16"),
    ))
    picked = pyrandom.Random(20261129).sample(space, count)
    return [Case(*values, seed=i) for i, values in enumerate(picked)]


CASES = _sample(72)


def _tolerance_dtype(dtype: str, algo_name: str, pass_: str) -> str:
    return dtype if registry.get(algo_name, pass_).exact else f"{dtype}-inexact"


TOLERANCE.update({f"{k}-inexact": v for k, v in
                  {"float64": 1e-9, "float32": 5e-3, "float16": 5e-3, "bfloat16": 2e-2}.items()})


def _run(pass_, algo, x, w, kw, y_shape):
    """(result, float64 reference) of one pass for one algorithm."""
    rng = np.random.default_rng(1)
    if pass_ == "forward":
        bias = rng.standard_normal(w.shape[0]).astype(x.dtype)
        return ce.conv(x, w, bias, algo=algo, **kw), reference("forward", x, w, bias, **kw)
    dy = random(rng, y_shape, np.dtype(x.dtype).name)
    if pass_ == "backward_data":
        return (ce.conv_backward_data(dy, w, x.shape, algo=algo, **kw),
                reference("backward_data", dy, w, x.shape, **kw))
    return (ce.conv_backward_weight(x, dy, w.shape, algo=algo, **kw),
            reference("backward_weight", x, dy, w.shape, **kw))


def _auto_choice(pass_, x, w, kw, y_shape) -> str:
    dy = np.zeros(y_shape, x.dtype)
    args = {"forward": (x, w), "backward_data": (dy, w, x.shape), "backward_weight": (x, dy, w.shape)}
    return ce.explain(*args[pass_], pass_=pass_, **kw).chosen


@pytest.mark.parametrize("pass_", ["forward", "backward_data", "backward_weight"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=() if i < 12 else pytest.mark.slow)
                                  for i, c in enumerate(CASES)])  # the first 12 in the fast tier
def test_every_algorithm_matches_reference(case: Case, pass_: str):
    x, w, kw = case.build()
    y_shape = ce.explain(x, w, **kw).problem.y_shape()
    served = 0
    for algo in ["auto", *ce.list_algorithms(pass_)]:
        try:
            out, expected = _run(pass_, algo, x, w, kw, y_shape)
        except ce.ConvSetupError as refusal:
            assert algo != "auto", f"auto must serve every valid problem: {refusal}"
            assert "cannot serve" in str(refusal)
            continue
        served += 1
        assert out.dtype == x.dtype, f"{algo}: output dtype {out.dtype} != input {x.dtype}"
        name = _auto_choice(pass_, x, w, kw, y_shape) if algo == "auto" else algo
        assert_close(out, expected, _tolerance_dtype(case.dtype, name, pass_), f"{algo} {pass_}")
    assert served >= 3  # auto, reference and at least one compiled/BLAS algorithm
