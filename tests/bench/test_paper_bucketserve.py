"""`tuned bench --paper bucketserve`: seed 004's Fig. 5 against the paper's own
baselines (padded static batcher, prefill/decode split) and, apart, tuned's FCFS
question."""

import io
import json

import pytest

from fakes import TokenStepModel
from tuned.bench.papers import bucketserve, run_paper
from tuned.workloads import RequestSpec

pytestmark = pytest.mark.usefixtures("quiet_logs")


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
    assert bucketserve.seed_stats([None])["lower"] is None


def test_checks_hold_ratios_to_the_papers_spread_over_each_baseline():
    res = {"offline": {"ratios": {"bucket/padded": 5.2, "pd-bucket/pd-fcfs": 1.4}},
           "online": {"ratios": {"bucket/padded": 3.0, "pd-bucket/pd-fcfs": 1.0}},
           "fcfs": {"offline": bucketserve.seed_stats([1.0, 1.01, 0.99]),
                    "online": bucketserve.seed_stats([1.05, 1.04, 1.06])}}
    checks = bucketserve.checks(res)
    assert [(c["figure"], c["ok"]) for c in checks] == [
        ("paper's: (a) offline throughput, bucket / padded static (UELLM-like)", False),
        ("paper's: (b) load at 80% attainment, bucket / padded static (UELLM-like)", True),
        ("paper's: (a) offline throughput, PD split bucket / FCFS (DistServe-like)", True),
        ("paper's: (b) load at 80% attainment, PD split bucket / FCFS (DistServe-like)", False),
        ("tuned's: (a) offline throughput, bucket / fcfs, mean - 2 SE over 3 seeds", False),
        ("tuned's: (b) load at 80% attainment, bucket / fcfs, mean - 2 SE over 3 seeds", True)]
    assert checks[0]["target"] == ("1.975..3.58x (paper 3.58x; its ratios over this "
                                   "baseline)")


@pytest.mark.slow  # a few minutes of simulation (five capacity searches, three seeds)
def test_bucketserve_quick_runs_the_shipped_bucket_policy_against_the_papers_baselines(
        tmp_path, monkeypatch):
    from tuned.policies.bucket import BucketPolicy

    modes = set()
    real = BucketPolicy.order

    def spy(self, waiting, now_s, ctx=None):
        modes.add(self.mode)
        return real(self, waiting, now_s, ctx)

    monkeypatch.setattr(BucketPolicy, "order", spy)
    out = io.StringIO()
    rc = run_paper("bucketserve", tmp_path, quick=True, seed=0, stdout=out)
    data = json.loads((tmp_path / "paper-bucketserve.json").read_text())
    assert modes == {"offline_ljf", "online"}
    assert rc == (0 if data["passed"] else 1)
    runs = data["offline"]["runs"]
    assert all(r["completed"] == 300 for r in runs.values())
    # padding is measured in the steps: the padded batcher computes far more tokens
    # than the requests need; the paged engine and the split compute what they need
    assert runs["padded"]["prefill_overhead"] > 2.0
    assert runs["padded"]["decode_overhead"] > 2.0
    for name in ("bucket", "pd-fcfs", "pd-bucket"):
        assert runs[name]["prefill_overhead"] == pytest.approx(1.0, abs=0.01)
    assert data["offline"]["ratios"]["bucket/padded"] > 2.0
    assert data["online"]["ratios"]["bucket/padded"] > 2.0
    assert data["online"]["runs"]["fcfs"]["converged"] is True
    assert len(data["fcfs"]["per_seed"]) == 3
    assert "(a) throughput bucket / padded static |" in out.getvalue()
