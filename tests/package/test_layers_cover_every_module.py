"""Every module of tuned stands in a layers contract (pyproject.toml's
[tool.importlinter]), so that a new module is checked from its first commit instead of
escaping the hand-written lists. A module is covered when the layers contract of its
nearest enclosing container names it, or names the ancestor package it sits in
(``tuned.bench.papers.pang`` through ``papers`` in the contract on ``tuned.bench``;
``tuned.telemetry.nvml`` through ``telemetry`` in the one on ``tuned``)."""

from __future__ import annotations

import pkgutil
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layer_names(pyproject: Path) -> dict[str, set[str]]:
    """container -> every name its layers contracts list (``a | b`` and ``a : b`` split)."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    names: dict[str, set[str]] = {}
    for c in contracts:
        if c["type"] != "layers":
            continue
        for container in c["containers"]:
            for spec in c["layers"]:
                names.setdefault(container, set()).update(
                    n.strip() for n in re.split(r"[|:]", spec))
    return names


def modules(package_dir: Path, prefix: str = "tuned") -> list[str]:
    """Every module and package under ``package_dir``, found by pkgutil from the files
    (nothing is imported)."""
    found = []
    for info in pkgutil.iter_modules([str(package_dir)]):
        name = f"{prefix}.{info.name}"
        found.append(name)
        if info.ispkg:
            found += modules(package_dir / info.name, name)
    return sorted(found)


def uncovered(names: list[str], contracts: dict[str, set[str]]) -> list[str]:
    """One line per module that the layers contract of its nearest container misses."""
    out = []
    for module in names:
        parts = module.split(".")
        # the nearest enclosing package that is a layers contract's container
        for depth in range(len(parts) - 1, 0, -1):
            container = ".".join(parts[:depth])
            if container in contracts:
                break
        else:
            out.append(f"{module}: no layers contract holds it (none on {parts[0]})")
            continue
        if parts[depth] not in contracts[container]:
            out.append(f"{module}: in no layer of the contract on {container} "
                       f"(add {parts[depth]!r} to its layers)")
    return out


def test_every_module_is_in_a_layers_contract():
    names = modules(ROOT / "tuned")
    assert "tuned.policies.gradient" in names and "tuned.sim.events" in names
    assert uncovered(names, layer_names(ROOT / "pyproject.toml")) == []


def test_a_planted_module_is_named_with_the_contract_it_needs():
    names = modules(ROOT / "tuned") + ["tuned.policies.planted", "tuned.planted",
                                       "tuned.bench.papers.planted"]
    assert uncovered(names, layer_names(ROOT / "pyproject.toml")) == [
        "tuned.policies.planted: in no layer of the contract on tuned.policies "
        "(add 'planted' to its layers)",
        "tuned.planted: in no layer of the contract on tuned (add 'planted' to its layers)",
    ]


def test_a_planted_file_is_found_in_a_copy(tmp_path):
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "__init__.py").write_text("")
    (tmp_path / "sim" / "engine.py").write_text("")
    (tmp_path / "sim" / "weather.py").write_text("")   # planted
    names = modules(tmp_path)
    assert names == ["tuned.sim", "tuned.sim.engine", "tuned.sim.weather"]
    assert uncovered(names, layer_names(ROOT / "pyproject.toml")) == [
        "tuned.sim.weather: in no layer of the contract on tuned.sim "
        "(add 'weather' to its layers)"]
