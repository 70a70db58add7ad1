"""tuned dropped into an existing vLLM command line: its own keys from the TOML,
``TUNED_<KEY>`` variables and ``--additional-config``, in that order of precedence; the
engine's settings read from vLLM; a source that repeats one with another value refused
with one line naming both (tuned.config.engine_setup), and by tuned's vLLM plugin in
the process that parses the arguments, before the model loads."""

from __future__ import annotations

import pytest

from tuned import config as config_mod
from tuned.config import ConfigError, engine_setup
from tuned.config.schema import restart_changes
from tuned.config.sources import CONFIG_ENV, reread

#: what the engine runs, as tuned.engines.vllm_plugin.engine_settings reads it
ENGINE = {"max_num_seqs": 16, "max_num_batched_tokens": 512, "max_model_len": 1024,
          "num_gpu_blocks": None, "model": "meta-llama/Llama-2-7b-hf",
          "given": frozenset({"max_num_seqs", "max_num_batched_tokens", "model"})}


def write(tmp_path, text: str, name: str = "tuned.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(call) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        call()
    return e.value


# ------------------------------------------------------------------ the engine's settings

def test_engine_keys_come_from_the_engine_when_no_source_sets_them():
    cfg = engine_setup(None, {}, ENGINE).cfg
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len,
            cfg.num_gpu_blocks, cfg.model) == (16, 512, 1024, 0, "meta-llama/Llama-2-7b-hf")
    # the rest are tuned's defaults, not the embedded demo's
    assert (cfg.tbt_sla_s, cfg.tbt_sla_auto, cfg.queue_policy, cfg.source_path) == (
        0.0, 0.0, "fcfs", "")
    assert engine_setup(None, {}, {**ENGINE, "num_gpu_blocks": 48}).cfg.num_gpu_blocks == 48


def test_a_repeated_engine_key_that_agrees_is_fine(tmp_path):
    path = write(tmp_path, "max_num_seqs = 16\nmax_model_len = 0\nnum_gpu_blocks = 0\n"
                           'model = "demo:small"\nqueue_policy = "mcsf"\n')
    cfg = engine_setup({}, {CONFIG_ENV: str(path)}, ENGINE).cfg
    # 0 (the engine's own choice) and a demo model are no contradiction: the engine's
    assert (cfg.max_num_seqs, cfg.max_model_len, cfg.model, cfg.queue_policy) == (
        16, 1024, "meta-llama/Llama-2-7b-hf", "mcsf")


def test_a_contradicting_toml_is_one_line_naming_both_values(tmp_path):
    path = write(tmp_path, "max_num_seqs = 8\n")
    e = refused(lambda: engine_setup({}, {CONFIG_ENV: str(path)}, ENGINE))
    assert config_mod.refusal_lines(e) == [
        f"tuned: config refused: {path.resolve()}: max_num_seqs: the config says 8, vLLM "
        "was given --max-num-seqs 16; remove it from the config or give both the same value"]


def test_contradictions_from_each_source(tmp_path):
    path = write(tmp_path, "num_gpu_blocks = 48\n")
    e = refused(lambda: engine_setup(
        {"tuned": {"config_path": str(path), "max_model_len": 2048}},
        {"TUNED_MAX_NUM_BATCHED_TOKENS": "1024"}, {**ENGINE, "given": frozenset()}))
    assert config_mod.refusal_lines(e) == [
        "tuned: config refused: max_num_batched_tokens: TUNED_MAX_NUM_BATCHED_TOKENS says "
        "1024, vLLM runs --max-num-batched-tokens 512 (its default); unset it or give both "
        "the same value",
        "tuned: config refused: max_model_len: --additional-config says 2048, vLLM runs "
        "--max-model-len 1024 (its default); remove it from --additional-config or give "
        "both the same value",
        f"tuned: config refused: {path.resolve()}: num_gpu_blocks: the config says 48, vLLM "
        "was started without --num-gpu-blocks-override; remove it from the config or give "
        "both the same value"]


