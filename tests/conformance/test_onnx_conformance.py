"""Conformance on suites others wrote: every ONNX backend node test of Conv,
ConvTranspose, ConvInteger and QLinearConv, and the pytorch-converted /
pytorch-operator conv tests shipped with the onnx package, run by convengine.onnx and
compared by the ONNX backend runner's own check at each test's tolerance."""

from __future__ import annotations

import functools
import os
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

import convengine.onnx as ceo  # noqa: E402

CONV_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"}
QUANTIZED_OPS = {"ConvInteger", "QLinearConv"}
# test name -> why it cannot pass; empty while every test passes
KNOWN_FAILURES: dict[str, str] = {}


@functools.cache
def node_cases():
    """Single-node backend tests whose operator is in CONV_OPS."""
    with warnings.catch_warnings():  # some unrelated generators warn on import
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return {
        c.name: c for c in cases
        if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in CONV_OPS
    }


@functools.cache
def model_cases():
    """pytorch-converted and pytorch-operator tests whose models contain a conv node."""
    found = {}
    for kind in ("pytorch-converted", "pytorch-operator"):
        for case in load_model_tests(kind=kind):
            model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
            if {n.op_type for n in model.graph.node} & CONV_OPS:
                found[case.name] = (case, model)
    return found


def _load_data_sets(model_dir: str):
    """[(inputs, outputs)] from test_data_set_*/input_*.pb and output_*.pb."""
    sets = []
    for name in sorted(os.listdir(model_dir)):
        folder = os.path.join(model_dir, name)
        if not name.startswith("test_data_set_"):
            continue

        def read(prefix, folder=folder):
            files = sorted(f for f in os.listdir(folder) if f.startswith(prefix))
            return [numpy_helper.to_array(onnx.load_tensor(os.path.join(folder, f)))
                    for f in sorted(files, key=lambda f: int(f[len(prefix):-3]))]

        sets.append((read("input_"), read("output_")))
    return sets


def _needs_qconv(op_types):
    if op_types & QUANTIZED_OPS:
        quant = pytest.importorskip("convengine.quant", reason="convengine.quant (qconv) "
                                    "is not available in this checkout")
        assert hasattr(quant, "qconv")


def _check(name, model, data_sets, rtol, atol):
    if name in KNOWN_FAILURES:
        pytest.skip(KNOWN_FAILURES[name])
    _needs_qconv({n.op_type for n in model.graph.node})
    assert data_sets, f"{name}: no test data"
    for inputs, expected in data_sets:
        outputs = ceo.run_model(model, list(inputs))
        Runner.assert_similar_outputs(expected, outputs, rtol=rtol, atol=atol, model_dir=name)


def test_suites_are_found():
    """The selection must not silently come back empty (a renamed op, a moved suite)."""
    ops = {c.model.graph.node[0].op_type for c in node_cases().values()}
    assert ops == CONV_OPS, f"backend node tests found for {ops}, expected {CONV_OPS}"
    assert len(node_cases()) >= 20
    assert len(model_cases()) >= 30


@pytest.mark.parametrize("name", sorted(node_cases()))
def test_backend_node(name):
    case = node_cases()[name]
    _check(name, case.model, case.data_sets, case.rtol, case.atol)


@pytest.mark.parametrize("name", sorted(model_cases()))
def test_pytorch_suites(name):
    case, model = model_cases()[name]
    _check(name, model, _load_data_sets(case.model_dir), case.rtol, case.atol)


def test_the_backend_check_can_fail():
    case = node_cases()["test_basic_conv_with_padding"]
    inputs, expected = case.data_sets[0]
    (y,) = ceo.run_model(case.model, list(inputs))
    y = y.copy()
    y.flat[0] += 1e-2 * max(1.0, float(np.abs(y.flat[0])))
    with pytest.raises(AssertionError):
        Runner.assert_similar_outputs(expected, [y], rtol=case.rtol, atol=case.atol)
