"""tuned inside your own vLLM command line: where the
scheduler finds its config (tuned serve's hand-off, ``--additional-config``'s
``config_path``, ``TUNED_CONFIG``), the check of the engine's own arguments against
it, ``max_model_len``'s default, and ``tuned serve --print-command``."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys

import pytest

from tuned import config as config_mod
from tuned.launch import launcher
from tuned.commands.cli import main
from tuned.config import ConfigError, engine_setup, validate
from tuned.config.checks import engine_problems
from tuned.config.sources import CONFIG_ENV

GOOD = 'max_num_seqs = 8\nmax_num_batched_tokens = 256\nmax_model_len = 256\nmetrics_port = 0\n'


def write(tmp_path, text: str, name: str = "tuned.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(call) -> list[str]:
    with pytest.raises(ConfigError) as e:
        call()
    return e.value.problems


# ------------------------------------------------------------------ where the config comes from

def test_handoff_from_tuned_serve_wins_and_is_not_reread(tmp_path):
    path = write(tmp_path, 'max_num_seqs = 8\nmax_num_batched_tokens = 256\n')
    cfg = config_mod.load(path)
    write(tmp_path, "max_num_seqs = 'changed since'\n")  # the shipped config is used
    setup = engine_setup(config_mod.engine_handoff(cfg, "http://127.0.0.1:8000/health"),
                         {CONFIG_ENV: "/elsewhere.toml"})
    assert (setup.cfg.max_num_seqs, setup.cfg.source_path, setup.serving_url,
            setup.reload_token_sha256) == (8, str(path.resolve()),
                                           "http://127.0.0.1:8000/health", "")


def test_config_path_in_additional_config(tmp_path):
    path = write(tmp_path, GOOD + 'reload_token = "s3cret"\n')
    setup = engine_setup({"tuned": {"config_path": str(path),
                                    "serving_url": "http://127.0.0.1:8000/health"}}, {})
    assert (setup.cfg.max_num_seqs, setup.cfg.max_model_len, setup.cfg.source_path) == (
        8, 256, str(path.resolve()))
    assert setup.serving_url == "http://127.0.0.1:8000/health"
    # the endpoint compares digests, as with tuned serve's hand-off
    assert setup.reload_token_sha256 == hashlib.sha256(b"s3cret").hexdigest()


def test_config_from_the_environment(tmp_path):
    path = write(tmp_path, GOOD)
    for additional in (None, {}, {"tuned": {}}, {"other_plugin": 1}):
        setup = engine_setup(additional, {CONFIG_ENV: str(path)})
        assert (setup.cfg.source_path, setup.serving_url) == (str(path.resolve()), None)
    # both naming the same file is fine
    setup = engine_setup({"tuned": {"config_path": str(path)}}, {CONFIG_ENV: str(path)})
    assert setup.cfg.max_num_seqs == 8


def test_no_config_runs_the_defaults_with_the_engines_settings():
    setup = engine_setup({}, {}, {**ENGINE, "max_num_seqs": 16})
    assert (setup.cfg.max_num_seqs, setup.cfg.max_num_batched_tokens, setup.cfg.model,
            setup.cfg.queue_policy, setup.cfg.source_path, setup.overridden) == (
        16, 256, "meta-llama/Llama-2-7b-hf", "fcfs", "", ())


def test_two_different_files_are_refused(tmp_path):
    a, b = write(tmp_path, GOOD, "a.toml"), write(tmp_path, GOOD, "b.toml")
    assert problems_of(lambda: engine_setup({"tuned": {"config_path": str(a)}},
                                            {CONFIG_ENV: str(b)})) == [
        f"config_path: additional_config names {a} and TUNED_CONFIG names {b}; give one"]


@pytest.mark.parametrize("additional, problem", [
    ({"tuned": "/etc/tuned/tuned.toml"},
     "additional_config.tuned: must be a JSON object such as {\"config_path\": "
     "\"/etc/tuned/tuned.toml\"}, got '/etc/tuned/tuned.toml'"),
    ({"tuned": {"config_file": "x"}},
     "additional_config.tuned: unknown key config_file; did you mean config_path? (known: "
     "config_path, serving_url and the config's keys, see `tuned check-config --explain`)"),
    ({"tuned": {"config_path": 3}},
     "additional_config.tuned.config_path: must be a file path string, got 3"),
    ({"tuned": {"config_path": "x", "serving_url": 8000}},
     "additional_config.tuned.serving_url: must be a URL string, got 8000"),
])
def test_malformed_additional_config(additional, problem):
    assert problems_of(lambda: engine_setup(additional, {})) == [problem]


def test_the_hand_off_in_the_environment_and_a_broken_one():
    """`tuned serve` hands its validated config over in TUNED_HANDOFF; a drop-in's own
    ``--additional-config`` tuned entry stands over it; text that is no JSON object is
    refused naming the variable."""
    cfg = config_mod.validate({"max_num_seqs": 12, "interval_s": 0.75})
    env = {"TUNED_HANDOFF": json.dumps(config_mod.engine_handoff(cfg, "http://h:1/health")
                                       ["tuned"])}
    setup = engine_setup({}, env)
    assert (setup.cfg.max_num_seqs, setup.cfg.interval_s, setup.serving_url) == \
        (12, 0.75, "http://h:1/health")
    assert engine_setup({"tuned": {"interval_s": 2.0}}, env).cfg.interval_s == 2.0
    assert problems_of(lambda: engine_setup({}, {"TUNED_HANDOFF": "{max_num_seqs"})) == [
        "TUNED_HANDOFF: must be the JSON object `tuned serve` writes, got '{max_num_seqs'"]


def test_a_bad_file_is_refused_as_check_config_refuses_it(tmp_path):
    path = write(tmp_path, "max_num_seqs = 0\n")
    assert problems_of(lambda: engine_setup({}, {CONFIG_ENV: str(path)})) == [
        "max_num_seqs: must be in [1, 4096], got 0"]
    missing = tmp_path / "none.toml"
    [problem] = problems_of(lambda: engine_setup({}, {CONFIG_ENV: str(missing)}))
    assert problem.startswith("cannot read config file: ")


# ------------------------------------------------------------------ the engine's own arguments

ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "max_model_len": 256,
          "num_gpu_blocks": None, "model": "meta-llama/Llama-2-7b-hf"}


def test_engine_agrees():
    cfg = validate({"model": "meta-llama/Llama-2-7b-hf", "max_num_seqs": 8,
                    "max_num_batched_tokens": 256, "max_model_len": 256})
    assert engine_problems(cfg, ENGINE) == []


def test_engine_contradicts_the_config():
    cfg = validate({"model": "meta-llama/Llama-2-7b-hf", "max_num_seqs": 32,
                    "max_num_batched_tokens": 256, "max_model_len": 256,
                    "num_gpu_blocks": 48})
    assert engine_problems(cfg, {**ENGINE, "max_num_seqs": 256,
                                 "model": "meta-llama/Llama-2-13b-hf"}) == [
        "max_num_seqs: the config says 32, the engine runs --max-num-seqs 256; pass "
        "--max-num-seqs 32 to vLLM or set max_num_seqs = 256 in the config",
        "num_gpu_blocks: the config says 48, the engine was started without "
        "--num-gpu-blocks-override; pass --num-gpu-blocks-override 48 to vLLM",
        "model: the config says meta-llama/Llama-2-7b-hf, the engine runs --model "
        "meta-llama/Llama-2-13b-hf; give both the same model"]


def test_model_own_length_and_demo_length():
    # max_model_len = 0: whatever the model's own length is
    cfg = validate({"model": "meta-llama/Llama-2-7b-hf", "max_num_seqs": 8,
                    "max_num_batched_tokens": 256})
    assert engine_problems(cfg, {**ENGINE, "max_model_len": 4096}) == []
    # a demo model runs at 1024 unless set; the folder given to vLLM is not compared
    demo = validate({"model": "demo:small", "max_num_seqs": 8, "max_num_batched_tokens": 256})
    assert engine_problems(demo, {**ENGINE, "max_model_len": 1024, "model": "/x/small"}) == []
    assert engine_problems(demo, {**ENGINE, "max_model_len": 2048}) == [
        "max_model_len: the config says 1024, the engine runs --max-model-len 2048; pass "
        "--max-model-len 1024 to vLLM or set max_model_len = 2048 in the config"]


def test_model_folder_compared_by_path(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = validate({"model": "./m", "max_num_seqs": 8, "max_num_batched_tokens": 256,
                    "max_model_len": 256})
    assert engine_problems(cfg, {**ENGINE, "model": str(tmp_path / "m")}) == []
    assert engine_problems(cfg, {**ENGINE, "model": str(tmp_path)})[0].startswith(
        "model: the config says ./m, the engine runs --model ")


# ------------------------------------------------------------------ max_model_len

def test_max_model_len_default_is_the_models_own():
    assert config_mod.Config().max_model_len == 0
    assert validate({"model": "meta-llama/Llama-2-7b-hf"}).effective_max_model_len is None
    assert validate({"model": "demo:tiny"}).effective_max_model_len == 1024
    assert validate({"model": "demo:tiny", "max_model_len": 512}).effective_max_model_len == 512
    assert validate({"model": "meta-llama/Llama-2-7b-hf",
                     "max_model_len": 2048}).effective_max_model_len == 2048


def test_max_model_len_range():
    assert problems_of(lambda: validate({"max_model_len": 8})) == [
        "max_model_len: must be 0 (the model's own) or in [16, 1048576], got 8"]


def test_no_max_model_len_flag_for_the_models_own():
    cfg = validate({"model": "meta-llama/Llama-2-7b-hf"})
    assert "--max-model-len" not in launcher.scheduler_command(cfg, cfg.model)
    demo = validate({"model": "demo:tiny"})
    cmd = launcher.scheduler_command(demo, "/cache/tiny")
    assert cmd[cmd.index("--max-model-len") + 1] == "1024"


# ------------------------------------------------------------------ tuned serve --print-command

def _printed(capsys, argv) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_print_command(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(launcher.KV_CACHE_SPACE_ENV, raising=False)
    model = tmp_path / "model"
    model.mkdir()
    path = write(tmp_path, f'model = "{model}"\n' + GOOD.replace("metrics_port = 0\n", "")
                 + 'port = 8100\nvllm_args = ["--dtype", "float32"]\n')
    code, out, err = _printed(capsys, ["serve", "--print-command", str(path), "--",
                                       "--enforce-eager"])
    assert (code, err) == (0, "")
    assert out.count("\n") == 1
    cmd = shlex.split(out)
    assert cmd == ["env", "VLLM_CPU_KVCACHE_SPACE=1", sys.executable, "-m",
                   "vllm.entrypoints.openai.api_server", "--model", str(model),
                   "--host", "127.0.0.1", "--port", "8100", "--max-num-seqs", "8",
                   "--max-num-batched-tokens", "256", "--max-model-len", "256",
                   "--scheduler-cls", "tuned.engines.vllm.TunedScheduler",
                   "--additional-config", cmd[-4], "--dtype", "float32", "--enforce-eager"]
    assert json.loads(cmd[-4]) == {"tuned": {"config_path": str(path.resolve()),
                                             "serving_url": "http://127.0.0.1:8100/health"}}
    # the same with --config
    assert _printed(capsys, ["serve", "--config", str(path), "--print-command", "--",
                             "--enforce-eager"]) == (0, out, "")


def test_print_command_keeps_the_operators_kv_space(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(launcher.KV_CACHE_SPACE_ENV, "8")
    path = write(tmp_path, 'model = "meta-llama/Llama-2-7b-hf"\n')
    code, out, _ = _printed(capsys, ["serve", "--print-command", str(path)])
    cmd = shlex.split(out)
    assert (code, cmd[:2], "--max-model-len" in cmd) == (0, ["env", "VLLM_CPU_KVCACHE_SPACE=8"],
                                                         False)
    assert cmd[cmd.index("--model") + 1] == "meta-llama/Llama-2-7b-hf"


def test_print_command_refusals(tmp_path, capsys):
    path = write(tmp_path, 'model = "/models/none-here"\n')
    code, out, err = _printed(capsys, ["serve", "--print-command", str(path)])
    assert (code, out) == (2, "")
    assert err.startswith("model: model folder '/models/none-here' does not exist")
    # the engine reads its config by path: the embedded default has none
    assert _printed(capsys, ["serve", "--print-command"]) == (
        2, "", "tuned serve: --print-command: give a config file (--print-command FILE): "
               "the engine reads it by path\n")
    other = write(tmp_path, GOOD, "other.toml")
    assert _printed(capsys, ["serve", "--config", str(other), "--print-command", str(path)]) == (
        2, "", f"tuned serve: --print-command: names {path} and --config names {other}; "
               "give one\n")
    bad = write(tmp_path, 'model = "meta-llama/Llama-2-7b-hf"\n', "bad.toml")
    code, out, err = _printed(capsys, ["serve", "--print-command", str(bad), "--",
                                       "--max-num-seqs", "4"])
    assert (code, out) == (2, "")
    assert err == (f"{bad.resolve()}: arguments after --: must not contain --max-num-seqs "
                   "(set max_num_seqs in the config instead)\n")


# ------------------------------------------------------------------ check-config and serve agree

def test_check_config_reads_the_model_as_serve_does(tmp_path, capsys, monkeypatch):
    from tuned.commands.check_config import check_config

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache
    hf = write(tmp_path, 'model = "meta-llama/Llama-2-7b-hf"\n', "hf.toml")
    missing = write(tmp_path, 'model = "/models/none-here"\n', "missing.toml")
    assert check_config([str(hf)]) == 0
    assert check_config([str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == f"{hf}: ok\n"
    # an id is valid; one not in the local cache gets a note (vLLM downloads it)
    assert err == (f"{hf}: note: model: meta-llama/Llama-2-7b-hf is not in the Hugging Face "
                   f"cache ({tmp_path / 'hub'}): vLLM downloads it at start\n"
                   f"{missing}: model: model folder '/models/none-here' does not exist (or is "
                   "not a folder); pass an existing model folder, a Hugging Face id "
                   "(owner/name) or demo:tiny / demo:small\n")


# ------------------------------------------------------------------ in a real scheduler

def test_scheduler_reads_the_file_the_command_line_names(tmp_path, tiny_model, monkeypatch):
    from fakes import make_scheduler

    path = write(tmp_path, GOOD + "fallback_cap = 2\n")
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    s = make_scheduler(str(tiny_model), False,
                       additional_config={"tuned": {"config_path": str(path)}})
    try:
        assert (s.controller.cfg.fallback_cap, s.controller.cfg.source_path) == (
            2, str(path.resolve()))
    finally:
        s.shutdown()
    monkeypatch.setenv(CONFIG_ENV, str(path))
    s = make_scheduler(str(tiny_model), False, additional_config={})
    try:
        assert s.controller.cfg.source_path == str(path.resolve())
    finally:
        s.shutdown()


def test_scheduler_refuses_a_contradicting_engine(tmp_path, tiny_model, monkeypatch, capfd):
    from fakes import make_scheduler

    path = write(tmp_path, GOOD.replace("max_num_seqs = 8", "max_num_seqs = 16"))
    monkeypatch.setenv(CONFIG_ENV, str(path))
    with pytest.raises(ConfigError) as e:
        make_scheduler(str(tiny_model), False, additional_config={})
    assert e.value.problems == [
        "max_num_seqs: the config says 16, vLLM was given --max-num-seqs 8; remove it "
        "from the config or give both the same value"]
    assert (f"tuned: config refused: {path.resolve()}: max_num_seqs: the config says 16"
            in capfd.readouterr().err)
