"""tuned's configuration: one frozen, validated object, :class:`Config`.

Configuration flows one way: file (or defaults) -> :class:`Config` -> constructors.
Every field carries its type, its allowed range and a one-line doc; that table is
the manual (`tuned check-config --explain` prints it, :mod:`tuned.config.manual`) and
the validator (:func:`validate`): a field's range and the rule that enforces it sit
in this one module.

Fields marked ``restart`` size the engine (model, ceiling, ports); a live reload
that changes one of them is reported as needing a restart and the running value
is kept.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuned.base.demo_model import DEMO_MAX_MODEL_LEN
from tuned.base.inputs import CLIP_CHARS, clip, clip_path, clip_text
from tuned.config.vllm_args import vllm_args_problems
from tuned.core import refusal
from tuned.core.ring import FINISHED_RING
# the policies' names and option schemas, read as data: no policy code is imported
from tuned.policies import catalog

SLA_MODES = ("evidence", "paper")
MEMORY_DEMANDS = ("occupancy", "lifetime")
SLA_STATISTICS = catalog.SLA_STATISTICS
TOKEN_BUDGET_POLICIES = ("auto", "sla", "max")
WAIT_BOUND_MODES = refusal.MODES
ADMISSION_GUARDS = ("tpot", "off")
LOG_LEVELS = ("debug", "info", "warning", "error")


def __getattr__(name: str) -> Any:
    # the policy names, from the catalog when first asked
    if name == "BATCH_POLICIES":
        return catalog.names("batch")
    if name == "QUEUE_POLICIES":
        return catalog.names("queue")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _f(default: Any, doc: str, *, lo: float | None = None, hi: float | None = None,
       choices: tuple | None = None, restart: bool = False, optional: bool = False,
       secret: bool = False, hi_open: bool = False, policies: str | None = None):
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": choices, "restart": restart,
            "optional": optional, "default": default, "secret": secret,
            "hi_open": hi_open, "policies": policies}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta, repr=not secret)


@dataclass(frozen=True)
class Config:
    # --- engine (restart to change) ---
    model: str = _f("demo:small", "model folder, Hugging Face id (owner/name, passed to "
                    "vLLM unchanged), or demo:tiny / demo:small to build the random-weight "
                    "demo Llama locally", restart=True)
    max_num_seqs: int = _f(32, "ceiling on running sequences handed to vLLM; tuned's cap "
                           "moves inside [b_min, max_num_seqs]", lo=1, hi=4096, restart=True)
    max_num_batched_tokens: int = _f(2048, "vLLM's per-step token ceiling; tuned's token "
                                     "budget moves below it", lo=16, hi=1 << 20, restart=True)
    max_model_len: int = _f(0, "longest prompt+output in tokens (0 = the model's own "
                            "context length, read by vLLM from the model; "
                            f"{DEMO_MAX_MODEL_LEN} for the demo models)", lo=0, hi=1 << 20,
                            restart=True)
    num_gpu_blocks: int = _f(0, "KV-cache blocks to allocate (0 = let vLLM size the cache)",
                             lo=0, hi=1 << 24, restart=True)
    host: str = _f("127.0.0.1", "address of the OpenAI-compatible server (an IP address "
                   "or a host name)", restart=True)
    port: int = _f(8000, "port of the OpenAI-compatible server", lo=1, hi=65535, restart=True)
    metrics_host: str = _f("127.0.0.1", "address of tuned's /metrics endpoint (an IP "
                           "address or a host name)", restart=True)
    metrics_port: int = _f(9464, "port of tuned's endpoint (plus the data-parallel rank; "
                           "0 = any free port)", lo=0, hi=65535, restart=True)
    reload_token: str = _f("", "shared secret: POST /reload from a non-loopback peer must "
                           "send 'Authorization: Bearer <token>' ('' = loopback peers only)",
                           restart=True, secret=True)
    vllm_args: tuple[str, ...] = _f((), "extra arguments passed to vLLM's server", restart=True)

    # --- controller loop ---
    interval_s: float = _f(0.5, "controller period", lo=0.05, hi=60.0)
    stale_after_s: float = _f(5.0, "a decision older than this makes the scheduler apply "
                              "fallback_cap", lo=0.2, hi=3600.0)
    engine_stall_s: float = _f(0.0, "with requests in the engine and no engine step "
                               "completed for this long, /healthz answers 503 and the "
                               "systemd watchdog is no longer pinged (0 = the larger of "
                               "20 s and 2 * interval_s)", lo=0.0, hi=3600.0)
    fallback_cap: int = _f(4, "safe static cap applied when the controller fails or stalls",
                           lo=1, hi=4096)
    b_min: int = _f(1, "lowest batch size tuned may choose (B_min)", lo=1, hi=4096)
    b_max: int = _f(0, "highest batch size tuned may choose (B_max); 0 = max_num_seqs",
                    lo=0, hi=4096)
    gpu_memory_floor: float = _f(0.02, "device free-memory floor (NVML, a fraction of the "
                                 "GPU's memory, the lowest over visible GPUs): below it "
                                 "the cap halves per tick (reason gpu_memory_pressure); "
                                 "it doubles back once free memory has been at twice "
                                 "the floor (at most halfway to 1) for 3 ticks (0 = "
                                 "off; no effect without NVML)", lo=0.0, hi=1.0,
                                 hi_open=True)
    cap_raise_hold_s: float = _f(0.0, "damping: a higher cap applies only once a raise has "
                                 "been wanted on every tick for this long, then to the "
                                 "lowest cap wanted meanwhile (reason cap_raise_hold "
                                 "while held); a lower cap applies at once (0 = off)",
                                 lo=0.0, hi=600.0)
    min_chunk_tokens: int = _f(32, "room kept in the token budget for a prefill chunk "
                               "above the cap", lo=1, hi=1 << 20)
    token_budget_granule: int = _f(256, "round the SLA-sized token budget down to a "
                                   "multiple of this many tokens: a GPU's step time "
                                   "jumps just past a multiple of its GEMM tile; 0 = off "
                                   "(a CPU host, whose step time grows smoothly)",
                                   lo=0, hi=1 << 20)

    # --- memory bound: Pang et al.'s Algorithm 1 ---
    eps_m: float = _f(0.05, "allowed probability that KV demand overflows the cache (eps_M)",
                      lo=1e-6, hi=0.5)
    memory_demand: str = _f("occupancy", "a request's KV demand in the memory bound: the "
                            "blocks it holds at a random decode step (occupancy: a "
                            "continuous batch's requests are at different points of their "
                            "lives; the prompts of the requests running and waiting now "
                            "with the finished ones' outputs) or its whole prompt plus "
                            "output (lifetime: Pang et al.'s rule as published, a static "
                            "batch's demand, from finished requests)", choices=MEMORY_DEMANDS)
    # short, so that the estimate follows a change of the request mix (a phase of long
    # prompts, then chat) within a few seconds of load instead of lagging it by the
    # whole window
    demand_window: int = _f(16, "finished requests used for the mean/variance of KV demand "
                            "(at most the finished requests the engine keeps)",
                            lo=2, hi=FINISHED_RING)
    min_demand_samples: int = _f(8, "finished requests needed before the memory bound acts",
                                 lo=1, hi=100000)

    # --- SLA bound: Pang et al.'s Algorithm 2 ---
    tbt_sla_s: float = _f(0.0, "time-between-tokens SLA D_SLA in seconds, below 1 (50 ms "
                          "is 0.05; a second or more between tokens is refused as "
                          "probably milliseconds); 0 = no SLA (memory alone decides)",
                          lo=0.0, hi=1.0, hi_open=True)
    tbt_sla_auto: float = _f(0.0, "derive the TBT SLA at start as this multiple of the "
                             "decode step time this host measures at batch 1 (when "
                             "tbt_sla_s = 0; 0 = off)", lo=0.0, hi=100.0)
    eps_d_s: float = _f(0.002, "SLA tolerance eps_D in seconds: a TBT within tbt_sla_s "
                        "plus or minus this counts as at the SLA, and the SLA search "
                        "narrows around the batch instead of moving", lo=0.0, hi=10.0)
    ttft_sla_s: float = _f(0.0, "time-to-first-token target in seconds: with the fcfs "
                           "queue, requests that waited longer (late already) are served "
                           "after those that can still make it (0 = off)",
                           lo=0.0, hi=3600.0)
    max_wait_s: float = _f(0.0, "bound on a request's wait for its first token, in seconds "
                           "(0 = with a TTFT target, the target itself when on_max_wait is "
                           "refuse and 10 x it when serve; else no bound); see on_max_wait",
                           lo=0.0, hi=86400.0)
    on_max_wait: str = _f("refuse", "what the wait bound does: refuse (a waiting request "
                          "is refused as soon as its first token is predicted past "
                          "max_wait_s from its arrival, from the work ahead of it at the "
                          "engine's measured pace under the cap, so its client can "
                          "retry elsewhere at once; a new request is turned away at the "
                          "API server by the same prediction), serve (served late, never refused) or off (no "
                          "bound: late requests wait for a lull). With refuse or serve, a "
                          "request that has waited age_after_s is admitted before the "
                          "queue policy's choice (aging)", choices=WAIT_BOUND_MODES)
    age_after_s: float = _f(0.0, "with a wait bound, a request that has waited this long is "
                            "admitted before the queue policy's choice, oldest first "
                            "(0 = 2 x ttft_sla_s, at most half of the bound; without a "
                            "TTFT target, half of the bound)", lo=0.0, hi=86400.0)
    alpha: int = _f(2, "narrowest interval of batch sizes the SLA search keeps, in "
                    "sequences (alpha)", lo=1, hi=4096)
    delta: int = _f(1, "how far the SLA search's other end moves back at each step, in "
                    "sequences, so that a step taken on a noisy measurement can be "
                    "undone (delta)", lo=0, hi=4096)
    tbt_window_s: float = _f(2.0, "window of recent steps for mean TBT and decode batch",
                             lo=0.05, hi=600.0)
    sla_mode: str = _f("evidence", "how the SLA search (Pang et al.'s Algorithm 2) moves "
                       "its interval: evidence (rise or narrow only from ticks where the "
                       "cap was binding, fall on measured violations; see docs) or paper "
                       "(Pang et al.'s rule as published)",
                       choices=SLA_MODES)
    sla_statistic: str = _f("auto", "what is held to tbt_sla_s: auto (p90 while the token "
                            "budget sizes prefill chunks for the SLA, decode_p90 while it "
                            "does not, as with token_budget_policy auto on a CPU host), "
                            "the 90th percentile of the "
                            "decode step times over tbt_window_s (p90) or their mean (mean, "
                            "Pang et al.'s), the "
                            "mean held to a margin below tbt_sla_s learnt from finished "
                            "requests' TPOT so that sla_attainment_target of them meet it "
                            "(attainment; the tuned and sla batch policies, sla_mode "
                            "evidence), or the 90th percentile of the decode steps without "
                            "prefill plus what prefill added to the mean step (decode_p90: "
                            "p90 without its jump once a tenth of the steps prefill)",
                            choices=SLA_STATISTICS)
    late_queue: str = _f("auto", "what the SLA bound does once the longest-waiting "
                         "request has waited past lift_after_s (half of ttft_sla_s): "
                         "auto (hold while the wait bound refuses: the queue refuses the "
                         "requests that cannot meet their TTFT, so a larger batch would "
                         "only cost the running ones their TPOT; lift_tpot otherwise), "
                         "lift_tpot (the cap goes up to the largest batch the step model "
                         "puts within tbt_sla_s, at most the memory bound, until none "
                         "has: holding TPOT while the queue's head is about to be late "
                         "grows the queue and every later request's TTFT, and past that "
                         "batch every request decoding meanwhile misses its TPOT; the SLA "
                         "search resumes one TBT window later), lift (the same, to the "
                         "memory bound: the queue drains faster, the decoding requests "
                         "pay in TPOT) or hold (Pang et al.'s: the SLA bound holds whatever "
                         "waits); needs ttft_sla_s > 0 and sla_mode evidence",
                         choices=("auto", "lift", "lift_tpot", "hold"))
    lift_after_s: float = _f(0.0, "with late_queue lift or lift_tpot: how long the "
                             "longest-waiting request may wait before the cap is lifted "
                             "(0 = half of ttft_sla_s: the lift comes while the queue's "
                             "head can still meet its TTFT, the other half left for its "
                             "prefill and the host's stalls). Longer: fewer lifts and a "
                             "longer TTFT tail; shorter: more of the decoding requests' "
                             "TPOT spent on the queue", lo=0.0, hi=86400.0)
    sla_attainment_target: float = _f(0.9, "with sla_statistic = attainment: the share of "
                                      "finished requests whose TPOT the margin aims to "
                                      "keep within tbt_sla_s", lo=0.5, hi=0.999)
    batch_policy: str = _f("tuned", "batch-size policy: a batch policy listed below, or "
                           "package.module:Class (your own)", policies="batch")
    batch_options: dict = _f({}, "options of the batch policy (a TOML table; each "
                             "policy's options are listed below)")
    token_budget_policy: str = _f("auto", "per-step token budget: sla (the largest prefill "
                                  "chunk that keeps the predicted step time within "
                                  "tbt_sla_s), max (max_num_batched_tokens) or auto (sla "
                                  "where token_budget_granule > 0, a GPU whose step time "
                                  "is a staircase in the tokens; max where it is 0, a "
                                  "host whose step time is a line: there a chunk changes "
                                  "no request's mean step, its TPOT, and only delays the "
                                  "prompt's first token)",
                                  choices=TOKEN_BUDGET_POLICIES)
    admission_guard: str = _f("tpot", "tpot: with a TBT SLA and a tuned waiting queue, "
                              "a new prompt waits while its prefill would push a running "
                              "request that still meets the SLA over it (per-request TPOT, "
                              "vLLM's benchmark definition), and with ttft_sla_s while it "
                              "would push a prompt prefilling beside it past the TTFT "
                              "target; off: admit on the cap alone",
                              choices=ADMISSION_GUARDS)

    # --- policies and curves ---
    queue_policy: str = _f("fcfs", "waiting-queue and admission policy (listed below)",
                           policies="queue")
    queue_options: dict = _f({}, "options of the queue policy (a TOML table; each "
                             "policy's options are listed below), e.g. "
                             "{reserve_fraction = 0.05} for mcsf")
    class_deadlines_s: dict = _f({}, "SLA table: request class (vllm_xargs tuned_class) -> "
                                 "deadline in seconds, for saber")
    queue_seed: int = _f(0, "seed of the queue policies' random choices", lo=0, hi=2**31 - 1)
    profile: str = _f("", "speed-curve profile file from `tuned profile` ('' = none)")
    log_level: str = _f("info", "log level", choices=LOG_LEVELS)

    # Where this config was read from ('' for the embedded default); not a TOML key.
    source_path: str = field(default="", compare=False, metadata={"internal": True})
    # Where a config dropped into a vLLM command line came from (:class:`Sources`), so
    # that a reload rebuilds it the same way; None otherwise. Not a TOML key.
    sources: Any = field(default=None, compare=False, repr=False,
                         metadata={"internal": True})

    def queue_spec(self) -> tuple[str, dict]:
        """The queue policy and its options as installed: fcfs with a TTFT target
        demotes late requests (``late_after_s``) unless its options say otherwise."""
        opts = dict(self.queue_options)
        if self.queue_policy == "fcfs" and self.ttft_sla_s > 0:
            opts.setdefault("late_after_s", self.ttft_sla_s)
        return self.queue_policy, opts

    def wait_bound_spec(self) -> tuple[float, bool, float] | None:
        """(bound, refuse at it, aging point), in seconds, of the wait bound, or None
        without one: the bound is ``max_wait_s``, else ``ttft_sla_s`` (refuse) or 10 x
        it (serve) when a TTFT target is set; the aging point ``age_after_s``, else 2 x
        ``ttft_sla_s``, at most half the bound (:func:`tuned.core.refusal.bound_spec`)."""
        return refusal.bound_spec(self.on_max_wait, self.max_wait_s, self.ttft_sla_s,
                                  self.age_after_s)

    @property
    def native_queue(self) -> bool:
        """True when the engine may keep its own FCFS queue (no tuned queue needed)."""
        name, opts = self.queue_spec()
        return (name == "fcfs" and not opts and not self.guards_admission
                and self.wait_bound_spec() is None)

    @property
    def late_queue_mode(self) -> str:
        """``late_queue`` as it acts: auto is hold while the wait bound refuses, else
        lift_tpot."""
        if self.late_queue != "auto":
            return self.late_queue
        return "hold" if refusal.refuses(self.wait_bound_spec()) else "lift_tpot"

    @property
    def guards_admission(self) -> bool:
        """Whether the per-request TPOT admission guard is on (it needs an SLA)."""
        return self.admission_guard == "tpot" and bool(self.tbt_sla_s or self.tbt_sla_auto)

    @property
    def effective_engine_stall_s(self) -> float:
        return self.engine_stall_s or max(20.0, 2 * self.interval_s)

    @property
    def effective_b_max(self) -> int:
        return self.b_max or self.max_num_seqs

    @property
    def effective_max_model_len(self) -> int | None:
        """The ``--max-model-len`` tuned gives vLLM: the config's, else the demo
        models' :data:`~tuned.base.demo_model.DEMO_MAX_MODEL_LEN`, else None (the flag is
        left out and vLLM reads the model's own)."""
        if self.max_model_len:
            return self.max_model_len
        return DEMO_MAX_MODEL_LEN if self.model.startswith("demo:") else None

    @property
    def sla_enabled(self) -> bool:
        return self.tbt_sla_s > 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(dataclasses.replace(self, sources=None))
        d.pop("sources")
        d["vllm_args"] = list(self.vllm_args)
        d["queue_options"] = dict(self.queue_options)
        d["batch_options"] = dict(self.batch_options)
        d["class_deadlines_s"] = dict(self.class_deadlines_s)
        return d


