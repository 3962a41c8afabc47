"""The plan cache: canonical keys with a stable hash, equal graphs share a plan, any
attribute change gives another, LRU eviction, and many threads at once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convengine.graph import Graph, PlanCache

BASE = dict(layout="NHWC", batch=1, cpg=2, opg=3, size=9, kernel=3, stride=1, padding=1,
            dilation=1, groups=1, dtype="float32", act="relu", factor=0.5, alignment=16,
            x_name="x", deterministic=False, policy="heuristic")

# attribute -> a different valid value
MUTATIONS = {
    "layout": lambda v: "NCHW" if v == "NHWC" else "NHWC",
    "batch": lambda v: v + 1,
    "cpg": lambda v: v + 1,
    "opg": lambda v: v + 1,
    "size": lambda v: v + 1,
    "kernel": lambda v: 1 if v == 3 else 3,
    "stride": lambda v: 3 - v,
    "padding": lambda v: 1 - v if isinstance(v, int) else 0,
    "dilation": lambda v: 3 - v,
    "groups": lambda v: 3 - v,
    "dtype": lambda v: "float64" if v == "float32" else "float32",
    "act": lambda v: "silu" if v == "relu" else "relu",
    "factor": lambda v: v + 0.25,
    "alignment": lambda v: 64 if v == 16 else 16,
    "x_name": lambda v: v + "_",
    "deterministic": lambda v: not v,
    "policy": lambda v: "all" if v == "heuristic" else "heuristic",
}


def make(a: dict):
    """A conv -> scale -> activation graph from the attributes, and its build flags."""
    g = Graph(io_dtype=a["dtype"], compute_dtype=a["dtype"], layout=a["layout"])
    c, o, k, s = a["cpg"] * a["groups"], a["opg"] * a["groups"], a["kernel"], a["size"]
    nchw = a["layout"] == "NCHW"
    x_shape = (a["batch"], c, s, s) if nchw else (a["batch"], s, s, c)
    w_shape = (o, a["cpg"], k, k) if nchw else (o, k, k, a["cpg"])
    X = g.tensor(a["x_name"], x_shape, alignment=a["alignment"])
    W = g.tensor("w", w_shape)
    v = g.conv_fprop(X, W, stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                     groups=a["groups"])
    getattr(g, a["act"])(g.scale(v, a["factor"])).set_output()
    return g, {"policy": a["policy"], "deterministic": a["deterministic"]}


attributes = st.fixed_dictionaries({
    "layout": st.sampled_from(["NHWC", "NCHW"]), "batch": st.integers(1, 3),
    "cpg": st.integers(1, 3), "opg": st.integers(1, 3), "size": st.integers(9, 11),
    "kernel": st.sampled_from([1, 3]), "stride": st.sampled_from([1, 2]),
    "padding": st.sampled_from([0, 1]), "dilation": st.sampled_from([1, 2]),
    "groups": st.sampled_from([1, 2]), "dtype": st.sampled_from(["float32", "float64"]),
    "act": st.sampled_from(["relu", "silu"]), "factor": st.sampled_from([0.5, 2.0]),
    "alignment": st.sampled_from([16, 64]), "x_name": st.sampled_from(["x", "input"]),
    "deterministic": st.booleans(), "policy": st.sampled_from(["heuristic", "all"]),
})


@settings(max_examples=40, deadline=None)
@given(attrs=attributes, changed=st.sampled_from(sorted(MUTATIONS)))
def test_equal_graphs_share_a_plan_and_any_change_gives_another(attrs, changed):
    cache = PlanCache()
    g1, f1 = make(attrs)
    g2, f2 = make(dict(attrs))
    plan = g1.build(cache=cache, **f1)
    assert g2.build(cache=cache, **f2) is plan
    assert g1.key(**f1) == g2.key(**f2)
    other = dict(attrs, **{changed: MUTATIONS[changed](attrs[changed])})
    g3, f3 = make(other)
    assert g3.key(**f3).digest != plan.key.digest
    assert g3.build(cache=cache, **f3) is not plan
    assert (cache.hits, cache.misses, len(cache)) == (1, 2, 2)


def test_key_is_canonical_and_stable_across_processes():
    a, _ = make(dict(BASE, padding="same"))
    b, _ = make(dict(BASE, padding=((1, 1), (1, 1))))
    a.validate(), b.validate()
    assert a.key(policy="heuristic").canonical == b.key(policy="heuristic").canonical
    code = ("import sys; sys.path.insert(0, {tests!r}); from test_graph_cache import make, BASE;"
            "g, _ = make(BASE); g.validate(); print(g.key(policy='heuristic').digest)")
    code = code.format(tests=os.path.dirname(__file__))
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONHASHSEED=seed)).stdout.strip()
        for seed in ("1", "2")
    }
    assert digests == {a.key(policy="heuristic").digest}


def test_lru_eviction():
    cache = PlanCache(maxsize=2)
    graphs = [make(dict(BASE, batch=n))[0] for n in (1, 2, 3)]
    a, b = graphs[0].build(cache=cache), graphs[1].build(cache=cache)
    assert graphs[0].build(cache=cache) is a  # a is now the most recent
    graphs[2].build(cache=cache)  # evicts b
    assert (len(cache), cache.evictions) == (2, 1)
    assert graphs[0].build(cache=cache) is a
    assert graphs[1].build(cache=cache) is not b
    with pytest.raises(ValueError, match="maxsize must be >= 1"):
        PlanCache(maxsize=0)


@pytest.mark.parametrize("maxsize", [16, 2])
def test_threads_hammering_the_cache(maxsize):
    cache = PlanCache(maxsize=maxsize)
    specs = [dict(BASE, batch=n, act=act) for n in (1, 2) for act in ("relu", "silu")]
    rng = np.random.default_rng(3)
    inputs = []
    for spec in specs:
        g, _ = make(spec)
        g.validate()
        inputs.append({name: rng.standard_normal(t.shape).astype(np.float32)
                       for name, t in g.tensors.items() if not t.is_virtual})
    expected = [
        make(s)[0].build(cache=PlanCache()).execute(i) for s, i in zip(specs, inputs, strict=True)
    ]
    seen: list[set[int]] = [set() for _ in specs]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(seed: int) -> None:
        order = np.random.default_rng(seed).integers(0, len(specs), 40)
        start.wait()
        try:
            for i in order:
                plan = make(specs[i])[0].build(cache=cache)
                seen[i].add(id(plan))
                out = plan.execute(inputs[i])
                for name, value in expected[i].items():
                    np.testing.assert_array_equal(out[name], value)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert cache.hits + cache.misses == 8 * 40
    if maxsize >= len(specs):
        assert cache.misses == len(specs)  # each plan built once, however many asked
        assert all(len(ids) == 1 for ids in seen)
    assert len(cache) <= maxsize
