"""tuned stands alone: its data ships inside the package, a built wheel carries all of
it and runs from anywhere, and what vLLM's EngineCore loads needs no bench extra."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tuned.commands import cli

from tuned.base import extras
from tuned.data import data_files, data_root, measured_dir, trace_names, trace_path, vidur_dir
from tuned.sim.gpu import MEASURED_HARDWARE, VIDUR_HARDWARE, profile_relpath

ROOT = Path(__file__).resolve().parents[2]


def test_data_files_hold_what_the_code_reads():
    files = set(data_files())
    for name in VIDUR_HARDWARE:
        assert f"vidur/{profile_relpath(name)}" in files
    for name in MEASURED_HARDWARE:
        rel = profile_relpath(name)
        assert {f"measured/{rel}", f"measured/{rel.with_name('attention.csv')}"} <= files
    assert {"measured/h200/steps.csv", "measured/h200/meta.json"} <= files
    assert measured_dir() == data_root() / "measured"
    assert trace_names() == ("azure_conv_2023",)
    assert trace_path("azure_conv_2023") == data_root() / "traces" / "azure_conv_2023.csv"
    assert {"LICENSE", "README.md", "vidur/decode_step_llama2_7b.md"} <= files
    assert vidur_dir() == data_root() / "vidur"
    assert "MIT License" in (data_root() / "LICENSE").read_text()


def test_unknown_packaged_trace_names_the_known_ones():
    with pytest.raises(ValueError) as err:
        trace_path("lmsys")
    assert str(err.value) == "no packaged trace 'lmsys'; packaged: azure_conv_2023"


def test_no_module_reads_a_path_beside_the_package():
    """The old reader climbed out of the package (``parents[2].parent / "shared"``)."""
    for path in (ROOT / "tuned").rglob("*.py"):
        text = path.read_text()
        assert '"shared"' not in text and "../shared" not in text, path


# ------------------------------------------------------------------ the bench extra

def _imported_tuned_modules(start: str) -> set[str]:
    """Every ``tuned`` module ``start`` can reach through any import statement (at
    module level or inside a function), with the packages that hold them."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        base = ROOT.joinpath(*name.split("."))
        path = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
        if not path.is_file():
            continue            # a name imported from a module, not a module
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        package = parts if path.name == "__init__.py" else parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    mod = ".".join(package[:len(package) - node.level + 1] + ([mod] if mod else []))
                todo += [mod] + [f"{mod}.{a.name}" for a in node.names]
    return seen


def _external_imports(module: str) -> set[str]:
    base = ROOT.joinpath(*module.split("."))
    path = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_engine_core_path_needs_no_bench_extra():
    reached = _imported_tuned_modules("tuned.engines.vllm")
    assert {"tuned.engines.vllm", "tuned.control.controller", "tuned.control.runtime"} <= reached
    assert not {"tuned.profiler", "tuned.bench", "tuned.curves.plot"} & reached
    offenders = {m: sorted(_external_imports(m) & set(extras.BENCH_EXTRA_MODULES))
                 for m in reached}
    assert {m: found for m, found in offenders.items() if found} == {}


def test_simulate_path_needs_no_bench_extra():
    reached = _imported_tuned_modules("tuned.commands.simulate") - {"tuned.bench", "tuned.bench.metrics",
                                                           "tuned.bench.runner"}
    offenders = {m: sorted(_external_imports(m) & set(extras.BENCH_EXTRA_MODULES))
                 for m in reached}
    assert {m: found for m, found in offenders.items() if found} == {}


def test_bench_extra_matches_pyproject():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bench = project["optional-dependencies"]["bench"]
    assert sorted(d.split(">")[0].split("=")[0] for d in bench) == \
        sorted(extras.BENCH_EXTRA_MODULES)
    core = {d.split(">")[0].split("=")[0] for d in project["dependencies"]}
    assert not core & set(extras.BENCH_EXTRA_MODULES)


