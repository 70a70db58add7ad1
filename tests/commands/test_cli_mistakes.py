"""The common mistakes a new user makes with tuned's CLI and config, each answered with
one line naming the option or field, and exit 2 (never a traceback, never a silently
different outcome). No engine is started: each mistake is caught before that."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakes import run_main
from tuned.commands import cli
from tuned import config as config_mod
from tuned.commands.check_config import check_config

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def check(path: Path, env: dict | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        code = check_config(str(path), out=out, err=err, watchdog_s=30.0)
    finally:
        os.environ.clear()
        os.environ.update(old)
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------ vLLM arguments after --

def test_a_bare_positional_is_refused_not_passed_to_vllm(tmp_path):
    c = write(tmp_path, 'model = "demo:tiny"\n')
    code, out, err = run_main(["serve", "--print-command", str(c), "meta-llama/Llama-2-7b-hf"])
    assert (code, out) == (2, "")
    assert err == ("tuned serve: unexpected argument 'meta-llama/Llama-2-7b-hf': vLLM "
                   "arguments go after -- (tuned serve [options] -- meta-llama/Llama-2-7b-hf) "
                   "(see tuned serve --help)\n")


def test_a_vllm_option_before_the_separator_is_refused(tmp_path):
    code, out, err = run_main(["serve", "--config", "c.toml", "--dtype", "float32"])
    assert (code, out) == (2, "")
    assert err == ("tuned serve: unrecognized arguments: --dtype float32; vLLM arguments go "
                   "after -- (tuned serve [options] -- --dtype float32) "
                   "(see tuned serve --help)\n")


def test_a_flag_tuned_sets_from_the_config_names_the_key():
    code, out, err = run_main(["serve", "--model", "/models/llama-7b"])
    # not "did you mean --model-cache": serve has no --model, the config has `model`
    assert (code, err) == (2, "tuned serve: unrecognized arguments: --model /models/llama-7b; "
                              "set model in the config file (--config FILE) "
                              "(see tuned serve --help)\n")


def test_a_flag_tuned_sets_is_recognised_in_vllm_s_underscore_spelling():
    code, out, err = run_main(["serve", "--max_num_seqs=8"])
    assert (code, err) == (2, "tuned serve: unrecognized arguments: --max_num_seqs=8; set "
                              "max_num_seqs in the config file (--config FILE) "
                              "(see tuned serve --help)\n")


def test_vllm_arguments_after_the_separator_still_reach_vllm(tmp_path):
    c = write(tmp_path, f'model = "{tmp_path}"\n')
    code, out, err = run_main(["serve", "--print-command", str(c), "--", "--dtype", "float32"])
    assert code == 0, err
    assert out.rstrip().endswith(" --dtype float32")


# ------------------------------------------------------------------ errors name their command

@pytest.mark.parametrize("argv, line", [
    (["serve", "--confg", "c.toml"],
     "tuned serve: unrecognized arguments: --confg c.toml; did you mean --config? "
     "(see tuned serve --help)"),
    (["check-config", "--explian"],
     "tuned check-config: unrecognized arguments: --explian; did you mean --explain? "
     "(see tuned check-config --help)"),
    (["status", "--jsno"],
     "tuned status: unrecognized arguments: --jsno; did you mean --json? "
     "(see tuned status --help)"),
    (["demo", "--ttft-sla", "3"],
     "tuned demo: unrecognized arguments: --ttft-sla 3; did you mean --ttft-sla-s? "
     "(see tuned demo --help)"),
    (["--bogus"], "tuned: unrecognized arguments: --bogus (see tuned --help)"),
    (["serv"], "tuned: argument COMMAND: invalid choice: 'serv' (choose from 'serve', "
               "'demo', 'profile', 'fit', 'check-config', 'status', 'reload', 'simulate', "
               "'bench', 'recommend'); did you mean serve? (see tuned --help)"),
    (["bench", "--engine", "vlm", "--out", "x"],
     "tuned bench: argument --engine: invalid choice: 'vlm' (choose from 'sim', 'vllm'); "
     "did you mean vllm? (see tuned bench --help)"),
])
def test_a_wrong_option_names_the_subcommand_and_its_help(argv, line):
    code, out, err = run_main(argv)
    assert (code, out, err) == (2, "", line + "\n")


def test_the_installed_command_prints_the_same_line():
    r = subprocess.run([sys.executable, "-m", "tuned", "serve", "--confg", "x.toml"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("tuned serve: unrecognized arguments: --confg x.toml; did you mean "
                        "--config? (see tuned serve --help)\n")


# ------------------------------------------------------------------ config keys and values

@pytest.mark.parametrize("text, line", [
    ("tbt_sla = 0.05\n", "tbt_sla: unknown key; did you mean tbt_sla_s? (known keys: see "
                         "`tuned check-config --explain`)"),
    ("max_num_seq = 8\n", "max_num_seq: unknown key; did you mean max_num_seqs? (known keys: "
                          "see `tuned check-config --explain`)"),
    ("zzz = 1\n", "zzz: unknown key (known keys: see `tuned check-config --explain`)"),
    ("tbt_sla_s = 50\n", "tbt_sla_s: must be in [0, 1), got 50 (probably "
                         "milliseconds: the SLA is in seconds, 50 ms is 0.05)"),
    ("tbt_sla_s = 1.0\n", "tbt_sla_s: must be in [0, 1), got 1.0 (probably "
                          "milliseconds: the SLA is in seconds, 1 ms is 0.001)"),
    ('metrics_host = "not a host!!"\n',
     "metrics_host: must be an IP address or a host name, got 'not a host!!' (letters, "
     "digits, '-' and '.' only, no label starting or ending with '-')"),
    ('host = "-bad-"\n', "host: must be an IP address or a host name, got '-bad-' "
                         "(letters, digits, '-' and '.' only, no label starting or ending "
                         "with '-')"),
    ('host = "10.0.0.300"\n', "host: must be an IP address or a host name, got "
                              "'10.0.0.300' (not a valid IP address)"),
    ('model = "meta llama/Llama 2"\n',
     "model: 'meta llama/Llama 2' is neither an existing model folder nor a Hugging Face "
     "id (owner/name); pass one of those (a folder here as ./name) or demo:tiny / "
     "demo:small"),
])
def test_check_config_answers_each_mistake_in_one_line(tmp_path, text, line):
    c = write(tmp_path, text)
    code, out, err = check(c)
    assert (code, out, err) == (2, "", f"{c}: {line}\n")


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost",
                                  "tuned-0.tuned.default.svc.cluster.local", "my"])
def test_real_hosts_pass(host):
    assert config_mod.validate({"metrics_host": host}).metrics_host == host


def test_an_sla_below_a_second_passes():
    assert config_mod.validate({"tbt_sla_s": 0.999, "eps_d_s": 0.0}).tbt_sla_s == 0.999


# ------------------------------------------------------------------ Hugging Face ids

def _hf_cache(tmp_path: Path, *ids: str) -> dict:
    for model_id in ids:
        (tmp_path / "hf" / "hub" / ("models--" + model_id.replace("/", "--"))
         / "snapshots").mkdir(parents=True)
    return {"HF_HOME": str(tmp_path / "hf"), "PATH": os.environ.get("PATH", "")}


def test_a_cached_hf_id_passes_silently(tmp_path):
    env = _hf_cache(tmp_path, "meta-llama/Llama-2-7b-hf")
    c = write(tmp_path, 'model = "meta-llama/Llama-2-7b-hf"\n')
    assert check(c, env) == (0, f"{c}: ok\n", "")


def test_a_misspelt_hf_id_gets_a_note_naming_the_cached_one(tmp_path):
    env = _hf_cache(tmp_path, "meta-llama/Llama-2-7b-hf")
    c = write(tmp_path, 'model = "meta-lama/Llama-2-7b-hf"\n')
    hub = tmp_path / "hf" / "hub"
    # not refused: vLLM may download a model this host has never seen (no network here)
    assert check(c, env) == (0, f"{c}: ok\n",
                             f"{c}: note: model: meta-lama/Llama-2-7b-hf is not in the Hugging "
                             f"Face cache ({hub}): vLLM downloads it at start; did you mean "
                             f"meta-llama/Llama-2-7b-hf (cached)?\n")


def test_an_uncached_hf_id_offline_is_refused(tmp_path):
    env = dict(_hf_cache(tmp_path, "meta-llama/Llama-2-7b-hf"), HF_HUB_OFFLINE="1")
    c = write(tmp_path, 'model = "meta-llama/Llama-2-7b-hff"\n')
    hub = tmp_path / "hf" / "hub"
    assert check(c, env) == (2, "", f"{c}: model: meta-llama/Llama-2-7b-hff is not in the "
                                    f"Hugging Face cache ({hub}) and HF_HUB_OFFLINE is set, so "
                                    f"vLLM cannot fetch it; did you mean "
                                    f"meta-llama/Llama-2-7b-hf (cached)?\n")


# ------------------------------------------------------------------ models that do not exist

def test_profile_with_a_missing_folder_exits_2_before_any_engine(tmp_path, monkeypatch):
    import tuned.profiler.command as pcli

    def no_engine(*a, **kw):
        raise AssertionError("an engine was started")

    monkeypatch.setattr(pcli, "start_engine", no_engine)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["profile", "--model", "./nosuch", "--out", "p.json"])
    assert (code, out) == (2, "")
    assert err == ("tuned: --model: model folder './nosuch' does not exist (or is not a "
                   "folder); pass an existing model folder, a Hugging Face id (owner/name) or "
                   "demo:tiny / demo:small\n")


def test_bench_with_a_missing_folder_exits_2(tmp_path):
    code, out, err = run_main(["bench", "--engine", "vllm", "--model", "/nosuch/model",
                               "--workload", "poisson:rate=1,prompt=8,output=8,n=2",
                               "--out", str(tmp_path / "b")])
    assert (code, out) == (2, "")
    assert err == ("tuned bench: --model: model folder '/nosuch/model' does not exist (or is "
                   "not a folder); pass an existing model folder, a Hugging Face id "
                   "(owner/name) or demo:tiny / demo:small\n")


# ------------------------------------------------------------------ serve without a config

def test_serve_without_config_says_what_it_serves(monkeypatch):
    import tuned.launch.serve as serve

    started = []

    class FakeSupervisor:
        def __init__(self, cfg, cmd, env):
            started.append(cfg.model)

        def run(self):
            return 0

    monkeypatch.setattr(serve, "Supervisor", FakeSupervisor)
    monkeypatch.setattr(serve, "resolve_model", lambda cfg, cache: "/models/demo-small")
    code, out, err = run_main(["serve"])
    assert (code, started) == (0, ["demo:small"])
    assert err == ("tuned serve: no --config given: serving the embedded demo (demo:small, a "
                   "random-weight model built locally, no download) at "
                   "http://127.0.0.1:8000/v1; give --config FILE to serve your model\n")


# ------------------------------------------------------------------ one naming of SLAs

def test_bench_and_demo_take_the_config_spelling_and_the_old_one():
    parser = cli.build_parser()
    new = parser.parse_args(["bench", "--sla", "ttft=2,tbt=0.05", "--out", "x"])
    old = parser.parse_args(["bench", "--slo", "ttft=2,tpot=0.05", "--out", "x"])
    from tuned.bench.metrics import Slo

    assert Slo.parse(new.slo) == Slo.parse(old.slo) == Slo(ttft_s=2.0, tpot_s=0.05)
    assert parser.parse_args(["demo", "--ttft-sla-s", "3"]).ttft_slo_s == 3.0
    assert parser.parse_args(["demo", "--ttft-slo-s", "3"]).ttft_slo_s == 3.0


def test_bench_refuses_an_sla_in_milliseconds(tmp_path):
    code, out, err = run_main(["bench", "--hardware", "a100-llama2-7b", "--sla",
                               "ttft=2,tpot=50", "--workload",
                               "poisson:rate=1,prompt=8,output=8,n=2", "--out",
                               str(tmp_path / "b")])
    assert (code, out) == (2, "")
    assert err == ("tuned bench: --sla: SLO tpot=50: must be below 1 s (probably "
                   "milliseconds: the SLA is in seconds, 50 ms is 0.05)\n")


# ------------------------------------------------------------------ --explain

def test_explain_prints_numbers_as_written():
    text = config_mod.explain()
    line = next(ln for ln in text.splitlines() if ln.startswith("max_num_batched_tokens "))
    assert "in [16, 1048576]" in line
    assert "e+" not in text


# ------------------------------------------------------------------ demo --config

def test_demo_config_applies_over_the_embedded_default(tmp_path):
    f = tmp_path / "demo.toml"
    f.write_text('sla_statistic = "mean"\n')
    cfg = config_mod.load(f, base=config_mod.EMBEDDED_DEFAULT)
    assert (cfg.sla_statistic, cfg.model, cfg.tbt_sla_auto, cfg.num_gpu_blocks) == (
        "mean", "demo:small", 2.5, 48)
    assert cfg.source_path == str(f.resolve())


def test_demo_refuses_at_once_a_config_without_a_tpot_sla(tmp_path):
    f = tmp_path / "demo.toml"
    f.write_text("tbt_sla_auto = 0\n")
    code, out, err = run_main(["demo", "--config", str(f), "--log-dir",
                               str(tmp_path / "logs")])
    assert (code, out) == (2, "")
    assert err == (f"{f.resolve()}: tbt_sla_s, tbt_sla_auto: the demo needs a TPOT SLA, so "
                   "one of them must be set (tbt_sla_s > 0 in seconds, or tbt_sla_auto > 1, "
                   "a multiple of the batch-1 step; the demo's default is tbt_sla_auto = "
                   "2.5); both are 0\n")
    assert not (tmp_path / "logs").exists()
