"""tuned's configuration: one frozen, validated object built from a TOML file.

Configuration flows one way: file (or defaults) -> :class:`Config` -> constructors.
Every field carries its type, its allowed range and a one-line doc; that table is
the manual (`tuned check-config --explain` prints it) and the validator.

Fields marked ``restart`` size the engine (model, ceiling, ports); a live reload
that changes one of them is reported as needing a restart and the running value
is kept.

One module past the usual size because it is one table (the fields) and the checks
that read it: splitting the checks from the table would put a field's range and the
rule that enforces it in two places.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuned.core import refusal
from tuned.core.ring import FINISHED_RING
from tuned.base.demo_model import DEMO_MAX_MODEL_LEN, model_form
from tuned.base.inputs import CLIP_CHARS, UserError, clip, clip_path, clip_text, read_text
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


def _type_name(t: Any) -> str:
    return {"int": "an integer", "float": "a number", "str": "a string",
            "tuple[str, ...]": "a list of strings", "dict": "a table"}.get(str(t), str(t))


def _range_text(meta: dict) -> str:
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


def _check_field(name: str, value: Any) -> tuple[Any, str | None]:
    f = FIELDS[name]
    meta = f.metadata
    want = str(f.type)
    raw = value  # errors quote what the user wrote, not our conversion of it
    if want == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return None, f"{name}: must be {_type_name(want)} {_range_text(meta)}, got {clip(value)}"
    elif want == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, f"{name}: must be {_type_name(want)} {_range_text(meta)}, got {clip(value)}"
        if not _finite(value):
            return None, f"{name}: must be a finite number {_range_text(meta)}, got {clip(value)}"
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
        return None, f"{name}: must be {_range_text(meta)}, got {clip(raw)}"
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None and (value < lo or value > hi or (meta.get("hi_open") and value == hi)):
        hint = ""
        if name in MS_HINT_FIELDS and value >= hi:
            hint = (f" (probably milliseconds: the SLA is in seconds, {number_text(value)} ms "
                    f"is {number_text(round(value / 1000, 9))})")
        return None, f"{name}: must be {_range_text(meta)}, got {clip(raw)}{hint}"
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
    checked, err = _check_field(name, value)
    if err:
        err = f"{name}: must be {_type_name(str(FIELDS[name].type))} (value not shown)"
    return checked, err


def _unknown_key(key: str) -> str:
    return (f"{clip_text(key)}: unknown key{did_you_mean(key, FIELDS)} "
            "(known keys: see `tuned check-config --explain`)")


def validate(raw: dict[str, Any], source: str = "", base_dir: Path | None = None) -> Config:
    """Build a :class:`Config` from a parsed mapping, or raise :class:`ConfigError`
    listing every problem (unknown keys, types, ranges, cross-field rules)."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in FIELDS:
            problems.append(_unknown_key(key))
            continue
        check = _check_secret if FIELDS[key].metadata.get("secret") else _check_field
        checked, err = check(key, value)
        if err:
            problems.append(err)
        else:
            values[key] = checked
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
                            f"{_range_text(FIELDS[f'{kind}_policy'].metadata)}, "
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


#: The one map of the config's engine settings to vLLM's flags: the command line tuned
#: starts vLLM with (:func:`tuned.launch.launcher.vllm_command`, in this order), the flags
#: ``vllm_args`` may not repeat (:data:`VLLM_FLAGS_SET`) and the settings
#: :func:`engine_problems` compares.
ENGINE_FLAGS = {"model": "--model", "host": "--host", "port": "--port",
                "max_num_seqs": "--max-num-seqs",
                "max_num_batched_tokens": "--max-num-batched-tokens",
                "max_model_len": "--max-model-len",
                "num_gpu_blocks": "--num-gpu-blocks-override"}

#: vLLM flags that tuned sets itself, with the config key that sets each (None: tuned's
#: own, not settable); repeating one in vllm_args would override tuned's value.
VLLM_FLAGS_SET = {**{flag: key for key, flag in ENGINE_FLAGS.items()},
                  "--scheduler-cls": None, "--additional-config": None}


