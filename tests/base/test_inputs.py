"""Bad input refused cleanly: check-config finds at start what
would fail later, every CLI input gives exit 0 or a one-line exit 2 (never a traceback
or a hang), long values are cut, and the reload token is never written to a file."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes import run_main
from tuned import config as config_mod
from tuned.sim.engine import SimEngine, SimulationError
from tuned.base.inputs import UserError, clip, clip_path, clip_text, read_text
from tuned.commands.check_config import check_config
from tuned.sim.hardware import gpu_hardware
from tuned.base.workloads import RequestSpec, WorkloadError, parse_workload

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_PROFILE = ROOT / "profiles" / "demo-small-cpu.json"
FAST = settings(derandomize=True, database=None, max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def check(path, watchdog_s=None) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = check_config(str(path), out=out, err=err, watchdog_s=watchdog_s)
    return code, err.getvalue()


# ------------------------------------------------------------------ the shared helpers

def test_clip_cuts_long_values_with_their_length():
    assert clip("abc") == "'abc'"
    assert clip("x" * 2_000_000) == "'" + "x" * 79 + "... (2000002 chars)"
    assert clip_text("a\nb") == "a b"
    # a file's path is the name of what to fix: kept whole to 240 characters
    deep = "/var/lib/" + "d" * 200 + "/tuned.toml"
    assert clip_path(deep) == deep
    assert clip_path("/" + "p" * 300) == "/" + "p" * 239 + "... (301 chars)"


def test_read_text_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "cfg.toml"
    os.mkfifo(fifo)
    with pytest.raises(UserError) as e:
        read_text(fifo, "config file", 1000)
    assert str(e.value) == f"config file {fifo}: must be a regular file, got a FIFO"


def test_read_text_refuses_a_file_over_the_limit(tmp_path):
    f = tmp_path / "big.toml"
    f.write_text("x" * 11)
    with pytest.raises(UserError) as e:
        read_text(f, "config file", 10)
    assert e.value.problem == "must be at most 10 bytes, got 11"


# ------------------------------------------------------------------ check-config at start

def write(tmp_path, text: str, name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("args, line", [
    ('["--host", "0.0.0.0"]', "vllm_args: must not contain --host (set host in the config "
                              "instead)"),
    ('["--max_num_seqs=256"]', "vllm_args: must not contain --max_num_seqs (set "
                               "max_num_seqs in the config instead)"),
    ('["--scheduler-cls", "x.Y"]', "vllm_args: must not contain --scheduler-cls (tuned sets "
                                   "it itself and cannot run without it)"),
])
def test_vllm_args_repeating_a_config_key_are_refused(tmp_path, args, line):
    code, err = check(write(tmp_path, f"vllm_args = {args}\n"))
    assert code == 2
    assert err.splitlines() == [f"{tmp_path / 'c.toml'}: {line}"]


def test_other_vllm_args_pass(tmp_path):
    assert check(write(tmp_path, 'vllm_args = ["--dtype", "float32", "--enforce-eager"]\n')) \
        == (0, "")


def test_empty_model_is_refused(tmp_path):
    code, err = check(write(tmp_path, 'model = ""\n'))
    assert (code, err.split(": ", 1)[1]) == (
        2, "model: must be a model folder, a Hugging Face id or demo:tiny / "
        "demo:small, got ''\n")


def test_a_huge_value_is_cut_in_the_problem_line(tmp_path):
    code, err = check(write(tmp_path, 'max_num_seqs = "' + "y" * 200_000 + '"\n'))
    assert code == 2
    line = err.split(": ", 1)[1].rstrip("\n")
    assert line == ("max_num_seqs: must be an integer in [1, 4096], got '" + "y" * 79
                    + "... (200002 chars)")


def test_interval_checked_against_the_watchdog(tmp_path):
    p = write(tmp_path, "interval_s = 16.0\nstale_after_s = 40.0\n")
    code, err = check(p, watchdog_s=30.0)
    assert code == 2
    assert [line.split(": ", 1)[1] for line in err.splitlines()] == [
        "interval_s: must be <= 15 (half the systemd watchdog of 30 s: pings ride on "
        "ticks), got 16"]
    assert check(write(tmp_path, "interval_s = 0.5\n", "ok.toml"), watchdog_s=1.0) == (0, "")
    assert check(p, watchdog_s=None) == (0, "")       # no watchdog: nothing to ping
    assert check(p, watchdog_s=120.0) == (0, "")


def test_check_config_cli_reads_the_watchdog_it_is_given(tmp_path, monkeypatch):
    p = write(tmp_path, "interval_s = 20.0\nstale_after_s = 45.0\n")
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert run_main(["check-config", str(p)])[0] == 2            # the unit's 30 s
    assert run_main(["check-config", "--watchdog-s", "0", str(p)])[0] == 0
    monkeypatch.setenv("WATCHDOG_USEC", str(100 * 10**6))
    assert run_main(["check-config", str(p)])[0] == 0


def test_metrics_port_zero_is_refused_for_the_service(tmp_path):
    code, err = check(write(tmp_path, "metrics_port = 0\n"))
    assert code == 2 and "metrics_port: must be in [1, 65535] for `tuned serve`" in err


@pytest.mark.parametrize("policy, line", [
    ("os:system", "batch_policy: 'os:system' must name a policy class (with "
                  "decide(observation) -> Decision), got a builtin_function_or_method, not a "
                  "class"),
    ("json:JSONDecoder", "batch_policy: 'json:JSONDecoder' must name a policy class (with "
                         "decide(observation) -> Decision), got a class without a decide "
                         "method"),
    ("no_such_module_x:Cls", "batch_policy: cannot load 'no_such_module_x:Cls': "
                             "ModuleNotFoundError: No module named 'no_such_module_x'"),
])
def test_plugins_are_imported_and_type_checked(tmp_path, policy, line):
    code, err = check(write(tmp_path, f'batch_policy = "{policy}"\n'))
    assert (code, err.split(": ", 1)[1]) == (2, line + "\n")


def test_a_plugin_policy_class_passes(tmp_path):
    # tuned's own fault-injection policies are plugins of this shape
    assert check(write(tmp_path, 'batch_policy = "tuned.policies.registry:StaticPolicy"\n')) \
        == (0, "")


def _profile(tmp_path, change) -> Path:
    d = json.loads(SHIPPED_PROFILE.read_text())
    change(d)
    p = tmp_path / "p.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("change, problem", [
    (lambda d: d["fits"].update(kv_demand={"mean": 100.0, "var": -5.0, "n": 10}),
     "'fits.kv_demand.var' must be >= 0, got -5.0"),
    (lambda d: d["fits"]["step_time"]["params"].update(gamma=-1e-3),
     "'fits.step_time.params.gamma' must be >= 0 (more work never takes less time), "
     "got -0.001"),
    (lambda d: d["fits"]["usl"]["params"].update(sigma=2.0),
     "'fits.usl.params.sigma' must be in [0, 1], got 2.0"),
])
def test_profile_contents_are_validated(tmp_path, change, problem):
    p = _profile(tmp_path, change)
    code, err = check(write(tmp_path, f'profile = "{p}"\n'))
    assert (code, err.split(": ", 1)[1]) == (2, f"profile: {problem} ({p})\n")


def test_a_profile_without_fits_is_refused(tmp_path):
    p = _profile(tmp_path, lambda d: d.update(fits={"usl": None, "speed": None,
                                                    "step_time": None, "kv_demand": None}))
    code, err = check(write(tmp_path, f'profile = "{p}"\n'))
    assert (code, err.split(": ", 1)[1]) == (
        2, "profile: must have a step-time, speed or USL fit, has none (re-fit it with "
           "`tuned fit`)\n")


def test_the_shipped_profile_and_configs_pass(tmp_path):
    assert check(write(tmp_path, f'profile = "{SHIPPED_PROFILE}"\ntbt_sla_s = 0.05\n'
                                 f'queue_policy = "saber"\n'), watchdog_s=30.0) == (0, "")
    for p in (ROOT / "tests" / "data" / "configs" / "good.toml",
              ROOT / "systemd" / "tuned.toml.example"):
        assert check(p, watchdog_s=30.0) == (0, ""), p


def test_a_deeply_nested_profile_is_one_line(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = run_main(["profile", "show", str(p)])
    assert (code, err) == (2, f"tuned: {p}: malformed JSON: nested too deeply\n")


# ------------------------------------------------------------------ CLI: no abbreviations

def test_an_abbreviated_option_is_not_read_as_another():
    code, out, err = run_main(["serve", "--model", "/models/llama-7b"])
    # serve has no --model: with abbreviations argparse read it as --model-cache
    # (the subcommand's own parser answers, naming the config key that sets the model)
    assert (code, err) == (2, "tuned serve: unrecognized arguments: --model /models/llama-7b; "
                              "set model in the config file (--config FILE) "
                              "(see tuned serve --help)\n")


def test_usage_errors_are_one_line():
    code, out, err = run_main(["simulate", "--hardware", "a100-llama2-7b", "--workload",
                               "poisson:rate=1,prompt=5,output=5,n=3", "--out", "x",
                               "--seed", "abc"])
    assert (code, err) == (2, "tuned simulate: argument --seed: invalid int value: 'abc' "
                              "(see tuned simulate --help)\n")


# ------------------------------------------------------------------ workloads and the simulator

@pytest.mark.parametrize("spec, problem", [
    ("poisson:rate=1e-320,prompt=5,output=5,n=3",
     "the last arrival is at inf s, must be <= 2.592e+06 s (30 days)"),
    ("gamma:rate=1,cv=1e200,prompt=5,output=5,n=3", "cv='1e200' must be a number in (0, 1000]"),
    ("gamma:rate=1,cv=1e-9,prompt=5,output=5,n=3",
     "cv='1e-9' must be a number in [0.001, 1000]"),
    ("poisson:rate=1,prompt=5,output=5,n=99999999999",
     "n='99999999999' must be an integer in [1, 1000000]"),
])
def test_workloads_that_would_hang_or_overflow_are_refused(spec, problem):
    with pytest.raises(WorkloadError) as e:
        parse_workload(spec)
    assert problem in str(e.value)


@pytest.mark.parametrize("cell", ["inf", "1e400", "-1", "nan"])
def test_trace_token_counts_out_of_range_are_refused(tmp_path, cell):
    f = tmp_path / "t.csv"
    f.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,{cell},5\n")
    with pytest.raises(WorkloadError) as e:
        parse_workload(f"trace:{f}")
    assert str(e.value) == f"trace {f}: line 2: token counts must be in [0, 16777216]"


def test_the_simulator_refuses_an_arrival_past_its_bound():
    hw = gpu_hardware("a100-llama2-7b")
    cfg = config_mod.validate({"num_gpu_blocks": hw.num_gpu_blocks})
    eng = SimEngine(cfg, hw.step_model, block_size=hw.block_size,
                    num_gpu_blocks=hw.num_gpu_blocks, max_sim_s=100.0)
    reqs = [RequestSpec("r0", 0.0, 5, 5, 5), RequestSpec("r1", 1e300, 5, 5, 5)]
    with pytest.raises(SimulationError) as e:
        eng.run(reqs)
    assert str(e.value) == ("workload: the last arrival at 1e+300 s is past the simulator's "
                            "bound of 100 s of virtual time")


# ------------------------------------------------------------------ the reload token

def test_simulate_never_writes_the_reload_token(tmp_path):
    cfg = write(tmp_path, 'reload_token = "s3cret-token"\nnum_gpu_blocks = 500\n')
    out = tmp_path / "out"
    code, _, err = run_main(["simulate", "--config", str(cfg), "--hardware", "a100-llama2-7b",
                             "--workload", "poisson:rate=4,prompt=8,output=8,n=3",
                             "--out", str(out)])
    assert code == 0, err
    text = (out / "result.json").read_text()
    assert "s3cret" not in text and "reload_token" not in json.loads(text)["config"]
    assert (out / "result.json").stat().st_mode & 0o777 == 0o600


def test_bench_config_toml_leaves_the_token_out():
    from tuned.bench.live import config_to_toml

    cfg = config_mod.validate({"reload_token": "s3cret-token", "max_num_seqs": 8})
    assert "s3cret" not in config_to_toml(cfg) and "max_num_seqs = 8" in config_to_toml(cfg)


# ------------------------------------------------------------------ property: every parser

NUMBERS = st.sampled_from(["1", "3", "0", "-1", "2.5", "1e400", "1e-320", "inf", "nan", "",
                           "x", "99999999999", "1e300", "U(1,4)", "LN(9e99,1)", "N(5,-1)",
                           "Exp(0)", "U(4,1)", "(", "1" * 500])


def assert_clean(code, err: str, lines_per_problem: bool = False):
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        lines = err.splitlines()
        assert lines and (lines_per_problem or len(lines) == 1), err
        assert all(len(line) < 1000 for line in lines), err


@FAST
@given(kind=st.sampled_from(["poisson", "gamma", "saber", "lmsys", "phase-shift", "bogus",
                             "phases"]),
       fields=st.dictionaries(st.sampled_from(["rate", "cv", "prompt", "output", "n", "mix",
                                               "arrival", "length_scale", "max_tokens",
                                               "scale", "zz"]), NUMBERS, max_size=6))
def test_property_workload_specs_exit_0_or_2(tmp_path, kind, fields):
    # valid runs stay short: every valid rate in NUMBERS is >= 1, every valid n <= 3
    body = ",".join(f"{k}={v}" for k, v in fields.items())
    spec = f"phases:poisson:{body};lmsys:rate=1,n=2" if kind == "phases" else f"{kind}:{body}"
    code, _, err = run_main(["simulate", "--hardware", "a100-llama2-7b", "--workload", spec,
                             "--out", str(tmp_path / "o")])
    assert_clean(code, err)


CELLS = st.sampled_from(["0", "1", "2.5", "-1", "inf", "nan", "1e400", "1e300", "x", "",
                         "5", '"', "9" * 40])


@FAST
@given(header=st.sampled_from(["arrived_at,num_prefill_tokens,num_decode_tokens",
                               "arrived_at,num_prefill_tokens", "a,b,c", ""]),
       rows=st.lists(st.lists(CELLS, min_size=0, max_size=4), max_size=4),
       fields=st.sampled_from(["", ",n=2", ",rate=1e-320", ",time_scale=1e300", ",n=0",
                               ",length_scale=1e9", ",rate=2"]))
def test_property_trace_files_exit_0_or_2(tmp_path, header, rows, fields):
    f = tmp_path / "t.csv"
    f.write_text("\n".join([header] + [",".join(r) for r in rows]) + "\n")
    code, _, err = run_main(["simulate", "--hardware", "a100-llama2-7b", "--workload",
                             f"trace:{f}{fields}", "--out", str(tmp_path / "o")])
    assert_clean(code, err)


TOML_VALUES = st.sampled_from(["0", "-1", "1e400", "inf", "nan", "0.5", "3", "99999999999999999999",
                               '""', '"x"', '"' + "z" * 5000 + '"', "[]", '["--host", "h"]',
                               "{a = 1}", "true", '"os:system"', '"demo:tiny"', "[[1]]",
                               "[" * 60 + "]" * 60])


@FAST
@given(items=st.dictionaries(st.sampled_from(sorted(config_mod.FIELDS) + ["zz"]), TOML_VALUES,
                             max_size=5),
       garbage=st.sampled_from(["", "\x00", "= =", "[a\n[a]\n", "\xff"]))
def test_property_config_files_exit_0_or_2(tmp_path, items, garbage):
    f = tmp_path / "c.toml"
    f.write_text("\n".join(f"{k} = {v}" for k, v in items.items()) + "\n" + garbage,
                 encoding="utf-8", errors="surrogateescape")
    code, _, err = run_main(["check-config", str(f)])
    assert_clean(code, err, lines_per_problem=True)


JSON_VALUES = st.sampled_from([None, -1, -1e300, 0, 1e308, "x", [], {}, [1, "a"], True,
                               {"name": "usl_throughput"}, "z" * 5000, 2 ** 70])
PROFILE_PATHS = [("schema_version",), ("fits", "kv_demand", "var"), ("fits", "kv_demand"),
                 ("fits", "step_time", "params", "a"), ("fits", "step_time", "params", "beta"),
                 ("fits", "usl", "params", "kappa"), ("fits", "speed", "best"),
                 ("fits", "speed"), ("samples", "steps", "step_s"), ("levels",),
                 ("meta", "model"), ("fits", "usl", "n_samples"), ("fits",)]


@FAST
@given(changes=st.lists(st.tuples(st.sampled_from(PROFILE_PATHS), JSON_VALUES), max_size=3))
def test_property_profile_files_exit_0_or_2(tmp_path, changes):
    d = json.loads(SHIPPED_PROFILE.read_text())
    for path, value in changes:
        node = d
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[path[-1]] = value
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    code, _, err = run_main(["profile", "show", str(f)])
    assert_clean(code, err)