FIELDS = {f.name: f for f in dataclasses.fields(Config) if not f.metadata.get("internal")}
RESTART_FIELDS = tuple(n for n, f in FIELDS.items() if f.metadata["restart"])
#: fields never written to a file or shown (the reload token)
SECRET_FIELDS = tuple(n for n, f in FIELDS.items() if f.metadata.get("secret"))


class ConfigError(ValueError):
    """A config that failed validation; ``problems`` holds one line per field."""

    def __init__(self, problems: list[str], source: str = ""):
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(problems))


def type_name(t: Any) -> str:
    return {"int": "an integer", "float": "a number", "str": "a string",
            "tuple[str, ...]": "a list of strings", "dict": "a table"}.get(str(t), str(t))


def range_text(meta: dict) -> str:
    if meta.get("policies"):
        return "one of " + ", ".join(catalog.names(meta["policies"])) + (
            " or package.module:Class" if meta["policies"] == "batch" else "")
    if meta["choices"]:
        return "one of " + ", ".join(meta["choices"])
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None and hi is not None:
        return f"in [{number_text(lo)}, {number_text(hi)}{')' if meta.get('hi_open') else ']'}"
    return ""


def number_text(v: Any) -> str:
    """A number as an operator reads it: 1048576 (not 1.04858e+06), 0.05, 1e-06."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, int) or (math.isfinite(v) and v.is_integer() and abs(v) < 1e15):
        return str(int(v))
    return repr(v)


def did_you_mean(word: str, known: Any, cutoff: float = 0.6) -> str:
    """``"; did you mean X?"`` for the closest of ``known`` (difflib), else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=cutoff)
    return f"; did you mean {close[0]}?" if close else ""


