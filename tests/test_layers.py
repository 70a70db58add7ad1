"""The floors of tuned (pyproject.toml's [tool.importlinter]): imports only point down,
and the engine adapter loads no command, plotting or client code. import-linter checks
both; a planted upward import must break the first contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    lint = Path(sys.executable).parent / "lint-imports"   # import-linter's command
    return subprocess.run([str(lint), str(cwd / "pyproject.toml"), "--no-cache"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_layers_contracts_are_kept():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 2 kept, 0 broken." in r.stdout


def test_a_planted_upward_import_breaks_the_layers_contract(tmp_path):
    shutil.copytree(ROOT / "tuned", tmp_path / "tuned",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    window = tmp_path / "tuned" / "core" / "window.py"
    window.write_text(window.read_text() + "\nimport tuned.controller  # planted\n")
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tuned's floors: imports only point down BROKEN" in r.stdout
    assert "tuned.core.window -> tuned.controller" in r.stdout