def test_a_model_the_config_names_must_be_the_engines(tmp_path):
    e = refused(lambda: engine_setup({"tuned": {"model": "meta-llama/Llama-2-13b-hf"}}, {},
                                     ENGINE))
    assert e.problems == [
        "model: --additional-config says 'meta-llama/Llama-2-13b-hf', vLLM was given --model "
        "meta-llama/Llama-2-7b-hf; remove it from --additional-config or give both the "
        "same value"]


# ------------------------------------------------------------------ precedence

def test_additional_config_over_environment_over_toml_over_defaults(tmp_path):
    path = write(tmp_path, 'queue_policy = "mcsf"\ninterval_s = 0.25\nttft_sla_s = 2.0\n'
                           'profile = "p.json"\n')
    write(tmp_path, "{}", "p.json")
    setup = engine_setup({"tuned": {"config_path": str(path), "queue_policy": "multibin",
                                    "tbt_sla_s": 0.05}},
                         {"TUNED_QUEUE_POLICY": "fcfs", "TUNED_INTERVAL_S": "0.3"}, ENGINE)
    cfg = setup.cfg
    assert (cfg.queue_policy, cfg.interval_s, cfg.ttft_sla_s, cfg.tbt_sla_s, cfg.log_level) == (
        "multibin", 0.3, 2.0, 0.05, "info")
    # a relative profile is read beside the TOML that names it
    assert cfg.profile == str(tmp_path / "p.json")
    assert setup.overridden == (
        "interval_s: TUNED_INTERVAL_S (0.3) overrides " + str(path.resolve()) + " (0.25)",
        "queue_policy: TUNED_QUEUE_POLICY ('fcfs') overrides " + str(path.resolve())
        + " ('mcsf')",
        "queue_policy: additional_config.tuned.queue_policy ('multibin') overrides "
        "TUNED_QUEUE_POLICY ('fcfs')")
    # two sources that agree override nothing
    assert engine_setup({"tuned": {"queue_policy": "fcfs"}}, {"TUNED_QUEUE_POLICY": "fcfs"},
                        ENGINE).overridden == ()


def test_a_cross_field_problem_names_the_sources_it_came_from(tmp_path):
    path = write(tmp_path, "interval_s = 2.0\n")
    e = refused(lambda: engine_setup({}, {CONFIG_ENV: str(path), "TUNED_STALE_AFTER_S": "3"},
                                     ENGINE))
    assert (e.source, e.problems) == (f"{path.resolve()} + TUNED_* variables",
                                      ["stale_after_s: must be >= 2 * interval_s (4), got 3"])


# ------------------------------------------------------------------ TUNED_<KEY>

def test_environment_values_are_typed_as_the_toml_is():
    cfg = engine_setup(None, {"TUNED_QUEUE_POLICY": "mcsf", "TUNED_TBT_SLA_S": "0.05",
                              "TUNED_B_MAX": "12", "TUNED_QUEUE_OPTIONS":
                              "{reserve_fraction = 0.1}", "TUNED_LOG_LEVEL": "debug"},
                       ENGINE).cfg
    assert (cfg.queue_policy, cfg.tbt_sla_s, cfg.b_max, cfg.queue_options, cfg.log_level) == (
        "mcsf", 0.05, 12, {"reserve_fraction": 0.1}, "debug")


