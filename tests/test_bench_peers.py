"""convengine.bench.peers (bench/bench_peers.py, ``convengine bench --peers``): its
options, and one tiny run end to end in fresh processes."""

from __future__ import annotations

import importlib.util
import json

import pytest

from convengine import cli
from convengine.bench import peers as bench_peers


def test_the_defaults_are_both_tables_at_batch_1_and_8():
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    args = bench_peers.parse([])
    assert args.models == ["resnet50", "mobilenet_v2"]
    assert args.batch == [1, 8]
    assert args.kinds == ["fp32", "int8"]
    assert args.engines == ["onnxruntime", "openvino", "convengine", "eager", "eager-cl",
                            "inductor", "optimize"]
    assert args.threads == 2


def test_subsets_are_parsed_and_checked():
    pytest.importorskip("torch")
    args = bench_peers.parse(["--models", "mobilenet_v2", "--batch", "8", "--engines",
                              "eager,optimize", "--passes", "3", "--rounds", "1"])
    assert (args.models, args.batch, args.engines, args.passes, args.rounds) == (
        ["mobilenet_v2"], [8], ["eager", "optimize"], 3, 1)
    with pytest.raises(ValueError, match="--engines: unknown \\['tvm'\\]"):
        bench_peers.parse(["--engines", "eager,tvm"])
    with pytest.raises(ValueError, match="--models: unknown"):
        bench_peers.parse(["--models", "resnet18"])
    with pytest.raises(ValueError, match="--batch"):
        bench_peers.parse(["--batch", "1,x"])
    with pytest.raises(ValueError, match="--passes must be >= 1"):
        bench_peers.parse(["--passes", "0"])
    assert bench_peers.main(["--kinds", "int4"]) == 2  # a bad option: exit status 2


def test_convengine_bench_peers_passes_its_options_on(monkeypatch, tmp_path):
    """``convengine bench --peers`` runs this benchmark with the models, batch sizes,
    threads and JSON file given to ``bench``."""
    seen: list[list[str]] = []
    monkeypatch.setattr(bench_peers, "main", lambda argv: seen.append(argv) or 0)
    out = str(tmp_path / "p.json")
    assert cli.main(["bench", "--peers", "--model", "mobilenet_v2", "--batch", "1",
                     "--threads", "1", "--json", out]) == 0
    assert cli.main(["bench", "--peers"]) == 0
    assert seen == [["--threads", "1", "--models", "mobilenet_v2", "--batch", "1",
                     "--json", out], ["--threads", "2"]]
    with pytest.raises(SystemExit):  # a layer suite's options make no sense with --peers
        cli.main(["bench", "--peers", "--compare", "torch"])


def test_outputs_are_compared_relative_to_the_reference():
    import numpy as np

    ref = np.array([1.0, -4.0, 2.0], np.float32)
    got = ref + np.array([0.0, 0.02, 0.0], np.float32)
    c = bench_peers._compare(got, ref)
    assert c["diff"] == pytest.approx(0.005, rel=1e-3)
    assert c["equal"] == pytest.approx(2 / 3)


@pytest.mark.slow
def test_a_tiny_run_end_to_end(tmp_path, monkeypatch):
    """A 1/8-width MobileNetV2 on 32x32 images, one pass per engine: every engine's
    process starts, runs and agrees with the reference; the tables and JSON appear."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    engines = ["onnxruntime", "convengine", "eager", "optimize"]
    if importlib.util.find_spec("openvino") is not None:
        engines.insert(1, "openvino")
    monkeypatch.setenv("CONVENGINE_TUNING", "off")  # the heuristic: no measuring
    out = tmp_path / "peers.json"
    assert bench_peers.main(["--models", "mobilenet_v2", "--batch", "2", "--width", "0.125",
                             "--size", "32", "--passes", "1", "--warmup", "0", "--rounds", "1",
                             "--engines", ",".join(engines), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["cpu"]["model_name"] and result["options"]["passes"] == 1
    (row,) = result["rows"]
    for kind, names in (("fp32", engines[:-2]), ("int8", engines[:-2]),
                        ("torch", engines[-2:])):
        for name in names:
            cell = row[kind][name]
            assert not cell["error"], (kind, name, cell["error"])
            assert cell["ms"] > 0 and cell["first_s"] > 0
            if kind == "int8" and name == "openvino":  # its own rounding: a step or two off
                assert cell["diff"] < 0.05, (kind, name, cell["diff"])
            elif kind == "int8":
                assert cell["equal"] == 1.0, (kind, name)  # convengine: bit-exact with ORT
            else:
                assert cell["diff"] < 1e-4, (kind, name, cell["diff"])
