"""One NaN rule (issue 19, item 7): NaN and inf in any operand give the float64
reference's NaN/inf pattern under every algorithm, so the result never depends on what
``auto`` or the tuning cache picked. The rule: forward and backward-weight sum over the
zero-padded input (``0 * NaN`` and ``0 * inf`` are NaN at padded taps); backward-data
sums over the (dy, w) pairs that land inside x."""

from __future__ import annotations

import numpy as np
import pytest

import convengine as ce

RNG = np.random.default_rng(7)


def _serving(pass_: str, call, *args, **kwargs) -> dict[str, np.ndarray]:
    """Each algorithm's result (forced by name), plus auto's, where it can serve."""
    results = {}
    for name in [*ce.list_algorithms(pass_), "auto"]:
        try:
            results[name] = call(*args, algo=name, **kwargs)
        except ce.ConvSetupError:
            continue
    return results


def _same_pattern(results: dict[str, np.ndarray], expected: np.ndarray) -> None:
    """NaN, +inf and -inf exactly where the reference has them; finite values close."""
    assert len(results) >= 3
    for name, got in results.items():
        for test in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(test(got), test(expected), err_msg=f"{name} {test}")
        finite = np.isfinite(expected)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-3, atol=1e-3,
                                   err_msg=name)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_forward_nonfinite_weight_poisons_padded_borders(value):
    x = RNG.standard_normal((2, 16, 10, 10)).astype(np.float32)
    w = RNG.standard_normal((16, 16, 3, 3)).astype(np.float32)
    w[0, 0, 0, 0] = value
    expected = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1, algo="reference")
    if value is np.nan:
        assert np.isnan(expected).sum() == 200  # the count of issue 19: padded taps count
    _same_pattern(_serving("forward", ce.conv, x, w, padding=1), expected)


@pytest.mark.parametrize("groups", [1, 8])
def test_backward_data_nonfinite_weight(groups):
    w = RNG.standard_normal((8, 8 // groups, 3, 3)).astype(np.float32)
    w[1, 0, 2, 2] = np.nan
    w[2, 0, 0, 1] = np.inf
    dy = RNG.standard_normal((2, 8, 7, 7)).astype(np.float32)
    args = dict(padding=1, groups=groups)
    expected = ce.conv_backward_data(dy.astype(np.float64), w.astype(np.float64), (2, 8, 7, 7),
                                     algo="reference", **args)
    _same_pattern(_serving("backward_data", ce.conv_backward_data, dy, w, (2, 8, 7, 7),
                           **args), expected)


@pytest.mark.parametrize("groups", [1, 8])
def test_backward_weight_nonfinite_dy_corner(groups):
    x = RNG.standard_normal((2, 8, 7, 7)).astype(np.float32)
    dy = RNG.standard_normal((2, 8, 7, 7)).astype(np.float32)
    dy[0, 3, 0, 0] = np.nan
    dy[1, 5, 6, 6] = -np.inf
    args = dict(padding=1, groups=groups)
    expected = ce.conv_backward_weight(x.astype(np.float64), dy.astype(np.float64),
                                       (8, 8 // groups, 3, 3), algo="reference", **args)
    _same_pattern(_serving("backward_weight", ce.conv_backward_weight, x, dy,
                           (8, 8 // groups, 3, 3), **args), expected)


def test_backward_weight_nonfinite_dy_where_no_tap_meets_x():
    """Padding wider than the kernel: the corner outputs read padding only, so only the
    padded taps (0 * NaN) carry dy's NaN into dw."""
    x = RNG.standard_normal((1, 16, 4, 4)).astype(np.float32)
    dy = RNG.standard_normal((1, 16, 9, 9)).astype(np.float32)
    dy[0, 2, 0, 0] = np.nan  # reads rows/cols -3..-2 only
    expected = ce.conv_backward_weight(x.astype(np.float64), dy.astype(np.float64),
                                       (16, 16, 2, 2), padding=3, algo="reference")
    assert np.isnan(expected[2]).all() and not np.isnan(np.delete(expected, 2, 0)).any()
    _same_pattern(_serving("backward_weight", ce.conv_backward_weight, x, dy, (16, 16, 2, 2),
                           padding=3), expected)


def test_nonfinite_input_follows_the_reference_too():
    x = RNG.standard_normal((1, 16, 9, 9)).astype(np.float32)
    x[0, 3, 4, 4] = np.inf
    x[0, 5, 0, 8] = np.nan
    w = RNG.standard_normal((16, 16, 3, 3)).astype(np.float32)
    expected = ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1, algo="reference")
    _same_pattern(_serving("forward", ce.conv, x, w, padding=1), expected)


@pytest.mark.parametrize(("x_shape", "w_shape", "args"), [
    ((1, 32, 3, 3), (32, 32, 3, 3), dict(padding=1)),  # w larger than y: y is read first
    ((1, 16, 1, 1), (16, 16, 2, 2), dict(padding=1, stride=2)),  # tap (0, 0) never meets x
])
def test_forward_nonfinite_weight_larger_than_the_output(x_shape, w_shape, args):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    w[3, 1, 0, 0] = np.nan
    expected = ce.conv(x.astype(np.float64), w.astype(np.float64), algo="reference", **args)
    assert np.isnan(expected[:, 3]).all()
    _same_pattern(_serving("forward", ce.conv, x, w, **args), expected)


@pytest.mark.parametrize("engine", ["fused", "partly_fused", "unfused"])
def test_graph_plans_follow_the_rule(engine):
    """Graph engines call the algorithms themselves (tiles included): same rule."""
    from convengine.graph import Candidate, Graph
    from convengine.graph import engines as eng
    from convengine.graph.program import Program

    x = RNG.standard_normal((2, 16, 10, 10)).astype(np.float32)
    w = RNG.standard_normal((16, 16, 3, 3)).astype(np.float32)
    w[0, 0, 0, 0] = np.nan
    g = Graph(io_dtype="float32", compute_dtype="float32")
    xt, wt = g.tensor("x", x.shape), g.tensor("w", w.shape)
    y = g.relu(g.conv_fprop(xt, wt, padding=1, name="conv"))
    y.set_output(True)
    g.validate()
    built = eng.build(Candidate(engine, "direct"), Program.from_graph(g), False, False)
    assert not isinstance(built, str), built
    got = built.run({"x": x, "w": w})[y.name]
    expected = np.maximum(ce.conv(x.astype(np.float64), w.astype(np.float64), padding=1,
                                  algo="reference"), 0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    assert np.isnan(got).sum() == 200