def _finite(v: int | float) -> bool:
    """True for a finite number; TOML integers may be too large for a float."""
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def check_field(name: str, value: Any) -> tuple[Any, str | None]:
    f = FIELDS[name]
    meta = f.metadata
    want = str(f.type)
    raw = value  # errors quote what the user wrote, not our conversion of it
    if want == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return None, f"{name}: must be {type_name(want)} {range_text(meta)}, got {clip(value)}"
    elif want == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, f"{name}: must be {type_name(want)} {range_text(meta)}, got {clip(value)}"
        if not _finite(value):
            return None, f"{name}: must be a finite number {range_text(meta)}, got {clip(value)}"
        value = float(value)
    elif want == "str":
        if not isinstance(value, str):
            return None, f"{name}: must be a string, got {clip(value)}"
    elif want == "dict":
        if not isinstance(value, dict):
            return None, f"{name}: must be a table, got {clip(value)}"
        value = dict(value)
    elif want == "tuple[str, ...]":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            return None, f"{name}: must be a list of strings, got {clip(value)}"
        value = tuple(value)
    if meta["choices"] and value not in meta["choices"]:
        return None, f"{name}: must be {range_text(meta)}, got {clip(raw)}"
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None and (value < lo or value > hi or (meta.get("hi_open") and value == hi)):
        hint = ""
        if name in MS_HINT_FIELDS and value >= hi:
            hint = (f" (probably milliseconds: the SLA is in seconds, {number_text(value)} ms "
                    f"is {number_text(round(value / 1000, 9))})")
        return None, f"{name}: must be {range_text(meta)}, got {clip(raw)}{hint}"
    if name in HOST_FIELDS and (why := host_problem(value)):
        return None, f"{name}: must be an IP address or a host name, got {clip(raw)} ({why})"
    return value, None


