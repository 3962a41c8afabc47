"""Hostile ONNX models: ``convengine.onnx.Session`` must end every malformed, truncated
or inconsistent model in a clear error (ConvSetupError / ValueError / TypeError /
NotImplementedError for an unknown operator, or onnx's own errors) whose message names
the model file, the node or the field, or load and run it; never a signal, a hang, a
bare internal exception or a MemoryError from a huge declared size.

Three small models built here with onnx.helper (a CNN: Conv + BatchNormalization + Relu
+ MaxPool, a residual Conv + Add, GlobalAveragePool + Flatten + Gemm; its QDQ form,
which the session rewrites to QLinearConv / QLinearAdd / QGemm; its QOperator form with
the com.microsoft ops) are (a) broken by hand, one case per kind of damage, and (b)
mutated by a hypothesis-driven fuzz (fixed seed) in a subprocess, so that a crash is a
failed exit status rather than a lost test run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import convengine as ce  # noqa: E402
import convengine.onnx as ceo  # noqa: E402

X_SHAPE = (1, 3, 8, 8)
CLASSES = 4
RNG_SEED = 0


# ------------------------------------------------------------------ the models


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _float_params():
    rng = np.random.default_rng(RNG_SEED)
    return {
        "w1": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        "b1": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32),
        "b2": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "bn_s": (rng.random(8) + 0.5).astype(np.float32),
        "bn_b": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "bn_m": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "bn_v": (rng.random(8) + 0.5).astype(np.float32),
        "fc_w": (rng.standard_normal((CLASSES, 8)) * 0.3).astype(np.float32),
        "fc_b": (rng.standard_normal(CLASSES) * 0.1).astype(np.float32),
    }


def _graph_model(nodes, inits, output_type=TensorProto.FLOAT, ms=False):
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE))],
        [helper.make_tensor_value_info("y", output_type, [X_SHAPE[0], CLASSES])],
        [_init(k, v) for k, v in inits.items()])
    imports = [helper.make_opsetid("", 21)]
    if ms:
        imports.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def float_model():
    """x -> Conv+BN+Relu -> MaxPool -> Conv + skip -> Relu -> GAP -> Flatten -> Gemm."""
    p = _float_params()
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4,
                         kernel_shape=[3, 3], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"],
                         ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4,
                         kernel_shape=[3, 3]),
        helper.make_node("Add", ["c2", "p1"], ["s2"], name="add2"),
        helper.make_node("Relu", ["s2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    return _graph_model(nodes, p)


# quantization parameters: uint8 activations, int8 weights (conv1 per channel)
SCALES = {"x": 0.02, "a1": 0.03, "a2": 0.05, "s": 0.06, "g": 0.03, "y": 0.05}
ZPS = {"x": 128, "a1": 0, "a2": 10, "s": 5, "g": 5, "y": 128}


def _quantized_params():
    p = _float_params()
    ws1 = (np.abs(p["w1"]).reshape(8, -1).max(1) / 127).astype(np.float32)  # per channel
    ws2 = np.float32(np.abs(p["w2"]).max() / 127)
    wsf = np.float32(np.abs(p["fc_w"]).max() / 127)
    q = {
        "w1_q": np.round(p["w1"] / ws1[:, None, None, None]).astype(np.int8),
        "w1_s": ws1, "w1_z": np.zeros(8, np.int8),
        "b1_q": np.round(p["b1"] / (SCALES["x"] * ws1)).astype(np.int32),
        "b1_s": (np.float32(SCALES["x"]) * ws1).astype(np.float32),
        "b1_z": np.zeros(8, np.int32),
        "w2_q": np.round(p["w2"] / ws2).astype(np.int8), "w2_s": ws2, "w2_z": np.int8(0),
        "b2_q": np.round(p["b2"] / (SCALES["a1"] * ws2)).astype(np.int32),
        "b2_s": np.float32(SCALES["a1"]) * ws2, "b2_z": np.int32(0),
        "fc_q": np.round(p["fc_w"] / wsf).astype(np.int8), "fc_s": wsf, "fc_z": np.int8(0),
        "fcb_q": np.round(p["fc_b"] / (SCALES["g"] * wsf)).astype(np.int32),
        "fcb_s": np.float32(SCALES["g"]) * wsf, "fcb_z": np.int32(0),
    }
    for k in SCALES:
        q[f"{k}_s"] = np.float32(SCALES[k])
        q[f"{k}_z"] = np.uint8(ZPS[k])
    return q


def _q(name, src, dst, key):
    return helper.make_node("QuantizeLinear", [src, f"{key}_s", f"{key}_z"], [dst], name=name)


def _dq(name, src, dst, key, axis=None):
    extra = {} if axis is None else {"axis": axis}
    return helper.make_node("DequantizeLinear", [src, f"{key}_s", f"{key}_z"], [dst],
                            name=name, **extra)


def qdq_model():
    """The float CNN (without BN) in QDQ form, as quantize_static writes it."""
    nodes = [
        _q("q_x", "x", "xq", "x"), _dq("dq_x", "xq", "xf", "x"),
        _dq("dq_w1", "w1_q", "w1f", "w1", axis=0), _dq("dq_b1", "b1_q", "b1f", "b1", axis=0),
        helper.make_node("Conv", ["xf", "w1f", "b1f"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        _q("q_r1", "r1", "r1q", "a1"), _dq("dq_r1", "r1q", "r1f", "a1"),
        helper.make_node("MaxPool", ["r1f"], ["p1"], name="pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        _q("q_p1", "p1", "p1q", "a1"), _dq("dq_p1", "p1q", "p1f", "a1"),
        _dq("dq_w2", "w2_q", "w2f", "w2"), _dq("dq_b2", "b2_q", "b2f", "b2"),
        helper.make_node("Conv", ["p1f", "w2f", "b2f"], ["c2"], name="conv2", pads=[1] * 4),
        _q("q_c2", "c2", "c2q", "a2"), _dq("dq_c2", "c2q", "c2f", "a2"),
        helper.make_node("Add", ["c2f", "p1f"], ["s2"], name="add2"),
        _q("q_s2", "s2", "s2q", "s"), _dq("dq_s2", "s2q", "s2f", "s"),
        helper.make_node("GlobalAveragePool", ["s2f"], ["g"], name="gap"),
        _q("q_g", "g", "gq", "g"), _dq("dq_g", "gq", "gf", "g"),
        helper.make_node("Flatten", ["gf"], ["f"], name="flatten"),
        _q("q_f", "f", "fq", "g"), _dq("dq_f", "fq", "ff", "g"),
        _dq("dq_fc", "fc_q", "fcf", "fc"), _dq("dq_fcb", "fcb_q", "fcbf", "fcb"),
        helper.make_node("Gemm", ["ff", "fcf", "fcbf"], ["yf"], name="fc", transB=1),
        _q("q_y", "yf", "yq", "y"), _dq("dq_y", "yq", "y", "y"),
    ]
    return _graph_model(nodes, _quantized_params())


def qoperator_model():
    """The same CNN with QLinearConv and the com.microsoft int8 ops."""
    q = _quantized_params()
    ms = "com.microsoft"
    nodes = [
        _q("q_x", "x", "xq", "x"),
        helper.make_node("QLinearConv", ["xq", "x_s", "x_z", "w1_q", "w1_s", "w1_z", "a1_s",
                                         "a1_z", "b1_q"], ["r1q"], name="conv1", pads=[1] * 4),
        helper.make_node("MaxPool", ["r1q"], ["p1q"], name="pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("QLinearConv", ["p1q", "a1_s", "a1_z", "w2_q", "w2_s", "w2_z", "a2_s",
                                         "a2_z", "b2_q"], ["c2q"], name="conv2", pads=[1] * 4),
        helper.make_node("QLinearAdd", ["c2q", "a2_s", "a2_z", "p1q", "a1_s", "a1_z", "s_s",
                                        "s_z"], ["s2q"], name="add2", domain=ms),
        helper.make_node("QLinearGlobalAveragePool", ["s2q", "s_s", "s_z", "g_s", "g_z"],
                         ["gq"], name="gap", domain=ms, channels_last=0),
        helper.make_node("Flatten", ["gq"], ["fq"], name="flatten"),
        helper.make_node("QGemm", ["fq", "g_s", "g_z", "fc_q", "fc_s", "fc_z", "fcb_q", "y_s",
                                   "y_z"], ["yq"], name="fc", domain=ms, transB=1),
        _dq("dq_y", "yq", "y", "y"),
    ]
    return _graph_model(nodes, q, ms=True)


MODELS = {"float": float_model, "qdq": qdq_model, "qoperator": qoperator_model}


def _x():
    return np.random.default_rng(1).standard_normal(X_SHAPE).astype(np.float32)


def _edit(model_fn, edit):
    """A fresh model with ``edit(model)`` applied."""
    model = model_fn()
    edit(model)
    return model


def _node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def _initializer(model, name):
    return next(t for t in model.graph.initializer if t.name == name)


def _set_attr(model, node, name, value):
    n = _node(model, node)
    kept = [a for a in n.attribute if a.name != name]
    del n.attribute[:]
    n.attribute.extend([*kept, helper.make_attribute(name, value)])


def _replace_init(model, name, array):
    t = _initializer(model, name)
    t.CopyFrom(_init(name, array))


# ------------------------------------------------------------------ the sound models


@pytest.mark.parametrize("kind", MODELS)
def test_sound_models_run(kind):
    """The models the fuzz breaks run; the float one matches onnx.reference."""
    model = MODELS[kind]()
    onnx.checker.check_model(model)
    (y,) = ceo.Session(model).run(None, {"x": _x()})
    assert y.shape == (X_SHAPE[0], CLASSES) and y.dtype == np.float32
    assert np.all(np.isfinite(y))
    if kind != "qoperator":  # com.microsoft ops: not in onnx.reference
        from onnx.reference import ReferenceEvaluator

        (expected,) = ReferenceEvaluator(model).run(None, {"x": _x()})
        tol = 1e-4 if kind == "float" else 3 * SCALES["y"]  # int8: a few output steps
        np.testing.assert_allclose(y, expected, rtol=0, atol=tol)


# ------------------------------------------------------------------ hand-written hostile cases


def _expect(model, kind, *patterns, source=None, run=True):
    """``model`` (or the file ``source``) fails with ``kind``, its message matching
    every pattern, at load or at run."""
    import re

    with pytest.raises(kind) as info:
        session = ceo.Session(source if source is not None else model)
        if run:
            session.run(None, {"x": _x()})
    message = str(info.value)
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    return message


HOSTILE = {
    # weights whose data does not match their declared shape
    "raw_data short": (
        "float", lambda m: setattr(_initializer(m, "w1"), "raw_data",
                                   _initializer(m, "w1").raw_data[:-4]),
        ce.ConvSetupError, [r"initializer 'w1'", r"raw_data"]),
    "dims mismatch": (
        "float", lambda m: _initializer(m, "w2").dims.__setitem__(0, 9),
        ce.ConvSetupError, [r"initializer 'w2'", r"\[9, 8, 3, 3\]"]),
    # a huge declared dimension: refused before anything is allocated
    "2**40 dim": (
        "float", lambda m: _initializer(m, "b1").dims.__setitem__(0, 2**40),
        ce.ConvSetupError, [r"initializer 'b1'", r"max_elements"]),
    "negative dim": (
        "float", lambda m: _initializer(m, "b1").dims.__setitem__(0, -8),
        ce.ConvSetupError, [r"initializer 'b1'", r"negative"]),
    "unknown data type": (
        "float", lambda m: setattr(_initializer(m, "b1"), "data_type", 77),
        ce.ConvSetupError, [r"initializer 'b1'", r"data_type 77"]),
    # inconsistent attributes
    "kernel_shape vs weight": (
        "float", lambda m: _set_attr(m, "conv1", "kernel_shape", [5, 5]),
        ce.ConvSetupError, [r"node 'conv1' \(Conv\)", r"kernel_shape"]),
    "negative pads": (
        "float", lambda m: _set_attr(m, "conv2", "pads", [1, -1, 1, 1]),
        ce.ConvSetupError, [r"node 'conv2' \(Conv\)", r"pads"]),
    "pads length": (
        "float", lambda m: _set_attr(m, "conv1", "pads", [1, 1, 1]),
        ce.ConvSetupError, [r"node 'conv1' \(Conv\)", r"pads"]),
    "zero stride": (
        "float", lambda m: _set_attr(m, "conv1", "strides", [0, 1]),
        ce.ConvSetupError, [r"node 'conv1' \(Conv\)", r"strides"]),
    "group": (
        "float", lambda m: _set_attr(m, "conv2", "group", 3),
        ce.ConvSetupError, [r"node 'conv2' \(Conv\)", r"group"]),
    "pool kernel 2**40": (
        "float", lambda m: _set_attr(m, "pool1", "kernel_shape", [2**40, 2]),
        ce.ConvSetupError, [r"node 'pool1' \(MaxPool\)", r"kernel_shape"]),
    "pool pads 2**40": (
        "float", lambda m: (_set_attr(m, "pool1", "pads", [2**40, 0, 2**40, 0]),
                            _set_attr(m, "pool1", "kernel_shape", [2**41, 2])),
        ce.ConvSetupError, [r"node 'pool1' \(MaxPool\)", r"max_elements"]),
    # graph structure
    "cycle": (
        "float", lambda m: _node(m, "conv1").input.__setitem__(0, "r2"),
        ce.ConvSetupError, [r"node 'conv1' \(Conv\)", r"'r2'", r"cycle"]),
    "missing input": (
        "float", lambda m: _node(m, "add2").input.__setitem__(1, "nowhere"),
        ce.ConvSetupError, [r"node 'add2' \(Add\)", r"'nowhere'"]),
    "too few inputs": (
        "float", lambda m: _node(m, "conv1").input.__delitem__(slice(1, None)),
        ce.ConvSetupError, [r"node 'conv1' \(Conv\)", r"inputs"]),
    "output defined twice": (
        "float", lambda m: _node(m, "relu2").output.__setitem__(0, "r1"),
        ce.ConvSetupError, [r"node 'relu2' \(Relu\)", r"'r1'"]),
    "batch norm parameters": (
        "float", lambda m: _replace_init(m, "bn_v", np.ones(5, np.float32)),
        ce.ConvSetupError, [r"node 'bn1' \(BatchNormalization\)"]),
    # zero points and scales of the wrong length
    "QLinearConv w_scale length": (
        "qoperator", lambda m: _replace_init(m, "w1_s", np.ones(5, np.float32)),
        ce.ConvSetupError, [r"node 'conv1' \(QLinearConv\)", r"w_scale"]),
    "QLinearConv y_zero_point length": (
        "qoperator", lambda m: _replace_init(m, "a2_z", np.zeros(3, np.uint8)),
        ce.ConvSetupError, [r"node 'conv2' \(QLinearConv\)", r"y_zero_point"]),
    "DequantizeLinear scale length": (
        "qdq", lambda m: _replace_init(m, "w1_s", np.ones(5, np.float32)),
        ce.ConvSetupError, [r"node 'dq_w1' \(DequantizeLinear\)", r"scale"]),
    "QLinearAdd per-channel": (
        "qoperator", lambda m: _replace_init(m, "s_z", np.zeros(8, np.uint8)),
        ce.ConvSetupError, [r"node 'add2' \(QLinearAdd\)", r"C_zero_point"]),
    # a QDQ model with one node removed (was a bare AssertionError)
    "QDQ without a bias DequantizeLinear": (
        "qdq", lambda m: m.graph.node.remove(_node(m, "dq_fcb")),
        ce.ConvSetupError, [r"'fcbf'"]),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_model(case):
    kind, edit, error, patterns = HOSTILE[case]
    _expect(_edit(MODELS[kind], edit), error, *patterns)


def test_undecodable_files_name_the_file(tmp_path):
    """Truncated protobufs, a flipped byte in a string, and not a model at all: the
    error names the file and says why it failed."""
    data = float_model().SerializeToString()
    cases = {"truncated.onnx": data[: len(data) // 3], "garbage.onnx": b"\xff" * 64}
    # a name's bytes made invalid UTF-8 (was a raw UnicodeDecodeError)
    at = data.index(b"conv1")
    cases["utf8.onnx"] = data[:at] + b"\xc3\x28" + data[at + 2:]
    for name, blob in cases.items():
        path = tmp_path / name
        path.write_bytes(blob)
        with pytest.raises(ValueError, match=rf"ONNX model .*{name}") as info:
            ceo.Session(path)
        assert not isinstance(info.value, UnicodeDecodeError)
        with pytest.raises(ValueError, match="ONNX model|node #0 .* not valid UTF-8"):
            ceo.Session(blob)
    with pytest.raises(ValueError, match=r"missing\.onnx"):
        ceo.Session(tmp_path / "missing.onnx")


def test_setup_errors_name_the_file(tmp_path):
    model = _edit(float_model, lambda m: _set_attr(m, "conv1", "strides", [0, 1]))
    path = tmp_path / "bad_stride.onnx"
    onnx.save(model, path)
    _expect(None, ce.ConvSetupError, r"bad_stride\.onnx", r"node 'conv1' \(Conv\)",
            source=path)


def test_external_data_from_bytes_is_refused():
    """An initializer pointing at an external file, given as bytes: refused, not read
    from the working directory."""
    model = float_model()
    t = _initializer(model, "w1")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../../../etc/passwd")
    _expect(model.SerializeToString(), ce.ConvSetupError, r"initializer 'w1'", "external")


# ------------------------------------------------------------------ the fuzz (in a subprocess)

FUZZ_EXAMPLES = 200
CASE_SECONDS = 20  # per mutated model, load + run (SIGALRM in the child)
ACCEPTED = ("ConvSetupError", "ValueError", "TypeError", "NotImplementedError",
            "ValidationError", "DecodeError")
# what a message must say: the model, a node, an initializer or graph field
NAMED = ("node '", "nodes '", "node #", "initializer '", "ONNX model", "graph input", "graph output",
         "input '", "output_names", "input_feed")


def _outcome(blob, expected_shape):
    """'ok' / 'ok_nonfinite' / the accepted error's type name; raises anything else."""
    try:
        session = ceo.Session(blob)
        outputs = session.run(None, {"x": _x()})
    except (ValueError, TypeError, NotImplementedError) as error:  # onnx's errors included
        name = type(error).__name__
        if isinstance(error, (UnicodeDecodeError, KeyError, IndexError)) or \
                name not in ACCEPTED:
            raise
        if not any(s in str(error) for s in NAMED):
            raise AssertionError(f"{name} names no node or field: {error}") from error
        return name
    if len(outputs) != 1 or outputs[0].shape != expected_shape:
        raise AssertionError(f"ran, but gave shapes {[o.shape for o in outputs]}")
    return "ok" if np.all(np.isfinite(outputs[0])) else "ok_nonfinite"