def test_command_without_the_bench_extra_fails_with_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(extras, "BENCH_EXTRA_MODULES", ("tqdm", "no_such_module_for_tuned"))
    rc = cli.main(["bench", "--paper", "pang", "--quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == ("tuned bench: needs no_such_module_for_tuned from the bench extra: "
                   "pip install 'tuned-llm[bench]'\n")
    assert not any(tmp_path.iterdir())


def test_core_command_runs_without_the_bench_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(extras, "BENCH_EXTRA_MODULES", ("no_such_module_for_tuned",))
    assert extras.bench_extra_error("simulate") is None
    rc = cli.main(["simulate", "--hardware", "a100-llama2-7b", "--workload",
                   "trace:azure_conv_2023,n=5", "--out", str(tmp_path)])
    assert rc == 0
    assert (tmp_path / "result.json").is_file()


# ------------------------------------------------------------------ the wheel

def _source_copy(dest: Path) -> Path:
    """The checkout without build outputs, caches or virtual environments (a build
    writes build/ and *.egg-info beside the sources)."""
    skip = shutil.ignore_patterns(".git", ".venv", ".cache", "build", "dist", "*.egg-info",
                                  "runs", "models", "__pycache__", ".pytest_cache")
    shutil.copytree(ROOT, dest, ignore=skip)
    return dest


def _build(src: Path, out: Path) -> tuple[Path, Path]:
    """``python -m build`` of ``src``: the sdist, then the wheel built from that sdist
    (so a file missing from the sdist is missing from the wheel too)."""
    run = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                          str(src)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (sdist,) = out.glob("tuned_llm-*.tar.gz")
    (wheel,) = out.glob("tuned_llm-*.whl")
    return sdist, wheel


@pytest.mark.slow
@pytest.mark.parallel
def test_release_builds_checks_and_runs_from_a_clean_venv(tmp_path):
    """The release as a user gets it: ``python -m build`` makes an sdist and a wheel
    that ``twine check --strict`` accepts, carrying the licences, the changelog and
    every data file; the wheel installed into a new virtual environment (its
    dependencies from the package index, no checkout beside it) runs `tuned
    simulate`."""
    import tarfile

    import tuned

    src = _source_copy(tmp_path / "src")
    sdist, wheel = _build(src, tmp_path / "dist")
    assert wheel.name == f"tuned_llm-{tuned.__version__}-py3-none-any.whl"
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist),
                            str(wheel)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 2

    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"tuned/data/{rel}" for rel in data_files()}
    assert {"tuned/data/LICENSE", "tuned/data/README.md"} <= expected
    assert expected - names == set()
    info = f"tuned_llm-{tuned.__version__}.dist-info"
    assert {f"{info}/licenses/LICENSE", f"{info}/licenses/tuned/data/LICENSE"} <= names
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    assert f"Version: {tuned.__version__}" in meta.splitlines()
    (gpu,) = [line for line in meta.splitlines()
              if line.startswith("Requires-Dist: vllm") and 'extra == "gpu"' in line]
    assert sorted(gpu.split()[1].rstrip(";").removeprefix("vllm").split(",")) == \
        ["<0.34", ">=0.32"]
    top = f"tuned_llm-{tuned.__version__}"
    in_sdist = set(tarfile.open(sdist).getnames())
    assert {f"{top}/LICENSE", f"{top}/CHANGELOG.md", f"{top}/tuned/data/LICENSE",
            f"{top}/pyproject.toml"} <= in_sdist
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert f"## {tuned.__version__} " in (ROOT / "CHANGELOG.md").read_text()

    venv = tmp_path / "venv"                # a new environment: none of .venv's packages
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    # the running interpreter's pip installs into the new environment (no ensurepip)
    install = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                              "--python", str(py), "install", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    cwd = tmp_path / "elsewhere"           # no ../shared, no checkout beside it
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run([str(py), "-c", "import tuned, sys; print(tuned.__file__); "
                            "print(sys.prefix)"], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=60)
    file, prefix = where.stdout.split()
    assert Path(file).is_relative_to(venv) and Path(prefix) == venv
    run = subprocess.run([str(venv / "bin" / "tuned"), "simulate", "--hardware",
                          "a100-llama2-7b", "--workload", "trace:azure_conv_2023,n=20",
                          "--seed", "1", "--out", "out"],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (cwd / "out" / "result.json").is_file()
    version = subprocess.run([str(venv / "bin" / "tuned"), "--version"], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"tuned {tuned.__version__}"
