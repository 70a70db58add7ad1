"""SGLang's admission by estimated future KV use (``new_token_ratio``), as a queue policy.

Reproduces the check of ``PrefillAdder`` and the ratio schedule of SGLang's scheduler,
read in sgl-project/sglang at these commits:

* ``python/sglang/srt/managers/schedule_policy.py`` @ ad0119fdde519598c25f5c48b95dacaa2b85d607
  (``PrefillAdder.__init__``, ``_get_running_request_total_token_offset``,
  ``rem_total_tokens``, ``add_one_req``, ``_update_prefill_budget``, ``CLIP_MAX_NEW_TOKENS``);
* ``python/sglang/srt/managers/schedule_batch.py`` @ fd3907ee4618e96b73ee94d9a836db78efb5d046
  (``ScheduleBatch.retract_decode``: the ratio after a retraction);
* ``python/sglang/srt/managers/scheduler_components/new_token_ratio_tracker.py`` @
  1a882c5c63cfeff4e20254078cbd89500d5b1fe9 (init/min/decay, ``decay_step``, ``reset``);
  the same formulas sit inline in ``Scheduler.init_schedule_policy`` and
  ``update_running_batch`` of older ``scheduler.py`` versions;
* ``python/sglang/global_config.py`` @ 025ea29a384914a7f0f338a660238bf7a85ba42f and
  ``python/sglang/srt/environ.py`` (defaults ``SGLANG_INIT_NEW_TOKEN_RATIO = 0.7``,
  ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14``, ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600``,
  ``SGLANG_RETRACT_DECODE_STEPS = 20``, ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096``);
  ``server_args.py``: ``schedule_conservativeness: float = 1.0``.

The admission check (``PrefillAdder``), with r the current ``new_token_ratio``:

* every running request reserves its clipped remaining output times r:
  ``min(max_new_tokens - len(output_ids), CLIP_MAX_NEW_TOKENS) * new_token_ratio``,
  summed into ``rem_total_token_offset``;
* every request already admitted in this pass reserves, in full,
  ``ceil_paged(extend_input_len) + min(max_new_tokens, CLIP_MAX_NEW_TOKENS)``
  (``_update_prefill_budget``);
* ``rem_total_tokens = available_size() + evictable_size() - rem_total_token_offset``;
* the candidate needs ``total_tokens = extend_input_len + min(max(max_new_tokens -
  len(output_ids), 0), CLIP_MAX_NEW_TOKENS)`` and is refused when
  ``total_tokens >= self.rem_total_tokens`` (``AddReqResult.NO_TOKEN``). Note the
  ``>=``: a request is admitted only with strictly more room than it needs; with
  exactly its need free it waits.
* on ``NO_TOKEN`` the scheduler marks the batch full and stops the pass: FCFS with
  head-of-line blocking, no skipping.

The ratio (``new_token_ratio``):

* ``init = min(0.7 * schedule_conservativeness, 1.0)``,
  ``min = min(init * 0.14, 1.0)``, ``decay = (init - min) / 600``; it starts at init;
* every decode step that did not have to retract: ``r = max(r - decay, min)``, so with
  the defaults 0.7 falls linearly to 0.098 over 600 decode steps and stays there;
* a decode step that ran out of KV memory retracts requests and then *sets* r from
  the requests it kept (not back to init): ``r = min(1.0, (sum(len(output_ids)) +
  20 * len(kept)) / (sum(max_new_tokens) + 1))`` (older versions: no ``+ 1``);
* when the scheduler is idle (no batch to run) r is reset to init.

Where SGLang's engine differs from vLLM's, and how this maps it:

* **Retraction vs preemption.** SGLang checks before each decode step that the next
  token of every running request fits (``check_decode_mem``); if not, it *retracts*
  requests (fewest generated tokens first, ties: longest prompt) back to the waiting
  queue, frees their KV, and re-estimates r. vLLM *preempts by recompute* when a step
  cannot allocate a block (the newest running request goes back to the waiting
  queue). We treat a vLLM step with preemptions as SGLang's retraction step:
  ``on_step(retracted=n, running=kept)`` sets r from the requests still running.
  Which requests leave is vLLM's choice, not SGLang's.
* **Free memory.** SGLang's ``available_size() + evictable_size()`` counts radix-cache
  tokens that no running request holds as free (they are evicted on demand). vLLM's
  free block pool already holds cached blocks whose reference count is zero, so
  ``AdmitContext.kv_free_tokens`` (free blocks × block size) is the same quantity, in
  whole blocks. SGLang's default ``page_size`` is 1 (token-granular KV); ``page_size``
  here only rounds the prompts of requests admitted earlier in the same pass, as
  ``ceil_paged_tokens`` does.
* **Prefix hits.** ``extend_input_len`` is the prompt minus its radix-cache prefix
  match; tuned's :class:`ReqInfo` carries no prefix-hit length, so the whole prompt
  (plus tokens already generated, for a preempted request) is charged, which is
  conservative when prompts share prefixes.
* **Steps.** SGLang runs a prefill batch *or* a decode batch per iteration and decays r
  only in decode iterations; vLLM mixes both in one step. ``on_step`` is to be called
  once per engine step that ran decodes (``num_decode_steps=1``), with ``idle=True``
  for a step with nothing to run. Admission in a step uses r as it stood after the
  previous step, as in SGLang (``get_new_batch_prefill`` runs before
  ``update_running_batch``).
* **Other limits** SGLang applies in the same pass (``max_prefill_tokens``, chunked
  prefill, ``max_running_requests``) are vLLM's token budget and batch cap here; the
  ``ignore_eos`` path (``add_one_req_ignore_eos``, only with the radix cache
  disabled) and hybrid SWA/Mamba pools are not reproduced.
* A vLLM running request still in chunked prefill is charged like a decoding one
  (its remaining output times r); the rest of its prompt is not reserved.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Verdict

INIT_NEW_TOKEN_RATIO = 0.7            # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14     # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600     # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20             # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096            # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


def ratio_after_retract(kept: Iterable[tuple[int, int]],
                        retract_decode_steps: int = RETRACT_DECODE_STEPS) -> float:
    """``retract_decode``'s new ratio from the requests kept running, given as
    (tokens generated, max_new_tokens) pairs:
    ``min(1.0, (Σ generated + steps · n) / (Σ max_new_tokens + 1))``."""
    decoded = total_max_new = n = 0
    for generated, max_new in kept:
        decoded += generated
        total_max_new += max_new
        n += 1
    return min(1.0, (decoded + retract_decode_steps * n) / (total_max_new + 1))


class NewTokenRatio:
    """SGLang's ``new_token_ratio`` state machine (``NewTokenRatioTracker``).

    ``value`` starts at ``init = min(init_new_token_ratio · schedule_conservativeness, 1)``;
    :meth:`on_decode_step` lowers it by ``decay = (init − min) / decay_steps`` down to
    ``min = min(init · min_new_token_ratio_factor, 1)``; :meth:`on_retract` sets it from
    the requests kept after a retraction; :meth:`on_idle` resets it to ``init``.
    """

    __slots__ = ("init", "min", "decay", "value", "retract_decode_steps")

    def __init__(self, *, schedule_conservativeness: float = 1.0,
                 init_new_token_ratio: float = INIT_NEW_TOKEN_RATIO,
                 min_new_token_ratio_factor: float = MIN_NEW_TOKEN_RATIO_FACTOR,
                 new_token_ratio_decay_steps: int = NEW_TOKEN_RATIO_DECAY_STEPS,
                 retract_decode_steps: int = RETRACT_DECODE_STEPS) -> None:
        if schedule_conservativeness < 0:
            raise ValueError(f"sglang: schedule_conservativeness must be >= 0, got "
                             f"{schedule_conservativeness}")
        if new_token_ratio_decay_steps <= 0:
            raise ValueError(f"sglang: new_token_ratio_decay_steps must be > 0, got "
                             f"{new_token_ratio_decay_steps}")
        self.init = min(init_new_token_ratio * schedule_conservativeness, 1.0)
        self.min = min(self.init * min_new_token_ratio_factor, 1.0)
        self.decay = (self.init - self.min) / new_token_ratio_decay_steps
        self.value = self.init
        self.retract_decode_steps = retract_decode_steps

    def on_decode_step(self) -> float:
        """A decode step that did not retract: ``value = max(value − decay, min)``."""
        self.value = max(self.value - self.decay, self.min)
        return self.value

    def on_retract(self, kept: Iterable[tuple[int, int]]) -> float:
        """A decode step that retracted: the value re-estimated from the (tokens
        generated, max_new_tokens) of the requests still running."""
        self.value = ratio_after_retract(kept, self.retract_decode_steps)
        return self.value

    def on_idle(self) -> float:
        """The scheduler had nothing to run: back to ``init``."""
        self.value = self.init
        return self.value


class SglangPolicy(QueuePolicy):
    """Arrival order; admit while SGLang's ``rem_total_tokens`` stays above the need.

    Options: ``schedule_conservativeness`` (SGLang's ``--schedule-conservativeness``),
    ``clip_max_new_tokens``, ``page_size``, and the environment knobs of the ratio
    (``init_new_token_ratio``, ``min_new_token_ratio_factor``,
    ``new_token_ratio_decay_steps``, ``retract_decode_steps``), all with SGLang's
    defaults. The engine must call :meth:`on_step` once per step (see module docstring).
    """

    name = "sglang"
    uses_running_progress = True

    def __init__(self, *, schedule_conservativeness: float = 1.0,
                 clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS, page_size: int = 1,
                 init_new_token_ratio: float = INIT_NEW_TOKEN_RATIO,
                 min_new_token_ratio_factor: float = MIN_NEW_TOKEN_RATIO_FACTOR,
                 new_token_ratio_decay_steps: int = NEW_TOKEN_RATIO_DECAY_STEPS,
                 retract_decode_steps: int = RETRACT_DECODE_STEPS, rng=None) -> None:
        super().__init__(rng=rng)
        if clip_max_new_tokens < 0 or page_size < 1:
            raise ValueError(f"sglang: need clip_max_new_tokens >= 0 and page_size >= 1, "
                             f"got {clip_max_new_tokens} and {page_size}")
        self.clip_max_new_tokens = int(clip_max_new_tokens)
        self.page_size = int(page_size)
        self.ratio = NewTokenRatio(
            schedule_conservativeness=float(schedule_conservativeness),
            init_new_token_ratio=float(init_new_token_ratio),
            min_new_token_ratio_factor=float(min_new_token_ratio_factor),
            new_token_ratio_decay_steps=int(new_token_ratio_decay_steps),
            retract_decode_steps=int(retract_decode_steps))

    # ---------------------------------------------------------------- order
    def order_key(self, info: ReqInfo) -> float:
        return info.arrival_s

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        return sorted(waiting, key=self.order_key)

    # ---------------------------------------------------------------- the check
    def _ceil_paged(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def running_reserve(self, running: Iterable[ReqInfo]) -> float:
        """Σ over running requests of ``min(max_new − generated, clip) · ratio``."""
        r = self.ratio.value
        return sum(min(q.max_tokens - q.output_tokens, self.clip_max_new_tokens) * r
                   for q in running)

    def admitted_reserve(self, admitted: Iterable[ReqInfo]) -> int:
        """Σ over requests admitted this pass of ``ceil_paged(input) + min(max_new, clip)``."""
        return sum(self._ceil_paged(q.prompt_tokens + q.output_tokens)
                   + min(q.max_tokens, self.clip_max_new_tokens) for q in admitted)

    def total_tokens(self, candidate: ReqInfo) -> int:
        """``extend_input_len + min(max(max_new − generated, 0), clip)``."""
        return (candidate.prompt_tokens + candidate.output_tokens
                + min(max(candidate.max_tokens - candidate.output_tokens, 0),
                      self.clip_max_new_tokens))

    def rem_total_tokens(self, running: Iterable[ReqInfo], admitted: Iterable[ReqInfo],
                         ctx: AdmitContext) -> float:
        """``available + evictable − rem_total_token_offset``."""
        return ctx.kv_free_tokens - self.running_reserve(running) - self.admitted_reserve(
            admitted)

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        need = self.total_tokens(candidate)
        reserve = self.running_reserve(running)
        admitted = self.admitted_reserve(admitted_this_step)
        rem = ctx.kv_free_tokens - reserve - admitted
        detail = (f"{ctx.kv_free_tokens} free - {reserve:g} running x ratio "
                  f"{self.ratio.value:.4f} - {admitted} admitted = {rem:g}")
        if need >= rem:
            return Verdict(False, f"sglang: no token, needs {need} >= {detail}")
        return Verdict(True, f"sglang: fits, needs {need} < {detail}")

    # ---------------------------------------------------------------- engine events
    def on_step(self, num_decode_steps: int = 1, retracted: int = 0,
                running: Sequence[ReqInfo] | None = None, idle: bool = False) -> float:
        """Advance the ratio by one engine step; returns the new value.

        ``idle``: nothing ran (reset to init). Otherwise ``num_decode_steps`` decode
        steps ran; with ``retracted`` > 0 the last of them preempted requests, and the
        ratio is re-estimated from ``running``, the requests still running after it
        (their ``output_tokens`` and ``max_tokens``). If ``running`` is not given the
        estimate is impossible and the ratio goes back to init instead (noted in
        ``stats.last_reason``).
        """
        if idle:
            return self.ratio.on_idle()
        if retracted <= 0:
            for _ in range(num_decode_steps):
                self.ratio.on_decode_step()
            return self.ratio.value
        for _ in range(num_decode_steps - 1):
            self.ratio.on_decode_step()
        if running is None:
            self.stats.last_reason = ("sglang: retraction reported without the running "
                                      "requests; new_token_ratio reset to init")
            return self.ratio.on_idle()
        return self.ratio.on_retract((q.output_tokens, q.max_tokens) for q in running)


__all__ = ["CLIP_MAX_NEW_TOKENS", "INIT_NEW_TOKEN_RATIO", "MIN_NEW_TOKEN_RATIO_FACTOR",
           "NEW_TOKEN_RATIO_DECAY_STEPS", "NewTokenRatio", "RETRACT_DECODE_STEPS",
           "SglangPolicy", "ratio_after_retract"]


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "sglang", "kind": "queue", "build": "SglangPolicy", "order": 60,
    "summary": "SGLang's new_token_ratio admission",
    "options": {
        "schedule_conservativeness": {"type": "float", "default": 1.0, "lo": 0.0,
                                      "doc": "scales the ratio schedule"},
        "clip_max_new_tokens": {"type": "int", "default": CLIP_MAX_NEW_TOKENS, "lo": 0,
                                "doc": "max_tokens counted at most this many"},
        "page_size": {"type": "int", "default": 1, "lo": 1, "doc": "KV page in tokens"},
        "init_new_token_ratio": {"type": "float", "default": INIT_NEW_TOKEN_RATIO,
                                 "doc": "the ratio at start"},
        "min_new_token_ratio_factor": {"type": "float",
                                       "default": MIN_NEW_TOKEN_RATIO_FACTOR,
                                       "doc": "the lowest ratio, as a share of the first"},
        "new_token_ratio_decay_steps": {"type": "int",
                                        "default": NEW_TOKEN_RATIO_DECAY_STEPS, "lo": 1,
                                        "doc": "steps the ratio decays over"},
        "retract_decode_steps": {"type": "int", "default": RETRACT_DECODE_STEPS,
                                 "doc": "decode steps assumed after a retraction"},
    },
    "bench": [{"name": "sglang", "kind": "peer",
               "config": {"batch_policy": "static", "queue_policy": "sglang",
                          "queue_options": {}}}],
}
