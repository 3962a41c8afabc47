"""The exact-only switch: ``auto`` (heuristic and tuner) without inexact algorithms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import convengine as ce
from convengine import registry
from convengine.tune import tuner
from test_tune_helpers import fast_registry, problem


@pytest.fixture(autouse=True)
def restore():
    previous = ce.allow_inexact(None)
    yield
    ce.allow_inexact(previous)


def _winograd_layer():
    """A float32 3x3 layer on which the heuristic picks a Winograd variant."""
    x = np.zeros((1, 32, 32, 64), np.float32)
    w = np.zeros((64, 3, 3, 64), np.float32)
    return x, w


def test_heuristic_keeps_to_exact_algorithms_when_inexact_is_off():
    x, w = _winograd_layer()
    chosen = ce.explain(x, w, padding=1, layout="NHWC").chosen
    assert not registry.get(chosen, "forward").exact  # the switch has something to do
    ce.allow_inexact(False)
    chosen = ce.explain(x, w, padding=1, layout="NHWC").chosen
    assert registry.get(chosen, "forward").exact
    # forcing an inexact algorithm by name still runs it
    assert ce.conv(x, w, padding=1, layout="NHWC", algo="winograd").shape == (1, 32, 32, 64)


def test_environment_and_bad_values(monkeypatch):
    monkeypatch.setenv("CONVENGINE_INEXACT", "off")
    assert ce.inexact_allowed() is False
    monkeypatch.setenv("CONVENGINE_INEXACT", " ON ")
    assert ce.inexact_allowed() is True
    assert ce.allow_inexact(False) is None and ce.inexact_allowed() is False
    monkeypatch.setenv("CONVENGINE_INEXACT", "maybe")
    ce.allow_inexact(None)
    with pytest.raises(ce.ConvSetupError, match="CONVENGINE_INEXACT"):
        ce.inexact_allowed()
    with pytest.raises(TypeError, match="allowed"):
        ce.allow_inexact("no")


def test_tuner_measures_and_keys_exact_only_separately(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", str(tmp_path))
    table = dict(fast_registry()["forward"])
    table["rough"] = dataclasses.replace(table["im2col"], name="rough", exact=False)
    monkeypatch.setitem(registry._REGISTRY, "forward", table)
    p = problem()
    assert "rough" in tuner.tune_problem(p).results
    ce.allow_inexact(False)
    exact_only = tuner.tune_problem(p)
    assert exact_only.source == "tuned"  # not the entry measured with "rough"
    assert "rough" not in exact_only.results
    assert exact_only.key.endswith("exact-only")
