"""The admission guard around any queue policy's choice (``admission_guard = "tpot"``).

A queue policy chooses the next request to admit; the guard decides whether that
request's prefill may run *now*: it holds the choice while the prefill would push a
running request over its TPOT target (:meth:`AdmissionGuard.tpot_room`) or a cohort of
prompts still prefilling over the TTFT target (:meth:`AdmissionGuard.ttft_room`). It
reads the engine's running requests (their progress, their remaining prompt tokens)
and the step model T(b, c, kv) the controller publishes, so it lives beside the queue
core that owns those, and wraps every policy the same way. Off without a step model
or an SLA; a held request never waits forever (with nothing to protect it is
admitted, and the guard holds one only while it can still meet its TTFT target, or
without one, at most :data:`HOLD_BOUND_PREFILLS` times its own prefill alone).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tuned.core.queue_policy import AdmitContext, ReqInfo

#: why the guard holds a choice: a running request's TPOT, a prefilling cohort's TTFT
HOLD_REASONS = ("tpot_guard", "ttft_guard")


def prompt_tokens_left(r) -> int:
    """Prompt tokens a running request has still to prefill (0 once through its
    prompt; an engine request without ``num_computed_tokens`` counts as none done)."""
    done = int(getattr(r, "num_computed_tokens", 0) or 0)
    return max(int(r.num_prompt_tokens) - done, 0)


#: the guard holds one request at least this many times its own prefill alone,
#: T(0, p), and without a TTFT target at most that: what it protects (the running
#: requests' TPOT) is paid for in the held prompt's TTFT, and this bounds that price to
#: a multiple of the prompt's own service time. With a TTFT target it holds the prompt
#: while it can still meet it: until that many prefills alone before its TTFT deadline
#: (:meth:`AdmissionGuard.hold_bound_s`)
HOLD_BOUND_PREFILLS = 2.0


#: who held an admission besides the guard: the queue policy's own deferrals
HELD_BY_POLICY = "queue_policy"


def holds_between(before: Mapping | None, after: Mapping | None) -> tuple | None:
    """The admissions held between two queue snapshots (:meth:`QueueCore.snapshot
    <tuned.core.queue.QueueCore.snapshot>`), by who held them: ``((reason, n), ...)``
    for the guard's :data:`HOLD_REASONS`, then :data:`HELD_BY_POLICY` (the policy's
    ``deferred`` count includes the guard's holds), only those with a hold. None
    without a snapshot now (vLLM's own queue: unknown); a policy switch restarts the
    policy's counts, so a count that fell counts from zero."""
    if not after:
        return None
    before = before or {}
    held_now, held_then = after.get("guard_held") or {}, before.get("guard_held") or {}
    out = []
    for reason in HOLD_REASONS:
        n = held_now.get(reason, 0) - held_then.get(reason, 0)
        if n < 0:
            n = held_now.get(reason, 0)
        if n > 0:
            out.append((reason, n))
    guard = sum(n for _, n in out)
    deferred = after.get("deferred", 0) - before.get("deferred", 0)
    if deferred < 0 or before.get("policy") != after.get("policy"):
        deferred = after.get("deferred", 0)
    if deferred - guard > 0:
        out.append((HELD_BY_POLICY, deferred - guard))
    return tuple(out)


class AdmissionGuard:
    """The guard's state: when each running request's first token came out (its TPOT
    clock) and how many times the guard held a choice, by reason (``held``, keys
    :data:`HOLD_REASONS`; ``holds``: all of them)."""

    def __init__(self) -> None:
        self.first_token_s: dict[str, float] = {}
        self.held = dict.fromkeys(HOLD_REASONS, 0)
        self.held_since: dict[str, float] = {}

    @property
    def holds(self) -> int:
        return sum(self.held.values())

    def begin_step(self, ctx: AdmitContext, running: Sequence) -> None:
        """Top of a step: a running request's first token came out in the step that
        just ended (cost: one dict lookup per running request, only while on)."""
        if ctx.step_model is not None and ctx.tpot_sla_s > 0:
            first = self.first_token_s
            for r in running:
                if r.num_output_tokens >= 1 and r.request_id not in first:
                    first[r.request_id] = ctx.now_s

    def hold_reason(self, cand: ReqInfo, ctx: AdmitContext, running: Sequence,
                    infos: Mapping[str, ReqInfo]) -> str | None:
        """``"tpot_guard"`` or ``"ttft_guard"`` when ``cand`` must wait, else None
        (also once the guard has held it for :meth:`hold_bound_s`)."""
        since = self.held_since.get(cand.request_id)
        if since is not None and ctx.now_s - since >= self.hold_bound_s(cand, ctx, since):
            return None
        held = ("tpot_guard" if not self.tpot_room(cand, ctx, running, infos)
                else "ttft_guard" if not self.ttft_room(cand, ctx, running, infos) else None)
        if held:
            self.held[held] += 1
            self.held_since.setdefault(cand.request_id, ctx.now_s)
        return held

    @staticmethod
    def hold_bound_s(cand: ReqInfo, ctx: AdmitContext, since: float | None = None) -> float:
        """How long the guard may hold ``cand`` in all, from its first hold at
        ``since``: :data:`HOLD_BOUND_PREFILLS` times its prefill alone, T(0, p), or,
        with a TTFT target (``ctx.ttft_sla_s``), while it can still meet it: until
        that many prefills alone before its TTFT deadline, if later (inf without a
        step model): on a CPU host a prefill is tens of decode steps, and a hold of
        twice it ends while the prompt's TTFT still has seconds to spare."""
        model = ctx.step_model
        if model is None:
            return float("inf")
        own = HOLD_BOUND_PREFILLS * model.predict_step_s(0, max(cand.prompt_tokens, 0))
        if ctx.ttft_sla_s > 0 and since is not None:
            return max(own, cand.arrival_s + ctx.ttft_sla_s - own - since)
        return own

    def forget(self, request_id: str) -> None:
        self.first_token_s.pop(request_id, None)
        self.held_since.pop(request_id, None)

    def prune(self, live: Iterable[str]) -> None:
        live = set(live)
        for rid in [rid for rid in self.first_token_s if rid not in live]:
            del self.first_token_s[rid]
        for rid in [rid for rid in self.held_since if rid not in live]:
            del self.held_since[rid]

    def tpot_room(self, cand: ReqInfo, ctx: AdmitContext, run: Sequence,
                  infos: Mapping[str, ReqInfo]) -> bool:
        """The per-request TPOT admission guard: may ``cand``'s prefill run now?

        vLLM's benchmark judges a request by its TPOT = (e2e - TTFT) / (output - 1),
        the mean of every step it decodes in. A prefill of p tokens lengthens the steps
        it runs in by about gamma * p (the step model's prefill term), for every
        request decoding then. For each running request past its first token, with g
        tokens out of a predicted n, the guard projects its TPOT as (time since its
        first token + (n - g) * T(b, 0, kv)) / (n - 1) without the newcomer (kv: the
        tokens resident in the cache, which every step reads) and adds
        gamma * p + beta * (n - g) with it; the newcomer waits if that pushes a request
        that still meets ``ctx.tpot_sla_s`` over it. Prompts admitted already (in this
        step too) and not yet prefilled add gamma times their remaining prompt tokens
        to every projection, with or without the newcomer: their prefill runs in the
        protected requests' steps either way. Requests already past the SLA,
        or whose first token came later than ``ctx.ttft_sla_s`` (when set), are not
        protected (they are lost either way), so one slow request cannot
        block admission; with nothing to protect the newcomer is admitted, so nothing
        waits forever. Off (always True) without a step model or an SLA."""
        model, sla, ttft = ctx.step_model, ctx.tpot_sla_s, ctx.ttft_sla_s
        if model is None or not sla > 0 or not run:
            return True
        now = ctx.now_s
        first = self.first_token_s
        t_step = model.predict_step_s(len(run), 0.0, ctx.kv_resident_tokens)
        extra_prefill = model.gamma * max(cand.prompt_tokens, 0)
        # prompts admitted already (this step's too) still to prefill: their steps are
        # the protected requests' steps as well, whatever the newcomer does
        committed = model.gamma * sum(prompt_tokens_left(r) for r in run
                                      if r.num_output_tokens < 1)
        beta = model.beta
        for r in run:
            g = r.num_output_tokens
            if g < 1:
                continue            # still in its prefill: its TPOT clock has not started
            rid = r.request_id
            t1 = first.get(rid)
            if t1 is None:
                # first seen past its first token now; it started at most g - 1 steps ago
                t1 = first[rid] = now - (g - 1) * t_step
            info = infos.get(rid)
            pred = info.predicted_output if info is not None else int(r.max_tokens or 0)
            n = max(pred, g + 1)
            rem = n - g
            denom = max(n - 1, 1)
            base = (now - t1 + rem * t_step + committed) / denom
            if base > sla:
                continue            # past saving: not protected
            if ttft > 0 and info is not None and t1 - info.arrival_s > ttft:
                continue            # its first token was late: lost either way
            if base + (extra_prefill + beta * rem) / denom > sla:
                return False
        return True

    def ttft_room(self, cand: ReqInfo, ctx: AdmitContext, run: Sequence,
                  infos: Mapping[str, ReqInfo]) -> bool:
        """The admission guard's TTFT half: may ``cand``'s prefill join the prompts
        still prefilling?

        A prompt's first token comes out at the end of the step that computes its last
        prompt token, and vLLM packs every admitted prompt into the same steps (up to
        the token budget): each newcomer delays the first token of all the prompts
        prefilling beside it by about gamma * p. On a GPU that is small; on a CPU one
        prompt's prefill is a sizeable share of a TTFT target, and a cohort admitted
        together can make all its members miss a TTFT that each would meet alone. With
        ``ctx.ttft_sla_s`` set, the newcomer waits while it would push a prefilling
        request that still meets the TTFT SLA over it (predicted first token:
        now + T(b, remaining prefill tokens of the cohort)), or would itself meet the
        SLA prefilled alone but not in this cohort (else each newcomer finds the
        cohort already late and it snowballs). Requests that miss it anyway are not
        protected; with no prompt prefilling the newcomer is admitted, so nothing
        waits forever. Off (always True) without a step model or a TTFT SLA."""
        model, sla = ctx.step_model, ctx.ttft_sla_s
        if model is None or not sla > 0:
            return True
        arrivals: list[float] = []
        tokens = 0
        for r in run:
            if r.num_output_tokens >= 1:
                continue
            rem = prompt_tokens_left(r)
            info = infos.get(r.request_id)
            if rem <= 0 or info is None:
                continue        # its last prompt token is already scheduled
            tokens += rem
            arrivals.append(info.arrival_s)
        if not arrivals:
            return True
        p = max(cand.prompt_tokens, 0)
        first = ctx.now_s + model.predict_step_s(len(run), tokens)
        later = first + model.gamma * p
        if any(first - a <= sla < later - a for a in arrivals):
            return False
        # nor may it doom itself by joining: one that would meet the SLA prefilled
        # alone now but not in this cohort waits for a smaller one
        wait = ctx.now_s - cand.arrival_s
        return not (later - cand.arrival_s > sla >= wait + model.predict_step_s(0, p))