def vllm_args_problems(args, field_name: str = "vllm_args") -> list[str]:
    """One line per argument that repeats a flag tuned sets itself (vLLM's last value
    wins, so it would override the config's key, or turn tuned off for
    ``--scheduler-cls``). vLLM reads ``--max_num_seqs`` as ``--max-num-seqs``."""
    problems = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        key = VLLM_FLAGS_SET.get("--" + flag[2:].replace("_", "-"), False)
        if key is False:
            continue
        instead = (f"set {key} in the config instead" if key else
                   "tuned sets it itself and cannot run without it")
        problems.append(f"{field_name}: must not contain {clip_text(flag)} ({instead})")
    return problems


#: the shipped unit's WatchdogSec (systemd/tuned.service); check-config's default
UNIT_WATCHDOG_S = 30.0


def service_problems(cfg: Config, watchdog_s: float | None) -> list[str]:
    """What only the service (`tuned serve` under systemd) cannot live with.

    ``watchdog_s`` is systemd's watchdog (WATCHDOG_USEC / 1e6, or None for none). The
    controller pings on its ticks once about ``watchdog_s / 2`` has passed
    (:class:`tuned.control.liveness.Watchdog`), so two pings are at most
    ``watchdog_s / 2 + interval_s / 2`` apart: ``interval_s <= watchdog_s / 2`` keeps
    that gap at three quarters of the watchdog, the rest is room for a late tick. The
    supervisor's reload (SIGHUP) and `tuned status` reach the endpoint at
    ``metrics_port``, which 0 (any free port) leaves unknown."""
    problems = []
    if watchdog_s is not None and watchdog_s > 0 and cfg.interval_s > watchdog_s / 2:
        problems.append(f"interval_s: must be <= {watchdog_s / 2:g} (half the systemd "
                        f"watchdog of {watchdog_s:g} s: pings ride on ticks), got "
                        f"{cfg.interval_s:g}")
    if cfg.metrics_port == 0:
        problems.append("metrics_port: must be in [1, 65535] for `tuned serve` (reloads "
                        "and `tuned status` reach the endpoint there; 0 picks an unknown "
                        "port), got 0")
    return problems


def load(path: str | Path, base: dict[str, Any] | None = None) -> Config:
    """Read and validate a TOML config file; raise :class:`ConfigError` on any problem.
    ``base``: values the file's keys are applied over (``tuned demo --config`` passes
    :data:`EMBEDDED_DEFAULT`); without it, the keys the file leaves out take
    :class:`Config`'s defaults."""
    p = Path(path)
    raw = {**(base or {}), **read_toml(p)}
    return validate(raw, source=str(p.resolve()), base_dir=p.resolve().parent)


