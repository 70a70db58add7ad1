"""Windowed aggregates of the telemetry rings: what the controller's observe step
computes, as pure functions so the controller, the profile and the tests share them.

* :func:`step_window`: over the engine steps that ended within ``window_s`` of
  ``now``, the mean step time of steps that ran decodes (Pang et al.'s T, the
  mean time between tokens), their mean decode batch (b-bar) and the latest KV usage.
* :func:`demand_moments`: the mean and standard deviation of per-request KV
  demand, in units of ``block_size`` tokens (Pang et al. eqs. (8)-(9); blocks are
  what vLLM's paged allocator hands out, so ``block_size=1`` gives tokens);
  :func:`occupancy_moments`: the same for the blocks a request holds at a random
  decode step (a continuous batch's demand).
* :func:`request_tpot_s`: a finished request's time per output token, as the TPOT
  SLO judges it; :class:`BindingHistory`: whether the cap bound, tick by tick, so
  that a finished request can be judged by the share of its life spent at a binding
  cap.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from tuned.core.predictor import upper_quantile
from tuned.core.ring import FinishedRequest, StepSample


class StepWindow(NamedTuple):
    """Aggregates of the recent decode steps (None where no decode step ran)."""

    tbt_mean_s: float | None
    decode_batch_mean: float | None
    decode_steps: int
    kv_usage: float                 # of the newest step, 0.0 with no step at all
    tbt_p90_s: float | None = None  # 90th percentile of decode step times in the window
    steps: int = 0                  # all steps in the window (decode or not)
    binding_steps: int = 0          # steps that ended with requests waiting and the cap full
    prefill_steps: int = 0          # decode steps that also carried prefill tokens
    decode_only_tbt_s: float | None = None  # mean time of decode steps without prefill
    mixed_tbt_s: float | None = None        # mean time of decode steps with prefill
    kv_tokens_resident: int = 0     # of the newest step
    prefill_residual_s: float | None = None  # mean of measured - model's T(b, c, kv) over
                                    # the decode steps with prefill (None: no model or
                                    # no such step)
    decode_only_p90_s: float | None = None  # 90th percentile of the decode-only steps

    @property
    def binding(self) -> float:
        """Share of the window's steps where the cap was binding."""
        return self.binding_steps / self.steps if self.steps else 0.0


def step_window(newest_first: Iterable[StepSample], now: float, window_s: float,
                cap: int | None = None, model=None) -> StepWindow:
    """Aggregate the steps that ended in (now - window_s, now], newest first.

    ``newest_first`` may be a lazy iterator (``Ring.newest_first()``); it is read
    only as far back as the window reaches. ``cap``: the admission cap applied; a
    step is *binding* when requests were left waiting with ``cap`` running.
    ``model``: a step model T(b, c, kv) (the controller's online fit); with one, the
    window says how much longer its prefilling decode steps took than the model
    predicts for them (``prefill_residual_s``, negative where they ran faster). The
    fit spans the step ring, the window only the last seconds, so this is the fit's
    error where the token budget spends it now (a host whose speed drifts, an
    intercept the fit over-reads).
    """
    tbt_sum = b_sum = dec_sum = mix_sum = res_sum = 0.0
    n = steps = binding = prefill = dec_n = 0
    kv_usage = None
    kv_res = 0
    times: list[float] = []
    dtimes: list[float] = []
    for s in newest_first:
        if kv_usage is None:
            kv_usage = s.kv_usage
            kv_res = s.kv_tokens_resident
        if now - s.t > window_s:
            break
        steps += 1
        if s.num_waiting and cap is not None and s.num_running >= cap:
            binding += 1
        if s.num_decode:
            tbt_sum += s.step_s
            b_sum += s.num_decode
            n += 1
            times.append(s.step_s)
            if s.prefill_tokens:
                prefill += 1
                mix_sum += s.step_s
                if model is not None:
                    res_sum += s.step_s - model.predict_step_s(
                        s.num_decode, s.prefill_tokens, s.kv_tokens_resident)
            else:
                dec_sum += s.step_s
                dec_n += 1
                dtimes.append(s.step_s)
    return StepWindow(tbt_sum / n if n else None, b_sum / n if n else None, n,
                      kv_usage or 0.0, _p90(times), steps, binding, prefill,
                      dec_sum / dec_n if dec_n else None, mix_sum / prefill if prefill else None,
                      kv_res, res_sum / prefill if prefill and model is not None else None,
                      _p90(dtimes))


def _p90(times: list[float]) -> float | None:
    """The 90th percentile of ``times`` (the rank above), None when there are none."""
    return upper_quantile(sorted(times), 0.9) if times else None


class DemandMoments(NamedTuple):
    mean: float | None
    std: float | None
    n: int


