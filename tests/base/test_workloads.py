"""Workload specs: determinism, arrival processes, published length mixes, traces,
phases, clamping, and every error message."""

import json
import statistics
import time

import pytest

from tuned.base.workloads import (LMSYS_OUTPUT, LMSYS_PROMPT, SABER_TASKS, Dist, WorkloadError,
                             load_trace, parse_dist, parse_workload, trace_file)

AZURE = "azure_conv_2023"  # packaged with tuned (tuned/data/traces/)

SPECS = [
    "poisson:rate=4,prompt=U(10,20),output=Exp(30),n=50",
    "gamma:rate=4,cv=2,prompt=N(100,30),output=LN(80,40),n=50",
    "saber:mix=W3,rate=5,n=40,arrival=gamma,cv=1.5",
    "lmsys:rate=3,n=50,max_tokens=64",
    "phase-shift:rate=2,n=20,scale=0.5",
]


def gaps(w):
    t = [r.arrival_s for r in w.requests]
    return [b - a for a, b in zip(t, t[1:])]


def cv(xs):
    return statistics.pstdev(xs) / statistics.fmean(xs)


@pytest.fixture
def trace_csv(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                 "10.0,374,44\n11.0,3000,109\n14.0,5,1\n16.0,20,0\n")
    return f


# --- determinism and the common shape -------------------------------------------------------

@pytest.mark.parametrize("spec", SPECS)
def test_same_spec_and_seed_give_identical_requests(spec):
    a, b = parse_workload(spec, seed=3), parse_workload(spec, seed=3)
    assert a.requests == b.requests
    assert parse_workload(spec, seed=4).requests != a.requests
    ids = [r.request_id for r in a.requests]
    assert ids == [f"r{i:06d}" for i in range(len(a))]
    t = [r.arrival_s for r in a.requests]
    assert t[0] == 0.0 and t == sorted(t)
    assert all(r.prompt_tokens >= 1 and 1 <= r.output_tokens <= r.max_tokens
               for r in a.requests)
    json.dumps(a.describe())


def test_lengths_do_not_depend_on_the_arrival_process():
    a = parse_workload("poisson:rate=2,prompt=U(10,99),output=U(1,50),n=30", seed=1)
    b = parse_workload("gamma:rate=9,cv=3,prompt=U(10,99),output=U(1,50),n=30", seed=1)
    assert [(r.prompt_tokens, r.output_tokens) for r in a.requests] == \
        [(r.prompt_tokens, r.output_tokens) for r in b.requests]
    assert gaps(a) != gaps(b)


# --- arrival processes ----------------------------------------------------------------------

def test_poisson_mean_gap_is_one_over_rate():
    w = parse_workload("poisson:rate=4,prompt=8,output=U(2,6),n=20000", seed=0)
    g = gaps(w)
    assert statistics.fmean(g) == pytest.approx(0.25, rel=0.05)
    assert cv(g) == pytest.approx(1.0, rel=0.1)
    assert {r.prompt_tokens for r in w.requests} == {8}
    assert {r.output_tokens for r in w.requests} == {2, 3, 4, 5, 6}
    assert w.describe()["rate_rps"] == pytest.approx(4, rel=0.05)


@pytest.mark.parametrize("c", [0.5, 3.0])
def test_gamma_gaps_have_the_rate_and_cv(c):
    w = parse_workload(f"gamma:rate=2,cv={c},prompt=8,output=8,n=20001", seed=5)
    g = gaps(w)
    assert len(g) == 20000
    assert statistics.fmean(g) == pytest.approx(0.5, rel=0.05)
    assert cv(g) == pytest.approx(c, rel=0.1)


def test_saber_and_lmsys_take_gamma_arrivals():
    w = parse_workload("lmsys:rate=2,n=20001,arrival=gamma,cv=2", seed=2)
    assert cv(gaps(w)) == pytest.approx(2.0, rel=0.1)


# --- distributions --------------------------------------------------------------------------

