"""What the simulator-fidelity test (tests/e2e/test_fidelity.py) and the
controller-course benchmark (tests/benchmarks/bench_fidelity_course.py) share: the
engine's config, live reloads, and the simulator run at the host's measured speed."""

from __future__ import annotations

import dataclasses
import json
import signal
import time

CEILING = 16
BLOCKS = 65          # 64 usable blocks of 128 tokens: memory never binds here
# the small demo model: its step time grows with the batch on two cores (the tiny
# one's 3-5 ms steps are mostly fixed cost and noise)
CAPS = (2, 4, 8, 16)


def base_config(model) -> dict:
    return {"model": str(model), "max_num_seqs": CEILING, "max_num_batched_tokens": 512,
            "max_model_len": 512, "num_gpu_blocks": BLOCKS, "interval_s": 0.25,
            "stale_after_s": 5.0, "fallback_cap": CEILING, "min_demand_samples": 4,
            "log_level": "warning"}


def toml(d: dict) -> str:
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in d.items())


def reload_to(srv, d: dict, want_cap: int | None = None) -> None:
    srv.config_path.write_text(toml(d))
    seq = (srv.decisions(1)["current"] or {}).get("seq", -1)
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        dec = srv.decisions(1)
        cur = dec["current"] or {}
        ok = dec["last_reload"]["outcome"] == "ok" and cur.get("seq", -1) > seq + 1
        # a decision made under the new config (the tick after the reload); the engine
        # takes its cap at its next schedule() call, i.e. before the first request of
        # the next run is admitted (an idle engine never steps, so 'applied' waits)
        if ok and (want_cap is None or cur.get("cap") == want_cap):
            return
        time.sleep(0.2)
    raise AssertionError(f"reload not applied: {srv.decisions(1)}")


def live_over_model(samples: list[dict], model, batches: range | None = None) -> float:
    """Mean measured step time over the model's prediction, for the busy steps among
    ``samples`` (those whose decode batch is in ``batches``, if given): how far this
    host drifted from its profile during a run (printed, so a miss can be told apart
    from a scheduling difference)."""
    got = [s for s in samples
           if (s["num_decode"] or s["prefill_tokens"])
           and (batches is None or s["num_decode"] in batches)]
    pred = sum(model.predict_step_s(s["num_decode"], s["prefill_tokens"],
                                    s["kv_tokens_resident"]) for s in got)
    return sum(s["step_s"] for s in got) / pred if pred > 0 else float("nan")


class AtHostSpeed:
    """A step model run at the speed the host actually had during one live run:
    ``scale`` times the profile's prediction (``live_over_model`` of that run). The
    simulator models scheduling given step times; a CI host whose steps ran 8 % slower
    than its profile minutes earlier is host noise, not a simulator error."""

    def __init__(self, model, scale: float, low: tuple[int, float] | None = None) -> None:
        self.model, self.scale, self.low = model, scale, low
        self.name = f"{model.name} x{scale:.3f}"
        self.gap_s = getattr(model, "gap_s", 0.0)

    def step_s(self, shape) -> float:
        # ``low`` = (b, scale): steps of at most b decodes ran at their own speed
        low = self.low is not None and shape.num_decode <= self.low[0]
        return self.model.step_s(shape) * (self.low[1] if low else self.scale)

    def describe(self) -> dict:
        return {**self.model.describe(), "scale": self.scale, "low": self.low}


def at_host_speed(hw, scale: float, low: tuple[int, float] | None = None):
    return dataclasses.replace(hw, step_model=AtHostSpeed(hw.step_model, scale, low))