def demand_moments(tokens_per_request: Sequence[int], block_size: int = 1) -> DemandMoments:
    """Mean and population standard deviation of ceil(tokens / block_size).

    The window of recent requests is the population the memory bound is about,
    hence the population variance. Pang et al. eqs. (8)-(9) take Var(l_in) + Var(l_out)
    (input and output independent); the variance of the per-request sum measures
    the same spread without that assumption.
    """
    n = len(tokens_per_request)
    if n == 0:
        return DemandMoments(None, None, 0)
    bs = max(int(block_size), 1)
    units = [-(-int(t) // bs) for t in tokens_per_request]
    mean = sum(units) / n
    var = sum((u - mean) ** 2 for u in units) / n if n > 1 else 0.0
    return DemandMoments(mean, math.sqrt(var), n)


def _block_sums(x: int, bs: int) -> tuple[int, int]:
    """Sum over the token counts y in [1, x] of ceil(y / bs), and of its square: with
    x = q bs + r, bs (1 + ... + q) + r (q + 1), and the same in squares. Exact
    integers, in constant time (the controller sums them over every finished request
    of its window on each tick)."""
    q, r = divmod(x, bs)
    return (bs * q * (q + 1) // 2 + r * (q + 1),
            bs * q * (q + 1) * (2 * q + 1) // 6 + r * (q + 1) * (q + 1))


def occupancy_moments(requests: Sequence[tuple[int, int]], block_size: int = 1) -> DemandMoments:
    """Mean and standard deviation of the KV blocks a running request holds at a random
    decode step: the demand Pang et al.'s memory bound sums over a continuous batch.

    Pang et al. size the batch on each request's whole demand, ceil((l_in + l_out) / B),
    which every request of a static batch holds until the batch ends. In a continuous
    batch a request holds ceil((l_in + t) / B) blocks while it writes its t-th output
    token and frees them all when it finishes, and the b requests running at once are
    at different points of their lives; what the b slots hold together is a sum of b
    draws of that occupancy. So each finished (prompt tokens, output tokens) pair adds
    one sample per decode step it lived (step-weighted: a request that decodes longer
    fills a slot for longer), and the moments are of those samples. A request that
    produced no token adds its prompt's blocks once. ``n`` counts the requests.
    """
    n = len(requests)
    if n == 0:
        return DemandMoments(None, None, 0)
    bs = max(int(block_size), 1)
    w = s1 = s2 = 0
    for prompt, output in requests:
        p, o = max(int(prompt), 0), max(int(output), 0)
        if o == 0:
            k = -(-p // bs)
            w, s1, s2 = w + 1, s1 + k, s2 + k * k
            continue
        # tokens held while writing output token t: p + t + 1, for t in [0, o), so the
        # blocks of the tokens x in [p + 1, p + o]
        hi1, hi2 = _block_sums(p + o, bs)
        lo1, lo2 = _block_sums(p, bs)
        w, s1, s2 = w + o, s1 + hi1 - lo1, s2 + hi2 - lo2
    if w == 0:
        return DemandMoments(None, None, n)
    mean = s1 / w
    return DemandMoments(mean, math.sqrt(max(s2 / w - mean * mean, 0.0)), n)


#: prompts the demand estimate reads at most (an even sample of a long queue)
MAX_PRESENT_PROMPTS = 256


def present_pairs(prompts: Sequence[int], outputs: Sequence[int]) -> list[tuple[int, int]]:
    """(prompt, output) pairs for :func:`occupancy_moments` from the requests the engine
    holds now, running and waiting (the batch the memory bound sizes is made of
    them): each one's prompt, known from its arrival, so that a change of the mix
    is read at once, with the output lengths of the recently finished requests in
    turn (max(P, m) pairs for P prompts and m outputs; over
    :data:`MAX_PRESENT_PROMPTS` prompts are read by an even sample). Empty when
    either side is: the caller falls back on the finished requests' own pairs."""
    if not prompts or not outputs:
        return []
    if len(prompts) > MAX_PRESENT_PROMPTS:
        step = len(prompts) / MAX_PRESENT_PROMPTS
        prompts = [prompts[int(i * step)] for i in range(MAX_PRESENT_PROMPTS)]
    n = max(len(prompts), len(outputs))
    return [(prompts[j % len(prompts)], outputs[j % len(outputs)]) for j in range(n)]


def request_tpot_s(f: FinishedRequest) -> float | None:
    """A finished request's TPOT: (finish - first token) / (output tokens - 1), vLLM's
    benchmark definition and the one the bench's SLO judges. None for a request with
    fewer than two output tokens or no first-token time (an abort, a refusal, an
    engine that does not record it)."""
    if f.first_token_s is None or f.output_tokens < 2:
        return None
    t = (f.t - f.first_token_s) / (f.output_tokens - 1)
    return t if math.isfinite(t) and t >= 0 else None


class BindingHistory:
    """Whether the cap was binding at each controller tick, kept for ``keep`` ticks:
    :meth:`share` gives the share of the ticks in a request's decode life at which it
    bound. A request's TPOT says something of the SLA search's setpoint only when the
    cap, not the offered load, set the batch it decoded in."""

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        self._t: list[float] = []
        self._n: list[int] = [0]    # prefix counts of binding ticks: _n[i] over _t[:i]

    def note(self, t: float, binding: bool) -> None:
        self._t.append(t)
        self._n.append(self._n[-1] + (1 if binding else 0))
        if len(self._t) > 2 * self.keep:     # drop the oldest half, amortised
            cut = len(self._t) - self.keep
            base = self._n[cut]
            self._t = self._t[cut:]
            self._n = [n - base for n in self._n[cut:]]

    def share(self, t0: float, t1: float) -> float | None:
        """The share of ticks in [t0, t1] that found the cap binding; for a life
        shorter than a tick, the state of the newest tick at or before ``t1``; None
        before any tick."""
        lo = bisect.bisect_left(self._t, t0)
        hi = bisect.bisect_right(self._t, t1)
        if hi > lo:
            return (self._n[hi] - self._n[lo]) / (hi - lo)
        if hi == 0:
            return None
        return float(self._n[hi] - self._n[hi - 1])