def test_parse_dist_forms_and_means():
    import random
    rng = random.Random(0)
    cases = {"64": ("fixed", 64), "U(16, 128)": ("uniform", 72), "N(200,50)": ("normal", 200),
             "ln(200,120)": ("lognormal", 200), "Exp(30)": ("exp", 30)}
    for text, (kind, mean) in cases.items():
        d = parse_dist(text, "prompt")
        assert d.kind == kind and d.mean == mean
        xs = [d.sample(rng) for _ in range(20000)]
        assert min(xs) >= 1 and statistics.fmean(xs) == pytest.approx(mean, rel=0.05)
        assert parse_dist(str(d), "prompt") == d
    assert str(parse_dist("LN(200,120)", "p")) == "LN(200,120)"
    ln = parse_dist("LN(200,120)", "p")
    assert statistics.median(ln.sample(rng) for _ in range(20000)) == pytest.approx(120, rel=0.05)


def test_lmsys_lengths_match_jaillet_et_al():
    w = parse_workload("lmsys:rate=10,n=20000", seed=0)
    p = [r.prompt_tokens for r in w.requests]
    o = [r.output_tokens for r in w.requests]
    assert statistics.fmean(p) == pytest.approx(40.6, rel=0.1)
    assert statistics.median(p) == pytest.approx(11, rel=0.1)
    assert statistics.fmean(o) == pytest.approx(85.3, rel=0.1)
    assert statistics.median(o) == pytest.approx(45, rel=0.1)
    assert (LMSYS_PROMPT.a, LMSYS_PROMPT.b, LMSYS_OUTPUT.a, LMSYS_OUTPUT.b) == (40.6, 11, 85.3, 45)


# --- SABER ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mix, counts", [
    ("W1", {"translation": 40, "generation": 40, "qna": 10, "summary": 10}),
    ("W2", {"qna": 40, "summary": 40, "generation": 10, "translation": 10}),
    ("W3", {"qna": 25, "generation": 25, "summary": 25, "translation": 25}),
])
def test_saber_mix_counts_and_deadlines(mix, counts):
    w = parse_workload(f"saber:mix={mix},rate=10,n=100", seed=1)
    assert w.describe()["sla_classes"] == counts
    deadlines = {r.sla_class: r.deadline_s for r in w.requests}
    assert deadlines == {"qna": 1.0, "generation": 8.0, "summary": 1.0, "translation": 12.0}
    assert [r.sla_class for r in w.requests] != sorted(r.sla_class for r in w.requests)


def test_saber_lengths_follow_table_i_and_length_scale_keeps_deadlines():
    w = parse_workload("saber:mix=W3,rate=10,n=8000", seed=0)
    for cls, task in SABER_TASKS.items():
        rs = [r for r in w.requests if r.sla_class == cls]
        assert statistics.fmean(r.prompt_tokens for r in rs) == pytest.approx(task.prompt_mean,
                                                                              rel=0.1)
        assert statistics.fmean(r.output_tokens for r in rs) == pytest.approx(task.output_mean,
                                                                              rel=0.1)
    s = parse_workload("saber:mix=W3,rate=10,n=8000,length_scale=0.1", seed=0)
    assert [r.deadline_s for r in s.requests] == [r.deadline_s for r in w.requests]
    gen = [r.output_tokens for r in s.requests if r.sla_class == "generation"]
    assert statistics.fmean(gen) == pytest.approx(38.7, rel=0.1)


# --- traces ---------------------------------------------------------------------------------

def test_azure_trace_loads_fast():
    t0 = time.perf_counter()
    w = parse_workload(f"trace:{AZURE}")
    assert time.perf_counter() - t0 < 1.0
    assert len(w) == 19366
    r = w.requests[0]
    assert (r.arrival_s, r.prompt_tokens, r.output_tokens, r.max_tokens) == (0.0, 374, 44, 44)
    assert w.requests[-1].arrival_s == pytest.approx(3501.721937)
    s = parse_workload(f"trace:{AZURE},n=1000,rate=2,length_scale=0.1")
    assert len(s) == 1000 and s.describe()["rate_rps"] == pytest.approx(2.0)
    assert (s.requests[0].prompt_tokens, s.requests[0].output_tokens) == (37, 4)


