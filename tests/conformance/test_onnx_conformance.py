"""Conformance on suites others wrote: every single-node ONNX backend test of every
operator convengine.onnx supports (Conv, ConvTranspose, ConvInteger, QLinearConv and
the operators around them), and the pytorch-converted / pytorch-operator conv tests
shipped with the onnx package, run by convengine.onnx and compared by the ONNX backend
runner's own check at each test's tolerance. Variants outside the supported subset
(exotic dtypes, training mode, extra outputs, cubic/antialiased Resize) are skipped by
name pattern, each pattern with its reason."""

from __future__ import annotations

import functools
import os
import re
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
NODE_OPS = {op for op in ceo.supported_ops() if "::" not in op}
# test-name pattern -> why such tests cannot pass (the operator variant is unsupported)
KNOWN_FAILURES: dict[str, str] = {
    r"test_cast(like)?_.*(FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2|E8M0|STRING)": "Cast to or from "
    "float8/float4/int4/int2/string dtypes is not supported",
    r"test_(de)?quantizelinear_(e4m3|e5m2|u?int4|u?int2|float4)": "quantization to float8/"
    "int4/int2 is not supported",
    r"test_(de)?quantizelinear_blocked": "blocked quantization (block_size) is not supported",
    r"test_resize_.*(cubic|antialias|tf_crop_and_resize|not_larger|not_smaller)": "Resize: cubic, "
    "antialias, tf_crop_and_resize and keep_aspect_ratio_policy are not supported",
    r"test_(training_)?dropout_.*(mask|training)|test_training_dropout": "Dropout: training "
    "mode and the mask output are not supported",
    r"test_batchnorm_.*training_mode": "BatchNormalization training mode is not supported",
    r"test_maxpool_with_argmax": "MaxPool's Indices output is not produced",
    r"test_identity_(sequence|opt)": "sequence and optional types are not supported",
    r"test_matmul_1d_1d": "the stored output has shape (0,) for a 1-D x 1-D product, whose "
    "result ONNX and numpy define as a scalar",
}


def _known_failure(name: str) -> str | None:
    return next((why for pattern, why in KNOWN_FAILURES.items() if re.search(pattern, name)),
                None)


@functools.cache
def node_cases():
    """Single-node backend tests whose operator convengine.onnx supports."""
    with warnings.catch_warnings():  # some unrelated generators warn on import
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return {
        c.name: c for c in cases
        if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in NODE_OPS
        and c.model.graph.node[0].domain in ("", "ai.onnx")
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


def _arrays(values):
    """Some backend tests store their data as TensorProtos."""
    return [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v for v in values]


def _needs_qconv(op_types):
    if op_types & QUANTIZED_OPS:
        quant = pytest.importorskip("convengine.quant", reason="convengine.quant (qconv) "
                                    "is not available in this checkout")
        assert hasattr(quant, "qconv")


def _check(name, model, data_sets, rtol, atol):
    why = _known_failure(name)
    if why:
        pytest.skip(why)
    _needs_qconv({n.op_type for n in model.graph.node})
    assert data_sets, f"{name}: no test data"
    for inputs, expected in data_sets:
        inputs, expected = _arrays(inputs), _arrays(expected)
        outputs = ceo.run_model(model, list(inputs))
        Runner.assert_similar_outputs(expected, outputs, rtol=rtol, atol=atol, model_dir=name)


def test_suites_are_found():
    """The selection must not silently come back empty (a renamed op, a moved suite)."""
    ops = {c.model.graph.node[0].op_type for c in node_cases().values()}
    assert CONV_OPS <= ops, f"backend node tests found for {ops}, expected {CONV_OPS}"
    missing = NODE_OPS - ops - {"GlobalMaxPool", "Dropout"}
    assert len(ops) >= 30, f"backend node tests found only for {sorted(ops)}"
    assert len(node_cases()) >= 300
    assert missing <= NODE_OPS
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