#: a config file larger than this is not a config file
MAX_CONFIG_BYTES = 1 << 20


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed TOML table of a config file; :class:`ConfigError` (one problem)
    when it is unreadable, not a regular file, too large or not TOML."""
    p = Path(path)
    try:
        text = read_text(p, "config file", MAX_CONFIG_BYTES)
    except UserError as e:
        problem = (f"{e.problem}: a TOML file must be UTF-8" if e.problem.startswith("not UTF-8")
                   else f"cannot read config file: {e.problem}")
        raise ConfigError([problem], clip_path(p)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"not valid TOML: {clip_text(str(e), 2 * CLIP_CHARS)}"],
                          clip_path(p)) from None
    except RecursionError:
        raise ConfigError(["not valid TOML: nested too deeply"], clip_path(p)) from None


# The embedded default (`tuned serve` / `tuned demo` with no --config): the small demo
# model on a CPU host. CPU hosts differ several-fold in decode speed (AVX-512 or not,
# core count), so the TBT SLA is not a number but a multiple of the decode step this
# host measures at batch 1 (tbt_sla_auto), chosen to fall between the step at batch 1
# and at the cap's ceiling on any such host. With a TTFT target, requests that
# already missed it wait behind those that can still make it. The KV cache is sized
# to hold fewer demo requests than the cap's ceiling, so both of Pang et al.'s bounds
# have something to do.
EMBEDDED_DEFAULT = {"model": "demo:small", "max_num_seqs": 32, "max_num_batched_tokens": 2048,
                    "max_model_len": 1024, "num_gpu_blocks": 48, "tbt_sla_auto": 2.5,
                    "eps_d_s": 0.002, "ttft_sla_s": 3.0, "token_budget_granule": 0}


def default() -> Config:
    """The embedded default: the small demo model on CPU, its TBT SLA derived on this
    host (see above)."""
    return validate(dict(EMBEDDED_DEFAULT))


def engine_handoff(cfg: Config, serving_url: str | None = None) -> dict:
    """vLLM's ``additional_config`` entry that carries a validated config into the
    EngineCore process (`tuned serve` -> engine); :func:`from_engine_handoff` reads it."""
    d = cfg.to_dict()
    d.pop("source_path", None)
    # vLLM logs its non-default arguments: the reload secret travels as a digest
    # (the engine compares digests), never in clear.
    token = d.pop("reload_token", "")
    digest = hashlib.sha256(token.encode()).hexdigest() if token else ""
    return {"tuned": {"config": d, "config_path": cfg.source_path,
                      "serving_url": serving_url, "reload_token_sha256": digest}}


def from_engine_handoff(additional: dict | None) -> tuple[Config, str | None]:
    """The config the supervisor validated and shipped (never a re-read of the file,
    which may have changed since), and the URL that says the server answers.
    ``config_path`` is kept as the source that a reload re-reads."""
    extra = (additional or {}).get("tuned") or {}
    cfg = validate(dict(extra.get("config") or {}), source=extra.get("config_path") or "")
    return cfg, extra.get("serving_url")


#: the environment variable naming the config file of a vLLM command line that runs
#: tuned's scheduler (the alternative to ``--additional-config``'s ``config_path``)
CONFIG_ENV = "TUNED_CONFIG"
#: ``TUNED_<KEY>`` sets a config key from the engine's environment (TUNED_QUEUE_POLICY=mcsf)
ENV_PREFIX = "TUNED_"
#: TUNED_ variables that are no config key: the config file, the 429 gateway's URL, the
#: installer's extras (tools/setup.sh) and the test suite's own
OTHER_ENV = (CONFIG_ENV, "TUNED_ADMISSION_URL", "TUNED_EXTRA", "TUNED_FAULT_MODE_FILE",
             "TUNED_TEST_DTYPE", "TUNED_TEST_STDERR_FULL_TRIGGER")
#: the settings vLLM's own arguments decide when tuned is dropped into a vLLM command
#: line: a config may leave them out (they are read from the engine) or repeat them
#: (then they must agree with the engine)
ENGINE_KEYS = ("model", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
               "num_gpu_blocks")
#: what ``additional_config["tuned"]`` may hold besides config keys
_HANDOFF_KEYS = ("config", "config_path", "serving_url", "reload_token_sha256")


@dataclass(frozen=True)
class EngineSetup:
    """What tuned's scheduler starts from: the validated config, the URL that says
    the OpenAI server answers (None: not known, taken as answering), the reload
    token's sha256 digest ('' = none) and one line per key that two sources gave
    different values for (the higher one is used)."""

    cfg: Config
    serving_url: str | None
    reload_token_sha256: str
    overridden: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sources:
    """Where a config dropped into a vLLM command line comes from, kept so that a
    reload rebuilds it the same way (:func:`reread`): the TOML file ('' = none), the
    ``TUNED_<KEY>`` variables and the ``--additional-config`` keys as they were at
    start, and the engine's settings (:func:`engine_setup`)."""

    path: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    inline: Mapping[str, Any] = field(default_factory=dict)
    engine: Mapping[str, Any] | None = None

    def build(self) -> tuple[Config, tuple[str, ...]]:
        """The config, and the keys one source overrode in another; :class:`ConfigError`
        (one line per problem, each naming its source) on any problem."""
        return _layered(self)


def env_name(key: str) -> str:
    """The environment variable that sets config key ``key``: TUNED_QUEUE_POLICY."""
    return ENV_PREFIX + key.upper()