def test_bare_trace_name_is_the_packaged_trace():
    from tuned.data import trace_path

    assert trace_file(AZURE) == trace_path(AZURE)
    assert parse_workload(f"trace:{AZURE},n=5").requests == \
        parse_workload(f"trace:{trace_path(AZURE)},n=5").requests


def test_bare_trace_name_prefers_a_file_on_disk(tmp_path, monkeypatch):
    (tmp_path / AZURE).write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,7,3\n")
    monkeypatch.chdir(tmp_path)
    w = parse_workload(f"trace:{AZURE}")
    assert [(r.prompt_tokens, r.output_tokens) for r in w.requests] == [(7, 3)]


def test_unknown_bare_trace_name_names_the_packaged_ones():
    with pytest.raises(WorkloadError) as err:
        parse_workload("trace:no_such_trace,n=3")
    assert str(err.value) == ("workload 'trace:no_such_trace,n=3': no file 'no_such_trace' "
                              "and no packaged trace 'no_such_trace'; packaged: azure_conv_2023")


def test_trace_options(trace_csv):
    w = parse_workload(f"trace:{trace_csv}")
    assert [r.arrival_s for r in w.requests] == [0.0, 1.0, 4.0, 6.0]
    assert [r.output_tokens for r in w.requests] == [44, 109, 1, 1]  # 0 decode tokens -> 1
    w = parse_workload(f"trace:{trace_csv},time_scale=2,length_scale=0.1,n=3")
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in w.requests] == \
        [(0.0, 37, 4), (2.0, 300, 11), (8.0, 1, 1)]
    w = parse_workload(f"trace:{trace_csv},rate=1.5")  # 3 gaps over 6 s -> over 2 s
    assert [r.arrival_s for r in w.requests] == pytest.approx([0, 1 / 3, 4 / 3, 2])
    w = parse_workload(f"trace:{trace_csv},max_tokens=50")
    assert [(r.output_tokens, r.max_tokens) for r in w.requests][:2] == [(44, 50), (50, 50)]


def test_trace_rows_are_sorted_by_arrival(tmp_path):
    f = tmp_path / "u.csv"
    f.write_text("num_decode_tokens,arrived_at,num_prefill_tokens\n5,3.0,1\n6,1.0,2\n")
    w = parse_workload(f"trace:{f}")
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in w.requests] == \
        [(0.0, 2, 6), (2.0, 1, 5)]
    assert load_trace(f) == [(3.0, 1, 5), (1.0, 2, 6)]


# --- phases ---------------------------------------------------------------------------------

def test_phases_concatenate_in_order(trace_csv):
    w = parse_workload(f"phases:trace:{trace_csv};poisson:rate=10,prompt=5,output=5,n=3;"
                       f"poisson:rate=1,prompt=7,output=7,n=2", seed=0)
    assert [r.phase for r in w.requests] == ["p0"] * 4 + ["p1"] * 3 + ["p2"] * 2
    t = [r.arrival_s for r in w.requests]
    assert t[:4] == [0.0, 1.0, 4.0, 6.0]
    assert t[4] == pytest.approx(6.1)              # last arrival + 1/10
    assert t[7] == pytest.approx(t[6] + 1.0)       # + 1/1
    assert [r.prompt_tokens for r in w.requests] == [374, 3000, 5, 20, 5, 5, 5, 7, 7]
    assert [r.request_id for r in w.requests][-1] == "r000008"
    d = w.describe()
    assert d["kinds"] == ["trace", "poisson", "poisson"]
    assert [(p["name"], p["n"]) for p in d["phases"]] == [("p0", 4), ("p1", 3), ("p2", 2)]


def test_phase_shift_alias():
    w = parse_workload("phase-shift:rate=2,n=300,scale=0.5", seed=0)
    names = ["chat1", "summarise", "chat2"]
    assert [r.phase for r in w.requests] == [n for n in names for _ in range(300)]
    by = {n: [r for r in w.requests if r.phase == n] for n in names}
    summ = [r.prompt_tokens for r in by["summarise"]]
    assert min(summ) >= 200 and max(summ) <= 400
    assert statistics.fmean(r.prompt_tokens for r in by["chat1"]) == pytest.approx(100, rel=0.1)
    rates = {p["name"]: p["rate_rps"] for p in w.describe()["phases"]}
    assert rates["chat1"] == pytest.approx(2, rel=0.15)
    assert rates["summarise"] == pytest.approx(4, rel=0.15)
    assert [r.prompt_tokens for r in by["chat1"]] != [r.prompt_tokens for r in by["chat2"]]
    assert len(parse_workload("phase-shift")) == 300


