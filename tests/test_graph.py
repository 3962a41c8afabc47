"""Graphs on float data: every engine against the float64 reference composed in
numpy (and PyTorch for one recipe), fused vs unfused, flags, validation errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from convengine import ConvSetupError, registry
from convengine.graph import Candidate, Graph, PlanCache, recipes
from convengine.graph import engines as eng
from convengine.graph.plan import engine_order
from convengine.graph.program import Program
from oracle import as_f64, assert_close, reference

rng = np.random.default_rng(42)


def np_gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))


NUMPY_OPS = {
    "relu": lambda v: np.maximum(v, 0),
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "silu": lambda v: v / (1 + np.exp(-v)),
    "gelu": np_gelu,
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3))),
    "clamp": lambda v: np.clip(v, -0.5, 0.75),
}


def run(g: Graph, engine: str, algo: str, bindings: dict) -> dict:
    """Build one engine directly (no cache, no ranking) and run it."""
    g.validate()
    built = eng.build(Candidate(engine, algo), Program.from_graph(g), False, False)
    assert not isinstance(built, str), built
    return built.run({t.name: v for t, v in bindings.items()})


CASES = [
    # layout, x shape (NCHW), w shape (NCHW), conv args, epilogue
    ("NCHW", (2, 6, 9, 11), (8, 6, 3, 3), dict(padding=1), ["bias", "residual", "relu"]),
    (
        "NHWC",
        (2, 6, 9, 11),
        (8, 3, 3, 3),
        dict(stride=2, padding=(1, 0), groups=2),
        ["bias", "scale", "gelu"],
    ),
    ("NHWC", (3, 4, 17), (5, 4, 3), dict(dilation=2, padding=2), ["mul", "silu", "clamp"]),
    ("NCHW", (1, 8, 7, 7), (16, 8, 1, 1), {}, ["bias", "sigmoid", "gelu_tanh"]),
]


def make_case(layout, xs, ws, args, ops):
    """The graph, its bindings and the float64 numpy expectation (NCHW maths)."""
    to_layout = (lambda a: np.moveaxis(a, 1, -1)) if layout == "NHWC" else (lambda a: a)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    expect = reference("forward", x, w, **args)
    g = Graph(layout=layout)
    X, W = g.tensor("x", to_layout(x).shape), g.tensor("w", to_layout(w).shape)
    bind = {X: np.ascontiguousarray(to_layout(x)), W: np.ascontiguousarray(to_layout(w))}
    v = g.conv_fprop(X, W, name="conv", **args)
    channel = (1, -1) + (1,) * (len(xs) - 2)
    for op in ops:
        if op == "bias":
            b = rng.standard_normal(ws[0]).astype(np.float32)
            B = g.tensor("b", b.shape)
            bind[B] = b
            v, expect = g.bias(v, B), expect + as_f64(b).reshape(channel)
        elif op == "residual":
            r = rng.standard_normal(expect.shape).astype(np.float32)
            R = g.tensor("r", to_layout(r).shape)
            bind[R] = np.ascontiguousarray(to_layout(r))
            v, expect = g.add(R, v), expect + r  # operand first: add is commutative
        elif op == "mul":  # per-channel operand written in the graph's layout
            m = rng.standard_normal(ws[0]).astype(np.float32).reshape(channel[1:])
            m_user = m if layout == "NCHW" else m.reshape(-1)
            M = g.tensor("m", m_user.shape)
            bind[M] = m_user
            v, expect = g.mul(v, M), expect * m
        elif op == "scale":
            v, expect = g.scale(v, 0.3), expect * np.float32(0.3)
        elif op == "clamp":
            v, expect = g.clamp(v, -0.5, 0.75), NUMPY_OPS[op](expect)
        elif op == "gelu_tanh":
            v, expect = g.gelu(v, approximate="tanh"), NUMPY_OPS[op](expect)
        else:
            v, expect = getattr(g, op)(v), NUMPY_OPS[op](expect)
    v.set_output()
    return g, bind, v, to_layout(expect)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{len(c[1]) - 2}d-{'-'.join(c[4])}")
@pytest.mark.parametrize("algo", ["im2col", "reference"])
def test_float_engines_match_reference(case, algo):
    g, bind, y, expect = make_case(*case)
    got = {e: run(g, e, algo, bind)[y.name] for e in eng.ENGINES}
    for engine, out in got.items():
        assert out.dtype == np.float32
        assert_close(out, expect, "float32", f"{engine}[{algo}]")
    assert_close(got["fused"], got["unfused"].astype(np.float64), "float32", "fused vs unfused")


@pytest.mark.parametrize("case", CASES[:2], ids=["nchw", "nhwc-groups"])
def test_fused_row_tiles(case, monkeypatch):
    """Tiles smaller than an image: row blocks with padding, stride and groups."""
    monkeypatch.setattr(eng, "TILE_BYTES", 64)
    monkeypatch.setattr(eng, "MIN_TILE_PIXELS", 1)
    g, bind, y, expect = make_case(*case)
    g.validate()
    problem = g.problems["conv"]
    assert len(eng.tiles(problem)) > problem.batch  # row blocks, not whole images
    assert_close(run(g, "fused", "im2col", bind)[y.name], expect, "float32", "row tiles")


def test_heuristic_plan_matches_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g, t = recipes.conv_bias_act(
        (2, 8, 12, 12), (16, 8, 3, 3), activation="silu", residual=True, padding=1, stride=1
    )
    x, w = (
        rng.standard_normal((2, 8, 12, 12), np.float32),
        rng.standard_normal((16, 8, 3, 3), np.float32),
    )
    b, r = rng.standard_normal(16, np.float32), rng.standard_normal((2, 16, 12, 12), np.float32)
    plan = g.build(cache=PlanCache())
    assert plan.engine_name.startswith("partly_fused[")  # 18 KiB of output: fits in cache
    got = plan.execute({t["x"]: x, t["w"]: w, t["bias"]: b, t["r"]: r})[t["y"]]
    tx = [torch.from_numpy(a) for a in (x, w, b, r)]
    want = F.silu(F.conv2d(tx[0], tx[1], tx[2], padding=1) + tx[3]).numpy()
    assert_close(got, want, "float32", "vs torch")


def test_dgrad_and_wgrad_chains():
    x = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 6, 4, 4)).astype(np.float32)
    args = dict(stride=2, padding=1)
    g = Graph(layout="NCHW")
    DY, W, R = g.tensor("dy", dy.shape), g.tensor("w", w.shape), g.tensor("r", x.shape)
    dx = g.relu(g.add(g.conv_dgrad(DY, W, input_shape=x.shape, **args), R)).set_output()
    r = rng.standard_normal(x.shape).astype(np.float32)
    expect = np.maximum(reference("backward_data", dy, w, x.shape, **args) + r, 0)
    for engine in eng.ENGINES:
        got = run(g, engine, "reference", {DY: dy, W: w, R: r})[dx.name]
        assert_close(got, expect, "float32", engine)

    g = Graph(layout="NCHW")
    X, DY = g.tensor("x", x.shape), g.tensor("dy", dy.shape)
    dw = g.scale(g.conv_wgrad(X, DY, weight_shape=w.shape, **args), -0.1).set_output()
    expect = -0.1 * reference("backward_weight", x, dy, w.shape, **args)
    g.validate()
    refusal = eng.build(Candidate("fused", "reference"), Program.from_graph(g), False, False)
    assert isinstance(refusal, str) and "no independent tiles" in refusal
    for engine in ("partly_fused", "unfused"):
        assert_close(
            run(g, engine, "reference", {X: x, DY: dy})[dw.name], expect, "float32", engine
        )
    plan = g.build(cache=PlanCache())
    assert plan.engine_name.startswith("partly_fused[")


def test_unfused_serves_general_graphs():
    """Two convs sharing an input, and a pointwise-only graph: only unfused serves."""
    g = Graph(layout="NHWC")
    X, W1, W2 = (
        g.tensor("x", (1, 5, 5, 3)),
        g.tensor("w1", (4, 1, 1, 3)),
        g.tensor("w2", (4, 3, 3, 3)),
    )
    a, b = g.conv_fprop(X, W1), g.conv_fprop(X, W2, padding=1)
    y = g.add(a, b).set_output()
    plan = g.build(cache=PlanCache())
    assert plan.engine_name.startswith("unfused[")
    assert "needs exactly one conv node, the graph has 2" in plan.describe()
    x, w1, w2 = (rng.standard_normal(t.shape).astype(np.float32) for t in (X, W1, W2))
    nchw = [np.moveaxis(a, -1, 1) for a in (x, w1, w2)]
    expect = reference("forward", nchw[0], nchw[1]) + reference(
        "forward", nchw[0], nchw[2], padding=1
    )
    assert_close(plan.execute({X: x, W1: w1, W2: w2})[y], np.moveaxis(expect, 1, -1), "float32")

    g = Graph()
    A = g.tensor("a", (3, 4))
    y = g.relu(g.scale(A, 2.0)).set_output()
    a = rng.standard_normal((3, 4)).astype(np.float32)
    assert_close(g.build(cache=PlanCache()).execute({"a": a})[y], np.maximum(2 * a, 0), "float32")


def test_float16_io_and_float64_compute():
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float16)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    for compute in ("float32", "float64"):
        g = Graph(io_dtype="float16", compute_dtype=compute, layout="NCHW")
        X, W = g.tensor("x", x.shape), g.tensor("w", w.shape)
        y = g.relu(g.conv_fprop(X, W)).set_output()
        out = g.build(cache=PlanCache()).execute({X: x, W: w})[y]
        assert out.dtype == np.float16
        assert_close(out, np.maximum(reference("forward", x, w), 0), "float16", compute)


def test_fused_workspace_is_smaller():
    g, t = recipes.conv_bias_act((4, 16, 64, 64), (64, 16, 1, 1), residual=True)
    g.validate()
    prog = Program.from_graph(g)
    space = {
        e: eng.build(Candidate(e, "1x1"), prog, False, False).workspace_bytes for e in eng.ENGINES
    }
    out_bytes = 4 * 64 * 64 * 64 * 4
    assert space["unfused"] >= 4 * out_bytes  # conv, bias, add, relu each materialised
    assert space["partly_fused"] <= 2 * out_bytes
    assert space["fused"] < out_bytes // 2


# ------------------------------------------------------------------ flags


@pytest.fixture
def nondeterministic_algo():
    """A stand-in algorithm registered ahead of the others: fast, non-deterministic."""
    from convengine.algorithms.reference import reference_fwd

    registry.register("fake_nondet", "forward", supports=lambda p: None, deterministic=False)(
        reference_fwd
    )
    registry.register("fake_reduced", "forward", supports=lambda p: None, exact=False)(
        reference_fwd
    )
    yield
    registry.unregister("fake_nondet", "forward")
    registry.unregister("fake_reduced", "forward")


@pytest.mark.parametrize("policy", ["heuristic", "all", "tune"])
def test_deterministic_never_selects_unsafe_algorithms(policy, nondeterministic_algo):
    g, t = recipes.conv_bias_act((1, 4, 6, 6), (4, 4, 3, 3), padding=1)
    for deterministic in (True, False):
        plan = g.build(policy, deterministic=deterministic, cache=PlanCache())
        algo = registry.get(plan.candidate.algo, "forward")
        assert algo.exact
        if deterministic:
            assert algo.deterministic
    plan = g.build("all", deterministic=True, cache=PlanCache())
    g.validate()
    prog = Program.from_graph(g)
    for cand in (Candidate("fused", "fake_nondet"), Candidate("unfused", "fake_reduced")):
        reason = eng.build(cand, prog, True, True)
        assert isinstance(reason, str) and ("not deterministic" in reason or "reduced" in reason)
    reason = eng.build(Candidate("fused", "fake_reduced"), prog, False, False)
    assert isinstance(reason, str) and "reduced precision" in reason
    assert not isinstance(eng.build(Candidate("fused", "fake_reduced"), prog, False, True), str)


def test_no_engine_lists_every_candidate():
    g = Graph(io_dtype="float32", compute_dtype="bfloat16", layout="NHWC")
    X, W = g.tensor("x", (1, 4, 4, 2)), g.tensor("w", (2, 1, 1, 2))
    g.relu(g.conv_fprop(X, W)).set_output()
    with pytest.raises(ConvSetupError) as info:
        g.build("all", cache=PlanCache())
    msg = str(info.value)
    assert msg.startswith("no engine can execute this graph")
    for engine in eng.ENGINES:
        assert f"{engine}[1x1]: refused: compute_dtype bfloat16 is reduced precision" in msg
        assert f"{engine}[reference]: refused" in msg
    plan = g.build(allow_reduced_precision=True, cache=PlanCache())
    x, w = (
        rng.standard_normal((1, 4, 4, 2), np.float32),
        rng.standard_normal((2, 1, 1, 2), np.float32),
    )
    got = plan.execute({X: x, W: w})["relu_1.out"]
    expect = np.maximum(
        np.einsum("nhwc,oc->nhwo", x.astype(np.float64), w[:, 0, 0].astype(np.float64)), 0
    )
    assert_close(got, expect, "bfloat16", "bfloat16 compute")


# ------------------------------------------------------------------ errors


def _bad_bias_graph():
    g = Graph(layout="NHWC")
    X, W, B = g.tensor("x", (1, 5, 5, 3)), g.tensor("w", (4, 3, 3, 3)), g.tensor("b", (3,))
    g.bias(g.conv_fprop(X, W, name="conv"), B, name="add_bias").set_output()
    return g


@pytest.mark.parametrize(
    "build, message",
    [
        (_bad_bias_graph, "node 'add_bias' (bias): 'b' has shape (3,), expected (4,)"),
        (lambda: _conv_graph(w=(4, 3, 3, 2)), "node 'conv' (conv_fprop): channel mismatch"),
        (lambda: _conv_graph(stride=0), "node 'conv' (conv_fprop): stride must be >= 1"),
        (
            lambda: _conv_graph(operand=(2, 1, 1, 4)),
            "node 'add' (add): operand 'r' of shape (2, 1, 1, 4) does not broadcast",
        ),
        (lambda: _conv_graph(requant_twice=True), "node 'again' (relu): input 'q.out' is int8"),
        (lambda: _conv_graph(output=False), "the graph has no output"),
        (
            lambda: _conv_graph(x_dtype="int8"),
            "node 'conv' (conv_fprop): dtypes 'x'=int8, 'w'=float32",
        ),
    ],
)
def test_validate_errors_name_the_node(build, message):
    with pytest.raises(ConvSetupError, match=None) as info:
        build().validate()
    assert message in str(info.value)


def _conv_graph(
    w=(4, 3, 3, 3), stride=1, operand=None, requant_twice=False, output=True, x_dtype="float32"
):
    g = Graph(layout="NHWC")
    X, W = g.tensor("x", (1, 5, 5, 3), x_dtype), g.tensor("w", w)
    v = g.conv_fprop(X, W, stride=stride, name="conv")
    if operand is not None:
        v = g.add(v, g.tensor("r", operand), name="add")
    if requant_twice:
        v = g.relu(g.requantize(v, 0.5, name="q"), name="again")
    if output:
        v.set_output()
    return g


def test_execute_errors():
    g = _conv_graph()
    plan = g.build(cache=PlanCache())
    x, w = np.zeros((1, 5, 5, 3), np.float32), np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(ConvSetupError, match=r"inputs not bound: \['w'\]"):
        plan.execute({"x": x})
    with pytest.raises(ConvSetupError, match="input 'w' has dtype float64, expected float32"):
        plan.execute({"x": x, "w": w.astype(np.float64)})
    with pytest.raises(ConvSetupError, match=r"input 'x' has shape \(1, 5, 5\), expected"):
        plan.execute({"x": x[..., 0], "w": w})
    with pytest.raises(ConvSetupError, match="'conv.out' is not an input"):
        plan.execute({"x": x, "w": w, "conv.out": x})
    with pytest.raises(ConvSetupError, match="is not 16-byte aligned"):
        buf = np.zeros(x.size + 1, np.float32)[1:].reshape(x.shape)
        plan.execute({"x": buf, "w": w})
    with pytest.raises(ConvSetupError, match="unknown policy 'fast'"):
        g.build("fast")


def test_assert_close_can_fail():
    with pytest.raises(AssertionError):
        assert_close(np.ones(3, np.float32), np.ones(3) + 1e-3, "float32", "must fail")


def test_engine_order_prefers_fusion_for_large_outputs():
    small, _ = recipes.conv_bias_act((1, 8, 8, 8), (16, 8, 1, 1))
    large, _ = recipes.conv_bias_act((8, 8, 64, 64), (64, 8, 1, 1))
    order = {}
    for name, g in (("small", small), ("large", large)):
        g.validate()
        order[name] = engine_order(Program.from_graph(g))
        # the engine leads; the conv algorithm is the heuristic's (blocked or 1x1)
        assert g.build(cache=PlanCache()).engine_name.startswith(f"{order[name][0]}[")
    assert order == {"small": ("partly_fused", "fused", "unfused"), "large": eng.ENGINES}


@pytest.mark.parametrize("batch", [0, 3])
def test_conv_only_graph_and_empty_batch(batch):
    x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = Graph(layout="NCHW")
    X, W = g.tensor("x", x.shape), g.tensor("w", w.shape)
    y = g.conv_fprop(X, W, padding=1).set_output()
    for engine in eng.ENGINES:
        got = run(g, engine, "im2col", {X: x, W: w})[y.name]
        assert_close(got, reference("forward", x, w, padding=1), "float32", engine)


def test_tune_policy_times_the_engines():
    g, t = recipes.conv_bias_act((2, 8, 16, 16), (8, 8, 3, 3), padding=1)
    plan = g.build("tune", cache=PlanCache())
    lines = [line for line in plan.describe().splitlines() if "median" in line]
    assert len(lines) >= 3 and sum("chosen" in line for line in lines) == 1
    assert plan.engine_name in {line.split()[0] for line in lines}


def test_default_layout_is_nchw_like_conv():
    """Graph() reads shapes as conv() does (NCHW), so conv's shapes build a graph."""
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = Graph()
    X, W = g.tensor("x", x.shape), g.tensor("w", w.shape)
    y = g.conv_fprop(X, W, stride=2, padding=1).set_output()
    got = g.build(cache=PlanCache()).execute({X: x, W: w})[y]
    assert_close(got, reference("forward", x, w, stride=2, padding=1), "float32")


