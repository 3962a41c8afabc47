"""``convengine demo`` (two epochs): accuracy against scikit-learn's labels, the
per-layer table's accounting, what it says while it runs, and the files it writes."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from sklearn.datasets import load_digits  # noqa: E402

from convengine import cli  # noqa: E402
from convengine.bench import demo  # noqa: E402


@pytest.mark.slow
def test_demo_two_epochs(tmp_path, capsys):
    assert cli.main(["demo", "--epochs", "2", "--seed", "0", "--out", str(tmp_path)]) == 0
    printed, said = capsys.readouterr()
    assert "test accuracy: float32" in printed and "first call (compile)" in printed
    assert "spent" in printed and "compiling" in printed
    assert said.startswith("convengine demo:")  # before anything is imported or compiled
    assert "epoch 1/2: loss" in said and "epoch 2/2: loss" in said
    report = json.loads((tmp_path / "demo.json").read_text())
    assert report["epochs"] == 2 and len(report["losses"]) == 2
    assert report["losses"][1] < report["losses"][0]

    # accuracy recomputed here, from the predictions and scikit-learn's own labels
    labels = load_digits().target
    test = report["test_indices"]
    assert len(test) == len(labels) - int(0.8 * len(labels))
    assert len(set(test)) == len(test)
    truth = labels[test]
    float_hits = sum(int(p == t) for p, t in zip(report["float_predictions"], truth, strict=True))
    int8_hits = sum(int(p == t) for p, t in zip(report["int8_predictions"], truth, strict=True))
    assert float_hits / len(test) >= 0.95
    assert int8_hits / len(test) >= 0.94
    assert report["float_accuracy"] == pytest.approx(float_hits / len(test))
    assert report["int8_accuracy"] == pytest.approx(int8_hits / len(test))
    agree = sum(int(a == b) for a, b in zip(report["float_predictions"],
                                            report["int8_predictions"], strict=True))
    assert agree / len(test) >= 0.98

    # every training step called each conv pass once: 2 epochs of batches of 32,
    # the first call at each batch shape (32 and the last batch's) reported apart
    batches = 2 * math.ceil(int(0.8 * len(labels)) / demo.BATCH)
    shapes = 1 + (int(0.8 * len(labels)) % demo.BATCH != 0)
    train = [k for k in report["first_call_seconds"] if k.startswith("train: ")]
    assert {k.split(" [")[0] for k in train} == {
        "train: conv1 forward", "train: conv2 forward", "train: conv2 backward_data",
        "train: conv2 backward_weight", "train: conv1 backward_weight"}
    for k in train:
        assert report["layer_calls"][k] == batches - shapes, k
        assert report["first_call_seconds"][k] > 0 and report["layer_seconds"][k] > 0
    assert {k for k in report["first_call_seconds"] if "[qconv]" in k} == {
        "test: conv1 int8 [qconv]", "test: conv2 int8 [qconv]"}
    assert report["seconds"] >= report["compile_seconds"] >= 0
    png = (tmp_path / "demo.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


@pytest.mark.parametrize("epochs", [0, 1.5, True])
def test_demo_rejects_bad_epochs(epochs, tmp_path):
    with pytest.raises(ValueError, match="epochs"):
        demo.run(epochs=epochs, out=tmp_path)
