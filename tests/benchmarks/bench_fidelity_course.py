"""Benchmark, not a test: does the live controller's course match the simulator's?

Run it by hand (it is not collected by the suite; it starts the real vLLM CPU engine for
about ten minutes):

    .venv/bin/python -m pytest -s -p no:cacheprovider tests/benchmarks/bench_fidelity_course.py

It measures a profile on this host, runs static caps 2-16 (to read the host's speed
against the profile), then tuned with a TBT SLA that binds at a decode batch of about 3
(max(T(3), 1.2 x T(1)) at the cap-2 run's speed), and simulates the tuned run at the
speeds its own steps had, and at 0.9x and 1.1x of them. It prints the live and
simulated courses, the settled caps and the decision reasons, and checks that the live
cap moves the way the simulator's does within that band. On a host whose step is
mostly fixed cost the SLAs that bring the cap down span a narrow band of the batch-1
step, about the host's drift within one run, which is why this is a benchmark: its
outcome depends on the host's speed during the run. The static-cap fidelity it shares
is a test (tests/e2e/test_fidelity.py).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness
from serve_harness import tuned_serve  # noqa: E402

pytestmark = pytest.mark.slow

from fidelity_harness import (CAPS, CEILING, at_host_speed, base_config,  # noqa: E402
                              check_static_fidelity, live_over_model, measure_static_caps,
                              reload_to, static_config, toml)

LOW_BATCHES = 3      # b_min + alpha: the decode batches the feasibility check reads
BAND = (0.9, 1.0, 1.1)   # the tuned run is also simulated this much slower and faster


def settled(caps: list[int]) -> int:
    """The median of the second half of a run's per-tick caps (the lower middle)."""
    tail = sorted(caps[len(caps) // 2:])
    return tail[(len(tail) - 1) // 2]


def test_controller_course_matches_the_simulator(tmp_path, small_model):
    from tuned import config as config_mod
    from tuned.bench.live import LiveServer
    from tuned.bench.runner import Contender
    from tuned.sim.engine import simulate

    with tuned_serve(tmp_path, toml({**static_config(small_model), "b_max": CEILING})) as srv:
        fid = measure_static_caps(tmp_path, srv, small_model)
        model, hw, wl, steps, drift = fid.model, fid.hw, fid.workload, fid.steps, fid.drift
        # ---- tuned with a TBT SLA that binds at a decode batch of about 3 on this host:
        # from its warm start at 8 the controller must come down, live and simulated (an
        # SLA at the batch the load reaches would leave the course to the host's noise).
        # Two edges bound that course: above ~1.3 x T(1) the SLA stops binding (the cap
        # stays at 8), below ~1.04 x T(1) it is infeasible (the cap goes to memory, 16).
        # On a host whose step is mostly fixed cost T(3) is only 1.10-1.13 x T(1), within
        # the host's drift between two runs: one CI run and one run here, with the SLA at
        # T(3), measured the low-batch steps 13 % slower in the tuned run than in the run
        # before, declared the SLA infeasible live (16) and not in the simulator (2). So
        # the SLA is at least 1.2 x T(1), the middle between the edges, at the speed the
        # cap-2 run's steps had (the lowest batches, which feasibility reads; the 1.4-1.9x
        # slowdown of another CI host is why it is not the profile's own speed)
        t1, t3 = model.predict_step_s(1, 0, 60), model.predict_step_s(3, 0, 3 * 60)
        sla = round(max(t3, 1.2 * t1) * drift[CAPS[0]], 4)
        # the admission guard off: this checks Algorithm 2's course, and the guard acts
        # from the first tick live (the online step fit reads the static runs' steps
        # still in the ring) but only after a few seconds in the simulator, whose ring
        # starts empty; one CI run stayed at 8 live and went 8 -> 3 simulated
        d = {**base_config(small_model), "tbt_sla_s": sla, "eps_d_s": round(sla / 20, 5),
             "admission_guard": "off"}
        cfg = config_mod.validate(d)
        # let the static runs' steps age out of the TBT window before the SLA comes in
        # (the simulator starts with an empty one): otherwise the first ticks read the
        # cap-16 steps and drop the cap before the run has sent anything
        time.sleep(cfg.tbt_window_s + 2 * cfg.interval_s)
        reload_to(srv, d)
        live_start = srv.decisions(1)["current"]["cap"]     # the warm start, idle
        since = steps.fetch()["next"]
        tuned_run = LiveServer.attach(Contender("tuned", "tuned", cfg), url=srv.base,
                                      endpoint=srv.endpoint, log_path=srv.log_path).drive(wl)
        ran_steps = steps.fetch(since)["samples"]
        tuned_drift = live_over_model(ran_steps, model)
        # the steps of at most 3 decodes and the others, each at its own speed: one
        # scale missed the first by 10 % or more here (the cap-2 runs' steps / profile
        # 1.05-1.18 where caps 4-16 had 0.93-1.07), and the course turns on them
        # (feasibility reads b-bar <= b_min + alpha); the run's mean where one side had
        # too few steps to measure
        few = LOW_BATCHES
        ran = [x["num_decode"] for x in ran_steps if x["num_decode"]]
        n_low = sum(1 for b in ran if b <= few)
        scale_low = (live_over_model(ran_steps, model, range(few + 1))
                     if n_low >= 50 else tuned_drift)
        scale_high = (live_over_model(ran_steps, model, range(few + 1, CEILING + 1))
                      if len(ran) - n_low >= 50 else tuned_drift)
        # and at 10 % either side (the throughput tolerance above): on a host whose step
        # is mostly fixed cost, SLAs from 1.04 to 1.3 x T(1) bring the cap down, below
        # that it is infeasible (16), above it never binds (8), and the host drifts by
        # about that much within a run; the course is judged against this band
        band = {f: simulate(cfg, at_host_speed(hw, scale_high * f, (few, scale_low * f)),
                            wl.requests) for f in BAND}
        tuned_sim = band[1.0]

    check_static_fidelity(fid)
    # decisions made during the run (the first poll also returns older ones)
    live_caps = [live_start] + [d["cap"] for d in tuned_run.decisions
                                if d.get("run_s", -1.0) >= 0]
    sim_caps = [d["cap"] for d in tuned_sim.decisions]
    # where the controller settled: the median cap over the second half of the run's
    # ticks (the very last tick reads the drain, where a live run's last few requests
    # let the evidence rise again: one CI run ended 2, 3, 2, 3, 5)
    live_end, sim_end = settled(live_caps), settled(sim_caps)
    print(f"tuned (SLA {sla * 1e3:.1f} ms = {sla / (t1 * drift[CAPS[0]]):.2f} x T(1) at "
          f"the cap-2 run's speed; live steps / profile {tuned_drift:.3f}: {scale_low:.3f} "
          f"at <= {LOW_BATCHES} decodes, {scale_high:.3f} above) caps: "
          f"live {live_caps[0]} -> {live_end}, sim {sim_caps[0]} -> {sim_end}")
    changes = lambda caps: [c for i, c in enumerate(caps) if i == 0 or c != caps[i - 1]]  # noqa: E731
    print(f"  live course {changes(live_caps)}\n  sim course  {changes(sim_caps)}")
    reasons = lambda ds: sorted(Counter(d.get("reason") for d in ds).items())  # noqa: E731
    print(f"  live reasons {reasons(d for d in tuned_run.decisions if d.get('run_s', -1.0) >= 0)}"
          f"\n  sim reasons  {reasons(tuned_sim.decisions)}")
    for name, ds in (("live", tuned_run.decisions), ("sim", tuned_sim.decisions)):
        for d in [d for d in ds if d.get("reason") == "sla_infeasible"][:3]:
            i = d.get("inputs", {})
            print(f"  {name} infeasible: {i.get('sla_infeasible_why')}; b-bar "
                  f"{i.get('decode_batch_mean')}, step model {i.get('step_model')}")
    band_end = {f: settled([d["cap"] for d in r.decisions]) for f, r in band.items()}
    print("  simulated at the host's speed x " + ", ".join(
        f"{f}: {sim_caps[0]} -> {e}" for f, e in band_end.items()))
    assert live_caps[0] == sim_caps[0], (live_caps[:3], sim_caps[:3])   # one warm start
    sign = lambda x: (x > 0) - (x < 0)  # noqa: E731
    # the same direction as the simulator at a speed within the band, and a final cap
    # within 2 of the finals the band spans (where the band agrees: of its one final)
    assert sign(live_end - live_caps[0]) in {sign(e - sim_caps[0]) for e in band_end.values()}
    assert min(band_end.values()) - 2 <= live_end <= max(band_end.values()) + 2, band_end