#: seconds fields where a value at the top of the range is almost surely milliseconds
MS_HINT_FIELDS = ("tbt_sla_s",)
#: fields holding an address to bind (or reach) a server on
HOST_FIELDS = ("host", "metrics_host")
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def host_problem(host: str) -> str:
    """Why ``host`` is neither an IP address nor a host name (RFC 1123), '' when it is
    one: what the servers bind and `tuned status` / reloads connect to."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return ""
    except ValueError:
        pass
    if not host:
        return "empty"
    if len(host) > 253:
        return "longer than 253 characters"
    labels = host.removesuffix(".").split(".")
    if not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return "letters, digits, '-' and '.' only, no label starting or ending with '-'"
    if labels[-1].isdigit():
        return "not a valid IP address"
    return ""


def _check_secret(name: str, value: Any) -> tuple[Any, str | None]:
    # Problems end up in logs and in /decisions (last_reload): never echo a secret.
    checked, err = check_field(name, value)
    if err:
        err = f"{name}: must be {type_name(str(FIELDS[name].type))} (value not shown)"
    return checked, err


def unknown_key(key: str) -> str:
    return (f"{clip_text(key)}: unknown key{did_you_mean(key, FIELDS)} "
            "(known keys: see `tuned check-config --explain`)")


def checked_values(values: Mapping[str, Any], label=None) -> tuple[dict[str, Any], list[str]]:
    """Each of ``values`` checked against its field (type, range, choices; a secret's
    value never echoed), converted as the field holds it, and one line per problem: an
    unknown key names the closest known one; ``label(key)`` says the key as its source
    writes it (TUNED_X, additional_config.tuned.x), the key itself without ``label``."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in values.items():
        if key not in FIELDS:
            problems.append(unknown_key(key))
            continue
        check = _check_secret if FIELDS[key].metadata.get("secret") else check_field
        checked, err = check(key, value)
        if err:
            problems.append(label(key) + err[len(key):] if label else err)
        else:
            out[key] = checked
    return out, problems