@pytest.mark.parametrize("var, value, problem", [
    ("TUNED_MAX_NUM_SEQS", "many",
     "TUNED_MAX_NUM_SEQS: must be an integer in [1, 4096], got 'many'"),
    ("TUNED_B_MAX", "5000", "TUNED_B_MAX: must be in [0, 4096], got 5000"),
    ("TUNED_TBT_SLA_S", "50",
     "TUNED_TBT_SLA_S: must be in [0, 1), got 50 (probably milliseconds: the SLA "
     "is in seconds, 50 ms is 0.05)"),
    ("TUNED_QUEUE_POLICY", "sjf", None),
    ("TUNED_INTERVAL_S", "", "TUNED_INTERVAL_S: must be a number in [0.05, 60], got ''"),
    ("TUNED_QUEUE_POLICYY", "mcsf",
     "TUNED_QUEUE_POLICYY: no such setting; did you mean TUNED_QUEUE_POLICY? (a config "
     "key as TUNED_<KEY>: see `tuned check-config --explain`)"),
])
def test_a_bad_variable_is_one_line_naming_it(var, value, problem):
    e = refused(lambda: engine_setup(None, {var: value}, ENGINE))
    if problem is None:     # the policy names come from the catalog: the line names them
        [problem] = e.problems
        assert problem.startswith(f"{var}: must be one of fcfs, ") and \
            problem.endswith(", got 'sjf'"), problem
    else:
        assert e.problems == [problem]


def test_the_projects_other_tuned_variables_are_no_keys(tmp_path):
    path = write(tmp_path, "b_max = 4\n")
    others = {CONFIG_ENV: str(path), "TUNED_ADMISSION_URL": "http://h:1/admission",
              "TUNED_EXTRA": "bench", "TUNED_FAULT_MODE_FILE": "/tmp/x",
              "TUNED_TEST_DTYPE": "float32", "TUNED_TEST_STDERR_FULL_TRIGGER": "3"}
    assert engine_setup(None, others, ENGINE).cfg.b_max == 4


def test_the_reload_token_from_the_environment_travels_as_its_digest():
    import hashlib

    setup = engine_setup(None, {"TUNED_RELOAD_TOKEN": "s3cret"}, ENGINE)
    assert (setup.cfg.reload_token, setup.reload_token_sha256) == (
        "s3cret", hashlib.sha256(b"s3cret").hexdigest())


# ------------------------------------------------------------------ --additional-config

def test_inline_keys_beside_config_path(tmp_path):
    cfg = engine_setup({"tuned": {"queue_policy": "mcsf", "tbt_sla_s": 0.05,
                                  "queue_options": {"reserve_fraction": 0.1},
                                  "serving_url": "http://127.0.0.1:8000/health"}},
                       {}, ENGINE).cfg
    assert (cfg.queue_policy, cfg.tbt_sla_s, cfg.queue_options) == (
        "mcsf", 0.05, {"reserve_fraction": 0.1})


def test_a_bad_inline_value_names_where_it_was_given():
    e = refused(lambda: engine_setup({"tuned": {"interval_s": "fast"}}, {}, ENGINE))
    assert e.problems == ["additional_config.tuned.interval_s: must be a number in "
                          "[0.05, 60], got 'fast'"]
    e = refused(lambda: engine_setup({"tuned": {"queue_polcy": "mcsf"}}, {}, ENGINE))
    assert e.problems == [
        "additional_config.tuned: unknown key queue_polcy; did you mean queue_policy? "
        "(known: config_path, serving_url and the config's keys, see `tuned check-config "
        "--explain`)"]


# ------------------------------------------------------------------ reload

def test_reload_rebuilds_from_the_same_sources(tmp_path):
    path = write(tmp_path, 'queue_policy = "mcsf"\ninterval_s = 0.25\n')
    setup = engine_setup({"tuned": {"config_path": str(path), "tbt_sla_s": 0.05}},
                         {"TUNED_INTERVAL_S": "0.3"}, ENGINE)
    write(tmp_path, 'queue_policy = "multibin"\ninterval_s = 0.5\n')
    new = reread(setup.cfg)
    # the file's new policy; the variable and the inline key as at start; the engine's
    assert (new.queue_policy, new.interval_s, new.tbt_sla_s, new.max_num_seqs) == (
        "multibin", 0.3, 0.05, 16)
    assert restart_changes(setup.cfg, new) == []
    # with no file at all, a reload keeps tuned's defaults (not the embedded demo's)
    bare = engine_setup(None, {}, ENGINE).cfg
    assert reread(bare) == bare
    # a file edited to contradict the engine is refused, as at start
    write(tmp_path, "max_num_seqs = 8\n")
    assert refused(lambda: reread(setup.cfg)).problems == [
        "max_num_seqs: the config says 8, vLLM was given --max-num-seqs 16; remove it from "
        "the config or give both the same value"]


