"""The layer suites (benchmarks and pre-tuning) describe the real networks."""

from __future__ import annotations

import pytest

from convengine.bench import suites
from convengine.errors import ConvSetupError


def network_gflop(name: str) -> float:
    """Forward GFLOP of one image (2 x multiply-adds), every layer times its count."""
    return sum(la.problem().flops * la.count for la in suites.suite(name, batch=1)) / 1e9


def test_multiply_adds_match_the_published_figures():
    # ResNet-50 at 224x224: 4.09 GMACs in its convolutions (plus 2M in the FC layer);
    # MobileNetV2 (width 1.0): 300 MMACs (the paper's table), 0.3% of it in the FC layer.
    assert network_gflop("resnet50") == pytest.approx(2 * 4.09, rel=0.01)
    assert network_gflop("mobilenet_v2") == pytest.approx(2 * 0.300, rel=0.01)


def test_layer_counts_match_the_architectures():
    convs = {name: sum(la.count for la in suites.SUITES[name]) for name in suites.SUITES}
    assert convs["resnet50"] == 1 + 16 * 3 + 4  # stem, 16 bottlenecks, 4 downsamples
    assert convs["mobilenet_v2"] == 1 + 2 + 16 * 3 + 1  # stem, first block, 16 blocks, head
    assert convs["unet3d"] == 15 and convs["conv1d"] == 11


def test_every_layer_is_a_valid_problem_in_every_pass_and_layout():
    for layer in suites.suite("all", batch=2):
        for pass_ in ("forward", "backward_data", "backward_weight"):
            p = layer.problem(pass_)
            assert p.batch == 2 and p.pass_ == pass_
            assert layer.problem(pass_, layout="NHWC").x_shape() == p.x_shape("NHWC")
    depthwise = [la for la in suites.suite("mobilenet_v2") if la.groups > 1]
    assert depthwise and all(la.problem().is_depthwise for la in depthwise)


def test_names_are_unique_and_all_prefixes_the_suite():
    names = [la.name for la in suites.suite("all")]
    assert len(names) == len(set(names)) and names[0] == "resnet50/conv1"
    assert all(la.x[0] == suites.DEFAULT_BATCH[n] for n in suites.SUITES
               for la in suites.suite(n))


def test_bad_suite_arguments_name_the_problem():
    with pytest.raises(ConvSetupError, match="unknown suite 'vgg'.*resnet50"):
        suites.suite("vgg")
    with pytest.raises(ConvSetupError, match="batch must be an int >= 1, got 0"):
        suites.suite("conv1d", batch=0)
