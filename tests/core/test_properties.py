"""Property-based tests (hypothesis): the loaders and the pure decision functions over
their whole input domain, malformed and non-finite inputs included.

Each property either gets a well-formed result that satisfies its documented bounds or
the module's own error with a readable message, never another exception. Seeds are
fixed (``derandomize=True``, no example database) so a CI run is reproducible.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tuned import config as config_mod
from tuned.config import FIELDS, Config, ConfigError
from tuned.curves.profile import Profile, ProfileError, load_profile
from tuned.policies.batch import BatchPolicy, Decision, Observation
from tuned.policies.memory_bound import MemoryBound, clt_theta, memory_batch_limit
from tuned.policies.sla_bound import SlaBound
from tuned.policies.budget import TokenBudget, token_budget
from tuned.core.queue_policy import AdmitContext, ReqInfo, Selection
from tuned.policies.registry import QUEUE_POLICIES, make_policy, policy_class

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_PROFILE = ROOT / "profiles" / "demo-small-cpu.json"

FAST = settings(derandomize=True, database=None, max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ------------------------------------------------------------------ values

HUGE_INTS = st.sampled_from([2**63, -(2**63) - 1, 10**30, 10**400, -(10**400)])
ODD_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e308, -1e308])
scalars = st.one_of(
    st.integers(min_value=-(2**31), max_value=2**31), HUGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True), ODD_FLOATS,
    st.text(max_size=12), st.booleans())
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


OPTION_NAMES = {name: policy_class(name).option_names() for name in QUEUE_POLICIES}


def near_valid(name: str):
    """Values close to the field's documented range, so valid configs come up often,
    and the edge values that broke the loader once (huge TOML integers, NUL)."""
    meta = FIELDS[name].metadata
    vals = [meta["default"], 10**400, math.inf, math.nan, "\x00"]
    if meta["choices"]:
        vals += list(meta["choices"]) + [meta["choices"][0].upper()]
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None:
        step = 1 if isinstance(meta["default"], int) else 1e-3
        vals += [lo, hi, lo - step, hi + step, (lo + hi) / 2]
        if isinstance(meta["default"], int):
            vals += [int((lo + hi) // 2), int(lo) + 1]
    if name == "queue_options":
        vals += [{"reserve_fraction": 0.05}, {"bogus": 1}, {"reserve_fraction": "x"}]
    if name == "class_deadlines_s":
        vals += [{"gold": 8.0}, {"gold": -1}, {"gold": "soon"}, {"gold": math.nan}]
    return st.sampled_from(vals)


def raw_configs(max_keys: int = 4):
    return st.lists(st.sampled_from(sorted(FIELDS)), unique=True, max_size=max_keys).flatmap(
        lambda keys: st.fixed_dictionaries(
            {k: st.one_of(near_valid(k), near_valid(k), anything) for k in keys}))


def queue_configs():
    """A queue policy with options named as that policy names them, any values."""
    return st.sampled_from(sorted(QUEUE_POLICIES)).flatmap(lambda name: st.fixed_dictionaries({
        "queue_policy": st.just(name),
        "queue_options": st.lists(st.sampled_from(OPTION_NAMES[name] or ("none",)),
                                  unique=True, max_size=3).flatmap(
            lambda keys: st.fixed_dictionaries({k: st.one_of(scalars, anything)
                                                for k in keys}))}))


def toml_value(v) -> str:
    """A TOML literal for a value built by the strategies above (inline forms only)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


PROBLEM = re.compile(r"^(?P<field>[a-z_]+)(\.[^:]*)?: ")


def check_config_outcome(cfg: Config | None, err: ConfigError | None) -> None:
    if err is not None:
        assert err.problems, err
        for p in err.problems:
            m = PROBLEM.match(p)
            assert m and m.group("field") in FIELDS, p
            assert "must be" in p, p
        return
    for name, f in FIELDS.items():
        v, meta = getattr(cfg, name), f.metadata
        want = str(f.type)
        if want == "int":
            assert isinstance(v, int) and not isinstance(v, bool), name
        elif want == "float":
            assert isinstance(v, float) and math.isfinite(v), name
        elif want == "str":
            assert isinstance(v, str), name
        elif want == "dict":
            assert isinstance(v, dict), name
        else:
            assert isinstance(v, tuple) and all(isinstance(x, str) for x in v), name
        if meta["lo"] is not None:
            assert meta["lo"] <= v <= meta["hi"], (name, v)
        if meta["choices"]:
            assert v in meta["choices"], (name, v)
    assert cfg.b_min <= cfg.effective_b_max <= cfg.max_num_seqs
    assert cfg.fallback_cap <= cfg.max_num_seqs
    assert cfg.max_num_batched_tokens >= cfg.max_num_seqs + cfg.min_chunk_tokens
    assert cfg.stale_after_s >= 2 * cfg.interval_s
    assert not cfg.sla_enabled or cfg.eps_d_s < cfg.tbt_sla_s
    assert all(isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0
               and math.isfinite(s) for s in cfg.class_deadlines_s.values())


