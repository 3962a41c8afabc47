"""``convengine demo`` (two epochs): accuracy bounds and the files it writes."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from convengine import cli, demo  # noqa: E402


def test_demo_two_epochs(tmp_path, capsys):
    assert cli.main(["demo", "--epochs", "2", "--seed", "0", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "test accuracy: float32" in printed
    report = json.loads((tmp_path / "demo.json").read_text())
    assert report["epochs"] == 2 and len(report["losses"]) == 2
    assert report["losses"][1] < report["losses"][0]
    assert report["float_accuracy"] >= 0.95
    assert abs(report["int8_accuracy"] - report["float_accuracy"]) <= 0.01
    assert report["int8_speedup"] > 0
    assert any("[qconv]" in k for k in report["layer_seconds"])
    assert any("backward_weight" in k for k in report["layer_seconds"])
    png = (tmp_path / "demo.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


@pytest.mark.parametrize("epochs", [0, 1.5, True])
def test_demo_rejects_bad_epochs(epochs, tmp_path):
    with pytest.raises(ValueError, match="epochs"):
        demo.run(epochs=epochs, out=tmp_path)