# --- clamping, rate scaling, head -----------------------------------------------------------

def test_max_model_len_clamps_and_counts():
    w = parse_workload("poisson:rate=1,prompt=1000,output=300,n=2", max_model_len=1024)
    assert [(r.prompt_tokens, r.output_tokens, r.max_tokens) for r in w.requests] == \
        [(724, 300, 300)] * 2
    assert w.describe()["clamped_requests"] == 2 and w.describe()["max_model_len"] == 1024
    w = parse_workload("poisson:rate=1,prompt=100,output=3000,n=1", max_model_len=1024)
    assert (w.requests[0].prompt_tokens, w.requests[0].output_tokens) == (1, 1023)
    w = parse_workload("poisson:rate=1,prompt=100,output=30,n=1,max_tokens=2000",
                       max_model_len=1024)
    assert (w.requests[0].output_tokens, w.requests[0].max_tokens, w.clamped) == (30, 924, 1)
    w = parse_workload("poisson:rate=1,prompt=100,output=30,n=1", max_model_len=1024)
    assert w.clamped == 0


def test_scaled_rate_and_head():
    w = parse_workload("poisson:rate=2,prompt=8,output=8,n=200,max_tokens=8", seed=0)
    f = w.scaled_rate(4)
    assert [r.arrival_s for r in f.requests] == [r.arrival_s / 4 for r in w.requests]
    assert [r.prompt_tokens for r in f.requests] == [r.prompt_tokens for r in w.requests]
    assert f.describe()["rate_rps"] == pytest.approx(4 * w.describe()["rate_rps"])
    assert f.rate_factor == 4 and f.spec == w.spec
    h = w.head(10.0)
    assert h.requests == tuple(r for r in w.requests if r.arrival_s < 10.0)
    assert 0 < len(h) < len(w)
    assert w.head(0).describe()["n"] == 0
    with pytest.raises(ValueError, match="factor must be a number > 0"):
        w.scaled_rate(0)


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ("zipf:rate=1", "workload 'zipf:rate=1': unknown kind 'zipf' (allowed: trace, poisson, "
                    "gamma, saber, lmsys, phases, phase-shift)"),
    ("poisson", "workload 'poisson': expected poisson:FIELD=VALUE,... (fields of poisson: "
                "rate, prompt, output, n, length_scale, max_tokens)"),
    ("poisson:rate=1,prompt=5,output=5", "workload 'poisson:rate=1,prompt=5,output=5': "
                                         "missing n= (poisson needs rate, prompt, output, n)"),
    ("poisson:rate=0,prompt=5,output=5,n=3", "rate='0' must be a number > 0"),
    ("poisson:rate=x,prompt=5,output=5,n=3", "rate='x' must be a number > 0"),
    ("poisson:rate=1,prompt=5,output=5,n=2.5", "n='2.5' must be an integer in [1, 1000000]"),
    ("poisson:rate=1,prompt=5,output=5,n=3,temp=1", "unknown field 'temp' for poisson "
                                                    "(allowed: rate, prompt, output, n, "
                                                    "length_scale, max_tokens)"),
    ("poisson:rate=1,rate=2", "field 'rate' given twice"),
    ("poisson:rate=1,fast", "'fast' is not FIELD=VALUE (fields of poisson: rate, prompt, "
                            "output, n, length_scale, max_tokens)"),
    ("poisson:rate=1,prompt=0,output=5,n=3", "workload 'poisson:rate=1,prompt=0,output=5,n=3'"
                                             ": prompt='0' must be a token count in [1, 16777216]"),
    ("poisson:rate=1,prompt=5,output=abc,n=3", "output='abc' is neither a token count (64) "
                                               "nor a distribution (U(lo,hi), N(mean,std), "
                                               "LN(mean,median), Exp(mean))"),
    ("poisson:rate=1,prompt=Z(1,2),output=5,n=3", "prompt='Z(1,2)': unknown distribution 'Z' "
                                                  "(allowed: U(lo,hi), N(mean,std), "
                                                  "LN(mean,median), Exp(mean))"),
    ("poisson:rate=1,prompt=U(1),output=5,n=3", "prompt='U(1)': expected U(lo,hi) with 2 "
                                                "numbers"),
    ("poisson:rate=1,prompt=Exp(1,2),output=5,n=3", "expected Exp(mean) with 1 number"),
    ("poisson:rate=1,prompt=U(1.5,3),output=5,n=3", "U(lo,hi) takes whole token counts"),
    ("poisson:rate=1,prompt=U(9,3),output=5,n=3", "prompt='U(9,3)' must have 1 <= low <= "
                                                  "high"),
    ("poisson:rate=1,prompt=N(0,3),output=5,n=3", "N(mean,std) needs mean > 0"),
    ("poisson:rate=1,prompt=LN(10,20),output=5,n=3", "LN(mean,median) needs mean >= "
                                                     "median > 0"),
    ("poisson:rate=1,prompt=Exp(0),output=5,n=3", "Exp(mean) needs mean > 0"),
    ("gamma:rate=1,prompt=5,output=5,n=3", "missing cv= (gamma needs rate, cv, prompt, "
                                           "output, n)"),
    ("saber:rate=1,n=3", "missing mix= (saber needs mix, rate, n)"),
    ("saber:mix=W4,rate=1,n=3", "mix='W4' is not one of W1, W2, W3"),
    ("saber:mix=W1,rate=1,n=3,arrival=burst", "arrival='burst' is not one of poisson, gamma"),
    ("saber:mix=W1,rate=1,n=3,arrival=gamma", "arrival=gamma needs cv=C (coefficient of "
                                              "variation of the gaps)"),
    ("lmsys:rate=1,n=3,cv=2", "cv= applies only with arrival=gamma"),
    ("lmsys:rate=1,n=3,length_scale=-1", "length_scale='-1' must be a number in (0, 1000]"),
    ("lmsys:rate=1,n=3,max_tokens=0", "max_tokens='0' must be an integer in [1, 16777216]"),
    ("trace:", "workload 'trace:': trace needs a PATH before its fields "
               "(trace:PATH[,time_scale=X,length_scale=Y,n=N,rate=R])"),
    ("trace:n=5", "trace needs a PATH before its fields"),
    ("trace:/nonexistent/x.csv", "trace /nonexistent/x.csv: No such file or directory"),
    ("phases:", "workload 'phases:': phase p0 is empty (phases:SPEC1;SPEC2;...)"),
    ("phases:lmsys:rate=1,n=2;", "phase p1 is empty"),
    ("phases:lmsys:rate=1,n=2;phases:lmsys:rate=1,n=2", "phase p1: phases cannot be nested"),
    ("phases:lmsys:rate=1,n=2;lmsys:rate=1", "workload 'phases:lmsys:rate=1,n=2;lmsys:rate=1',"
                                             " phase p1: workload 'lmsys:rate=1': missing n= "
                                             "(lmsys needs rate, n)"),
    ("phase-shift:rate=2,n=0", "workload 'phase-shift:rate=2,n=0': n='0' must be an integer "
                               "in [1, 1000000]"),
    ("phase-shift:speed=2", "unknown field 'speed' for phase-shift (allowed: rate, n, scale)"),
])
def test_bad_specs(spec, message):
    with pytest.raises(WorkloadError) as e:
        parse_workload(spec)
    assert message in str(e.value)


