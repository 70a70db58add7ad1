"""`tuned simulate`: the command line, result.json as its module docstring documents
it, byte-identical reruns, and every refusal with exit code 2 and a message naming
what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from tuned import config as config_mod
from tuned.commands.cli import main
from tuned.sim.hardware import gpu_hardware
from tuned.core.ring import StepSample
from tuned.base.workloads import parse_workload

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "demo-small-cpu.json"
SPEC = "poisson:rate=5,prompt=U(16,256),output=U(16,128),n=40"
CONFIG = "max_num_seqs = 16\nmax_num_batched_tokens = 512\ntbt_sla_s = 0.03\n"

TOP_KEYS = {"requests", "steps", "decisions", "summary", "hardware", "config", "workload",
            "failed", "refused"}     # and "events" with --events
REQUEST_KEYS = {"id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s",
                "finish_s", "preemptions", "refused_s"}


@pytest.fixture(autouse=True)
def _structlog_defaults():
    # the command points structlog at this test's captured stderr; later tests must
    # not log into a closed capture
    yield
    structlog.reset_defaults()


def write_config(tmp_path: Path, text: str = CONFIG, name: str = "tuned.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def simulate(tmp_path: Path, *extra: str, config: str | None = CONFIG, out: str = "out",
             hardware: str | None = "a100-llama2-7b", workload: str | None = SPEC,
             seed: str = "1") -> tuple[int, Path]:
    argv = ["simulate", "--seed", seed, "--out", str(tmp_path / out)]
    if config is not None:
        argv += ["--config", write_config(tmp_path, config)]
    if hardware is not None:
        argv += ["--hardware", hardware]
    if workload is not None:
        argv += ["--workload", workload]
    return main(argv + list(extra)), tmp_path / out / "result.json"


def strict_json(text: str) -> dict:
    def refuse(name):
        raise ValueError(f"result.json holds {name}, not valid JSON")
    return json.loads(text, parse_constant=refuse)


def test_simulate_writes_the_documented_result_json(tmp_path, capsys):
    rc, path = simulate(tmp_path)
    assert rc == 0
    out = capsys.readouterr().out
    # the config it runs, first: the hardware's engine, then the file's keys
    hw = gpu_hardware("a100-llama2-7b")
    assert out.startswith(
        "config:\n  max_num_seqs             16\n  max_num_batched_tokens   512\n"
        f"  max_model_len            8192\n  num_gpu_blocks           {hw.num_gpu_blocks}\n"
        "  tbt_sla_s                0.03\nsimulated 40 requests on a100-llama2-7b in ")
    assert f"wrote {path}" in out
    doc = strict_json(path.read_text())
    assert set(doc) == TOP_KEYS
    # requests: one row per request of the workload, in arrival order, all finished
    wl = parse_workload(SPEC, 1, max_model_len=8192)
    assert [set(r) for r in doc["requests"]] == [REQUEST_KEYS] * 40
    assert [(r["id"], r["arrival_s"], r["prompt_tokens"], r["output_tokens"])
            for r in doc["requests"]] == \
        [(s.request_id, s.arrival_s, s.prompt_tokens, s.output_tokens) for s in wl.requests]
    for r in doc["requests"]:
        assert r["arrival_s"] < r["first_token_s"] <= r["finish_s"]
    assert doc["failed"] == []
    # steps: the live ring's fields; decisions as /decisions shows them
    assert doc["steps"] and all(list(s) == sorted(StepSample._fields) for s in doc["steps"])
    assert sum(s["generated_tokens"] for s in doc["steps"]) == \
        sum(s.output_tokens for s in wl.requests)
    assert doc["decisions"][0]["t"] == 0.0
    for d in doc["decisions"]:
        assert {"t", "seq", "cap", "token_budget", "reason", "target", "lower",
                "upper"} <= set(d)
        assert 1 <= d["cap"] <= 16 and d["token_budget"] <= 512
    assert [d["seq"] for d in doc["decisions"]] == list(range(1, len(doc["decisions"]) + 1))
    # the engine's size is the hardware's where the file leaves it to vLLM
    assert doc["hardware"]["name"] == "a100-llama2-7b"
    assert doc["hardware"]["num_gpu_blocks"] == hw.num_gpu_blocks
    assert doc["config"]["num_gpu_blocks"] == hw.num_gpu_blocks
    assert (doc["config"]["max_num_seqs"], doc["config"]["tbt_sla_s"]) == (16, 0.03)
    assert doc["workload"]["spec"] == SPEC and doc["workload"]["n"] == 40
    s = doc["summary"]
    assert (s["completed"], s["failed"], s["submitted"]) == (40, 0, 40)
    assert s["steps"] == len(doc["steps"]) and s["decisions"] == len(doc["decisions"])
    assert s["final_cap"] == doc["decisions"][-1]["cap"]
    assert s["simulated_s"] == max(r["finish_s"] for r in doc["requests"])


def test_two_runs_with_one_seed_write_identical_bytes(tmp_path):
    runs = [simulate(tmp_path, out=f"out{i}") for i in range(2)]
    assert [rc for rc, _ in runs] == [0, 0]
    a, b = (p.read_bytes() for _, p in runs)
    assert a == b
    rc, other = simulate(tmp_path, out="out-seed2", seed="2")
    assert rc == 0 and other.read_bytes() != a


def test_data_dir_names_the_operator_tables(tmp_path, capsys):
    import shutil

    from tuned.data import vidur_dir

    tables = shutil.copytree(vidur_dir(), tmp_path / "tables")
    rc, packaged = simulate(tmp_path, out="packaged")
    rc_dd, copied = simulate(tmp_path, "--data-dir", str(tables), out="copied")
    assert (rc, rc_dd) == (0, 0)
    assert copied.read_bytes() == packaged.read_bytes()
    capsys.readouterr()
    (tmp_path / "partial" / "a100").mkdir(parents=True)   # models are cached per folder
    rc, path = simulate(tmp_path, "--data-dir", str(tmp_path / "partial"), out="missing")
    assert rc == 2 and not path.exists()
    assert capsys.readouterr().err == (
        "tuned simulate: operator profile not found at "
        f"{(tmp_path / 'partial').resolve()}/a100/Llama-2-7b-hf/mlp.csv\n")


def test_data_dir_is_for_hardware_only(tmp_path, capsys):
    rc, path = simulate(tmp_path, "--profile", str(PROFILE), "--data-dir", str(tmp_path),
                        hardware=None)
    assert rc == 2 and not path.exists()
    assert capsys.readouterr().err == ("tuned simulate: --data-dir: applies only with "
                                       "--hardware (GPU operator tables)\n")


def test_result_json_does_not_depend_on_the_hash_seed(tmp_path):
    """Two processes with different string hashing (set and dict orders of ids,
    classes) write the same bytes, with a queue policy that keeps per-class state."""
    cfg = write_config(tmp_path, CONFIG + 'queue_policy = "saber"\n'
                       '[class_deadlines_s]\nqna = 1.0\n')
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"h{hash_seed}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, "-m", "tuned", "simulate", "--config", cfg, "--hardware",
             "a100-llama2-7b", "--workload", "saber:mix=W3,rate=6,n=40,length_scale=0.3",
             "--seed", "3", "--out", str(out)], env=env, cwd=ROOT, capture_output=True,
            text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outs.append((out / "result.json").read_bytes())
    assert outs[0] == outs[1]
    assert strict_json(outs[0].decode())["config"]["queue_policy"] == "saber"


def test_profile_gives_the_step_model_and_cache_of_the_profiled_host(tmp_path):
    rc, path = simulate(tmp_path, "--profile", str(PROFILE), hardware=None,
                        workload="poisson:rate=4,prompt=U(16,128),output=U(8,64),n=20")
    assert rc == 0
    doc = strict_json(path.read_text())
    meta = json.loads(PROFILE.read_text())["meta"]["engine"]
    assert doc["hardware"]["name"] == "profile:demo-small-cpu.json"
    assert doc["hardware"]["step_model"]["kind"] == "profile"
    assert doc["hardware"]["block_size"] == meta["block_size"] == 128
    assert doc["config"]["num_gpu_blocks"] == meta["num_gpu_blocks"]
    assert doc["summary"]["completed"] == 20


def test_without_a_config_the_default_runs_on_the_hardwares_engine(tmp_path):
    # the embedded default's engine (32 sequences, 48 blocks of 128 tokens) is the CPU
    # demo's; on an A100 the run starts from vLLM's A100 engine, as `tuned bench` does
    rc, path = simulate(tmp_path, config=None)
    assert rc == 0
    doc = strict_json(path.read_text())
    engine = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "max_model_len": 8192,
              "num_gpu_blocks": gpu_hardware("a100-llama2-7b").num_gpu_blocks}
    assert {k: doc["config"][k] for k in engine} == engine
    for key, value in config_mod.EMBEDDED_DEFAULT.items():
        if key not in engine:
            assert doc["config"][key] == value, key


def test_simulate_and_bench_start_from_one_engine(tmp_path):
    """`tuned simulate --hardware a100-llama2-7b` runs vLLM's A100 defaults (256
    sequences), the config `tuned bench` builds for that hardware."""
    from argparse import Namespace

    from tuned.bench.command import base_config
    from tuned.bench.metrics import Slo
    from tuned.sim.hardware import engine_defaults

    for hardware, seqs in (("a100-llama2-7b", 256), ("h100-llama2-7b", 1024)):
        rc, path = simulate(tmp_path, config=None, hardware=hardware, out=hardware,
                            workload="poisson:rate=5,prompt=U(16,64),output=U(8,16),n=5")
        assert rc == 0
        ran = strict_json(path.read_text())["config"]
        bench = base_config(Namespace(config=None), Slo(),
                            engine_defaults(gpu_hardware(hardware))).to_dict()
        for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                    "num_gpu_blocks"):
            assert ran[key] == bench[key], key
        assert ran["max_num_seqs"] == seqs


def test_static_batching_admits_only_into_an_empty_engine(tmp_path):
    rc, path = simulate(tmp_path, "--static-batching")
    assert rc == 0
    steps = strict_json(path.read_text())["steps"]
    prev_running = 0
    for s in steps:
        if s["num_prefill_reqs"]:
            assert prev_running == 0, s
        prev_running = s["num_running"]
    assert sum(1 for s in steps if s["num_prefill_reqs"]) > 1


# ------------------------------------------------------------------ refusals

def test_unknown_hardware_names_the_known_ones(tmp_path, capsys):
    rc, path = simulate(tmp_path, hardware="b200-llama2-7b")
    assert rc == 2 and not path.exists()
    err = capsys.readouterr().err
    assert "unknown hardware 'b200-llama2-7b'" in err
    for name in ("a100-llama2-7b", "h100-llama2-7b", "a100-llama2-70b", "h100-llama2-70b"):
        assert name in err


@pytest.mark.parametrize("spec, message", [
    ("poisson:rate=x,prompt=16,output=16,n=4", "rate='x' must be a number > 0"),
    ("poisson:rate=2,prompt=16,output=16,n=4,bogus=1", "unknown field 'bogus' for poisson"),
    ("poisson:rate=2,prompt=16,output=16", "missing n="),
    ("poisson:rate=2,prompt=U(9,3),output=16,n=4", "prompt='U(9,3)' must have 1 <= low"),
    ("uniform:rate=2", "unknown kind 'uniform'"),
    ("trace:/nonexistent/trace.csv", "trace /nonexistent/trace.csv:"),
])
def test_a_bad_workload_spec_names_the_field(tmp_path, capsys, spec, message):
    rc, path = simulate(tmp_path, workload=spec)
    assert rc == 2 and not path.exists()
    err = capsys.readouterr().err
    assert err.startswith("tuned simulate: workload") or err.startswith("tuned simulate: trace")
    assert message in err


def test_missing_workload_is_an_argparse_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        simulate(tmp_path, workload=None)
    assert e.value.code == 2
    assert "the following arguments are required: --workload" in capsys.readouterr().err


def test_hardware_and_profile_are_one_or_the_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        simulate(tmp_path, "--profile", str(PROFILE))
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        simulate(tmp_path, hardware=None)
    assert e.value.code == 2
    assert "one of the arguments --hardware --profile is required" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("max_num_seqs = 0\n", "max_num_seqs: must be in [1, 4096], got 0"),
    ("max_num_seqs = 64\nmax_num_batched_tokens = 64\n",
     "max_num_batched_tokens: must be >= max_num_seqs + min_chunk_tokens (96), got 64"),
    ("max_num_seq = 8\n", "max_num_seq: unknown key"),
    ('queue_policy = "lifo"\n', "queue_policy: must be one of fcfs, mcsf"),
    ("max_num_seqs = \n", "not valid TOML"),
])
def test_a_config_problem_names_the_field(tmp_path, capsys, text, message):
    rc, path = simulate(tmp_path, config=text)
    assert rc == 2 and not path.exists()
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith(str((tmp_path / "tuned.toml").resolve()) + ": ")


def test_a_missing_config_file_is_refused(tmp_path, capsys):
    rc = main(["simulate", "--config", str(tmp_path / "none.toml"), "--hardware",
               "a100-llama2-7b", "--workload", SPEC, "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "cannot read config file" in capsys.readouterr().err


def test_a_profile_without_kv_blocks_needs_them_in_the_config(tmp_path, capsys):
    doc = json.loads(PROFILE.read_text())
    del doc["meta"]["engine"]["num_gpu_blocks"]
    prof = tmp_path / "noblocks.json"
    prof.write_text(json.dumps(doc))
    rc, path = simulate(tmp_path, "--profile", str(prof), hardware=None)
    assert rc == 2 and not path.exists()
    assert "num_gpu_blocks: must be >= 2, got 0 (profile:noblocks.json does not record" \
        in capsys.readouterr().err
    rc, path = simulate(tmp_path, "--profile", str(prof), hardware=None,
                        config=CONFIG + "num_gpu_blocks = 200\n")
    assert rc == 0
    assert strict_json(path.read_text())["config"]["num_gpu_blocks"] == 200


def test_a_missing_profile_file_is_refused(tmp_path, capsys):
    rc, _ = simulate(tmp_path, "--profile", str(tmp_path / "none.json"), hardware=None)
    assert rc == 2
    assert f"tuned simulate: {tmp_path / 'none.json'}: file not found" in \
        capsys.readouterr().err