def _mutate_bytes(data, strategy_data):
    from hypothesis import strategies as st

    kind = strategy_data.draw(st.sampled_from(["flip", "truncate", "insert"]))
    at = strategy_data.draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        count = strategy_data.draw(st.integers(1, 4))
        blob = bytearray(data)
        for i in range(count):
            pos = (at + i * strategy_data.draw(st.integers(1, 97))) % len(blob)
            blob[pos] ^= strategy_data.draw(st.integers(1, 255))
        return kind, bytes(blob)
    if kind == "truncate":
        return kind, data[:at]
    extra = strategy_data.draw(st.binary(min_size=1, max_size=8))
    return kind, data[:at] + extra + data[at:]


EXTREMES = [0, -1, 1, 2, 3, 7, 2**31, 2**40, -(2**40)]


def _mutate_proto(model, strategy_data):
    """One structural change of the parsed model; returns its description."""
    from hypothesis import strategies as st

    g = model.graph
    kind = strategy_data.draw(st.sampled_from(
        ["dims", "raw_data", "data_type", "attribute", "drop_node", "drop_input",
         "rename_input", "param_length"]))
    pick = strategy_data.draw
    if kind in ("dims", "raw_data", "data_type", "param_length"):
        t = g.initializer[pick(st.integers(0, len(g.initializer) - 1))]
        if kind == "dims":
            if t.dims and pick(st.booleans()):
                t.dims[pick(st.integers(0, len(t.dims) - 1))] = pick(st.sampled_from(EXTREMES))
            else:
                t.dims.append(pick(st.sampled_from(EXTREMES)))
        elif kind == "raw_data":
            raw = t.raw_data
            t.raw_data = raw[:pick(st.integers(0, max(len(raw) - 1, 0)))] if \
                pick(st.booleans()) else raw + pick(st.binary(min_size=1, max_size=16))
        elif kind == "data_type":
            t.data_type = pick(st.sampled_from([0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 16, 99]))
        else:
            a = numpy_helper.to_array(t)
            n = pick(st.sampled_from([0, 2, 3, 5, 9]))
            t.CopyFrom(_init(t.name, np.resize(a.reshape(-1), n).astype(a.dtype)))
        return f"{kind} of initializer {t.name}"
    nodes = [n for n in g.node]
    node = nodes[pick(st.integers(0, len(nodes) - 1))]
    if kind == "attribute":
        names = ["kernel_shape", "pads", "strides", "dilations", "group", "axis", "transB",
                 "channels_last"]
        name = pick(st.sampled_from(names))
        existing = next((a for a in node.attribute if a.name == name), None)
        value = pick(st.sampled_from(EXTREMES))
        if existing is not None and existing.ints:
            values = list(existing.ints)
            values[pick(st.integers(0, len(values) - 1))] = value
            if pick(st.booleans()):
                values = values[:-1]
        elif name in ("kernel_shape", "pads", "strides", "dilations"):
            values = [value] * pick(st.integers(1, 4))
        else:
            values = value
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(name, values)])
        return f"attribute {name}={values} of node {node.name}"
    if kind == "drop_node":
        g.node.remove(node)
        return f"node {node.name} dropped"
    if not node.input:
        return "no change"
    i = pick(st.integers(0, len(node.input) - 1))
    if kind == "drop_input":
        del node.input[i]
        return f"input {i} of node {node.name} dropped"
    others = [o for n in nodes for o in n.output] + ["", "ghost"]
    node.input[i] = pick(st.sampled_from(others))
    return f"input {i} of node {node.name} -> {node.input[i]!r}"