def validate(raw: dict[str, Any], source: str = "", base_dir: Path | None = None) -> Config:
    """Build a :class:`Config` from a parsed mapping, or raise :class:`ConfigError`
    listing every problem (unknown keys, types, ranges, cross-field rules)."""
    values, problems = checked_values(raw)
    if "\x00" in values.get("profile", ""):
        problems.append("profile: must be a file path, got a string with a NUL character")
    problems += policy_problems(values)
    if problems:
        raise ConfigError(problems, source)
    if values.get("profile") and base_dir is not None:
        p = Path(values["profile"])
        if not p.is_absolute():
            values["profile"] = str((base_dir / p).resolve())
    cfg = Config(**values, source_path=source)
    problems += cross_field_problems(cfg)
    if problems:
        raise ConfigError(problems, source)
    return cfg


_PLUGIN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def policy_problems(values: Mapping[str, Any]) -> list[str]:
    """The policy fields of checked ``values`` (missing ones at their defaults) held to
    the policies' declarations (:mod:`tuned.policies.catalog`): the names, then each
    option of ``batch_options`` / ``queue_options`` against its schema. Reads the
    declarations as data; no policy is imported or built."""
    problems = []
    for kind in ("batch", "queue"):
        name = values.get(f"{kind}_policy", FIELDS[f"{kind}_policy"].metadata["default"])
        options = values.get(f"{kind}_options", {})
        spec = catalog.find(kind, name)
        if spec is None:
            if kind == "batch" and _PLUGIN.fullmatch(name):
                continue   # a package.module:Class plugin reads its own options
            left_out = "; ".join(catalog.skipped())
            problems.append(f"{kind}_policy: must be "
                            f"{range_text(FIELDS[f'{kind}_policy'].metadata)}, "
                            f"got {clip(name)}{did_you_mean(name, catalog.names(kind))}"
                            + (f" (policies left out: {left_out})" if left_out else ""))
            continue
        problems += [clip_text(p, 2 * CLIP_CHARS)
                     for p in spec.option_problems(options, f"{kind}_options")]
    return problems