# ------------------------------------------------------------------ config

@FAST
@given(st.one_of(raw_configs(), raw_configs(max_keys=1), queue_configs()))
@example({"interval_s": 10**400})            # float(int) overflowed
@example({"class_deadlines_s": {"gold": math.inf}})  # was accepted
@example({"queue_options": {"bogus": 1}})    # problem line said no "must be"
@example({"metrics_port": 8000})
@example({"profile": "no/such/file.json"})
@example({"profile": "a\x00b"})              # resolve() raised a bare ValueError
def test_config_validate_gives_config_in_range_or_field_problems(raw):
    try:
        cfg, err = config_mod.validate(dict(raw)), None
    except ConfigError as e:
        cfg, err = None, e
    check_config_outcome(cfg, err)


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="tuned-props-") as d:
        yield Path(d)


@FAST
@given(raw=st.one_of(raw_configs(), queue_configs()))
@example(raw={"eps_m": 10**400})
@example(raw={"profile": "a\x00b"})
def test_config_load_of_toml_text(scratch, raw):
    # TOML has no null and no mixed-type rules to worry about here: every value the
    # strategies build has an inline TOML form
    text = "".join(f"{k} = {toml_value(v)}\n" for k, v in raw.items())
    path = scratch / "tuned.toml"
    path.write_text(text)
    try:
        cfg, err = config_mod.load(path), None
    except ConfigError as e:
        cfg, err = None, e
    if err is not None and err.problems[0].startswith("not valid TOML"):
        # tomllib's own limits (e.g. inf inside a table key path); still a ConfigError
        return
    check_config_outcome(cfg, err)


# ------------------------------------------------------------------ profiles

SHIPPED = json.loads(SHIPPED_PROFILE.read_text())
# the sample columns cut to 64 rows (equal lengths, still a valid profile): the same
# structure, written and parsed a hundred times in a second
for _group in SHIPPED["samples"].values():
    for _k in _group:
        _group[_k] = _group[_k][:64]
WRONG = [None, "x", [], {}, True, 1.5, -1, 0, math.nan, math.inf, 10**400, [1, "a"]]


