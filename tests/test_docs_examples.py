"""Every ```python block of README.md and docs/**/*.md runs, each in a fresh namespace.

A block preceded by ``<!-- skip-example -->`` is not run (it needs a GPU or files the
docs only name); one preceded by ``<!-- slow-example -->`` is marked ``slow`` (it tunes
or compiles for more than a few seconds). A block that imports an optional extra
(torch, onnx, dask) is skipped where that extra is not installed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_MARK = "<!-- skip-example -->"
SLOW_MARK = "<!-- slow-example -->"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
EXTRAS = {"torch": "torch", "onnx": "onnx", "dask": "dask.array"}


def _examples() -> list:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            before = text[: m.start()].rstrip().splitlines()
            mark = before[-1].strip() if before else ""
            line = text.count("\n", 0, m.start()) + 1
            name = f"{path.relative_to(ROOT)}:{line}"
            marks = {SKIP_MARK: [pytest.mark.skip(reason="marked skip-example")],
                     SLOW_MARK: [pytest.mark.slow]}.get(mark, [])
            found.append(pytest.param(m.group(1), id=name, marks=marks))
    return found


EXAMPLES = _examples()


def test_examples_found() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs(code: str) -> None:
    for word, module in EXTRAS.items():
        if re.search(rf"^\s*(import|from)\s+(convengine\.)?{word}\b", code, re.M):
            pytest.importorskip(module)
    exec(compile(code, "<example>", "exec"), {"__name__": "__docs_example__"})
