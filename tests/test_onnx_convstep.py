"""convengine.onnx's prepared float conv (ConvStep): every kernel it calls directly
(blocked's panels, Winograd's, a bound algorithm) and every epilogue (fused bias +
residual + ReLU / ReLU6 / SiLU, numpy for the rest, a broadcasting residual) against
onnx.reference; weights kept once, rebuilt when another shape needs them; NaN rule."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import convengine as ce  # noqa: E402
import convengine.onnx as ceo  # noqa: E402
from convengine import builders, select  # noqa: E402
from convengine.onnx.convstep import ConvStep  # noqa: E402

RNG = np.random.default_rng(3)


@pytest.fixture(autouse=True)
def heuristic_only():
    """No tuning benchmarks inside the reference ce.conv calls."""
    previous = ce.set_tuning("off")
    yield
    ce.set_tuning(previous)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _conv_model(w, b, kernel_pad, tail_nodes, extra_inits=None, residual_shape=None):
    """x -> Conv(w, b) -> [Add(r)] -> tail nodes -> y."""
    inits = {"w": w, **({"b": b} if b is not None else {}), **(extra_inits or {})}
    nodes = [helper.make_node("Conv", ["x", "w", *(["b"] if b is not None else [])], ["c"],
                              pads=[kernel_pad] * 4)]
    inputs = ["x"]
    last = "c"
    if residual_shape is not None:
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
        inputs.append("r")
        last = "a"
    nodes += [helper.make_node(op, [last if i == "$" else i for i in ins], outs, **attrs)
              for op, ins, outs, attrs in tail_nodes]
    if not tail_nodes:
        nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


TAILS = {
    "none": [],
    "relu": [("Relu", ["$"], ["y"], {})],
    "relu6": [("Clip", ["$", "lo", "hi"], ["y"], {})],
    "clip_other": [("Clip", ["$", "lo2", "hi"], ["y"], {})],
    "silu": [("Sigmoid", ["$"], ["s"], {}), ("Mul", ["$", "s"], ["y"], {})],
    "leaky": [("LeakyRelu", ["$"], ["y"], {"alpha": 0.1})],
}
BOUNDS = {"lo": np.float32(0), "hi": np.float32(6), "lo2": np.float32(-1)}
# (batch, C, O, size, kernel): the heuristic's blocked (also with 24 output channels:
# zero-padded panels, the output cropped), Winograd F(2x2), F(4x4)
SHAPES = {"blocked": (1, 16, 32, 8, 1), "blocked-o24": (1, 24, 24, 8, 1),
          "winograd": (1, 16, 32, 8, 3), "winograd4": (2, 32, 32, 16, 3)}


@pytest.mark.parametrize("tail", list(TAILS))
@pytest.mark.parametrize("residual", ["none", "same", "broadcast"])
@pytest.mark.parametrize("algo", list(SHAPES))
def test_conv_step_matches_onnx_reference(algo, residual, tail):
    n, c, o, size, k = SHAPES[algo]
    w, b = f32(o, c, k, k) * 0.3, f32(o)
    problem = builders.forward_problem(np.zeros((n, size, size, c), np.float32),
                                  np.moveaxis(w, 1, -1), layout="NHWC", padding=k // 2)
    assert select.heuristic(problem).name == algo.split("-")[0]  # what ConvStep runs
    r_shape = {"none": None, "same": (n, o, size, size), "broadcast": (o, 1, 1)}[residual]
    model = _conv_model(w, b, k // 2, TAILS[tail], BOUNDS, r_shape)
    feed = {"x": f32(n, c, size, size) * 3}
    if r_shape is not None:
        feed["r"] = f32(*r_shape)
    session = ceo.Session(model)
    assert [node.op_type for node in session._nodes] == ["Conv"]  # one fused step
    (got,) = session.run(None, feed)
    (expected,) = ReferenceEvaluator(model).run(None, feed)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    # the measure: within 1e-5 of the largest magnitude (Winograd's error
    # scales with the conv's output, before a clip)
    (conv,) = ReferenceEvaluator(_conv_model(w, b, k // 2, [])).run(None, {"x": feed["x"]})
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(conv).max()


def test_weights_kept_once_and_rebuilt_for_another_shape():
    w = f32(32, 16, 1, 1)
    step = ConvStep(w, None, {"stride": (1, 1), "padding": ((0, 0), (0, 0)),
                              "dilation": (1, 1), "groups": 1}, [])
    x = f32(1, 16, 8, 8)
    y = step(x, [])
    assert step.conv._w is None  # blocked reads only its panels
    np.testing.assert_array_equal(step.conv.weights(), np.moveaxis(w, 1, -1))
    ref = ce.conv(x, w)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    x2 = f32(3, 16, 5, 5)  # another batch and size: a new kernel
    np.testing.assert_allclose(step(x2, []), ce.conv(x2, w), rtol=1e-5, atol=1e-5)


def test_nonfinite_weights_and_inputs_follow_the_nan_rule():
    w = f32(32, 16, 3, 3)
    w[0, 0, 0, 0] = np.nan
    model = _conv_model(w, f32(32), 1, TAILS["relu"], BOUNDS)
    x = f32(1, 16, 8, 8)
    (got,) = ceo.Session(model).run(None, {"x": x})
    expected = np.maximum(ce.conv(x, w, padding=1), 0)  # NaN kept by relu, as convengine
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected + f32(32)[:, None, None]))
    w[0, 0, 0, 0] = 0.5  # finite weights, a NaN in x: Winograd's result falls back
    x[0, 3, 4, 4] = np.nan
    model = _conv_model(w, None, 1, [], BOUNDS)
    (got,) = ceo.Session(model).run(None, {"x": x})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ce.conv(x, w, padding=1)))


def test_float64_and_thread_counts():
    w, x = f32(32, 16, 3, 3), f32(2, 16, 9, 9)
    model = _conv_model(w.astype(np.float64), None, 1, TAILS["relu"], BOUNDS)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    (got,) = ceo.Session(model).run(None, {"x": x.astype(np.float64)})
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.maximum(ce.conv(x.astype(np.float64), w.astype(
        np.float64), padding=1), 0), rtol=1e-12, atol=1e-12)
    model = _conv_model(w, None, 1, TAILS["relu"], BOUNDS)
    one, two = (ceo.Session(model, threads=t).run(None, {"x": x})[0] for t in (1, 2))
    np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("trans_b", "c_shape", "beta", "alpha"), [
    (1, (10,), 1.0, 1.0), (0, (1, 10), 0.5, 1.0), (1, (), 1.0, 1.0), (1, None, 1.0, 1.0),
    (1, (10,), 1.0, 2.0),  # alpha: the generic Gemm
])
def test_gemm_with_constant_b_runs_as_a_prepared_conv(trans_b, c_shape, beta, alpha):
    """Gemm with constant B and C against onnx.reference, for one row and several,
    B stored either way round, C as a vector, a row, a scalar or absent."""
    k, n = 37, 10
    b = f32(n, k) if trans_b else f32(k, n)
    inits = {"b": b}
    if c_shape is not None:
        inits["c"] = f32(*c_shape)
    node = helper.make_node("Gemm", ["a", "b", *(["c"] if c_shape is not None else [])], ["y"],
                            transB=trans_b, beta=beta, alpha=alpha)
    graph = helper.make_graph(
        [node], "gemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ceo.Session(model.SerializeToString())
    for m in (1, 5):
        a = f32(m, k)
        (want,) = ReferenceEvaluator(model).run(None, {"a": a})
        (got,) = session.run(None, {"a": a})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
