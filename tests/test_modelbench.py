"""convengine.bench.modelbench: the whole-network benchmark's pieces that need no timing."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from convengine.bench import modelbench  # noqa: E402


# conv layers, depthwise ones, and multiply-adds of one 224x224 image in the convs:
# ResNet-50 4.09 G (stem, 16 bottlenecks, 4 downsamples), MobileNetV2 0.300 G less its
# 1.28M-MAC classifier (the paper's table), as in test_tune_suites
@pytest.mark.parametrize(("model", "convs", "depthwise", "gmacs"),
                         [("resnet50", 53, 0, 4.09), ("mobilenet_v2", 52, 17, 0.2987)])
def test_conv_shapes_follow_the_network(model, convs, depthwise, gmacs):
    shapes = modelbench.conv_shapes(model, batch=2)
    assert len(shapes) == convs
    assert sum(s["groups"] > 1 for s in shapes) == depthwise
    first = shapes[0]
    assert first["x"] == [2, 3, 224, 224] and first["w"][1] == 3  # the stem reads the image
    macs = 0
    for s in shapes:
        assert s["x"][0] == 2 and s["x"][1] == s["w"][1] * s["groups"]  # channels agree
        out = [(n + 2 * p - d * (k - 1) - 1) // st + 1 for n, k, st, p, d in
               zip(s["x"][2:], s["w"][2:], s["stride"], s["padding"], s["dilation"], strict=True)]
        macs += out[0] * out[1] * s["w"][0] * s["w"][1] * s["w"][2] * s["w"][3]
    assert out == [7, 7]  # the last conv runs at 1/32 of the image
    assert macs / 1e9 == pytest.approx(gmacs, rel=0.01)


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


@pytest.mark.slow
def test_the_sgd_mode_updates_the_weights_each_step():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:  # _build sets PyTorch's threads, as a worker process does
        step = modelbench._build("resnet50", 1, "cl", "sgd", "torch", threads)
        first = step().detach().clone()
        assert not torch.equal(step().detach(), first)  # the SGD update moved the weights
    finally:
        torch.set_num_threads(threads)