def _env_value(name: str, var: str, text: str) -> tuple[Any, str | None]:
    # a string key takes the text as it is (TUNED_QUEUE_POLICY=mcsf); any other is read
    # as a TOML value, so TUNED_MAX_NUM_SEQS=16 is the integer and
    # TUNED_QUEUE_OPTIONS='{reserve_fraction = 0.05}' the table
    f = FIELDS[name]
    if str(f.type) == "str":
        return text, None
    try:
        return tomllib.loads(f"v = {text}")["v"], None
    except (tomllib.TOMLDecodeError, RecursionError):
        return None, (f"{var}: must be {_type_name(str(f.type))} {_range_text(f.metadata)}"
                      .rstrip() + f", got {clip(text)}")


def _checked_layer(values: Mapping[str, Any], label) -> tuple[dict[str, Any], list[str]]:
    """Each of ``values`` checked as the TOML's keys are (type, range, choices); a
    problem names the key as ``label(key)`` writes it (TUNED_X, additional_config.tuned.x)."""
    out, problems = {}, []
    for key, value in values.items():
        check = _check_secret if FIELDS[key].metadata.get("secret") else _check_field
        checked, err = check(key, value)
        if err:
            problems.append(label(key) + err[len(key):])
        else:
            out[key] = checked
    # a policy name is checked where it was given; its options once the layers are merged
    names = {k: out[k] for k in ("batch_policy", "queue_policy") if k in out}
    for problem in policy_problems(names) if names else []:
        key = problem.split(":", 1)[0]
        problems.append(label(key) + problem[len(key):])
        out.pop(key, None)
    return out, problems


