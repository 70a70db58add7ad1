"""Profile files: round trip, schema-1 migration, errors that name the file and the
problem, and the prediction helpers the controller calls."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tuned.curves.fit import FitResult
from tuned.curves.report import profile_summary
from tuned.curves.profile import (SCHEMA_VERSION, Profile, ProfileError, build_profile,
                                  empty_columns, load_profile, save_profile, STEP_COLUMNS)

from fakes import META, V1, make_samples  # noqa: F401

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def profile():
    req, steps = make_samples()
    return build_profile(json.loads(json.dumps(META)), req, steps)


@pytest.fixture
def saved(tmp_path, profile):
    path = tmp_path / "p.json"
    save_profile(profile, path)
    return path


def test_build_profile_aggregates_and_fits(profile):
    assert [lv["concurrency"] for lv in profile.levels] == [1, 2, 4, 8, 16]
    assert [lv["num_requests"] for lv in profile.levels] == [4, 8, 16, 32, 64]
    lv4 = profile.levels[2]
    # closed loop: X = N * sum(out) / sum(duration) = 4 * mean speed (equal outputs)
    assert lv4["throughput_tok_s"] == pytest.approx(
        4 * 16 * 64 / sum(64 / v for v in profile.requests["speed_tok_s"][12:28]))
    assert profile.usl.params["sigma"] == pytest.approx(0.05, rel=0.1)
    assert profile.best_speed == "usl"
    assert profile.step_time.params["beta"] == pytest.approx(0.0006, rel=0.05)
    assert profile.kv.mean == pytest.approx(
        np.mean(np.add(profile.requests["prompt_tokens"], 64)))
    assert "step_s_mean" in profile.levels[0]


def test_save_load_round_trip(saved, profile):
    q = load_profile(saved)
    assert q.to_dict() == profile.to_dict()
    assert q.source == str(saved)
    d = json.loads(saved.read_text())
    assert d["schema_version"] == SCHEMA_VERSION == 2
    assert d["fits"]["speed"]["best"] == "usl"
    # sample columns are written one per line
    assert any(line.strip().startswith('"duration_s": [') and line.rstrip().endswith("],")
               for line in saved.read_text().splitlines())


def test_save_is_atomic_and_leaves_no_temp_file(tmp_path, profile):
    path = tmp_path / "sub" / "p.json"
    save_profile(profile, path)
    save_profile(profile, path)  # overwrite
    assert sorted(p.name for p in path.parent.iterdir()) == ["p.json"]


def test_v1_fixture_loads_and_migrates():
    p = load_profile(V1)
    assert p.migrated_from == 1
    assert p.meta["model"]["path"] == "/models/llama-3-8b-instruct"
    assert p.meta["workload"]["spec"] == "synthetic:prompt=64,output=64"
    assert [lv["concurrency"] for lv in p.levels] == [1, 2, 4, 8, 16]
    assert p.levels[1]["speed_tok_s_mean"] == pytest.approx(71.4286 / 2)
    assert p.usl.params == {"lam": 40.0, "sigma": 0.1, "kappa": 0.01}
    assert p.usl.r2 == 0.998
    assert p.best_speed == "usl"
    # the migrated speed curve is X(N)/N, and its R² on the stored rows is ~1
    assert p.speed_tok_s(4) == pytest.approx(40 / 1.42)
    assert p.speed["usl"].r2 == pytest.approx(1.0, abs=1e-8)
    assert p.step_time is None
    assert "migrated from schema 1" in profile_summary(p)


def test_v1_migrates_to_v2_on_save(tmp_path):
    p = load_profile(V1)
    out = tmp_path / "v2.json"
    save_profile(p, out)
    q = load_profile(out)
    assert json.loads(out.read_text())["schema_version"] == 2
    assert q.usl.params == p.usl.params
    assert q.speed_tok_s(8) == pytest.approx(p.speed_tok_s(8))


# --- errors ------------------------------------------------------------------------------

def write(tmp_path, text, name="bad.json"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path):
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    return str(e.value)


def test_truncated_json(tmp_path, saved):
    text = saved.read_text()
    path = write(tmp_path, text[: len(text) // 2])
    msg = error_of(path)
    assert msg.startswith(f"{path}: truncated JSON: ")
    assert "line" in msg and "column" in msg


def test_malformed_json(tmp_path):
    path = write(tmp_path, '{"schema_version": 2,, "meta": {}}')
    assert error_of(path) == (f"{path}: malformed JSON: Expecting property name enclosed in "
                              f"double quotes at line 1 column 22")


def test_empty_and_missing_file(tmp_path):
    assert error_of(write(tmp_path, "  \n")) == f"{tmp_path / 'bad.json'}: empty file"
    assert error_of(tmp_path / "nope.json") == f"{tmp_path / 'nope.json'}: file not found"


def test_not_an_object(tmp_path):
    path = write(tmp_path, "[1, 2, 3]")
    assert error_of(path) == (f"{path}: not a profile: the top level must be a JSON object, "
                              f"got a list")


def test_missing_schema_version(tmp_path):
    path = write(tmp_path, '{"meta": {}}')
    assert error_of(path) == f"{path}: missing key 'schema_version' (not a tuned profile?)"


def test_newer_schema_version(tmp_path, saved):
    d = json.loads(saved.read_text())
    d["schema_version"] = 3
    path = write(tmp_path, json.dumps(d))
    assert error_of(path) == (f"{path}: schema_version 3 is newer than this tuned can read "
                              f"(up to 2); upgrade tuned to use this profile")


def test_unknown_and_mistyped_schema_version(tmp_path, saved):
    d = json.loads(saved.read_text())
    d["schema_version"] = 0
    assert error_of(write(tmp_path, json.dumps(d))).endswith(
        ": unknown schema_version 0 (known: 1, 2)")
    d["schema_version"] = "2"
    assert error_of(write(tmp_path, json.dumps(d))).endswith(
        ": 'schema_version' must be an integer, got a string \"2\"")


def test_missing_key(tmp_path, saved):
    d = json.loads(saved.read_text())
    del d["meta"]["model"]["path"]
    path = write(tmp_path, json.dumps(d))
    assert error_of(path) == f"{path}: missing key 'meta.model.path'"


def test_wrong_type(tmp_path, saved):
    d = json.loads(saved.read_text())
    d["levels"][2]["concurrency"] = "4"
    path = write(tmp_path, json.dumps(d))
    assert error_of(path) == f"{path}: 'levels[2].concurrency' must be an integer, got a " \
                             f"string \"4\""


def test_bad_sample_column(tmp_path, saved):
    d = json.loads(saved.read_text())
    d["samples"]["steps"]["step_s"][5] = None
    assert error_of(write(tmp_path, json.dumps(d))).endswith(
        ": 'samples.steps.step_s[5]' must be a number, got null null")
    d = json.loads(saved.read_text())
    d["samples"]["requests"]["duration_s"].pop()
    assert "'samples.requests' columns differ in length: concurrency=124, " \
           "prompt_tokens=124, output_tokens=124, duration_s=123" in \
           error_of(write(tmp_path, json.dumps(d)))


def test_bad_fit(tmp_path, saved):
    d = json.loads(saved.read_text())
    d["fits"]["speed"]["cubic"] = d["fits"]["speed"]["linear"]
    assert error_of(write(tmp_path, json.dumps(d))).endswith(
        ": 'fits.speed' has unknown model 'cubic' (known: usl, linear, logistic)")
    del d["fits"]["speed"]["cubic"]
    d["fits"]["speed"]["best"] = "logistic"
    del d["fits"]["speed"]["logistic"]
    assert error_of(write(tmp_path, json.dumps(d))).endswith(
        ": 'fits.speed.best' names 'logistic', which is not among the fitted models "
        "(usl, linear)")
    d = json.loads(saved.read_text())
    del d["fits"]["usl"]["params"]["kappa"]
    assert error_of(write(tmp_path, json.dumps(d))).endswith(
        ": 'fits.usl': 'params' is missing kappa for model usl_throughput")


def test_bad_v1_usl_list(tmp_path):
    d = json.loads(V1.read_text())
    d["usl"] = [40.0, 0.1]
    path = write(tmp_path, json.dumps(d))
    assert error_of(path) == (f"{path}: 'usl' must be a list of 3 numbers [lam, sigma, "
                              f"kappa], got [40.0, 0.1]")
    d = json.loads(V1.read_text())
    del d["levels"][0]["throughput_tok_s"]
    assert error_of(write(tmp_path, json.dumps(d))).endswith(
        ": missing key 'levels[0].throughput_tok_s'")


# --- prediction helpers ------------------------------------------------------------------

def hand_profile(step_name="step_time", speed=True):
    params = {"a": 0.004, "beta": 0.0005, "gamma": 0.00001}
    if step_name == "step_time_kv":
        params["eta"] = 1e-6
    st = FitResult(step_name, params, {k: None for k in params}, 0.99, 100) if step_name \
        else None
    sp = {"usl": FitResult("usl_speed", {"lam": 100.0, "sigma": 0.1, "kappa": 0.01},
                           {"lam": None, "sigma": None, "kappa": None}, 0.99, 100)} \
        if speed else {}
    return Profile(meta=dict(META), requests=empty_columns(("concurrency",)),
                   steps=empty_columns(STEP_COLUMNS), levels=[], speed=sp,
                   best_speed="usl" if speed else None, step_time=st)


def test_predict_step_s_hand_values():
    p = hand_profile()
    # 0.004 + 0.0005*10 + 0.00001*100
    assert p.predict_step_s(10, 100) == pytest.approx(0.010)
    assert p.predict_step_s(10) == pytest.approx(0.009)
    assert p.predict_step_s(10, 100, kv_tokens=10**6) == pytest.approx(0.010)  # no KV term
    k = hand_profile("step_time_kv")
    assert k.predict_step_s(10, 100, 2000) == pytest.approx(0.012)


def test_speed_tok_s_hand_values():
    p = hand_profile()
    assert p.speed_tok_s(4) == pytest.approx(100 / 1.42)
    assert p.speed_tok_s(0) == pytest.approx(100.0)  # read as n = 1


def test_largest_batch_within():
    p = hand_profile()
    # 0.004 + 0.0005 b <= 0.0101  ->  b <= 12.2
    assert p.largest_batch_within(0.0101, 64) == 12
    assert p.largest_batch_within(0.0101, 8) == 8       # clamped to b_max
    assert p.largest_batch_within(0.001, 64) == 1       # none fits
    assert p.largest_batch_within(1.0, 32) == 32


def test_largest_chunk_within():
    p = hand_profile()
    # b = 10: 0.009 + 1e-5 c <= 0.012555  ->  c <= 355.5
    assert p.largest_chunk_within(10, 0.012555, 32, 2048) == 355
    assert p.largest_chunk_within(10, 0.005, 32, 2048) == 32    # none fits -> lo
    assert p.largest_chunk_within(10, 1.0, 32, 2048) == 2048    # all fit -> hi
    assert p.largest_chunk_within(10, 0.012555, 400, 2048) == 400
    for c in (354, 355, 356):
        assert (p.predict_step_s(10, c) <= 0.012555) == (c <= 355)


def test_predictions_without_step_fit_use_speed_curve():
    p = hand_profile(step_name=None)
    v4 = 100 / 1.42
    assert p.predict_step_s(4, 512) == pytest.approx(1 / v4)
    # 1/v(b) = (1 + 0.1(b-1) + 0.01 b(b-1)) / 100 <= 0.02 -> b = 6 (1.8/100), b = 7 (2.02/100)
    assert p.largest_batch_within(0.02, 64) == 6
    assert p.largest_chunk_within(4, 1.0, 32, 512) == 512
    assert p.largest_chunk_within(4, 0.001, 32, 512) == 32


def test_speed_without_any_fit_names_the_problem():
    p = hand_profile(speed=False)
    p.source = "x.json"
    with pytest.raises(ProfileError, match=r"^x.json: no speed curve"):
        p.speed_tok_s(2)


def test_summary_lists_levels_and_fits(profile):
    s = profile_summary(profile)
    assert "model: /models/demo-tiny (LlamaForCausalLM, 2 layers)" in s
    assert "throughput (USL): lam=" in s
    # samples drawn with sigma 0.05, kappa 0.002: N* = sqrt(0.95 / 0.002) = 21.8
    peak = float(s.split("peak at N*=")[1].split()[0])
    assert peak == pytest.approx(21.8, rel=0.15)
    assert "-> best usl" in s
    assert "step time (step_time" in s
    lines = s.splitlines()
    row = next(line for line in lines if line.split()[:2] == ["4", "16"])
    assert f"{profile.levels[2]['throughput_tok_s']:.1f}" in row


def test_refit_reproduces_fits(profile):
    q = profile.refit()
    assert q.levels == profile.levels
    assert q.usl.params == pytest.approx(profile.usl.params)
    assert q.step_time.params == pytest.approx(profile.step_time.params)
    assert math.isclose(q.speed["usl"].r2, profile.speed["usl"].r2)


def test_summary_says_no_peak_when_kappa_is_nil():
    """The shipped CPU profile fits kappa ~ 0 (N* in the millions): the summary says
    there is no peak in range instead of printing that concurrency."""
    p = load_profile(Path(__file__).parents[2] / "profiles" / "demo-small-cpu.json")
    assert p.usl.params["kappa"] < 1e-6
    assert "no peak within 10x the measured levels" in profile_summary(p)


def test_one_step_time_model_the_profile_picks_not_computes():
    """The profile times a step by curves.online's models: the fitted one, or the speed
    curve's T(b) = 1 / v(b); it has no arithmetic of its own."""
    from tuned.curves.online import LinearStepModel, SpeedStepModel

    fitted, speed_only = hand_profile(), hand_profile(step_name=None)
    assert type(fitted.timing()) is LinearStepModel
    assert fitted.timing() == fitted.step_model()
    t = speed_only.timing()
    assert type(t) is SpeedStepModel and speed_only.step_model() is None
    v4 = 100 / 1.42
    assert t.predict_step_s(4, 512, 10**6) == pytest.approx(1 / v4)
    assert t.largest_batch_within(0.02, 64) == 6
    assert t.largest_batch_within(0.001, 64) == 0            # none fits: the profile says 1
    assert speed_only.largest_batch_within(0.001, 64) == 1
    with pytest.raises(ValueError, match=r"largest_chunk_within: lo \(9\) > hi \(8\)"):
        t.largest_chunk_within(4, 1.0, 9, 8)
    import tuned.curves.profile as profile_mod
    src = Path(profile_mod.__file__).read_text()
    assert "def summary" not in src and "1.0 / v" not in src
