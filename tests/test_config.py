"""convengine.config: one place for every setting, its environment variable, set/override."""

from __future__ import annotations

import pytest

import convengine as ce
from convengine import ConvSetupError, config


def test_defaults_follow_the_environment(monkeypatch):
    monkeypatch.delenv("CONVENGINE_TUNING", raising=False)
    assert config.get("tuning") == "on"
    monkeypatch.setenv("CONVENGINE_TUNING", " Cache-Only ")
    assert config.get("tuning") == "cache-only"
    monkeypatch.setenv("CONVENGINE_INEXACT", "off")
    assert config.get("inexact") is False
    monkeypatch.setenv("CONVENGINE_MAX_ELEMENTS", "1000")
    assert config.get("max_elements") == 1000
    monkeypatch.setenv("CONVENGINE_CACHE_DIR", "/tmp/ce-cache")
    assert str(config.get("cache_dir")) == "/tmp/ce-cache"


@pytest.mark.parametrize(("variable", "word"), [("CONVENGINE_TUNING", "sometimes"),
                                                ("CONVENGINE_INEXACT", "maybe"),
                                                ("CONVENGINE_MAX_ELEMENTS", "-3"),
                                                ("CONVENGINE_INT8_PATH", "fast")])
def test_a_bad_environment_value_names_the_variable(monkeypatch, variable, word):
    monkeypatch.setenv(variable, word)
    name = next(n for n, s in config.SETTINGS.items() if s.env == variable)
    with pytest.raises(ConvSetupError, match=rf"\${variable} must be"):
        config.get(name)


def test_set_returns_what_restores_it_and_beats_the_environment(monkeypatch):
    monkeypatch.setenv("CONVENGINE_TUNING", "cache-only")
    before = config.generation
    previous = config.set(tuning="off", max_elements=123)
    try:
        assert previous == {"tuning": None, "max_elements": None}
        assert config.get("tuning") == "off" and config.get("max_elements") == 123
        assert ce.get_tuning() == "off"  # the old getter reads the same setting
        assert config.generation > before
    finally:
        config.set(**previous)
    assert config.get("tuning") == "cache-only"  # the environment again


def test_override_restores_after_an_exception():
    threads = config.get("threads")
    with pytest.raises(RuntimeError), config.override(inexact=False, threads=1):
        assert config.get("inexact") is False and ce.get_num_threads() == 1
        raise RuntimeError("inside")
    assert config.get("inexact") is True and config.get("threads") == threads


def test_bad_settings_are_refused_before_anything_changes():
    tuning = config.get("tuning")
    with pytest.raises(ConvSetupError, match="unknown setting 'tunning'"):
        config.set(tunning="off")
    with pytest.raises(ConvSetupError, match="isa is fixed at import"):
        config.set(isa="avx2")
    with pytest.raises(ConvSetupError, match="max_elements must be a positive int"):
        config.set(tuning="cache-only" if tuning != "cache-only" else "off", max_elements=0)
    assert config.get("tuning") == tuning  # the valid half of that call was not applied
    with pytest.raises(ConvSetupError, match="unknown setting"):
        config.get("speed")


def test_describe_lists_every_setting_with_its_variable():
    text = config.describe()
    for name, setting in config.SETTINGS.items():
        line = next(row for row in text.splitlines() if row.startswith(name))
        assert (setting.env or "-") in line