def paths(d, prefix=()):
    """Every key/index path of a JSON tree, sample columns cut to their first entries."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield prefix + (k,)
            yield from paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d[:3]):
            yield prefix + (i,)
            yield from paths(v, prefix + (i,))


PROFILE_PATHS = list(paths(SHIPPED))


def test_mutations_start_from_a_valid_profile():
    prof = Profile.from_dict(copy.deepcopy(SHIPPED), "shipped.json")
    assert prof.step_time is not None and len(prof.steps["step_s"]) == 64


def mutate(d, path, how, value):
    d = copy.deepcopy(d)
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if how == "drop":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    else:
        parent[last] = value
    return d


def check_profile_outcome(build) -> None:
    try:
        prof = build()
    except ProfileError as e:
        assert str(e).startswith(f"{e.source}: ") and e.source, str(e)
        assert e.problem
        return
    assert isinstance(prof, Profile)


@FAST
@given(d=anything)
def test_profile_from_dict_of_arbitrary_json(d):
    check_profile_outcome(lambda: Profile.from_dict(d, "arbitrary.json"))


@FAST
@given(d=st.fixed_dictionaries({"schema_version": st.one_of(st.sampled_from([1, 2]), scalars)},
                               optional={k: anything for k in ("meta", "samples", "levels",
                                                              "fits", "version", "model",
                                                              "created", "usl", "r2")}))
def test_profile_from_dict_of_profile_shaped_json(d):
    check_profile_outcome(lambda: Profile.from_dict(d, "shaped.json"))


# the validated part of a profile (fits, levels, sample columns) gets half the mutations
CHECKED_PATHS = [p for p in PROFILE_PATHS if p[0] in ("fits", "levels", "samples",
                                                       "schema_version")]


@FAST
@given(path=st.one_of(st.sampled_from(PROFILE_PATHS), st.sampled_from(CHECKED_PATHS)),
       how=st.sampled_from(["drop", "replace"]),
       value=st.one_of(st.sampled_from(WRONG), anything))
@example(path=("fits", "usl", "name"), how="replace", value=[1])    # unhashable: TypeError
@example(path=("fits", "usl", "params", "lam"), how="replace", value=10**400)  # OverflowError
@example(path=("levels", 0, "throughput_tok_s"), how="replace", value=10**400)
@example(path=("samples", "steps", "step_s", 0), how="replace", value=10**400)
@example(path=("levels", 0, "concurrency"), how="replace", value=10**400)
def test_mutated_shipped_profile_file(scratch, path, how, value):
    d = mutate(SHIPPED, path, how, value)
    f = scratch / "mutated.json"
    f.write_text(json.dumps(d))  # NaN / Infinity are written as JSON's extensions
    check_profile_outcome(lambda: load_profile(f))


@FAST
@given(text=st.one_of(st.text(max_size=60), st.binary(max_size=60).map(
    lambda b: b.decode("latin-1")), st.just(SHIPPED_PROFILE.read_text()[:500])))
def test_profile_file_of_arbitrary_text(scratch, text):
    f = scratch / "text.json"
    f.write_text(text, encoding="utf-8", errors="surrogatepass")
    check_profile_outcome(lambda: load_profile(f))


# ------------------------------------------------------------------ batch decisions

SHIPPED_MODEL = load_profile(SHIPPED_PROFILE)

timings = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                    st.floats(min_value=0.0, max_value=1.0), ODD_FLOATS)
demands = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                    st.floats(min_value=0.5, max_value=1e6), ODD_FLOATS)
counts = st.one_of(st.integers(min_value=0, max_value=10), st.integers(min_value=0,
                                                                       max_value=10**9))
_OBS_FIELDS = {f.name for f in dataclasses.fields(Observation)}
# optional fields (telemetry that only some policies read) where this version has them
_OBS_OPTIONAL = {"tbt_p90_s": timings, "decode_only_tbt_s": timings,
                 "decode_only_p90_s": timings,
                 "binding": st.one_of(st.floats(min_value=0.0, max_value=1.0), ODD_FLOATS),
                 "kv_tokens_resident": st.one_of(st.just(0), st.integers(0, 10**12))}
observations = st.builds(
    Observation, num_running=counts, num_waiting=counts,
    kv_capacity_blocks=st.one_of(st.just(0), st.integers(min_value=0, max_value=10**9)),
    demand_mean=demands, demand_std=demands,
    demand_samples=st.integers(min_value=0, max_value=10**6),
    tbt_mean_s=timings, decode_batch_mean=demands,
    kv_usage=st.floats(min_value=0.0, max_value=1.0),
    **{k: v for k, v in _OBS_OPTIONAL.items() if k in _OBS_FIELDS})


@FAST
@given(n=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**12)),
       mean=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**9)),
       std=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**9)),
       eps_m=st.floats(min_value=1e-6, max_value=0.5))
def test_memory_batch_limit_domain(n, mean, std, eps_m):
    theta = clt_theta(eps_m)
    try:
        b, l0 = memory_batch_limit(n, mean, std, theta)
    except ValueError as e:
        assert re.match(r"^(n_tokens|mean demand|demand std|theta) must be ", str(e)), str(e)
        return
    assert isinstance(b, int) and b >= 0
    assert math.isfinite(l0) and l0 >= 0
    if b > 0:  # Alg. 1: b requests of mean demand plus the buffer fit in n
        assert b * mean + l0 <= n * (1 + 1e-9) + 1e-6


@st.composite
def policies(draw, sla: bool | None = None):
    ceiling = draw(st.integers(min_value=1, max_value=4096))
    b_max = draw(st.integers(min_value=1, max_value=ceiling))
    b_min = draw(st.integers(min_value=1, max_value=b_max))
    min_chunk = draw(st.integers(min_value=1, max_value=1 << 12))
    mnbt = draw(st.integers(min_value=ceiling + min_chunk, max_value=max(ceiling + min_chunk,
                                                                          1 << 20)))
    eps_m = draw(st.floats(min_value=1e-6, max_value=0.5))
    use_sla = draw(st.booleans()) if sla is None else sla
    bound = None
    if use_sla:
        sla_s = draw(st.one_of(st.floats(min_value=1e-4, max_value=0.05),
                               st.floats(min_value=1e-4, max_value=60.0)))
        eps = draw(st.floats(min_value=0.0, max_value=sla_s * 0.99))
        bound = SlaBound(sla_s, eps, draw(st.integers(1, 64)), draw(st.integers(0, 64)),
                         b_min, b_max)
        if draw(st.booleans()):
            bound.warm_start(draw(st.integers(-5, 10**6)))
    mem = MemoryBound(eps_m, b_max, draw(st.integers(min_value=1, max_value=16)))
    model = draw(st.sampled_from([None, SHIPPED_MODEL]))
    inner = BatchPolicy(ceiling=ceiling, b_min=b_min, b_max=b_max, memory=mem, sla=bound,
                        max_num_batched_tokens=mnbt, min_chunk_tokens=min_chunk,
                        step_model=model)
    if not draw(st.booleans()):
        return inner
    return TokenBudget(inner, max_num_batched_tokens=mnbt, min_chunk_tokens=min_chunk,
                       sla_s=bound.sla_s if bound is not None else 0.0, step_model=model,
                       decode_budget=draw(st.sampled_from(["running", "batch"])))


def check_decision(policy: BatchPolicy | TokenBudget, obs: Observation, d: Decision) -> None:
    pol = getattr(policy, "inner", policy)
    assert d.lower <= d.upper, d
    assert pol.b_min <= d.cap <= pol.ceiling, d
    assert d.cap <= d.batch <= pol.ceiling, d
    assert d.token_budget <= pol.max_num_batched_tokens, d
    if getattr(policy, "decode_budget", "batch") == "batch":
        # the paper's PD fusion: the budget holds the whole batch plus a chunk
        assert d.cap + 1 <= d.token_budget, d
    else:
        # the budget is sized for the decodes running now; the knob slot lifts what it
        # applies to cap + 1 (tuned.core.knobs), so admission is never starved
        assert min(max(obs.num_running, 1), d.cap) + 1 <= d.token_budget, d
    assert d.b_mem is not None and 0 <= d.b_mem <= pol.b_max, d
    if pol.sla is not None:
        assert pol.b_min <= d.b_sla <= pol.b_max, d
        assert pol.b_min <= pol.sla.low <= pol.sla.high <= pol.b_max
    json.dumps(d.to_dict(), allow_nan=True)  # serialisable for /decisions


@FAST
@given(pol=policies(), obs=st.lists(observations, min_size=1, max_size=6))
def test_batch_policy_decide_domain(pol, obs):
    """A sequence of ticks (state carries over) never raises and stays in bounds."""
    for o in obs:
        check_decision(pol, o, pol.decide(o))


@FAST
@given(pol=policies(sla=True), obs=observations)
def test_sla_bound_update_domain(pol, obs):
    pol = getattr(pol, "inner", pol)
    b, reason = pol.sla.update(obs)
    assert pol.b_min <= b <= pol.b_max and isinstance(b, int)
    assert pol.sla.low <= b <= pol.sla.high
    finite = (obs.tbt_mean_s is not None and obs.decode_batch_mean is not None
              and math.isfinite(obs.tbt_mean_s) and math.isfinite(obs.decode_batch_mean))
    assert reason in (("sla_over", "sla_under", "sla_hold") if finite else ("initial",))


@FAST
@given(b_max=st.integers(1, 4096), eps_m=st.floats(min_value=1e-6, max_value=0.5),
       min_samples=st.integers(1, 16), obs=st.lists(observations, min_size=1, max_size=4))
def test_memory_bound_update_domain(b_max, eps_m, min_samples, obs):
    mb = MemoryBound(eps_m, b_max, min_samples)
    for o in obs:
        b, reason = mb.update(o)
        assert isinstance(b, int) and 0 <= b <= b_max
        assert reason in ("memory", "memory_no_data", "hold_no_queue")
        usable = (o.demand_mean is not None and math.isfinite(o.demand_mean)
                  and o.demand_mean > 0 and o.demand_samples >= min_samples)
        if not usable:
            assert reason == "memory_no_data"


class StubStepModel:
    """A step-time model answering whatever the test says, within [lo, hi] or not."""

    def __init__(self, answer):
        self.answer = answer

    def largest_chunk_within(self, b, tbt_s, lo, hi, kv_tokens=0.0):
        return self.answer(lo, hi)


@FAST
@given(ceiling=st.integers(1, 4096), data=st.data(),
       sla_s=st.one_of(st.floats(allow_nan=True, allow_infinity=True), ODD_FLOATS,
                       st.floats(min_value=1e-4, max_value=60.0)),
       kind=st.sampled_from(["none", "lo", "hi", "inside", "below", "above", "shipped"]))
def test_token_budget_domain(ceiling, data, sla_s, kind):
    min_chunk = data.draw(st.integers(1, 1 << 12))
    mnbt = data.draw(st.integers(ceiling + min_chunk, max(ceiling + min_chunk, 1 << 20)))
    batch = data.draw(st.integers(0, ceiling))
    model = {"none": None,
             "lo": StubStepModel(lambda lo, hi: lo),
             "hi": StubStepModel(lambda lo, hi: hi),
             "inside": StubStepModel(lambda lo, hi: (lo + hi) // 2),
             "below": StubStepModel(lambda lo, hi: -10**9),
             "above": StubStepModel(lambda lo, hi: 10**12),
             "shipped": SHIPPED_MODEL}[kind]
    budget = token_budget(batch, mnbt, min_chunk, sla_s, model)
    assert isinstance(budget, int)
    # room for every running decode plus a prefill chunk, never above the ceiling
    assert batch + 1 <= batch + min(min_chunk, mnbt - batch) <= budget <= mnbt


# ------------------------------------------------------------------ queue policies

NOW = 1_763_800_000.0


@st.composite
def req_infos(draw, request_id: str):
    max_tokens = draw(st.integers(1, 10**6))
    return ReqInfo(
        request_id=request_id,
        arrival_s=NOW - draw(st.floats(min_value=0.0, max_value=1e5)),
        prompt_tokens=draw(st.integers(1, 10**6)),
        max_tokens=max_tokens,
        predicted_output=draw(st.integers(1, max_tokens)),
        output_tokens=draw(st.one_of(st.just(0), st.integers(0, 2 * max_tokens))),
        started_s=draw(st.one_of(st.none(), st.floats(min_value=NOW - 1e5, max_value=NOW))),
        hint_output_tokens=draw(st.one_of(st.none(), st.integers(1, max_tokens))),
        deadline_s=draw(st.one_of(st.none(), st.floats(min_value=NOW - 1e4,
                                                       max_value=NOW + 1e4))),
        priority=draw(st.integers(-2, 2)))


def req_lists(prefix: str, max_size: int):
    return st.integers(0, max_size).flatmap(
        lambda n: st.tuples(*[req_infos(f"{prefix}{i}") for i in range(n)]).map(list))


@st.composite
def admit_contexts(draw, n_total: int):
    capacity = draw(st.one_of(st.just(0), st.integers(0, 10**7)))
    free = draw(st.one_of(st.just(0), st.integers(0, capacity)))
    speed = draw(st.sampled_from([None, lambda n: 50.0 / max(n, 1), lambda n: 0.0]))
    return AdmitContext(now_s=NOW, kv_capacity_tokens=capacity, kv_free_tokens=free,
                        cap=draw(st.integers(0, max(n_total, 1))), speed_tok_s=speed)


@FAST
@given(name=st.sampled_from(sorted(QUEUE_POLICIES)), data=st.data())
def test_queue_policy_select_domain(name, data):
    pol = make_policy(name, {} if name != "saber" else data.draw(st.sampled_from(
        [{}, {"window": 1}])))
    waiting = data.draw(req_lists("w", 8))
    running = [r.with_progress(r.output_tokens, r.started_s or NOW - 1.0)
               for r in data.draw(req_lists("run", 6))]
    admitted = data.draw(req_lists("adm", 3))
    ctx = data.draw(admit_contexts(len(waiting) + len(running)))
    for r in waiting:
        pol.observe_arrival(r)
    pol.refresh(waiting, ctx)
    ordered = pol.order(waiting, NOW, ctx)
    assert sorted(r.request_id for r in ordered) == sorted(r.request_id for r in waiting)
    sel = pol.select(ordered, running, admitted, ctx)
    assert isinstance(sel, Selection)
    assert sel.chosen is None or any(sel.chosen is r for r in ordered)
    assert isinstance(sel.verdict.reason, str) and sel.verdict.admit == (sel.chosen is not None)
    assert all(any(x is r for r in ordered) for x in sel.refused)
