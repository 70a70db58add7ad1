"""The tests mirror the package (docs/architecture.md, "Tests"): a test module lives in
the folder of a tuned subpackage or of the whole, is named after what it tests rather
than after an issue, and no two share a file name (pytest's default import mode,
with no ``__init__.py`` in the test folders, would refuse the second)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

#: folders that hold the tests of the whole rather than of one package
FLOORS = {"docs", "deploy", "package", "e2e", "benchmarks"}
#: test modules of the helpers that sit in tests/ itself
FLAT = {"test_prom_harness.py"}


def _test_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "data" not in p.parts)


def test_every_test_module_is_in_a_package_or_floor_folder():
    subpackages = {p.parent.name for p in (ROOT / "tuned").glob("*/__init__.py")}
    misplaced = []
    for path in _test_modules():
        rel = path.relative_to(TESTS)
        if len(rel.parts) == 1:
            ok = rel.name in FLAT
        else:
            ok = rel.parts[0] in subpackages | FLOORS
        if not ok:
            misplaced.append(str(rel))
    assert misplaced == []


def test_no_test_module_is_named_after_an_issue():
    named = [str(p.relative_to(TESTS)) for p in _test_modules()
             if re.search(r"issue|\d{2,}", p.stem)]
    assert named == []


def test_no_two_test_modules_share_a_name():
    counts = Counter(p.name for p in _test_modules())
    assert [name for name, n in counts.items() if n > 1] == []
    assert list(TESTS.rglob("__init__.py")) == []
