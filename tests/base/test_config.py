"""tuned.config: the field table's defaults and the values "0" stands for, one exact line
per bad field (range, type, choice, unknown key with its did-you-mean, the secret never
echoed), the cross-field rules, reading a file, and the shipped example configs carried
through every way a config travels (a TOML file written by bench, the hand-off into the
engine) unchanged. The CLI's answer to the same mistakes (exit 2, one line) is in
commands/test_check_config.py and commands/test_cli_mistakes.py."""

from __future__ import annotations

import dataclasses
import hashlib
import tomllib
from pathlib import Path

import pytest

from tuned import config
from tuned.config import Config, ConfigError, validate
from tuned.config.files import MAX_CONFIG_BYTES
from tuned.config.handoff import from_engine_handoff, reload_token_digest
from tuned.config.schema import RESTART_FIELDS, restart_changes
from tuned.base.demo_model import DEMO_MAX_MODEL_LEN

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"
EXAMPLES = [ROOT / "systemd" / "tuned.toml.example",
            *sorted((ROOT / "systemd" / "examples").glob("*.toml"))]
KNOWN = "(known keys: see `tuned check-config --explain`)"


def problems(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as e:
        validate(raw)
    return e.value.problems


# ------------------------------------------------------------------ defaults


def test_an_empty_file_is_the_documented_defaults():
    cfg = validate({})
    assert cfg == Config()
    assert (cfg.model, cfg.max_num_seqs, cfg.max_num_batched_tokens) == ("demo:small", 32, 2048)
    assert (cfg.host, cfg.port, cfg.metrics_host, cfg.metrics_port) == \
        ("127.0.0.1", 8000, "127.0.0.1", 9464)
    assert (cfg.interval_s, cfg.stale_after_s, cfg.fallback_cap) == (0.5, 5.0, 4)
    assert (cfg.batch_policy, cfg.queue_policy, cfg.token_budget_policy) == ("tuned", "fcfs", "auto")
    assert (cfg.on_max_wait, cfg.admission_guard, cfg.log_level) == ("refuse", "tpot", "info")
    assert cfg.tbt_sla_s == 0.0 and not cfg.sla_enabled


def test_the_default_explain_prints_is_the_default_a_config_gets():
    # `tuned check-config --explain` prints metadata["default"]; Config() uses the
    # dataclass default: one table, so they cannot differ
    empty = Config()
    for name, f in config.FIELDS.items():
        assert getattr(empty, name) == f.metadata["default"], name
    lines = config.explain().splitlines()
    # one line per key, then a blank line and the policies' own options
    n = len(config.FIELDS)
    assert [ln.split(" (", 1)[0] for ln in lines[:n]] == list(config.FIELDS)
    assert (lines[n], lines[n + 1]) == ("", "Policies (batch_policy, queue_policy) and their "
                                        "options (batch_options, queue_options):")
    assert lines[1] == ("max_num_seqs (int, default 32, in [1, 4096]) [restart]: ceiling on "
                        "running sequences handed to vLLM; tuned's cap moves inside "
                        "[b_min, max_num_seqs]")


def test_source_path_is_not_a_key():
    assert "source_path" not in config.FIELDS
    assert problems({"source_path": "x"}) == [f"source_path: unknown key {KNOWN}"]


def test_what_zero_stands_for():
    cfg = validate({"max_num_seqs": 48, "interval_s": 15.0, "stale_after_s": 30.0})
    assert cfg.b_max == 0 and cfg.effective_b_max == 48
    assert cfg.engine_stall_s == 0 and cfg.effective_engine_stall_s == 30.0   # 2 x interval_s
    assert validate({}).effective_engine_stall_s == 20.0                   # at least 20 s
    # max_model_len 0: the demo models' own length, else the model's (no flag)
    assert validate({}).effective_max_model_len == DEMO_MAX_MODEL_LEN
    assert validate({"model": "owner/name"}).effective_max_model_len is None
    assert validate({"model": "owner/name", "max_model_len": 4096}).effective_max_model_len == 4096


def test_the_wait_bound_and_its_aging_point():
    assert validate({}).wait_bound_spec() is None                           # no TTFT, no bound
    assert validate({"ttft_sla_s": 3.0}).wait_bound_spec() == (3.0, True, 1.5)   # at the target
    assert validate({"max_wait_s": 100.0}).wait_bound_spec() == (100.0, True, 50.0)
    assert validate({"ttft_sla_s": 3.0, "on_max_wait": "serve"}).wait_bound_spec() == \
        (30.0, False, 6.0)
    assert validate({"ttft_sla_s": 3.0, "on_max_wait": "off"}).wait_bound_spec() is None
    # the aging point never passes the bound
    assert validate({"max_wait_s": 4.0, "age_after_s": 9.0}).wait_bound_spec() == (4.0, True, 4.0)


def test_fcfs_with_a_ttft_target_demotes_late_requests_unless_told_otherwise():
    assert validate({}).queue_spec() == ("fcfs", {})
    assert validate({"ttft_sla_s": 2.0}).queue_spec() == ("fcfs", {"late_after_s": 2.0})
    assert validate({"ttft_sla_s": 2.0, "queue_options": {"late_after_s": 5.0}}).queue_spec() \
        == ("fcfs", {"late_after_s": 5.0})
    assert validate({}).native_queue
    assert not validate({"ttft_sla_s": 2.0}).native_queue


# ------------------------------------------------------------------ one field at a time


@pytest.mark.parametrize("raw, line", [
    # out of range, integer and float, closed and half-open
    ({"max_num_seqs": 0}, "max_num_seqs: must be in [1, 4096], got 0"),
    ({"max_num_seqs": 10**30},
     "max_num_seqs: must be in [1, 4096], got 1000000000000000000000000000000"),
    ({"interval_s": 0.001}, "interval_s: must be in [0.05, 60], got 0.001"),
    ({"eps_m": 0.9}, "eps_m: must be in [1e-06, 0.5], got 0.9"),
    ({"gpu_memory_floor": 1.0}, "gpu_memory_floor: must be in [0, 1), got 1.0"),
    # the window reads the engines' finished-request ring, which holds 4096
    ({"demand_window": 5000}, "demand_window: must be in [2, 4096], got 5000"),
    ({"tbt_sla_s": 50}, "tbt_sla_s: must be in [0, 1), got 50 (probably milliseconds: "
                        "the SLA is in seconds, 50 ms is 0.05)"),
    # wrong type: the range comes with it; a bool is no number, a float no integer
    ({"max_num_seqs": "32"}, "max_num_seqs: must be an integer in [1, 4096], got '32'"),
    ({"max_num_seqs": 8.0}, "max_num_seqs: must be an integer in [1, 4096], got 8.0"),
    ({"max_num_seqs": True}, "max_num_seqs: must be an integer in [1, 4096], got True"),
    ({"tbt_sla_s": True}, "tbt_sla_s: must be a number in [0, 1), got True"),
    ({"interval_s": "fast"}, "interval_s: must be a number in [0.05, 60], got 'fast'"),
    ({"interval_s": float("inf")}, "interval_s: must be a finite number in [0.05, 60], got inf"),
    ({"model": 3}, "model: must be a string, got 3"),
    ({"vllm_args": "--enforce-eager"},
     "vllm_args: must be a list of strings, got '--enforce-eager'"),
    ({"queue_options": 3}, "queue_options: must be a table, got 3"),
    # a choice
    ({"on_max_wait": "drop"}, "on_max_wait: must be one of refuse, serve, off, got 'drop'"),
    ({"sla_statistic": "p99"},
     "sla_statistic: must be one of auto, mean, p90, attainment, decode_p90, got 'p99'"),
    ({"sla_attainment_target": 0.3},
     "sla_attainment_target: must be in [0.5, 0.999], got 0.3"),
    ({"sla_attainment_target": 1.0},
     "sla_attainment_target: must be in [0.5, 0.999], got 1.0"),
    ({"log_level": "verbose"},
     "log_level: must be one of debug, info, warning, error, got 'verbose'"),
    ({"sla_mode": 1}, "sla_mode: must be a string, got 1"),
    # an address
    ({"host": "a b"}, "host: must be an IP address or a host name, got 'a b' (letters, "
                      "digits, '-' and '.' only, no label starting or ending with '-')"),
    ({"metrics_host": "10.0.0.300"},
     "metrics_host: must be an IP address or a host name, got '10.0.0.300' "
     "(not a valid IP address)"),
    # unknown keys: the closest known key when there is one
    ({"max_num_seq": 8}, f"max_num_seq: unknown key; did you mean max_num_seqs? {KNOWN}"),
    ({"intervall_s": 1.0}, f"intervall_s: unknown key; did you mean interval_s? {KNOWN}"),
    ({"zzzz": 1}, f"zzzz: unknown key {KNOWN}"),
])
def test_a_bad_field_is_one_line_naming_it_and_what_it_allows(raw, line):
    assert problems(raw) == [line]


def test_a_toml_section_is_an_unknown_key():
    with pytest.raises(ConfigError) as e:
        config.load(CONFIGS / "unknown_key.toml")
    assert e.value.problems == [
        f"max_batch_size: unknown key; did you mean max_wait_s? {KNOWN}",
        f"engine: unknown key; did you mean engine_stall_s? {KNOWN}"]


def test_the_reload_token_is_never_quoted():
    [line] = problems({"reload_token": 123456})
    assert line == "reload_token: must be a string (value not shown)"
    assert "123456" not in repr(validate({"reload_token": "s3cret-123456"}))


def test_every_bad_field_is_reported_at_once_in_file_order():
    with pytest.raises(ConfigError) as e:
        config.load(CONFIGS / "out_of_range.toml")
    assert e.value.problems == [
        "eps_m: must be in [1e-06, 0.5], got 0.9",
        "metrics_port: must be in [0, 65535], got 70000",
        "interval_s: must be in [0.05, 60], got 0.001",
        "b_min: must be in [1, 4096], got 0",
        f"queue_policy: must be one of {', '.join(config.QUEUE_POLICIES)}, got 'lifo'"]
    # the message carries the file, then the problems on one line
    assert str(e.value) == f"{e.value.source}: " + "; ".join(e.value.problems)
    assert e.value.source == str((CONFIGS / "out_of_range.toml").resolve())


def test_a_long_value_is_cut_in_its_line():
    assert problems({"z" * 400: 1}) == [f"{'z' * 80}... (400 chars): unknown key {KNOWN}"]
    assert problems({"port": "p" * 400}) == [
        f"port: must be an integer in [1, 65535], got '{'p' * 79}... (402 chars)"]


# ------------------------------------------------------------------ fields together


@pytest.mark.parametrize("raw, line", [
    ({"max_num_seqs": 16, "b_max": 64}, "b_max: must be <= max_num_seqs (16), got 64"),
    ({"max_num_seqs": 8, "b_min": 9}, "b_min: must be <= b_max (8), got 9"),   # b_max 0 = 8
    ({"max_num_seqs": 8, "fallback_cap": 9}, "fallback_cap: must be <= max_num_seqs (8), got 9"),
    ({"max_num_seqs": 64, "max_num_batched_tokens": 80},
     "max_num_batched_tokens: must be >= max_num_seqs + min_chunk_tokens (96), got 80"),
    ({"interval_s": 2.0, "stale_after_s": 3.0},
     "stale_after_s: must be >= 2 * interval_s (4), got 3"),
    ({"engine_stall_s": 0.5}, "engine_stall_s: must be 0 (auto) or >= 2 * interval_s (1), got 0.5"),
    ({"tbt_sla_auto": 1.0},
     "tbt_sla_auto: must be 0 (off) or > 1 (a multiple of the batch-1 step time), got 1"),
    ({"tbt_sla_s": 0.01, "eps_d_s": 0.02}, "eps_d_s: must be < tbt_sla_s (0.01), got 0.02"),
    ({"port": 9000, "metrics_port": 9000}, "metrics_port: must be different from port (9000)"),
    ({"max_model_len": 8}, "max_model_len: must be 0 (the model's own) or in [16, 1048576], got 8"),
    ({"model": "  "},
     "model: must be a model folder, a Hugging Face id or demo:tiny / demo:small, got ''"),
    ({"class_deadlines_s": {"gold": -1}},
     "class_deadlines_s.gold: must be a number of seconds > 0, got -1"),
    ({"vllm_args": ["--max-num-seqs", "4"]},
     "vllm_args: must not contain --max-num-seqs (set max_num_seqs in the config instead)"),
])
def test_contradicting_fields(raw, line):
    assert problems(raw) == [line]


def test_the_same_address_on_another_host_is_no_contradiction():
    cfg = validate({"port": 9000, "metrics_port": 9000, "metrics_host": "127.0.0.2"})
    assert (cfg.port, cfg.metrics_port) == (9000, 9000)


def test_cross_field_rules_wait_until_every_field_is_valid_on_its_own():
    # b_max > max_num_seqs would also be wrong, but the bad type comes alone first
    assert problems({"max_num_seqs": "8", "b_max": 64}) == \
        ["max_num_seqs: must be an integer in [1, 4096], got '8'"]


# ------------------------------------------------------------------ files


def test_a_relative_profile_is_read_from_the_configs_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "p.json").write_text("{}")
    path = tmp_path / "sub" / "tuned.toml"
    path.write_text('profile = "p.json"\n')
    assert config.load(path).profile == str(tmp_path / "sub" / "p.json")
    with pytest.raises(ConfigError) as e:
        config.load(CONFIGS / "missing_profile.toml")
    assert e.value.problems == ["profile: must be an existing file, not found: "
                                f"{(CONFIGS / 'no-such-profile.json').resolve()}"]