def env_layer(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The config keys set by ``TUNED_<KEY>`` variables, typed and checked, and one
    line per problem: a bad value names the variable and the allowed values; an
    unknown TUNED_ variable names the closest one (:data:`OTHER_ENV` are not keys)."""
    by_var = {env_name(k): k for k in FIELDS}
    raw, problems = {}, []
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in OTHER_ENV:
            continue
        key = by_var.get(var)
        if key is None:
            problems.append(f"{clip_text(var)}: no such setting{did_you_mean(var, by_var)} "
                            f"(a config key as TUNED_<KEY>: see `tuned check-config --explain`)")
            continue
        value, err = _env_value(key, var, environ[var])
        if err:
            problems.append(err)
        else:
            raw[key] = value
    checked, bad = _checked_layer(raw, env_name)
    return checked, problems + bad


def _inline_label(key: str) -> str:
    return f"additional_config.tuned.{key}"


def _engine_text(key: str, engine: Mapping[str, Any]) -> str:
    got, flag = engine.get(key), ENGINE_FLAGS[key]
    if got is None:
        return f"vLLM was started without {flag}"
    shown = clip_path(got) if key == "model" else number_text(got)
    given = engine.get("given")
    if given is None or key in given:
        return f"vLLM was given {flag} {shown}"
    return f"vLLM runs {flag} {shown} (its default)"


def _agrees(key: str, value: Any, engine: Mapping[str, Any]) -> bool:
    """Whether a config's ``key`` says what the engine runs. 0 for max_model_len or
    num_gpu_blocks means the engine's own choice, and a demo model is whatever folder
    the engine was given: neither contradicts anything."""
    got = engine.get(key)
    if key in ("max_model_len", "num_gpu_blocks") and value == 0:
        return True
    if key == "model":
        if got is None or str(value).startswith("demo:"):
            return True
        if Path(value).expanduser().is_dir():
            return Path(value).expanduser().resolve() == Path(str(got)).expanduser().resolve()
    return value == got


def _from_engine(key: str, engine: Mapping[str, Any]) -> Any:
    got = engine.get(key)
    if key in ("max_model_len", "num_gpu_blocks"):
        return int(got or 0)
    return got


def _refuse(found: list[tuple[str, str]]) -> None:
    """Raise one :class:`ConfigError` for ``(source, line)`` pairs: under their source
    when they share one (a file's problems read as `tuned check-config` prints them),
    else each line under its own."""
    if not found:
        return
    sources = {src for src, _ in found}
    if len(sources) == 1:
        raise ConfigError([line for _, line in found], sources.pop())
    raise ConfigError([f"{src}: {line}" if src else line for src, line in found])


def _layered(src: Sources) -> tuple[Config, tuple[str, ...]]:
    toml: dict[str, Any] = {}
    where = ""
    if src.path:
        p = Path(src.path)
        where = str(p.resolve())
        raw = read_toml(p)
        found = [_unknown_key(k) for k in raw if k not in FIELDS]
        toml, bad = _checked_layer({k: v for k, v in raw.items() if k in FIELDS},
                                   lambda k: k)
        _refuse([(where, line) for line in found + bad])
        if toml.get("profile") and not Path(toml["profile"]).is_absolute():
            toml["profile"] = str((p.resolve().parent / toml["profile"]).resolve())
    env, bad = env_layer(src.env)
    inline, bad_inline = _checked_layer(src.inline, _inline_label)
    _refuse([("", line) for line in bad + bad_inline])
    # precedence: --additional-config over TUNED_<KEY> over the TOML over the defaults;
    # each layer: (its name for key, its values, how it says key, how to drop key)
    layers = ((lambda k: where, toml, lambda k: "the config", "remove it from the config",
               where),
              (env_name, env, env_name, "unset it", ""),
              (_inline_label, inline, lambda k: "--additional-config",
               "remove it from --additional-config", ""))
    merged: dict[str, Any] = {}
    said: dict[str, tuple] = {}
    overridden = []
    for layer in layers:
        for key, value in layer[1].items():
            if key in merged and merged[key] != value:
                overridden.append(f"{key}: {layer[0](key)} ({clip(value)}) overrides "
                                  f"{said[key][0](key)} ({clip(merged[key])})")
            merged[key], said[key] = value, layer
    from_engine = set()
    if src.engine is not None:
        found = []
        for key in ENGINE_KEYS:
            if key in merged and not _agrees(key, merged[key], src.engine):
                _, _, says, remove, origin = said[key]
                shown = clip(merged[key]) if key == "model" else number_text(merged[key])
                found.append((origin, f"{key}: {says(key)} says {shown}, "
                                      f"{_engine_text(key, src.engine)}; {remove} or give "
                                      "both the same value"))
                continue
            got = _from_engine(key, src.engine)
            if got is not None:
                merged[key] = got
                from_engine.add(key)
        _refuse(found)
    # checked again only for what the engine gave: vLLM's ranges may be wider than tuned's
    values, problems = _checked_layer(
        merged, lambda k: f"{k} (vLLM's {ENGINE_FLAGS[k]})" if k in from_engine else k)
    problems += policy_problems(values)
    if not problems:
        cfg = Config(**values, source_path=where, sources=src)
        problems = cross_field_problems(cfg)
    if problems:
        raise ConfigError(problems, _describe(src, where))
    return cfg, tuple(overridden)


def _describe(src: Sources, where: str) -> str:
    """The sources a merged config came from, for a problem no single one owns."""
    parts = [where] if where else []
    if src.env:
        parts.append("TUNED_* variables")
    if src.inline:
        parts.append("--additional-config")
    return " + ".join(parts)


def engine_setup(additional: Any, environ: Mapping[str, str],
                 engine: Mapping[str, Any] | None = None) -> EngineSetup:
    """The config tuned's scheduler runs, from vLLM's ``additional_config``, the
    engine's environment and (``engine``) the engine's own settings, under the config's
    key names (:data:`ENGINE_KEYS`; ``given``: the keys the operator passed, when
    known):

    1. ``{"tuned": {"config": {...}}}``: the config `tuned serve` validated and shipped
       (:func:`engine_handoff`), never a re-read of the file; with ``engine``, it is
       held to the engine's arguments (:func:`engine_problems`);
    2. otherwise tuned was dropped into your own vLLM command line, and its keys come
       from, highest first: config keys beside ``config_path`` in
       ``--additional-config '{"tuned": {...}}'``, ``TUNED_<KEY>`` variables, the TOML
       file named by ``config_path`` or :data:`CONFIG_ENV`, the defaults. A key two
       sources give takes the higher one's value (listed in ``overridden``). The
       engine's settings (:data:`ENGINE_KEYS`) come from ``engine``; a source that
       repeats one must say what the engine runs, or the config is refused. With no
       source at all, tuned runs its defaults.

    :class:`ConfigError` (one line per problem) for a bad config, a contradiction, an
    ``additional_config`` entry of the wrong shape, or a path and :data:`CONFIG_ENV`
    naming two different files."""
    if additional is not None and not isinstance(additional, Mapping):
        raise ConfigError([f"additional_config: must be a JSON object, got "
                           f"{clip(additional)}"])
    extra = (additional or {}).get("tuned")
    if extra is None:
        extra = {}
    if not isinstance(extra, Mapping):
        raise ConfigError([f"additional_config.tuned: must be a JSON object such as "
                           f"{{\"config_path\": \"/etc/tuned/tuned.toml\"}}, got {clip(extra)}"])
    unknown = sorted(set(extra) - set(_HANDOFF_KEYS) - set(FIELDS))
    if unknown:
        raise ConfigError([f"additional_config.tuned: unknown key {clip_text(unknown[0])}"
                           f"{did_you_mean(unknown[0], [*FIELDS, 'config_path', 'serving_url'])}"
                           f" (known: config_path, serving_url and the config's keys, see "
                           f"`tuned check-config --explain`)"])
    serving_url = extra.get("serving_url") or None
    if serving_url is not None and not isinstance(serving_url, str):
        raise ConfigError([f"additional_config.tuned.serving_url: must be a URL string, "
                           f"got {clip(serving_url)}"])
    if "config" in extra:
        cfg, _ = from_engine_handoff(additional)
        if engine is not None:
            problems = model_problems(cfg) + engine_problems(cfg, engine)
            if problems:
                raise ConfigError(problems, cfg.source_path)
        return EngineSetup(cfg, serving_url, reload_token_digest(additional))
    path = extra.get("config_path") or ""
    if not isinstance(path, str):
        raise ConfigError([f"additional_config.tuned.config_path: must be a file path "
                           f"string, got {clip(path)}"])
    env_path = environ.get(CONFIG_ENV, "")
    if path and env_path and Path(path).resolve() != Path(env_path).resolve():
        raise ConfigError([f"config_path: additional_config names {clip_path(path)} and "
                           f"{CONFIG_ENV} names {clip_path(env_path)}; give one"])
    src = Sources(path=path or env_path,
                  env={k: v for k, v in environ.items()
                       if k.startswith(ENV_PREFIX) and k not in OTHER_ENV},
                  inline={k: v for k, v in extra.items() if k not in _HANDOFF_KEYS},
                  engine=None if engine is None else dict(engine))
    cfg, overridden = src.build()
    digest = hashlib.sha256(cfg.reload_token.encode()).hexdigest() if cfg.reload_token else ""
    return EngineSetup(cfg, serving_url, digest, overridden)


def reread(cfg: Config) -> Config:
    """``cfg`` built again from where it came from, for a reload: a config dropped
    into a vLLM command line from its file, its variables and ``--additional-config``
    as they were at start and the engine's settings (:class:`Sources`); otherwise its
    file, or the embedded default when it had none."""
    if cfg.sources is not None:
        return cfg.sources.build()[0]
    return load(cfg.source_path) if cfg.source_path else default()


def refusal_lines(e: ConfigError) -> list[str]:
    """The lines that say, on stderr, why tuned refused to start the engine."""
    where = f"{e.source}: " if e.source else ""
    return [f"tuned: config refused: {where}{problem}" for problem in e.problems]


def model_problems(cfg: Config) -> list[str]:
    """``model`` as :func:`tuned.base.demo_model.model_form` reads it (a missing folder, an
    unknown demo size, something that is no Hugging Face id): `tuned serve`,
    `tuned check-config` and tuned's scheduler refuse the same settings."""
    try:
        model_form(cfg.model)
    except ValueError as e:
        return [f"model: {e}"]
    return []


def hf_cache_dir(environ: Mapping[str, str]) -> Path:
    """Where Hugging Face's hub keeps downloaded models (``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub``), as vLLM's downloader reads it."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    xdg = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _offline(environ: Mapping[str, str]) -> bool:
    return any(environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hf_cache_findings(model: str, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(problems, notes) about a Hugging Face id from the local cache alone (no
    network): not cached while ``HF_HUB_OFFLINE`` is set is a problem (vLLM cannot
    fetch it); not cached otherwise is a note (vLLM downloads it at start), with the
    closest cached id when there is one (a misspelt id)."""
    try:
        if model_form(model) != "hf_id":
            return [], []
    except ValueError:
        return [], []
    cache = hf_cache_dir(environ)
    try:
        cached = sorted(p.name.removeprefix("models--").replace("--", "/")
                        for p in cache.iterdir() if p.name.startswith("models--")
                        and (p / "snapshots").is_dir())
    except OSError:
        cached = []
    if model in cached:
        return [], []
    hint = did_you_mean(model, cached).replace("?", " (cached)?")
    where = clip_path(cache)
    if _offline(environ):
        return [f"model: {clip_text(model)} is not in the Hugging Face cache ({where}) and "
                f"HF_HUB_OFFLINE is set, so vLLM cannot fetch it{hint}"], []
    return [], [f"model: {clip_text(model)} is not in the Hugging Face cache ({where}): "
                f"vLLM downloads it at start{hint}"]


def engine_problems(cfg: Config, engine: Mapping[str, Any]) -> list[str]:
    """One line per setting where the engine's own arguments contradict the config.

    ``engine`` holds what vLLM runs with, under the config's key names
    (:data:`ENGINE_FLAGS`): ``max_num_seqs``, ``max_num_batched_tokens``,
    ``max_model_len``, ``num_gpu_blocks`` (vLLM's override, None when unset) and
    ``model``. ``max_model_len`` is compared when tuned would pass it
    (:attr:`Config.effective_max_model_len`), ``num_gpu_blocks`` when the config sets
    it, ``model`` when it is a folder (same folder) or a Hugging Face id (same id); a
    demo model is whatever folder the engine was given."""
    want: dict[str, Any] = {"max_num_seqs": cfg.max_num_seqs,
                            "max_num_batched_tokens": cfg.max_num_batched_tokens}
    if cfg.effective_max_model_len:
        want["max_model_len"] = cfg.effective_max_model_len
    if cfg.num_gpu_blocks:
        want["num_gpu_blocks"] = cfg.num_gpu_blocks
    problems = []
    for key, value in want.items():
        got, flag = engine.get(key), ENGINE_FLAGS[key]
        if got is None:
            problems.append(f"{key}: the config says {value}, the engine was started "
                            f"without {flag}; pass {flag} {value} to vLLM")
        elif got != value:
            problems.append(f"{key}: the config says {value}, the engine runs {flag} {got}; "
                            f"pass {flag} {value} to vLLM or set {key} = {got} in the config")
    model = engine.get("model")
    if not _agrees("model", cfg.model, engine):
        problems.append(f"model: the config says {clip_text(cfg.model)}, the engine runs "
                        f"--model {clip_path(model)}; give both the same model")
    return problems


def reload_token_digest(additional: dict | None) -> str:
    """The sha256 hex digest of the reload token shipped by :func:`engine_handoff`
    ('' when none is set)."""
    return str(((additional or {}).get("tuned") or {}).get("reload_token_sha256") or "")


def restart_changes(old: Config, new: Config) -> list[str]:
    """Fields that differ between two configs but cannot change on a live engine."""
    return [n for n in RESTART_FIELDS if getattr(old, n) != getattr(new, n)]


def explain() -> str:
    """The field table, one line per key: name, type, default, range, doc."""
    lines = []
    for name, f in FIELDS.items():
        meta = f.metadata
        rng = _range_text(meta)
        flag = " [restart]" if meta["restart"] else ""
        lines.append(f"{name} ({f.type}, default {meta['default']!r}{', ' + rng if rng else ''})"
                     f"{flag}: {meta['doc']}")
    lines += ["", "Policies (batch_policy, queue_policy) and their options (batch_options, "
              "queue_options):", catalog.explain(),
              "", f"Dropped into your own vLLM command line (--scheduler-cls "
              f"tuned.engines.vllm.TunedScheduler), {', '.join(ENGINE_KEYS)} are read from "
              f"vLLM's arguments (set here, they must agree with them) and every key may "
              f"also be given as {ENV_PREFIX}<KEY> or in --additional-config "
              f"'{{\"tuned\": {{...}}}}'."]
    return "\n".join(lines)
