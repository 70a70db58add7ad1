"""`tuned bench --paper bucketserve`: BucketServe's Fig. 5 against UELLM- and
DistServe-like baselines (padded static batcher, prefill/decode split), and the bucket
policy's own gain over FCFS on the same engine."""

import io
import json

import pytest

from fakes import TokenStepModel
from tuned.bench.papers import bucketserve, run_paper
from tuned.base.workloads import RequestSpec

# every test here starts no engine: tools/test.sh runs the slow ones on every core
pytestmark = [pytest.mark.usefixtures("quiet_logs"), pytest.mark.simulation]


class TinyHardware:
    step_model = TokenStepModel()
    block_size = 16
    num_gpu_blocks = 64
    kv_bytes_per_token = 0.0
    vllm_default_max_num_seqs = 8
    vllm_default_max_num_batched_tokens = 256

    def describe(self) -> dict:
        return {"name": "tiny"}


def test_bucketserve_mixed_workload_is_half_short_half_long_in_arrival_order():
    reqs = bucketserve.mixed_requests(200, 0, rate=4.0)
    assert [r.request_id for r in reqs][:2] == ["r000000", "r000001"]
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    long = [r for r in reqs if r.prompt_tokens > 400]
    assert 80 <= len(long) <= 110     # LongBench-like prompts (mean 2000) among 100 drawn
    assert all(r.prompt_tokens + r.output_tokens <= bucketserve.MAX_MODEL_LEN for r in reqs)


def test_pd_split_hands_each_request_from_the_prefill_to_the_decode_instance():
    """Prefill instance: both prompts (10 + 20 tokens) in one 30 ms step, first tokens at
    30 ms; decode instance: a step of two rows (2 ms: b's second and last token), then
    one row (1 ms: a's third)."""
    hw = TinyHardware()
    reqs = [RequestSpec("a", 0.0, 10, 3, 3), RequestSpec("b", 0.0, 20, 2, 2),
            RequestSpec("c", 0.0, 5, 1, 1)]
    cfg = bucketserve._config(hw, "fcfs", {})
    work: dict = {}
    a, b, c = bucketserve.pd_split(cfg, cfg, hw, reqs, work)
    assert (a.ttft_s, a.finish_s, a.output_tokens) == pytest.approx((0.035, 0.038, 3))
    assert (b.ttft_s, b.finish_s, b.output_tokens) == pytest.approx((0.035, 0.037, 2))
    assert (c.ttft_s, c.finish_s, c.output_tokens) == pytest.approx((0.035, 0.035, 1))
    assert a.tpot_s == pytest.approx(0.0015)
    assert (work["prefill_tokens"], work["decode_rows"]) == (35, 3)


def test_padded_system_runs_the_padded_static_batcher():
    hw = TinyHardware()
    reqs = [RequestSpec("a", 0.0, 10, 3, 3), RequestSpec("b", 0.0, 20, 2, 2)]
    work: dict = {}
    a, b = bucketserve.run_system("padded", "offline_ljf", hw, reqs, work)
    # one batch: 2 rows x 20 padded prompt tokens (40 ms), 2 decode steps of 2 rows
    assert (work["prefill_tokens"], work["decode_rows"]) == (40, 4)
    assert (a.finish_s, b.finish_s) == pytest.approx((0.044, 0.042))
    work = {}
    bucketserve.run_system("bucket-x2", "offline_ljf", hw, reqs, work)
    assert (work["prefill_tokens"], work["decode_rows"]) == (30, 3)


def test_seed_stats_mean_minus_two_standard_errors():
    st = bucketserve.seed_stats([0.99, 1.05, None, 1.02])
    assert st["n"] == 3 and st["mean"] == pytest.approx(1.02)
    assert st["sd"] == pytest.approx(0.03)
    assert st["lower"] == pytest.approx(1.02 - 2 * 0.03 / 3 ** 0.5)
    assert st["upper"] == pytest.approx(1.02 + 2 * 0.03 / 3 ** 0.5)
    assert bucketserve.seed_stats([None])["lower"] is None


def test_gain_verdict_is_a_gain_only_clear_of_the_seed_spread():
    v = bucketserve.gain_verdict
    assert v(bucketserve.seed_stats([1.03, 1.02, 1.04])) == "gain"
    assert v(bucketserve.seed_stats([1.005, 0.995, 1.021])) == "no measurable gain"
    assert v(bucketserve.seed_stats([0.95, 0.96, 0.94])) == "loss"
    assert v(bucketserve.seed_stats([None])) is None