@pytest.mark.parametrize("layout, x, w, hint", [
    (None, (1, 5, 5, 3), (4, 3, 3, 3),
     "(shapes read as NCHW; they fit NHWC: declare Graph(layout='NHWC')"),
    ("NHWC", (1, 3, 5, 5), (4, 3, 3, 3),
     "(shapes read as NHWC; they fit NCHW: declare Graph(layout='NCHW')"),
    (None, (1, 5, 5, 5), (4, 3, 3, 3), "(shapes read as NCHW)"),
])
def test_layout_named_when_shapes_disagree(layout, x, w, hint):
    g = Graph() if layout is None else Graph(layout=layout)
    g.conv_fprop(g.tensor("x", x), g.tensor("w", w), name="conv").set_output()
    with pytest.raises(ConvSetupError, match="channel mismatch") as info:
        g.validate()
    assert hint in str(info.value)


def test_bfloat16_graph_builds_in_a_fresh_process():
    """ml_dtypes is imported lazily: a bfloat16 graph must load it itself (tuning makes
    random bfloat16 inputs), not rely on something else having imported it."""
    import subprocess
    import sys

    code = ("import sys, convengine as ce\n"
            "assert 'ml_dtypes' not in sys.modules\n"
            "g = ce.Graph(io_dtype='bfloat16', compute_dtype='float32', layout='NHWC')\n"
            "x = g.tensor('x', (1, 6, 6, 16)); w = g.tensor('w', (16, 1, 1, 16))\n"
            "g.conv_fprop(x, w).set_output(True)\n"
            "print(g.build(policy='tune', allow_reduced_precision=True).engine_name)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
