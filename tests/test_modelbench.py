"""convengine.bench.modelbench: the whole-network benchmark's pieces that need no timing."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from convengine.bench import modelbench  # noqa: E402


@pytest.mark.parametrize(("model", "convs", "depthwise"), [("resnet50", 53, 0),
                                                          ("mobilenet_v2", 52, 17)])
def test_conv_shapes_follow_the_network(model, convs, depthwise):
    shapes = modelbench.conv_shapes(model, batch=2)
    assert len(shapes) == convs
    assert sum(s["groups"] > 1 for s in shapes) == depthwise
    first = shapes[0]
    assert first["x"] == [2, 3, 224, 224] and first["w"][1] == 3  # the stem reads the image
    for a, b in zip(shapes, shapes[1:]):  # every conv's input exists at the batch asked
        assert b["x"][0] == 2 and a["w"][0] >= 1


def test_compare_is_relative_to_the_reference_side():
    import numpy as np

    a = np.array([1.0, -4.0])
    assert modelbench._compare(a, a + np.array([0.0, 0.02])) == pytest.approx(0.005)


def test_unknown_modes_are_refused_before_anything_runs():
    import argparse

    args = argparse.Namespace(modes="infer,trian", models="resnet50", batch="1",
                              formats="cl", rounds=1, threads=1)
    with pytest.raises(ValueError, match="unknown \\['trian'\\]"):
        modelbench.run(args)


def test_the_sgd_mode_updates_the_weights_each_step():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:  # _build sets PyTorch's threads, as a worker process does
        step = modelbench._build("resnet50", 1, "cl", "sgd", "torch", threads)
        first = step().detach().clone()
        assert not torch.equal(step().detach(), first)  # the SGD update moved the weights
    finally:
        torch.set_num_threads(threads)