def _own(*parts):
    out = {}
    for part, xs in parts:
        st = bucketserve.seed_stats(xs)
        out[part] = {**st, "verdict": bucketserve.gain_verdict(st)}
    return out


def test_checks_hold_ratios_to_the_papers_spread_and_the_bucket_policy_to_a_gain():
    res = {"offline": {"ratios": {"bucket/padded-bucket": 5.2, "pd-bucket/pd-fcfs": 1.4}},
           "online": {"ratios": {"bucket/padded-bucket": 3.0, "pd-bucket/pd-fcfs": 1.0}},
           "own": _own(("offline", [1.0, 1.01, 0.99]), ("online", [1.05, 1.04, 1.06]))}
    checks = bucketserve.checks(res)
    assert [(c["figure"], c["ok"]) for c in checks] == [
        ("paper's: (a) offline throughput, BucketServe-like / UELLM-like", False),
        ("paper's: (b) load at 80% attainment, BucketServe-like / UELLM-like", True),
        ("paper's: (a) offline throughput, BucketServe-like / DistServe-like (PD split, "
         "bucket / FCFS prefill)", True),
        ("paper's: (b) load at 80% attainment, BucketServe-like / DistServe-like (PD split, "
         "bucket / FCFS prefill)", False),
        ("bucket policy's own: (a) offline throughput, bucket / FCFS on the same engine, "
         "mean - 2 SE over 3 seeds (no measurable gain)", False),
        ("bucket policy's own: (b) load at 80% attainment, bucket / FCFS on the same "
         "engine, mean - 2 SE over 3 seeds (gain)", True)]
    assert checks[0]["target"] == ("1.975..3.58x (paper 3.58x; its ratios over this "
                                   "baseline)")
    # without the online part, only the offline checks
    del res["online"], res["own"]["online"]
    assert [c["ok"] for c in bucketserve.checks(res)] == [False, True, False]


@pytest.mark.slow  # about 5 s of simulation (offline parts, three seeds)
def test_bucketserve_quick_offline_verdict_the_bucket_policy_adds_no_measurable_gain(
        tmp_path, monkeypatch):
    """The verdict of the offline checks at the quick size, seed 0: over the UELLM-like
    batcher inside the paper's spread, almost all of it the engine; over the
    DistServe-like split and over FCFS on the same engine, the bucket policy's own
    gain is not enough: short of the paper's 1.31x, and not clear of its seed spread."""
    from tuned.policies.bucket import BucketPolicy

    modes = set()
    real = BucketPolicy.order

    def spy(self, waiting, now_s, ctx=None):
        modes.add(self.mode)
        return real(self, waiting, now_s, ctx)

    monkeypatch.setattr(BucketPolicy, "order", spy)
    out = io.StringIO()
    rc = run_paper("bucketserve", tmp_path, quick=True, seed=0, stdout=out,
                   runner=lambda seed, quick: bucketserve.run(seed, quick=quick,
                                                              online=False))
    data = json.loads((tmp_path / "paper-bucketserve.json").read_text())
    assert modes == {"offline_ljf"}
    assert rc == 1 and data["passed"] is False
    assert [c["ok"] for c in data["checks"]] == [True, False, False]
    own = data["own"]["offline"]
    assert own["verdict"] == "no measurable gain" and own["n"] == 3
    assert own["mean"] == pytest.approx(1.007, abs=0.003)
    assert own["lower"] < 1.0 < own["upper"]
    r = data["offline"]["ratios"]
    assert 1.975 <= r["bucket/padded-bucket"] <= 3.58
    # the engine carries the UELLM-like ratio: FCFS on tuned's engine gets within 1%
    assert r["fcfs/padded-bucket"] == pytest.approx(r["bucket/padded-bucket"], rel=0.01)
    assert r["pd-bucket/pd-fcfs"] < 1.31
    runs = data["offline"]["runs"]
    assert all(x["completed"] == 300 for x in runs.values())
    # padding is measured in the steps: the padded batcher computes far more tokens
    # than the requests need; the paged engine and the split compute what they need
    assert runs["padded"]["prefill_overhead"] > 2.0
    assert runs["padded-bucket"]["decode_overhead"] > 2.0
    for name in ("bucket", "pd-fcfs", "pd-bucket"):
        assert runs[name]["prefill_overhead"] == pytest.approx(1.0, abs=0.01)
    text = out.getvalue()
    assert "bucket policy's own gain over FCFS, offline, same engine, 3 seeds | +0.7%" in text
    assert text.rstrip().splitlines()[-1].startswith(
        "Out of tolerance: paper's: (a) offline throughput, BucketServe-like / "
        "DistServe-like")
