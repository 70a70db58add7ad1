"""docs/compatibility.md names a test for every feature; each one it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "compatibility.md"


def _rows(header: str = "| Feature") -> list[list[str]]:
    """The rows of the table whose header starts with ``header``."""
    rows, inside = [], False
    for line in DOC.read_text().splitlines():
        if line.startswith(header):
            inside = True
        elif inside and not line.startswith("|"):
            break
        elif inside and "---" not in line:
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_the_version_table_names_each_supported_release_and_its_report():
    from tuned.engines.vllm_version import SUPPORTED_VLLM

    rows = _rows("| vLLM |")
    assert [r[0] for r in rows] == [f"{a}.{b}.x" for a, b in SUPPORTED_VLLM]
    for version, _, how in rows:
        report = re.search(r"\]\((vllm-surface/[\d.]+\.json)\)", how).group(1)
        assert report.startswith(f"vllm-surface/{version[:-1]}"), version
        assert (DOC.parent / report).is_file(), report


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
