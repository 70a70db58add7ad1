"""Faults injected into a real vLLM CPU run: the engine serves on, the fallback cap
is applied within a bound derived from the config and the measured step times, and
a counter and a log line record each fault.

One ``tuned serve`` (module fixture) runs the batch-policy plugin
:class:`faults.FaultPolicy` (behaviour switched by a mode file), tuned's MC-SF
queue (so request hints are parsed) and a fake ``pynvml`` (a state file) first on
the engine's PYTHONPATH. The tests run in file order on it:

1. the decision function raises, returns a NaN / negative / huge cap, or takes
   longer than ``interval_s``: cause ``controller_error`` / ``invalid_decision`` /
   ``slow_decision``, applied within ``2 * interval_s + the longest step`` of the
   mode write (plus the sleep for the slow one);
2. the tick stalls longer than ``stale_after_s``: cause ``stale`` once the last good
   tick is ``stale_after_s`` old, then ``slow_decision`` when the stalled tick
   returns; ``/healthz`` answers 503 meanwhile;
3. an idle engine over several ``stale_after_s`` is not a fault;
4. NVML queries fail mid-run ("Unknown Error", then "GPU is lost"): one
   ``nvml_lost`` line each time, GPU series withdrawn, decisions go on, no fallback;
5. the profile vanishes / is corrupted between reloads: refused, the old config
   runs on; two reloads at once are serialised and the last file wins;
6. a client disconnects mid-stream: the request is aborted and its KV blocks freed
   (``tuned_kv_usage_ratio`` back to 0);
7. odd ``vllm_xargs``: served, each ignored hint counted and logged in 40 chars.

A second engine (:func:`test_metrics_port_taken_and_nvml_init_failure`) starts
with its metrics port held by the test and NVML failing to initialise.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import faults
from serve_harness import (wait_for, ROOT, Load, event_wall_s, get_json, log_events, metric_values,
                           mval, start_server, stop, tuned_serve)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

INTERVAL_S = 0.25
STALE_AFTER_S = 1.5
FALLBACK_CAP = 2
CEILING = 8
NORMAL_CAP = faults.NORMAL_CAP
assert FALLBACK_CAP != NORMAL_CAP
#: how long a test waits for something that must happen before calling it missing
#: (a guard against hanging, not a threshold: every bound asserted is derived below)


def base_config(model) -> str:
    return (f'model = "{model}"\nmax_num_seqs = {CEILING}\nmax_num_batched_tokens = 512\n'
            f"max_model_len = 512\nnum_gpu_blocks = 64\ninterval_s = {INTERVAL_S}\n"
            f"stale_after_s = {STALE_AFTER_S}\nfallback_cap = {FALLBACK_CAP}\n"
            f'batch_policy = "faults:FaultPolicy"\nqueue_policy = "mcsf"\n'
            f'vllm_args = ["--enforce-eager"]\n')


def plugin_env(tmp: Path, nvml_state: str) -> tuple[dict, Path, Path]:
    """PYTHONPATH with the fake pynvml and a copy of tests/faults.py (nothing else of
    tests/), the mode file, the NVML state file."""
    pydir = tmp / "pythonpath"
    state = tmp / "nvml-state"
    faults.write_fake_pynvml(pydir, state, nvml_state)
    shutil.copy(Path(faults.__file__), pydir / "faults.py")
    mode = tmp / "fault-mode"
    faults.write_mode(mode, "normal")
    return {"PYTHONPATH": str(pydir), faults.MODE_ENV: str(mode)}, mode, state


@dataclass
class Ctx:
    srv: object
    tmp: Path
    mode: Path
    nvml: Path
    base: str
    model: str
    delays: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("faults")
    env, mode, nvml = plugin_env(tmp, "ok")
    base = base_config(tiny_model)
    with tuned_serve(tmp, base, env_extra=env) as srv:
        c = Ctx(srv, tmp, mode, nvml, base, srv.model_id())
        yield c
        # what the report quotes: every fallback delay measured in this module
        print("\nfallback delays (s):", json.dumps(c.delays, indent=1))


# ------------------------------------------------------------------ helpers


def events_after(srv, event: str, t_wall: float, **match) -> list[dict]:
    return [e for e in log_events(srv.log_path, event)
            if event_wall_s(e) >= t_wall and all(e.get(k) == v for k, v in match.items())]


def wait_event(srv, event: str, t_wall: float, **match) -> dict:
    return wait_for(f"log event {event} {match}",
                    lambda: (events_after(srv, event, t_wall, **match) or [None])[0])


def steps_since(srv, seq: int) -> list[dict]:
    return get_json(f"{srv.endpoint}/steps?since={seq}")["samples"]


def next_step_seq(srv) -> int:
    return get_json(f"{srv.endpoint}/steps?since=0")["next"]


def wait_normal(c: Ctx) -> dict:
    """Until the applied cap is the plugin's normal cap, out of fallback."""
    def ok():
        d = c.srv.decisions(1)
        a = d["applied"]
        return d if (not a["fallback"] and a["cap"] == NORMAL_CAP) else None
    return wait_for("the normal cap applied", ok)