def test_to_dict_carries_no_sources():
    cfg = engine_setup({"tuned": {"queue_policy": "mcsf"}}, {}, ENGINE).cfg
    assert "sources" not in cfg.to_dict()
    assert config_mod.validate({k: v for k, v in cfg.to_dict().items()
                                if k != "source_path"}) == cfg


# ------------------------------------------------------------------ the vLLM plugin

def _engine_args(model, **kw):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model), max_num_seqs=16, max_num_batched_tokens=512,
                      max_model_len=256, **kw)


def test_plugin_refuses_before_the_engine_starts(tiny_model, tmp_path, monkeypatch, capfd):
    """vLLM's own EngineArgs.create_engine_config (no engine, no model load) with the
    plugin vLLM loaded from tuned's entry point."""
    from vllm.usage.usage_lib import UsageContext

    from tuned.engines import vllm_plugin

    path = write(tmp_path, "max_num_seqs = 8\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    args = _engine_args(tiny_model, scheduler_cls="tuned.engines.vllm.TunedScheduler")
    vllm_plugin.register()      # vLLM did already (EngineArgs.__post_init__): once only
    assert getattr(type(args).create_engine_config, "__wrapped__").__name__ == \
        "create_engine_config"
    assert not hasattr(type(args).create_engine_config.__wrapped__, "__wrapped__")
    capfd.readouterr()
    line = (f"tuned: config refused: {path.resolve()}: max_num_seqs: the config says 8, vLLM "
            "was given --max-num-seqs 16; remove it from the config or give both the same "
            "value")
    with pytest.raises(ConfigError):        # LLM(...)
        args.create_engine_config()
    assert capfd.readouterr().err.splitlines() == [line]
    with pytest.raises(SystemExit) as e:    # the API server: the line, no traceback
        args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    assert e.value.code == 1 and capfd.readouterr().err.splitlines() == [line]
    # the same config agreeing with the engine: vLLM's config comes back as it was
    path.write_text("max_num_seqs = 16\n")
    assert args.create_engine_config().scheduler_config.max_num_seqs == 16


def test_plugin_does_nothing_without_tuneds_scheduler(tiny_model, monkeypatch, capfd):
    monkeypatch.setenv("TUNED_NO_SUCH_KEY", "1")
    monkeypatch.setenv(CONFIG_ENV, "/no/such/file.toml")
    capfd.readouterr()
    vc = _engine_args(tiny_model).create_engine_config()
    assert vc.scheduler_config.max_num_seqs == 16
    assert "tuned: config refused" not in capfd.readouterr().err


def test_plugin_names_tuneds_scheduler_only():
    from tuned.engines.vllm_plugin import names_tuned

    assert [names_tuned(c) for c in ("tuned.engines.vllm.TunedScheduler",
                                     "tuned.engines.vllm.TunedSyncScheduler",
                                     "vllm.v1.core.sched.scheduler.Scheduler",
                                     "mytuned.engines.vllm.TunedScheduler", None, int)] == [
        True, True, False, False, False, False]


def test_explain_says_engine_keys_come_from_vllm():
    assert config_mod.explain().splitlines()[-1] == (
        "Dropped into your own vLLM command line (--scheduler-cls "
        "tuned.engines.vllm.TunedScheduler), model, max_num_seqs, max_num_batched_tokens, "
        "max_model_len, num_gpu_blocks are read from vLLM's arguments (set here, they must "
        "agree with them) and every key may also be given as TUNED_<KEY> or in "
        "--additional-config '{\"tuned\": {...}}'.")
