"""SABER as its authors ran it (Chang et al., *SABER*, ``shared/seeds/002_56b8c98eae4faee6.txt``),
checked against the raw results of their public replication package
(``saber270/Saber``), on the simulator.

The package holds the dispatcher they ran (``saber.py``), the static-batching client
(``baseline_client.py``), the workload generator (``generate_workloads.py``), the
measured speed curve (``estimation_function/measured_generation_speed.csv``), one CSV
per workload and rate of SABER's own run (``experiment_data/saber_data_USL/``) and the
notebook that picks the best static cap (``RQ2.ipynb``). The package carries no
licence, so nothing of it is copied here: the figures below are derived from it (a
fraction, a mean) and each names the file it comes from.

Set-up (:func:`hardware`, :func:`workload`):

* the four task types with the code's fixed ``max_tokens`` (617 / 387 / 51 / 48) and
  end-to-end deadlines (12 / 8 / 1 / 1 s); each request generates all its
  ``max_tokens`` (the measured execution times at 1 RPS are ``max_tokens`` over about
  90 tok/s); prompt lengths are this project's estimate, the code's prompt
  characters / 4 (:data:`PROMPT_TOKENS`; the model's tokenizer is not available here);
* 100 requests, W1 / W2 / W3 with the generator's counts, shuffled; Poisson arrivals
  for SABER (``saber.py``: cumulative exponential gaps), sorted uniform arrivals over
  100 / rate seconds for the static caps (``baseline_client.py``);
* the engine (:class:`AuthorsStepModel`): a decode step takes 1 / v(b), v the
  per-batch mean of the measured speeds (:data:`MEASURED_SPEED_TOK_S`), linear
  between the measured batch sizes and past 60 along the last segment, plus
  :data:`PREFILL_S_PER_TOKEN` per prompt token (this project's estimate from the
  package's first-token times at 1-2 RPS); vLLM's A100 defaults (max_num_seqs 256,
  token budget 2048); a KV cache of :data:`NUM_GPU_BLOCKS` blocks (this project's
  choice: about 117 W1 requests at full length, the paper's "above 100 exceeded the
  GPU memory");
* SABER: the shipped ``saber`` queue policy with the authors' code's options
  (:data:`AUTHORS`); the static caps 10..100 with vLLM's FCFS.

Ablation (:data:`ABLATIONS`): the authors' reading with one mechanism changed at a
time. The result also counts what refused each attempt (``SaberPolicy.refusals``).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

from tuned import config as config_mod
from tuned.sim.hardware import SimHardware
from tuned.sim.stepmodel import StepShape
from tuned.base.workloads import RequestSpec

RATES = tuple(float(r) for r in range(1, 11)) + (15.0, 20.0)
MIXES = ("W1", "W2", "W3")
STATIC_CAPS = tuple(range(10, 101, 10))
REQUESTS_PER_RUN = 100
SABER_CEILING = 256
MAX_NUM_BATCHED_TOKENS = 2048
MAX_MODEL_LEN = 4096
BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 8192
QUICK = {"rates": (5.0, 10.0, 20.0), "seeds": 1}
FULL = {"rates": RATES, "seeds": 3}

#: task -> (max_tokens, deadline s): saber.py's data_templates and sla_thresholds
TASKS = {"translation": (617, 12.0), "generation": (387, 8.0),
         "qna": (51, 1.0), "summary": (48, 1.0)}
#: task -> prompt tokens: this project's estimate, characters of saber.py's prompt / 4
#: (4104, 2660, 885 and 439 characters)
PROMPT_TOKENS = {"translation": 1026, "generation": 665, "qna": 221, "summary": 110}
#: mix -> requests per task out of 100: generate_workloads.py
MIX_COUNTS = {"W1": {"translation": 40, "summary": 10, "generation": 40, "qna": 10},
              "W2": {"translation": 10, "summary": 40, "generation": 10, "qna": 40},
              "W3": {"translation": 25, "summary": 25, "generation": 25, "qna": 25}}
#: batch size -> per-request generation speed (tok/s), the mean of the rows of
#: estimation_function/measured_generation_speed.csv at that batch size
MEASURED_SPEED_TOK_S = {1: 94.95, 2: 92.70, 3: 91.71, 4: 90.58, 5: 89.12, 6: 87.34,
                        7: 86.33, 8: 85.40, 9: 83.72, 10: 82.48, 20: 63.26, 30: 58.54,
                        40: 51.99, 50: 48.58, 60: 44.98}
#: seconds per prompt token: this project's estimate, the slope of the mean first-token
#: time over the estimated prompt length across the four tasks, least squares (SABER's
#: USL runs at 1 and 2 RPS, high-priority requests, every workload: 0.061 s summary,
#: 0.066 s QnA, 0.101 s generation, 0.127 s translation)
PREFILL_S_PER_TOKEN = 0.074e-3
#: the saber queue options that do what the authors' code does (saber.py)
AUTHORS = {"window": 20, "running_check": "recorded", "pace_s": 0.1, "refused": "tail",
           "speed_limit_tok_s": 100.0, "expiry_check_s": 1.0, "load": "doubled",
           "speed_curve": "authors_code"}
#: contender -> (what it changes, the options it overrides in AUTHORS); None drops
#: the speed curve altogether (no profile, no coefficients: nothing is tested)
ABLATIONS = {
    "no-demotion": ("demoted requests keep their place and go without a test "
                    "(demoted = in_order)", {"demoted": "in_order"}),
    "no-pacing": ("every step may admit, trying the whole window (pace_s = 0)",
                  {"pace_s": 0.0}),
    "window-1": ("the head of the high-priority queue only (window = 1)", {"window": 1}),
    "no-cap": ("the fitted coefficients (0.0300, -0.0001), no zero crossing "
               "(speed_curve = authors_fit)", {"speed_curve": "authors_fit"}),
    "load-plus-one": ("speed predicted at running + 1, the cap near 33 "
                      "(load = next)", {"load": "next"}),
    "no-speed-test": ("no speed curve: no first or second clause and no cap "
                      "(speed_curve = profile, none loaded)", {"speed_curve": "profile"}),
    "refused-stay": ("a refused request keeps its place (refused = stay)",
                     {"refused": "stay"}),
}

#: the authors' raw goodput (%) per rate (RATES): the share of rows with SLA Met =
#: yes in experiment_data/saber_data_USL/workload{1,2,3}_rps_{rate}.csv
AUTHORS_GOODPUT = {
    "W1": (100, 99, 97, 96, 80, 62, 52, 45, 50, 49, 37, 36),
    "W2": (100, 100, 100, 100, 100, 100, 100, 100, 100, 99, 77, 61),
    "W3": (100, 100, 100, 100, 99, 92, 86, 76, 74, 74, 54, 50),
}
#: the best static cap's goodput (%) per rate, as RQ2.ipynb prints it (its baseline
#: runs are not in the package)
NOTEBOOK_BEST_STATIC = {
    "W1": (100, 100, 100, 98, 52, 40, 32, 31, 35, 33, 32, 28),
    "W2": (100, 100, 100, 100, 100, 100, 100, 100, 100, 97, 72, 54),
    "W3": (100, 100, 100, 100, 100, 93, 88, 77, 74, 58, 39, 24),
}
#: the paper's mean gains (points) and SABER's CV of the per-rate mean completion/SLA
#: (%), which the package's CSVs reproduce exactly (against the notebook's best static)
PAPER_GAIN_POINTS = {"W1": 10.2, "W2": 1.2, "W3": 4.3}
PAPER_CV = {"W1": 33.7, "W2": 17.5, "W3": 25.1}
#: the marks: the authors' reading within this many points of the authors' raw goodput,
#: mean over the rates of each mix; its mean gain within this many of the paper's
GOODPUT_TOLERANCE_POINTS = 5.0
GAIN_TOLERANCE_POINTS = 3.0


class AuthorsStepModel:
    """The step time of the authors' testbed as their measured curve implies it: a
    step that decodes b requests takes 1 / v(b) (v linear between the measured batch
    sizes, past the last one along its last segment's step-time slope), plus
    :data:`PREFILL_S_PER_TOKEN` per prompt token it computes. A prefill-only step
    takes 1 / v(1) plus its tokens."""

    name = "saber-authors-measured"

    def __init__(self, speeds: dict[int, float] = MEASURED_SPEED_TOK_S,
                 prefill_s_per_token: float = PREFILL_S_PER_TOKEN) -> None:
        self._b = sorted(speeds)
        self._t = [1.0 / speeds[b] for b in self._b]
        self.prefill_s_per_token = prefill_s_per_token

    def decode_step_s(self, b: int) -> float:
        bs, ts = self._b, self._t
        b = max(b, bs[0])
        if b >= bs[-1]:
            return ts[-1] + (b - bs[-1]) * (ts[-1] - ts[-2]) / (bs[-1] - bs[-2])
        i = next(k for k in range(1, len(bs)) if bs[k] >= b)
        f = (b - bs[i - 1]) / (bs[i] - bs[i - 1])
        return ts[i - 1] + f * (ts[i] - ts[i - 1])

    def step_s(self, shape: StepShape) -> float:
        if not shape.num_decode and not shape.prefill_tokens:
            return 0.0
        return (self.decode_step_s(max(shape.num_decode, 1))
                + shape.prefill_tokens * self.prefill_s_per_token)

    def describe(self) -> dict:
        return {"kind": "saber-authors", "speeds_tok_s": dict(zip(self._b, (
            1 / t for t in self._t))), "prefill_s_per_token": self.prefill_s_per_token}


def hardware() -> SimHardware:
    """The authors' testbed as the simulator runs it (module doc)."""
    return SimHardware("saber-authors-measured", AuthorsStepModel(), BLOCK_SIZE,
                       NUM_GPU_BLOCKS, SABER_CEILING, MAX_NUM_BATCHED_TOKENS,
                       {"source": "saber270/Saber estimation_function/"
                                  "measured_generation_speed.csv (per-batch means)"},
                       max_model_len=MAX_MODEL_LEN)


def workload(mix: str, rate: float, seed: int, arrivals: str = "poisson"
             ) -> list[RequestSpec]:
    """100 requests of ``mix`` in a shuffled order; ``arrivals`` "poisson" (SABER's
    client) or "uniform" (the static client's sorted uniform times over 100 / rate s).
    The same ``seed`` gives the same task order under both."""
    rng = random.Random(seed)
    tasks = [t for t, n in MIX_COUNTS[mix].items() for _ in range(n)]
    rng.shuffle(tasks)
    n = len(tasks)
    if arrivals == "poisson":
        t, times = 0.0, []
        for _ in range(n):
            t += rng.expovariate(rate)
            times.append(t)
    elif arrivals == "uniform":
        times = sorted(rng.uniform(0.0, n / rate) for _ in range(n))
    else:
        raise ValueError(f"arrivals must be poisson or uniform, got {arrivals!r}")
    out = []
    for i, (task, at) in enumerate(zip(tasks, times)):
        mt, sla = TASKS[task]
        out.append(RequestSpec(f"r{i:06d}", at, PROMPT_TOKENS[task], mt, mt,
                               sla_class=task, deadline_s=sla))
    return out


def _base() -> dict:
    return {"max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_model_len": MAX_MODEL_LEN,
            "log_level": "warning", "fallback_cap": 4}


def configs() -> dict[str, config_mod.Config]:
    """The static caps, the authors' reading (``authors``) and each ablation."""
    out = {f"static-{c}": config_mod.validate({**_base(), "max_num_seqs": c,
                                               "batch_policy": "static",
                                               "token_budget_policy": "max"})
           for c in STATIC_CAPS}
    # vLLM as the authors started it for SABER (its defaults), no tuned cap on top
    saber = {**_base(), "max_num_seqs": SABER_CEILING, "queue_policy": "saber",
             "batch_policy": "static", "token_budget_policy": "max"}
    out["authors"] = config_mod.validate({**saber, "queue_options": dict(AUTHORS)})
    for name, (_, opts) in ABLATIONS.items():
        out[name] = config_mod.validate({**saber, "queue_options": {**AUTHORS, **opts}})
    return out


def run_one(cfg, hw: SimHardware, specs: Sequence[RequestSpec]) -> dict:
    """One run: goodput (finish - arrival <= deadline), mean completion/SLA, the share
    demoted and, for SABER, what refused its attempts."""
    from tuned.bench.runner import results_from_sim
    from tuned.sim.engine import SimEngine

    eng = SimEngine(cfg, hw.step_model, block_size=hw.block_size,
                    num_gpu_blocks=hw.num_gpu_blocks)
    res = eng.run(specs)
    dl = {s.request_id: s.deadline_s for s in specs}
    results = results_from_sim(res)
    good = sum(1 for r in results if r.completed and r.e2e_s <= dl[r.request_id] + 1e-9)
    ratios = [r.e2e_s / dl[r.request_id] for r in results if r.completed]
    policy = getattr(eng.waiting, "policy", None)
    busy = [s for s in res.steps if s.step_s > 0]
    total = sum(s.step_s for s in busy)
    return {"goodput": good / len(specs),
            "ratio_mean": statistics.fmean(ratios) if ratios else None,
            "demoted": policy.stats.demoted if policy is not None else 0,
            "refusals": dict(getattr(policy, "refusals", {}) or {}),
            "mean_running": (sum(s.num_running * s.step_s for s in busy) / total
                             if total else 0.0),
            "unfinished": sum(1 for r in results if not r.completed)}


def _cv(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mu = statistics.fmean(values)
    return statistics.pstdev(values) / mu if mu else None


def measure(seed: int = 0, *, rates: Sequence[float] = RATES, seeds: int = 3,
            mixes: Sequence[str] = MIXES, contenders: Sequence[str] | None = None) -> dict:
    """Every (mix, rate, contender) over ``seeds`` workload seeds (seed * 1000 + i):
    SABER contenders on Poisson arrivals, the static caps on uniform ones, the same
    task order. Per mix: per-rate goodput beside the authors', the best static beside
    the notebook's, the mean gain and the CV of the per-rate mean completion/SLA."""
    hw = hardware()
    cfgs = configs()
    if contenders is not None:
        cfgs = {k: v for k, v in cfgs.items() if k.startswith("static-") or k in contenders}
    out: dict = {"rates": list(rates), "seeds": seeds, "options": dict(AUTHORS),
                 "ablations": {k: v[0] for k, v in ABLATIONS.items()
                               if k in cfgs}, "mixes": {}}
    for mix in mixes:
        rows = []
        for rate in rates:
            acc: dict[str, list[dict]] = {k: [] for k in cfgs}
            for i in range(seeds):
                ws = seed * 1000 + i
                poisson = workload(mix, rate, ws, "poisson")
                uniform = workload(mix, rate, ws, "uniform")
                for name, cfg in cfgs.items():
                    specs = uniform if name.startswith("static-") else poisson
                    acc[name].append(run_one(cfg, hw, specs))
            row: dict = {"rps": rate, "contenders": {}}
            for name, runs in acc.items():
                refusals: dict[str, int] = {}
                for r in runs:
                    for k, v in r["refusals"].items():
                        refusals[k] = refusals.get(k, 0) + v
                ratios = [r["ratio_mean"] for r in runs if r["ratio_mean"] is not None]
                row["contenders"][name] = {
                    "goodput": statistics.fmean(r["goodput"] for r in runs),
                    "ratio_mean": statistics.fmean(ratios) if ratios else None,
                    "demoted_share": statistics.fmean(r["demoted"] for r in runs)
                    / REQUESTS_PER_RUN,
                    "mean_running": statistics.fmean(r["mean_running"] for r in runs),
                    "refusals": refusals,
                    "unfinished": sum(r["unfinished"] for r in runs)}
            statics = [f"static-{c}" for c in STATIC_CAPS]
            row["best_static"] = max(statics, key=lambda k: row["contenders"][k]["goodput"])
            rows.append(row)
        out["mixes"][mix] = summarise(mix, rows)
    return out


def summarise(mix: str, rows: list[dict]) -> dict:
    """A mix's rows with the figures the checks and the table read."""
    idx = [RATES.index(r["rps"]) for r in rows]
    authors = [AUTHORS_GOODPUT[mix][i] / 100 for i in idx]
    notebook = [NOTEBOOK_BEST_STATIC[mix][i] / 100 for i in idx]
    best = [r["contenders"][r["best_static"]]["goodput"] for r in rows]
    names = [k for k in rows[0]["contenders"] if not k.startswith("static-")]
    contenders = {}
    for name in names:
        g = [r["contenders"][name]["goodput"] for r in rows]
        means = [r["contenders"][name]["ratio_mean"] for r in rows
                 if r["contenders"][name]["ratio_mean"] is not None]
        contenders[name] = {"goodput": g, "gain_points": 100 * statistics.fmean(
            a - b for a, b in zip(g, best)), "cv": _cv(means)}
    best_means = [r["contenders"][r["best_static"]]["ratio_mean"] for r in rows]
    ours = contenders["authors"]["goodput"] if "authors" in contenders else []
    return {"rows": rows, "authors_goodput": authors, "notebook_best_static": notebook,
            "best_static": best, "contenders": contenders,
            "best_static_cv": _cv([m for m in best_means if m is not None]),
            "mean_abs_diff_points": (100 * statistics.fmean(
                abs(a - b) for a, b in zip(ours, authors)) if ours else None),
            "best_static_mean_abs_diff_points": 100 * statistics.fmean(
                abs(a - b) for a, b in zip(best, notebook)),
            "paper_gain_points": PAPER_GAIN_POINTS[mix],
            "authors_gain_points": 100 * statistics.fmean(
                a - b for a, b in zip(authors, notebook)),
            "paper_cv": PAPER_CV[mix]}


def checks(result: dict) -> list[dict]:
    """The marks: per mix, the authors' reading's goodput within
    :data:`GOODPUT_TOLERANCE_POINTS` of the authors' raw goodput (mean absolute
    difference over the rates), and its mean gain over the best static within
    :data:`GAIN_TOLERANCE_POINTS` of the paper's."""
    out = []
    full = len(result["rates"]) == len(RATES)
    for mix, s in result["mixes"].items():
        d = s["mean_abs_diff_points"]
        out.append({"figure": f"authors' code's reading: {mix} goodput against the "
                              f"authors' raw goodput, mean |difference| over RPS (points)",
                    "ours": f"{d:.1f}", "target": f"<= {GOODPUT_TOLERANCE_POINTS:g}",
                    "ok": d <= GOODPUT_TOLERANCE_POINTS})
        g = s["contenders"]["authors"]["gain_points"]
        paper = s["paper_gain_points"]
        if full:
            out.append({"figure": f"authors' code's reading: {mix} mean goodput gain over "
                                  f"best static (points)",
                        "ours": f"{g:+.1f}",
                        "target": f"{paper:+.1f} ± {GAIN_TOLERANCE_POINTS:g}",
                        "ok": abs(g - paper) <= GAIN_TOLERANCE_POINTS})
    return out


def _pc(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}"


def format_lines(result: dict) -> list[str]:
    """The per-rate table, the gains, the CVs and the ablation."""
    rates = ", ".join(f"{r:g}" for r in result["rates"])
    lines = [f"SABER as its authors ran it (saber270/Saber's saber.py, options "
             f"{result['options']}), on their measured speed curve; RPS {rates}, "
             f"{result['seeds']} seed(s) each",
             "figure | ours | authors' data"]
    for mix, s in result["mixes"].items():
        c = s["contenders"]["authors"]
        lines.append(f"{mix} SABER goodput per RPS (%) | "
                     + " ".join(_pc(x) for x in c["goodput"]) + " | "
                     + " ".join(_pc(x) for x in s["authors_goodput"]))
        lines.append(f"{mix} best static goodput per RPS (%) | "
                     + " ".join(_pc(x) for x in s["best_static"]) + " | "
                     + " ".join(_pc(x) for x in s["notebook_best_static"]) + " (RQ2.ipynb)")
        lines.append(f"{mix} SABER mean |difference| from the authors' goodput (points); "
                     f"best static's from the notebook's | {s['mean_abs_diff_points']:.1f}; "
                     f"{s['best_static_mean_abs_diff_points']:.1f} | —")
        lines.append(f"{mix} mean gain over best static (points) | {c['gain_points']:+.1f} | "
                     f"{s['authors_gain_points']:+.1f} (paper {s['paper_gain_points']:+.1f})")
        lines.append(f"{mix} CV of per-RPS mean completion/SLA (%), best static → SABER | "
                     f"{_pct(s['best_static_cv'])} → {_pct(c['cv'])} | {s['paper_cv']:g}")
    names = [n for n in next(iter(result["mixes"].values()))["contenders"] if n != "authors"]
    if names:
        lines.append(f"ablation: the authors' reading with one mechanism changed | gain "
                     f"{' / '.join(result['mixes'])} (points); CV (%) | the authors' "
                     f"reading's")
        ref = " / ".join(f"{s['contenders']['authors']['gain_points']:+.1f}"
                         for s in result["mixes"].values())
        for n in names:
            g = " / ".join(f"{s['contenders'][n]['gain_points']:+.1f}"
                           for s in result["mixes"].values())
            cvs = " / ".join(_pct(s["contenders"][n]["cv"]) for s in result["mixes"].values())
            lines.append(f"  {n}: {result['ablations'].get(n, '')} | {g}; {cvs} | {ref}")
    tot: dict[str, int] = {}
    for s in result["mixes"].values():
        for r in s["rows"]:
            for k, v in r["contenders"]["authors"].get("refusals", {}).items():
                tot[k] = tot.get(k, 0) + v
    lines.append("authors' reading: attempts refused by (all mixes, rates, seeds) | "
                 + ", ".join(f"{k} {v}" for k, v in tot.items()) + " | —")
    return lines


def _pct(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"