def test_trace_errors(tmp_path, trace_csv):
    def err(spec):
        with pytest.raises(WorkloadError) as e:
            parse_workload(spec)
        return str(e.value)

    f = tmp_path / "bad.csv"
    f.write_text("a,b\n1,2\n")
    assert err(f"trace:{f}") == (f"trace {f}: missing column 'arrived_at' (has: a, b; needs: "
                                 f"arrived_at, num_prefill_tokens, num_decode_tokens)")
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,x,2\n")
    assert err(f"trace:{f}") == (f"trace {f}: line 3: arrived_at and token counts must be "
                                 f"numbers")
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,-1,1\n")
    assert err(f"trace:{f}") == f"trace {f}: line 2: token counts must be in [0, 16777216]"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n")
    assert err(f"trace:{f}") == f"trace {f}: no rows"
    f.write_text("")
    assert "missing column 'arrived_at' (has: nothing;" in err(f"trace:{f}")
    assert err(f"trace:{trace_csv},time_scale=2,rate=1") == \
        f"workload 'trace:{trace_csv},time_scale=2,rate=1': give time_scale= or rate=, not both"
    assert err(f"trace:{trace_csv},n=1,rate=1").endswith(
        "rate= needs at least two requests with different arrival times")


def test_max_model_len_too_small():
    with pytest.raises(WorkloadError, match=r"max_model_len=1 must be >= 2 \(one prompt and "
                                            r"one output token\)"):
        parse_workload("lmsys:rate=1,n=2", max_model_len=1)