def post(url: str, body: bytes | dict | None = None, timeout: float = 60.0,
         headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"{}")
        except ValueError:
            return e.code, {"raw": raw.decode(errors="replace")}


def healthz(srv) -> int:
    try:
        with urllib.request.urlopen(f"{srv.endpoint}/healthz", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def complete(c: Ctx, prompt_tokens: int = 12, max_tokens: int = 8, xargs=None,
             raw_xargs: str | None = None) -> tuple[int, dict]:
    """One non-streamed completion; ``raw_xargs`` is spliced into the JSON body as
    written (for what json.dumps cannot write)."""
    body = {"model": c.model, "prompt": list(range(20, 20 + prompt_tokens)),
            "max_tokens": max_tokens, "ignore_eos": True}
    if xargs is not None:
        body["vllm_xargs"] = xargs
    data = json.dumps(body)
    if raw_xargs is not None:
        data = data[:-1] + f', "vllm_xargs": {raw_xargs}}}'
    return post(f"{c.srv.api}/completions", data.encode())


# ================================================================== 1. decisions
DECISION_FAULTS = [
    # (mode, cause, seconds the fault itself takes before it can be seen)
    ("raise", "controller_error", 0.0),
    ("nan", "invalid_decision", 0.0),
    ("negative", "invalid_decision", 0.0),
    ("huge", "invalid_decision", 0.0),
    (f"slow:{3 * INTERVAL_S}", "slow_decision", 3 * INTERVAL_S),
]


def test_decision_faults_fall_back_within_bound(ctx):
    c, srv = ctx, ctx.srv
    load = Load(srv, concurrency=6, prompt_tokens=(8, 24), max_tokens=(32, 64)).start()
    try:
        wait_normal(c)
        v0 = metric_values(srv)
        for mode, cause, fault_s in DECISION_FAULTS:
            seq0 = next_step_seq(srv)
            t_w = faults.write_mode(c.mode, mode)
            fb = wait_event(srv, "fallback", t_w, cause=cause)
            err = wait_event(srv, "controller_error", t_w, cause=cause)
            d = srv.decisions(1)
            faults.write_mode(c.mode, "normal")
            cleared = wait_event(srv, "fallback_cleared", event_wall_s(fb), cause=cause)
            wait_normal(c)
            # the fault as the engine saw it: the plugin's first tick in this mode
            began = next(e for e in faults.read_events(c.mode)
                         if e["mode"] == mode.split(":")[0] and e["t_wall"] >= t_w)
            steps = steps_since(srv, seq0)
            assert steps, "the engine did not step under load"
            max_step_s = max(s["step_s"] for s in steps)
            t_fb = event_wall_s(fb)
            from_write = t_fb - t_w
            from_fault = t_fb - began["t_wall"]
            c.delays[mode] = {"cause": cause, "from_write_s": round(from_write, 4),
                              "from_fault_s": round(from_fault, 4),
                              "max_step_s": round(max_step_s, 4)}
            # the first tick that starts after the write sees the fault: at most one
            # decision lands between the write and the faulted tick (the tick already
            # under way at the write, which read the file before it). An order, not a
            # time: how soon that tick runs is the host's scheduling (a host that keeps
            # the tick thread off its cores for a while delays it); what the controller
            # promises is timed from the faulted tick itself: it offers the fallback
            # and the engine applies it at the top of its next step
            ticks = [d["t"] for d in srv.decisions(200)["recent"]
                     if t_w < d["t"] < began["t_wall"]]
            c.delays[mode]["ticks_between"] = len(ticks)
            assert len(ticks) <= 1, c.delays[mode]
            assert 0 <= from_fault <= INTERVAL_S + fault_s + max_step_s, c.delays[mode]
            assert fb["cap"] == FALLBACK_CAP and fb["level"] == "warning"
            assert err["level"] == "error" and err["fallback_cap"] == FALLBACK_CAP
            if cause == "invalid_decision":
                assert err["error"].startswith(f"cap must be an integer in [1, {CEILING}]")
            if cause == "slow_decision":
                assert "longer than interval_s" in err["error"]
            if cause == "controller_error":
                assert "injected fault" in err["error"]
            assert d["applied"] == {"cap": FALLBACK_CAP, "token_budget": 512,
                                    "fallback": True, "fallback_cause": cause}, d["applied"]
            assert cleared["cap"] == NORMAL_CAP
        v1 = metric_values(srv)
    finally:
        load.stop()
    assert load.errors == [], load.errors[:5]
    assert load.sent == load.completed > 0

    def grew(name, **lb):
        return mval(v1, name, **lb) - mval(v0, name, **lb)
    assert grew("tuned_fallbacks_total", cause="controller_error") == 1
    assert grew("tuned_fallbacks_total", cause="invalid_decision") == 3
    assert grew("tuned_fallbacks_total", cause="slow_decision") == 1
    assert grew("tuned_fallbacks_total", cause="stale") == 0
    # every faulty tick counts as a controller error (several per fault)
    assert grew("tuned_controller_errors_total") >= len(DECISION_FAULTS)
    assert mval(v1, "tuned_fallback_active") == 0


# ================================================================== 2. stall
def test_stalled_tick_is_stale_then_slow_decision(ctx):
    """A tick stuck in decide for longer than stale_after_s: the scheduler applies
    the fallback on its own once the last good tick is stale_after_s old (cause
    ``stale``: the controller cannot report anything while stuck); when the stuck
    tick returns, its decision is thrown away as ``slow_decision`` (a second,
    distinct entry); the next good tick clears it."""
    c, srv = ctx, ctx.srv
    stall_s = STALE_AFTER_S + 2.0
    load = Load(srv, concurrency=6, prompt_tokens=(8, 24), max_tokens=(32, 64)).start()
    try:
        wait_normal(c)
        v0 = metric_values(srv)
        seq0 = next_step_seq(srv)
        t_w = faults.write_mode(c.mode, f"slow:{stall_s}")
        stale = wait_event(srv, "fallback", t_w, cause="stale")
        health_during = healthz(srv)
        faults.write_mode(c.mode, "normal")       # the stuck tick still sleeps
        slow = wait_event(srv, "fallback", t_w, cause="slow_decision")
        cleared = wait_event(srv, "fallback_cleared", event_wall_s(slow))
        wait_normal(c)
        health_after = healthz(srv)
        began = next(e for e in faults.read_events(c.mode)
                     if e["mode"] == "slow" and e["t_wall"] >= t_w)
        max_step_s = max(s["step_s"] for s in steps_since(srv, seq0))
        v1 = metric_values(srv)
    finally:
        load.stop()
    assert load.errors == [], load.errors[:5]
    assert load.sent == load.completed > 0
    causes = [e["cause"] for e in events_after(srv, "fallback", t_w)]
    assert causes == ["stale", "slow_decision"], causes
    assert cleared["cause"] == "slow_decision"
    t_stale = event_wall_s(stale)
    c.delays["stall"] = {"cause": "stale", "from_write_s": round(t_stale - t_w, 4),
                         "from_stall_s": round(t_stale - began["t_wall"], 4),
                         "last_good_tick_age_s": stale["last_good_tick_age_s"],
                         "slow_decision_after_stall_s":
                             round(event_wall_s(slow) - began["t_wall"], 4),
                         "max_step_s": round(max_step_s, 4)}
    # stale exactly when the rule says: the last good tick is older than
    # stale_after_s, and no later than one interval (the tick before the stall) plus
    # stale_after_s plus one step after the stall began
    assert stale["last_good_tick_age_s"] >= STALE_AFTER_S    # logged rounded to 1 ms
    assert t_stale - began["t_wall"] <= STALE_AFTER_S + INTERVAL_S + max_step_s, c.delays
    assert t_stale - t_w <= STALE_AFTER_S + 2 * INTERVAL_S + max_step_s, c.delays
    # the stuck tick is thrown away when it returns (after stall_s)
    assert event_wall_s(slow) - began["t_wall"] >= stall_s
    assert health_during == 503 and health_after == 200
    # apscheduler's own plain-text warning per skipped tick is silenced: tuned said it
    assert "maximum number of running instances" not in srv.log_path.read_text()
    assert mval(v1, "tuned_fallbacks_total", cause="stale") - \
        mval(v0, "tuned_fallbacks_total", cause="stale") == 1
    assert mval(v1, "tuned_fallbacks_total", cause="slow_decision") - \
        mval(v0, "tuned_fallbacks_total", cause="slow_decision") == 1


# ================================================================== 3. idle
def test_idle_engine_is_not_a_fault(ctx):
    """No request for 4 x stale_after_s: the controller still ticks, so nothing is
    stale; the first step after the pause does not see a stale decision either."""
    c, srv = ctx, ctx.srv
    wait_normal(c)
    wait_for("an idle engine", lambda: (lambda t: t["running"] == t["waiting"] == 0)(
        srv.decisions(0)["telemetry"]))
    v0 = metric_values(srv)
    t0 = time.time()
    idle_s = 4 * STALE_AFTER_S
    health = []
    end = time.monotonic() + idle_s
    while time.monotonic() < end:
        health.append(healthz(srv))
        time.sleep(INTERVAL_S)
    status, out = complete(c, max_tokens=16)
    assert status == 200 and out["usage"]["completion_tokens"] == 16
    v1 = metric_values(srv)
    assert set(health) == {200}, health
    assert events_after(srv, "fallback", t0) == []
    for cause in ("stale", "controller_error", "invalid_decision", "slow_decision"):
        assert mval(v1, "tuned_fallbacks_total", cause=cause) == \
            mval(v0, "tuned_fallbacks_total", cause=cause), cause
    # the ticks went on over the idle period (about one per interval_s)
    assert mval(v1, "tuned_controller_tick_seconds_count") - \
        mval(v0, "tuned_controller_tick_seconds_count") >= idle_s / INTERVAL_S / 2


# ================================================================== 4. NVML
def gpu_series(values: dict) -> dict:
    return {(n, lb): v for (n, lb), v in values.items() if n.startswith("tuned_gpu_memory")}


def test_nvml_errors_mid_run_degrade_to_engine_only(ctx):
    c, srv = ctx, ctx.srv
    assert [e["gpus"] for e in log_events(srv.log_path, "nvml_ready")] == [["Fake GPU 24GB"]]
    v = wait_for("GPU series", lambda: (lambda v: v if gpu_series(v) else None)(
        metric_values(srv)))
    assert mval(v, "tuned_gpu_memory_total_bytes", gpu="0") == 24 * 2 ** 30
    assert srv.decisions(0)["telemetry"]["gpu"][0]["name"] == "Fake GPU 24GB"
    v0 = metric_values(srv)
    for state, reason in (("error", "NVMLError: Unknown Error"),
                          ("gone", "NVMLError: GPU is lost")):
        t_w = time.time()
        c.nvml.write_text(state)
        lost = wait_event(srv, "nvml_lost", t_w)
        assert lost["reason"] == reason and lost["telemetry"] == "engine-only"
        seq = srv.decisions(1)["current"]["seq"]
        # decisions go on, requests are served, the series are withdrawn
        wait_for("4 more decisions", lambda: srv.decisions(1)["current"]["seq"] >= seq + 4)
        assert not gpu_series(metric_values(srv))
        assert srv.decisions(0)["telemetry"]["gpu"] is None
        status, out = complete(c, max_tokens=8)
        assert status == 200 and out["usage"]["completion_tokens"] == 8
        assert len(events_after(srv, "nvml_lost", t_w)) == 1      # one line per episode
        t_r = time.time()
        c.nvml.write_text("ok")
        wait_event(srv, "nvml_recovered", t_r)
        wait_for("GPU series back", lambda: gpu_series(metric_values(srv)))
    v1 = metric_values(srv)
    for cause in ("stale", "controller_error", "invalid_decision", "slow_decision"):
        assert mval(v1, "tuned_fallbacks_total", cause=cause) == \
            mval(v0, "tuned_fallbacks_total", cause=cause)
    assert mval(v1, "tuned_controller_errors_total") == mval(v0, "tuned_controller_errors_total")


# ================================================================== 5. reloads
def reload_post(srv) -> tuple[int, dict]:
    return post(f"{srv.endpoint}/reload", b"")


def test_profile_vanishes_or_is_corrupted_between_reloads(ctx):
    c, srv = ctx, ctx.srv
    head = "".join(srv.config_path.read_text().splitlines(keepends=True)[:2])  # ports
    profile = c.tmp / "profile.json"
    shutil.copy(ROOT / "tests" / "data" / "profile_v1.json", profile)
    with_profile = head + c.base + f'profile = "{profile}"\n'
    v0 = metric_values(srv)
    srv.config_path.write_text(with_profile)
    status, res = reload_post(srv)
    assert (status, res["outcome"], res["changed"]) == (200, "ok", ["profile"]), res
    kept = srv.decisions(0)["config"]
    assert kept["profile"] == str(profile)

    profile.unlink()                                   # 1. the profile vanishes
    status, res = reload_post(srv)
    assert (status, res["outcome"]) == (422, "refused"), res
    assert res["problems"] == [f"profile: must be an existing file, not found: {profile}"]
    profile.write_text('{"schema": 1, "levels": [')    # 2. ... comes back corrupted
    t_hup = time.time()
    srv.proc.send_signal(signal.SIGHUP)                # this one the way systemctl does
    res = wait_event(srv, "reload_refused", t_hup)
    assert len(res["problems"]) == 1 and res["problems"][0].startswith("ProfileError: "), res
    d = srv.decisions(1)
    assert d["last_reload"]["outcome"] == "refused"
    assert d["config"] == kept                         # the old config keeps running
    seq = d["current"]["seq"]
    wait_for("decisions after the refusals", lambda: srv.decisions(1)["current"]["seq"] >= seq + 4)
    v1 = metric_values(srv)
    assert mval(v1, "tuned_reloads_total", outcome="refused") - \
        mval(v0, "tuned_reloads_total", outcome="refused") == 2
    assert mval(v1, "tuned_reloads_total", outcome="ok") - \
        mval(v0, "tuned_reloads_total", outcome="ok") == 1
    status, out = complete(c, max_tokens=8)
    assert status == 200
    srv.config_path.write_text(head + c.base)          # back to the module's config
    status, res = reload_post(srv)
    assert res["outcome"] == "ok" and res["changed"] == ["profile"], res


def test_two_reloads_at_once_are_serialised_and_the_last_file_wins(ctx):
    """Reload A is being applied (the policy's build sleeps) when reload B arrives
    with a newer file: both are answered ok, B's build starts after A's ended, and
    the config in force is B's."""
    c, srv = ctx, ctx.srv
    head = "".join(srv.config_path.read_text().splitlines(keepends=True)[:2])
    v0 = metric_values(srv)
    build_s = STALE_AFTER_S / 3       # two builds back to back stay below stale_after_s
    faults.write_mode(c.mode, f"slow_build:{build_s}")
    n_events = len(faults.read_events(c.mode))
    srv.config_path.write_text(head + c.base + "tbt_sla_s = 0.5\n")
    answers: dict = {}

    def send(name):
        answers[name] = reload_post(srv)

    a = threading.Thread(target=send, args=("A",))
    a.start()
    wait_for("reload A building", lambda: any(
        e["phase"] == "build_start" for e in faults.read_events(c.mode)[n_events:]))
    srv.config_path.write_text(head + c.base + "tbt_sla_s = 0.7\n")
    b = threading.Thread(target=send, args=("B",))
    b.start()
    a.join(60)
    b.join(60)
    faults.write_mode(c.mode, "normal")
    assert answers["A"][0] == answers["B"][0] == 200, answers
    assert answers["A"][1]["changed"] == answers["B"][1]["changed"] == ["tbt_sla_s"], answers
    builds = [e for e in faults.read_events(c.mode)[n_events:] if e["phase"].startswith("build")]
    assert [e["phase"] for e in builds] == ["build_start", "build_end"] * 2, builds
    assert builds[2]["t_mono"] >= builds[1]["t_mono"]           # B after A, not inside it
    d = srv.decisions(0)
    assert d["config"]["tbt_sla_s"] == 0.7 and d["last_reload"]["outcome"] == "ok"
    v1 = wait_for("the SLA gauge", lambda: (lambda v: v if mval(
        v, "tuned_tbt_sla_seconds") == 0.7 else None)(metric_values(srv)))
    assert mval(v1, "tuned_reloads_total", outcome="ok") - \
        mval(v0, "tuned_reloads_total", outcome="ok") == 2
    assert mval(v1, "tuned_fallbacks_total", cause="stale") == \
        mval(v0, "tuned_fallbacks_total", cause="stale")
    srv.config_path.write_text(head + c.base)
    assert reload_post(srv)[1]["outcome"] == "ok"


# ================================================================== 6. disconnect
def test_client_disconnect_aborts_and_frees_kv(ctx):
    """A client that closes its stream mid-generation: vLLM aborts the request, tuned
    counts it finished and its KV blocks come back. The stream is closed at its first
    token; a host that delivers that chunk only after the engine generated every token
    (CI's once, at the fifth chunk) cannot show an abort: such an attempt, told by the
    engine's step times against the close, is tried again, at most three times."""
    import httpx2 as httpx

    c, srv = ctx, ctx.srv
    max_tokens = 400
    body = {"model": c.model, "prompt": list(range(30, 130)), "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}
    attempts: list[dict] = []
    for _ in range(3):
        wait_for("an idle engine", lambda: (lambda t: t["running"] == t["waiting"] == 0)(
            srv.decisions(0)["telemetry"]))
        v0 = wait_for("kv usage 0 before", lambda: (lambda v: v if mval(
            v, "tuned_kv_usage_ratio") == 0.0 else None)(metric_values(srv)))
        seq0 = next_step_seq(srv)
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{srv.api}/completions", json=body) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data:") and '"text"' in line:
                        break       # closing the stream mid-generation
        t_close = time.monotonic()  # the engine's step times are on the same clock
        wait_for("the aborted request to leave", lambda: (
            lambda t: t["running"] == t["waiting"] == 0)(srv.decisions(0)["telemetry"]))
        t_left = time.monotonic()
        v1 = wait_for("kv usage 0 and the request counted", lambda: (lambda v: v if (
            mval(v, "tuned_kv_usage_ratio") == 0.0 and mval(v, "tuned_requests_finished_total")
            > mval(v0, "tuned_requests_finished_total")) else None)(metric_values(srv)))
        d = srv.decisions(0)
        steps = steps_since(srv, seq0)
        generated = sum(s["generated_tokens"] for s in steps)
        last_token_t = max(s["t"] for s in steps if s["generated_tokens"])
        attempts.append({"left_engine_after_close_s": round(t_left - t_close, 3),
                         "tokens_generated": generated, "max_tokens": max_tokens,
                         "last_token_after_close_s": round(last_token_t - t_close, 3),
                         "kv_blocks_held_max": max(s["kv_used_blocks"] for s in steps)})
        if generated < max_tokens or last_token_t > t_close:
            break           # closed before the end: this attempt shows what happened
    c.delays["disconnect"] = attempts
    # the request held KV blocks while it ran (100 prompt tokens: one 128-token block,
    # two once it passed 128 tokens)
    assert max(s["kv_used_blocks"] for s in steps) >= 1
    assert 1 <= generated < max_tokens, attempts     # aborted, not run to the end
    assert d["telemetry"]["kv_usage"] == 0.0 and d["telemetry"]["running"] == 0
    assert mval(v1, "tuned_requests_finished_total") - \
        mval(v0, "tuned_requests_finished_total") == 1
    # and a new request gets the whole cache again: it is served in full
    status, out = complete(c, max_tokens=8)
    assert status == 200 and out["usage"]["completion_tokens"] == 8


# ================================================================== 7. odd xargs
MB = "x" * 1_000_000
# (vllm_xargs as sent, HTTP status, ignored-hint warnings by field). Raw JSON text
# where json.dumps cannot write it (1e400 parses as inf; Python's json reads NaN).
ODD_XARGS = [
    ('{"tuned_deadline_s": "nan"}', 200, {"tuned_deadline_s": 1}),
    ('{"tuned_deadline_s": NaN}', 200, {"tuned_deadline_s": 1}),
    ('{"tuned_deadline_s": -1}', 200, {"tuned_deadline_s": 1}),
    ('{"tuned_deadline_s": 1e400}', 200, {"tuned_deadline_s": 1}),
    ('{"tuned_deadline_s": 1e300}', 200, {}),                       # huge, but valid
    ('{"tuned_output_tokens": 1e300}', 200, {}),                    # capped at max_tokens
    ('{"tuned_output_tokens": -5}', 200, {"tuned_output_tokens": 1}),
    ('{"tuned_output_tokens": "12"}', 200, {"tuned_output_tokens": 1}),
    ('{"tuned_output_tokens": [1, 2]}', 200, {"tuned_output_tokens": 1}),
    ('{"tuned_output_tokens": 18446744073709551615}', 200, {}),     # 2**64 - 1: capped
    ('{"tuned_class": 7}', 200, {"tuned_class": 1}),
    ('{"tuned_class": ["a", "b"]}', 200, {"tuned_class": 1}),
    ('{"tuned_deadlin_s": 5, "tuned_x": 1, "session": "abc"}', 200, {"unknown": 1}),
    ('{"tuned_class": "' + MB + '"}', 200, {"tuned_class": 1}),
    ('{"tuned_deadline_s": "' + MB + '"}', 200, {"tuned_deadline_s": 1}),
    ('{"tuned_deadline_s": {"seconds": 5}}', 400, {}),              # vLLM refuses nesting
    ('"soon"', 400, {}),                                            # not an object
]


def test_odd_vllm_xargs_are_served_counted_and_logged_short(ctx):
    c, srv = ctx, ctx.srv
    wait_normal(c)
    v0 = metric_values(srv)
    t0 = time.time()
    want: dict[str, int] = {}
    for raw, status_want, warns in ODD_XARGS:
        status, out = complete(c, max_tokens=6, raw_xargs=raw)
        assert status == status_want, (raw[:80], status, str(out)[:300])
        if status == 200:
            assert out["usage"]["completion_tokens"] == 6, raw[:80]
        for f, n in warns.items():
            want[f] = want.get(f, 0) + n
    v1 = wait_for("the hint counters", lambda: (lambda v: v if all(
        mval(v, "tuned_request_hint_warnings_total", field=f)
        - mval(v0, "tuned_request_hint_warnings_total", field=f) >= n
        for f, n in want.items()) else None)(metric_values(srv)))
    got = {dict(lb)["field"]: val - v0.get((n, lb), 0.0) for (n, lb), val in v1.items()
           if n == "tuned_request_hint_warnings_total" and val != v0.get((n, lb), 0.0)}
    assert got == want, got
    lines = events_after(srv, "request_hint_ignored", t0)
    assert sorted(e["field"] for e in lines) == sorted(f for f, n in want.items()
                                                      for _ in range(n))
    for e in lines:
        # the value is shown in at most 40 characters, whatever the client sent
        assert "x" * 41 not in e["problem"] and len(e["problem"]) < 200, e["problem"][:300]
    log = srv.log_path.read_text(errors="replace")
    assert "x" * 1000 not in log
    assert max(len(line) for line in log.splitlines()) < 20_000
    # the engine served on: nothing raised on the step path
    assert "step_path_error" not in log
    assert mval(v1, "tuned_controller_errors_total") == mval(v0, "tuned_controller_errors_total")


# ================================================================== second engine
def test_metrics_port_taken_and_nvml_init_failure(tmp_path, tiny_model):
    """The metrics port is held by another listener when the engine starts and NVML
    cannot initialise: the engine serves anyway, with one ``endpoint_failed`` line
    naming the port and what is off, and one ``nvml_unavailable`` line."""
    import os

    env, mode, state = plugin_env(tmp_path, "init_fail")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    srv = start_server(tmp_path, base_config(tiny_model), {**os.environ, **env},
                       metrics_port=taken)
    try:
        def serving():
            assert srv.proc.poll() is None, srv.log_tail()
            try:
                urllib.request.urlopen(srv.base + "/health", timeout=2).close()
                return True
            except OSError:
                return False
        wait_for("the API to answer", serving, timeout_s=600, every_s=0.5)
        model = srv.model_id()
        for n in (4, 9):
            status, out = post(f"{srv.api}/completions", {
                "model": model, "prompt": list(range(5, 37)), "max_tokens": n,
                "ignore_eos": True})
            assert status == 200 and out["usage"]["completion_tokens"] == n
        failed = log_events(srv.log_path, "endpoint_failed")
        assert len(failed) == 1, failed
        ev = failed[0]
        assert ev["port"] == taken and ev["host"] == "127.0.0.1"
        assert f"127.0.0.1:{taken}" in ev["message"]
        for what in ("/metrics", "tuned status", "POST /reload", "keeps serving"):
            assert what in ev["message"], (what, ev["message"])
        started = log_events(srv.log_path, "tuned_started")
        assert started and started[0]["metrics"] is None
        nv = log_events(srv.log_path, "nvml_unavailable")
        assert len(nv) == 1 and nv[0]["reason"] == "NVMLError: Driver Not Loaded", nv
        assert nv[0]["telemetry"] == "engine-only"
        assert log_events(srv.log_path, "nvml_lost") == []
    finally:
        stop(srv.proc)
        holder.close()
    assert srv.proc.returncode == 0, srv.log_tail()
