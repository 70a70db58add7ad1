"""docs/compatibility.md names a test for every feature; each one it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "compatibility.md"


def _rows() -> list[list[str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| Feature") and "---" not in line:
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_every_row_has_a_status_and_a_test():
    rows = _rows()
    assert len(rows) == 12
    for feature, status, test in rows:
        assert status.split(":")[0].split(".")[0] in (
            "Works", "Not supported by the CPU build", "Refused at start", "Open") or \
            status.startswith("vLLM 0.32"), feature
        assert "tests/" in test, feature


def test_every_named_test_exists():
    named = 0
    for _, _, cell in _rows():
        current = None
        for m in re.finditer(r"`(tests/[\w/]+\.py)?(::[\w\[\]-]+)?`", cell):
            path, node = m.group(1), m.group(2)
            if path:
                current = ROOT / path
                assert current.is_file(), path
            if node:
                name = node[2:].split("[")[0]
                assert current is not None
                assert re.search(rf"^def {name}\(", current.read_text(), re.M), (current, name)
                named += 1
    assert named >= 14