def test_profiler_uses_the_shared_distributions():
    from tuned.profiler.lengths import parse_sweep_workload

    w = parse_sweep_workload("synthetic:prompt=N(50,5),output=Exp(20)", seed=1)
    assert w.describe()["prompt"] == "N(50,5)" and w.describe()["output"] == "Exp(20)"
    with pytest.raises(WorkloadError, match="unknown distribution 'Q'"):
        parse_sweep_workload("synthetic:prompt=Q(1),output=4")


def test_rates_relative_to_the_hosts_capacity_are_sized_per_part():
    """``rate=Kx`` is K times the capacity the caller gives for the part's lengths (its
    means), ``s=S`` becomes n = rate x S; parts without one are kept as written."""
    from tuned.base.workloads import has_relative_rates, sized_workload

    seen = []

    def capacity(prompt, output):
        seen.append((prompt.mean, output.mean))
        return 2.0

    spec = ("phases:poisson:rate=10x,prompt=U(26,486),output=U(13,243),s=20;"
            "gamma:rate=0.25x,cv=2,prompt=64,output=Exp(32),n=20;"
            "poisson:rate=1,prompt=8,output=8,n=3")
    assert has_relative_rates(spec) and not has_relative_rates("poisson:rate=1,prompt=8,"
                                                               "output=8,n=3")
    assert sized_workload(spec, capacity) == (
        "phases:poisson:rate=20,prompt=U(26,486),output=U(13,243),n=400;"
        "gamma:rate=0.5,cv=2,prompt=64,output=Exp(32),n=20;"
        "poisson:rate=1,prompt=8,output=8,n=3")
    assert seen == [(256.0, 128.0), (64.0, 32.0)]
    wl = parse_workload(sized_workload(spec, capacity), 0)
    assert [sum(1 for r in wl if r.phase == p) for p in ("p0", "p1", "p2")] == [400, 20, 3]


@pytest.mark.parametrize("spec, problem", [
    ("poisson:rate=3x,prompt=8,output=8,n=3,s=2", "give n= or s=, not both"),
    ("trace:azure_conv_2023,rate=2x", "rate=Kx (K times this host's capacity) is for "
                                       "poisson and gamma parts, not 'trace'"),
    ("poisson:rate=2x,prompt=8,output=8,s=-1", "s='-1' must be seconds in (0, 2.592e+06]"),
])
def test_a_bad_relative_rate_names_the_field(spec, problem):
    from tuned.base.workloads import sized_workload

    with pytest.raises(WorkloadError) as e:
        sized_workload(spec, lambda prompt, output: 1.0)
    assert str(e.value).endswith(problem)


def test_a_relative_rate_outside_the_bench_says_where_it_belongs():
    with pytest.raises(WorkloadError) as e:
        parse_workload("poisson:rate=2x,prompt=8,output=8,n=3", 0)
    assert str(e.value) == (
        "workload 'poisson:rate=2x,prompt=8,output=8,n=3': rate='2x' must be a number > 0 "
        "(rate=Kx, K times this host's capacity, is for `tuned bench --engine vllm` with a "
        "relative --slo such as tpot=2.5x)")
