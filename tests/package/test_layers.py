"""The floors of tuned (pyproject.toml's [tool.importlinter]): imports only point down,
between packages and inside each, and the engine adapter loads no command, plotting or
client code. import-linter checks the import statements; tests/import_graph.py adds
the modules loaded by name through importlib and looks for circles. A planted upward
import, a planted upward importlib load and a planted importlib loop must each be
caught."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    lint = Path(sys.executable).parent / "lint-imports"   # import-linter's command
    return subprocess.run([str(lint), str(cwd / "pyproject.toml"), "--no-cache"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_layers_contracts_are_kept():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 14 kept, 0 broken." in r.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "tuned", tmp_path / "tuned",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _graph(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tests" / "import_graph.py"), str(cwd)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def _plant(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_a_planted_upward_import_breaks_the_layers_contract(tmp_path):
    _copy(tmp_path)
    window = tmp_path / "tuned" / "core" / "window.py"
    window.write_text(window.read_text() + "\nimport tuned.control.controller  # planted\n")
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tuned's floors: imports only point down BROKEN" in r.stdout
    assert "tuned.core.window -> tuned.control.controller" in r.stdout


def test_no_import_goes_up_or_round_importlib_included():
    r = _graph(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "no upward or circular import, importlib included"


def test_a_planted_upward_importlib_load_is_caught_where_import_linter_is_blind(tmp_path):
    _copy(tmp_path)
    _plant(tmp_path / "tuned" / "core" / "window.py",
           '\nimport importlib\n\n\ndef _planted():\n'
           '    return importlib.import_module("tuned.control.controller")\n')
    assert _lint(tmp_path).returncode == 0         # no import statement: import-linter passes
    r = _graph(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("tuned's floors: imports only point down: tuned.core.window -> tuned.control.controller "
            "(importlib, from tuned.core up to tuned.control)") in r.stdout.splitlines()


def test_a_planted_importlib_loop_is_caught(tmp_path):
    """The loop this contract was written for: a queue policy that reaches the registry
    by name while the registry loads the policy by name."""
    _copy(tmp_path)
    _plant(tmp_path / "tuned" / "policies" / "fcfs.py",
           '\nimport importlib\n\n\ndef _planted():\n'
           '    return importlib.import_module("tuned.policies.registry")\n')
    r = _graph(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("circle inside tuned.policies: ") for line in lines), lines
    assert ("inside policies: the registry over the policies over their algorithms: "
            "tuned.policies.fcfs -> tuned.policies.registry (importlib, from "
            "tuned.policies.fcfs up to tuned.policies.registry)") in lines