def _alarm(signum, frame):
    raise TimeoutError(f"a mutated model took over {CASE_SECONDS} s")


def fuzz(examples: int) -> dict:
    """Run the hypothesis fuzz; returns {outcomes, failures, seconds}."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    sound = {k: fn().SerializeToString() for k, fn in MODELS.items()}
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    for blob in sound.values():  # their kernels compiled before the clock runs (a cold
        _outcome(blob, (X_SHAPE[0], CLASSES))  # compile on a loaded host can take 20 s)
    signal.signal(signal.SIGALRM, _alarm)

    @settings(derandomize=True, max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(st.sampled_from(sorted(sound)), st.booleans(), st.data())
    def case(kind, on_bytes, data):
        if on_bytes:
            what, blob = _mutate_bytes(sound[kind], data)
        else:
            model = onnx.load_from_string(sound[kind])
            what = _mutate_proto(model, data)
            blob = model.SerializeToString()
        signal.alarm(CASE_SECONDS)
        try:
            outcomes[_outcome(blob, (X_SHAPE[0], CLASSES))] += 1
        except BaseException as error:  # noqa: BLE001 - every other kind is a failure
            outcomes["FAILED"] += 1
            failures.append(f"{kind}, {what}: {type(error).__name__}: {error}"[:600])
        finally:
            signal.alarm(0)

    start = time.perf_counter()
    case()
    return {"outcomes": dict(outcomes), "failures": failures,
            "seconds": round(time.perf_counter() - start, 1)}


def test_fuzz_mutated_models_in_a_subprocess():
    """FUZZ_EXAMPLES seeded mutations (bytes flipped, truncated, inserted; dims, data,
    data types, attributes, nodes and inputs of the parsed model), each loaded and run
    in a child process that must exit 0: every outcome a clean run or a clear error."""
    pytest.importorskip("hypothesis")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    timeout = 60 + FUZZ_EXAMPLES * 2
    done = subprocess.run([sys.executable, __file__, str(FUZZ_EXAMPLES)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"the fuzz process exited {done.returncode} "
                                  f"(a negative status is a signal):\n{done.stdout[-4000:]}\n"
                                  f"{done.stderr[-4000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["failures"], "\n".join(report["failures"])
    assert sum(report["outcomes"].values()) == FUZZ_EXAMPLES
    assert report["outcomes"].get("ok", 0) > 0  # some mutations leave a model that runs
    print(f"\nfuzz: {FUZZ_EXAMPLES} models, {report['outcomes']}, {report['seconds']} s")


if __name__ == "__main__":
    result = fuzz(int(sys.argv[1]) if len(sys.argv) > 1 else FUZZ_EXAMPLES)
    print(json.dumps(result))
    sys.exit(1 if result["failures"] else 0)