def test_what_is_not_a_toml_config_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        config.load(CONFIGS / "invalid_toml.toml")
    assert e.value.problems == ["not valid TOML: Invalid value (at line 3, column 8)"]
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'model = "caf\xe9"\n')
    with pytest.raises(ConfigError) as e:
        config.load(latin)
    assert len(e.value.problems) == 1
    assert e.value.problems[0].startswith("not UTF-8") and \
        e.value.problems[0].endswith(": a TOML file must be UTF-8")
    with pytest.raises(ConfigError) as e:
        config.load(tmp_path)
    assert e.value.problems[0].startswith("cannot read config file: ")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError) as e:
        config.load(big)
    assert e.value.problems[0].startswith("cannot read config file: ")


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_config_survives_every_way_a_config_travels(path, tmp_path):
    from tuned.bench.live import config_to_toml

    cfg = config.load(path)
    raw = tomllib.loads(path.read_text())
    # what the file says is what the config holds; the rest are the defaults
    assert {k: getattr(cfg, k) for k in raw} == raw
    assert all(getattr(cfg, n) == f.metadata["default"]
               for n, f in config.FIELDS.items() if n not in raw)

    # written back as TOML (what `tuned bench` hands its servers) and read again
    again = tmp_path / "again.toml"
    again.write_text(config_to_toml(cfg))
    back = config.load(again)
    assert back == cfg
    assert dataclasses.asdict(back) | {"source_path": ""} == \
        dataclasses.asdict(cfg) | {"source_path": ""}

    # shipped into the engine (`tuned serve` -> the scheduler) and read there
    shipped, url = from_engine_handoff(config.engine_handoff(cfg, "http://h:1/v1"))
    assert shipped == cfg and url == "http://h:1/v1"
    assert shipped.source_path == str(path.resolve())   # a reload re-reads this file
    assert restart_changes(cfg, shipped) == []


def test_the_reload_token_travels_into_the_engine_as_a_digest_only():
    cfg = validate({"reload_token": "s3cret"})
    handoff = config.engine_handoff(cfg)
    assert "s3cret" not in repr(handoff)
    assert reload_token_digest(handoff) == hashlib.sha256(b"s3cret").hexdigest()
    shipped, _ = from_engine_handoff(handoff)
    assert shipped.reload_token == "" and shipped == dataclasses.replace(cfg, reload_token="")


def test_the_embedded_default_is_valid_and_what_serve_runs_without_a_file():
    cfg = config.default()
    assert {k: getattr(cfg, k) for k in config.EMBEDDED_DEFAULT} == config.EMBEDDED_DEFAULT
    assert cfg.source_path == ""


def test_a_reload_names_the_fields_that_need_a_restart():
    old = validate({})
    new = validate({"max_num_seqs": 64, "port": 8001, "interval_s": 1.0, "tbt_sla_s": 0.05})
    assert restart_changes(old, new) == ["max_num_seqs", "port"]
    assert set(RESTART_FIELDS) >= {"model", "max_num_seqs", "port", "metrics_port"}
    assert "interval_s" not in RESTART_FIELDS
