"""`tuned check-config`, run as a real subprocess where it matters: one line per bad
field, never a traceback, the manual (`--explain`), the shipped example config."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuned import config as config_mod
from tuned.commands.check_config import check_config
from tuned.config.schema import RESTART_FIELDS

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "tuned", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


CONFIGS = ROOT / "tests" / "data" / "configs"
EXAMPLE = ROOT / "systemd" / "tuned.toml.example"


BROKEN = {
    "wrong_types.toml": ["max_num_seqs", "interval_s", "vllm_args", "queue_policy", "tbt_sla_s"],
    "out_of_range.toml": ["eps_m", "metrics_port", "interval_s", "b_min", "queue_policy"],
    "bmin_above_bmax.toml": ["b_min"],
    "bmax_above_ceiling.toml": ["b_max", "fallback_cap"],
    "contradictions.toml": ["eps_d_s", "stale_after_s", "max_num_batched_tokens", "metrics_port"],
    "missing_profile.toml": ["profile"],
    "unknown_key.toml": ["max_batch_size", "engine"],
    "invalid_toml.toml": [],  # no field to name: the line number instead
}


def test_every_broken_config_file_has_an_expectation():
    files = {p.name for p in CONFIGS.glob("*.toml")}
    assert files == set(BROKEN) | {"good.toml"}


def check(*paths: str, explain: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = check_config(list(paths), explain=explain, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def problem_lines(path: str, stderr: str) -> list[str]:
    # Only tuned's own lines: an engine import may add its own warnings to stderr.
    return [ln for ln in stderr.splitlines() if ln.startswith(path + ": ")]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_check_config_names_each_bad_field(name):
    path = str(CONFIGS / name)
    code, out, err = check(path)
    assert code == 2 and out == ""
    lines = err.splitlines()
    # one line per problem, each naming the file and then the field
    assert lines == problem_lines(path, err)
    assert len(lines) == max(1, len(BROKEN[name]))
    named = [line[len(path) + 2:].split(":", 1)[0] for line in lines]
    if BROKEN[name]:
        assert sorted(named) == sorted(BROKEN[name])
    else:
        assert "not valid TOML" in err and "line 3" in err


def test_check_config_cli_subprocess_on_all_files():
    """The real command, once: every broken file refused with its fields named, the good
    one accepted, exit 2, and no traceback."""
    paths = [str(CONFIGS / n) for n in sorted(BROKEN)] + [str(CONFIGS / "good.toml")]
    r = run_cli("check-config", *paths)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    for name, fields in BROKEN.items():
        lines = problem_lines(str(CONFIGS / name), r.stderr)
        assert len(lines) == max(1, len(fields)), (name, r.stderr)
        for field in fields:
            assert any(f": {field}: " in ln for ln in lines), (name, field, lines)
    assert r.stdout == f"{CONFIGS / 'good.toml'}: ok\n"


def test_check_config_cli_subprocess_good_file():
    path = str(CONFIGS / "good.toml")
    r = run_cli("check-config", path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{path}: ok\n"
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("case", ["missing", "directory", "not_utf8", "empty_name"])
def test_check_config_unreadable_inputs_never_traceback(tmp_path, case):
    if case == "missing":
        path, expect = tmp_path / "nope.toml", "cannot read config file: No such file or directory"
    elif case == "directory":
        path, expect = tmp_path, "cannot read config file: Is a directory"
    elif case == "not_utf8":
        path = tmp_path / "latin1.toml"
        path.write_bytes('model = "caf\xe9"\n'.encode("latin-1"))
        expect = "not UTF-8 text"
    else:
        path, expect = "", "cannot read config file"
    code, out, err = check(str(path))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(f"{path}: {expect}")


def test_check_config_explain_lists_every_key():
    code, out, err = check(explain=True)
    assert code == 0 and err == ""
    fields, policies = out.split("\n\n", 1)
    keys = [line.split(" ", 1)[0] for line in fields.splitlines()]
    assert keys == list(config_mod.FIELDS)
    # then every declared policy with its options (tuned.policies.catalog)
    assert "queue_policy = saber: deadline-aware two-tier admission (SABER)" in policies
    assert ("  queue_options.window (int, default 16, an integer >= 1): waiting requests "
            "one admission attempt may try") in policies
    assert "max_num_seqs (int, default 32" in out
    restart_lines = [ln for ln in out.splitlines() if "[restart]" in ln]
    assert [ln.split(" ", 1)[0] for ln in restart_lines] == list(RESTART_FIELDS)


def test_check_config_with_file_and_explain():
    code, out, err = check(str(CONFIGS / "bmin_above_bmax.toml"), explain=True)
    assert code == 2
    assert "b_min: must be <= b_max (10), got 20" in err
    assert out.startswith("model (str")


def test_check_config_without_file_is_a_usage_error():
    code, out, err = check()
    assert code == 2 and out == ""
    assert err == "tuned check-config: give a FILE to validate, or --explain to list the keys\n"


def test_explain_survives_a_closed_pipe():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = f"{sys.executable} -m tuned check-config --explain | head -n 1"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("model (str")
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr


def test_shipped_example_config_is_valid_and_complete(tmp_path):
    """systemd/tuned.toml.example validates, names every key, and stays valid with all
    its commented defaults switched on (so the defaults it shows are real)."""
    assert check(str(EXAMPLE))[0] == 0
    text = EXAMPLE.read_text()
    for key in config_mod.FIELDS:
        if key != "source_path":
            assert re.search(rf"^#? ?{key} = ", text, re.M), f"{key} missing from the example"
    # profile is left out: its example path is a placeholder for the operator's file.
    uncommented = re.sub(r"^# ((?!profile\b)\w+ = )", r"\1", text, flags=re.M)
    assert uncommented != text
    cfg_file = tmp_path / "all.toml"
    cfg_file.write_text(uncommented)
    cfg = config_mod.load(cfg_file)
    for key, f in config_mod.FIELDS.items():
        if key not in ("profile", "model"):
            assert getattr(cfg, key) == f.metadata["default"], key