def cross_field_problems(cfg: Config) -> list[str]:
    problems = []
    if cfg.b_max and cfg.b_max > cfg.max_num_seqs:
        problems.append(f"b_max: must be <= max_num_seqs ({cfg.max_num_seqs}), got {cfg.b_max}")
    if cfg.b_min > cfg.effective_b_max:
        problems.append(f"b_min: must be <= b_max ({cfg.effective_b_max}), got {cfg.b_min}")
    if cfg.fallback_cap > cfg.max_num_seqs:
        problems.append(f"fallback_cap: must be <= max_num_seqs ({cfg.max_num_seqs}), "
                        f"got {cfg.fallback_cap}")
    if cfg.max_num_batched_tokens < cfg.max_num_seqs + cfg.min_chunk_tokens:
        problems.append(
            f"max_num_batched_tokens: must be >= max_num_seqs + min_chunk_tokens "
            f"({cfg.max_num_seqs + cfg.min_chunk_tokens}), got {cfg.max_num_batched_tokens}")
    if cfg.stale_after_s < 2 * cfg.interval_s:
        problems.append(f"stale_after_s: must be >= 2 * interval_s ({2 * cfg.interval_s:g}), "
                        f"got {cfg.stale_after_s:g}")
    if cfg.engine_stall_s and cfg.engine_stall_s < 2 * cfg.interval_s:
        problems.append(f"engine_stall_s: must be 0 (auto) or >= 2 * interval_s "
                        f"({2 * cfg.interval_s:g}), got {cfg.engine_stall_s:g}")
    if cfg.tbt_sla_auto and cfg.tbt_sla_auto <= 1.0:
        problems.append(f"tbt_sla_auto: must be 0 (off) or > 1 (a multiple of the batch-1 "
                        f"step time), got {cfg.tbt_sla_auto:g}")
    if cfg.sla_enabled and cfg.eps_d_s >= cfg.tbt_sla_s:
        problems.append(f"eps_d_s: must be < tbt_sla_s ({cfg.tbt_sla_s:g}), got {cfg.eps_d_s:g}")
    for cls, secs in cfg.class_deadlines_s.items():
        if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not _finite(secs) \
                or not secs > 0:
            problems.append(f"class_deadlines_s.{clip_text(cls)}: must be a number of "
                            f"seconds > 0, got {clip(secs)}")
    if cfg.profile and not Path(cfg.profile).is_file():
        problems.append(f"profile: must be an existing file, not found: "
                        f"{clip_path(cfg.profile)}")
    if cfg.metrics_port == cfg.port and cfg.metrics_host == cfg.host:
        problems.append(f"metrics_port: must be different from port ({cfg.port})")
    if cfg.max_model_len and cfg.max_model_len < 16:
        problems.append(f"max_model_len: must be 0 (the model's own) or in [16, 1048576], "
                        f"got {cfg.max_model_len}")
    if not cfg.model.strip():
        problems.append("model: must be a model folder, a Hugging Face id or demo:tiny / "
                        "demo:small, got ''")
    problems += vllm_args_problems(cfg.vllm_args)
    return problems


def restart_changes(old: Config, new: Config) -> list[str]:
    """Fields that differ between two configs but cannot change on a live engine."""
    return [n for n in RESTART_FIELDS if getattr(old, n) != getattr(new, n)]
