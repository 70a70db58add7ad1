"""tuned.core.length_learning: the queue's output-length collaborator reads hints,
predicts, re-predicts for an over-estimating policy and learns from finished requests;
the queue delegates to it."""

from __future__ import annotations

from fakes import QueuedReq
from tuned.core.length_learning import LengthLearning
from tuned.core.predictor import OutputLengthPredictor
from tuned.core.queue import QueueCore
from tuned.policies.registry import make_policy


def trained(outputs: list[int]) -> LengthLearning:
    """A learner that has seen ``outputs`` (8-token prompts, max_tokens 1000)."""
    lengths = LengthLearning(OutputLengthPredictor(min_samples=1))
    for out in outputs:
        lengths.learn(8, out, None)
    return lengths


def test_a_hint_wins_and_a_malformed_one_is_reported_and_counted():
    seen = []
    lengths = LengthLearning(on_warning=lambda rid, w: seen.append((rid, w)))
    hints, pred = lengths.predict("a", {"tuned_output_tokens": 30}, 8, 100, False)
    assert (hints.output_tokens, pred) == (30, 30)
    hints, pred = lengths.predict("b", {"tuned_output_tokens": -1}, 8, 100, False)
    assert (hints.output_tokens, pred) == (None, 100)     # nothing learnt: max_tokens
    assert lengths.hint_warnings == 1 and [rid for rid, _ in seen] == ["b"]


def test_a_class_deadline_comes_from_the_table():
    lengths = LengthLearning(class_deadlines_s={"chat": 2.5})
    hints, _ = lengths.predict("a", {"tuned_class": "chat"}, 8, 100, False)
    assert (hints.sla_class, hints.deadline_s) == ("chat", 2.5)


def test_learning_moves_the_prediction_and_the_over_estimate_is_higher():
    lengths = trained([10] * 9 + [200])
    _, median = lengths.predict("a", None, 8, 1000, False)
    _, high = lengths.predict("a", None, 8, 1000, True)
    assert median == 10 and high == 200
    stats = lengths.prediction_stats()
    assert stats == {"prediction_count": 0, "prediction_mae_tokens": 0.0,
                     "prediction_mean_error_tokens": 0.0}     # none learnt with a plan


def test_errors_and_under_prediction_come_from_what_was_planned():
    q: QueueCore = QueueCore(make_policy("fcfs", {}))
    r = QueuedReq("a", 0.0, 8, max_tokens=100)
    q.add_request(r)
    assert q.info("a").predicted_output == 100 and q.pop_request() is r   # admitted
    r.num_output_tokens = 40
    q.request_finished(r, learn=True)
    assert q.lengths.predictor.observed == 1
    assert q.snapshot()["prediction_count"] == 1
    assert q.snapshot()["prediction_mae_tokens"] == 60.0
    assert q.lengths.under_excess == 0.0          # over-predicted: no excess
    r2 = QueuedReq("b", 0.0, 8, max_tokens=10)
    q.add_request(r2)
    assert q.pop_request() is r2
    r2.num_output_tokens = 20                     # past its plan of 10: excess 1.0
    q.request_finished(r2, learn=True)
    assert q.lengths.under_excess == 0.5


def test_a_policy_switch_repredicts_the_waiting_requests():
    lengths = trained([10] * 9 + [200])
    q: QueueCore = QueueCore(make_policy("fcfs", {}), lengths.predictor)
    q.add_request(QueuedReq("a", 0.0, 8, max_tokens=1000))
    assert q.info("a").predicted_output == 10
    q.switch_policy(make_policy("mcsf", {}))      # plans with an over-estimate
    assert q.info("a").predicted_output == 200


def test_an_aborted_request_is_not_learnt():
    q: QueueCore = QueueCore(make_policy("fcfs", {}))
    r = QueuedReq("a", 0.0, 8, num_output_tokens=3)
    q.add_request(r)
    q.request_finished(r, learn=False)
    assert q.lengths.predictor.observed == 0 and q.info("a") is None


def test_the_waiting_prompts_are_read_without_the_running_ones():
    q: QueueCore = QueueCore(make_policy("fcfs", {}))
    for rid, prompt in (("a", 8), ("b", 300), ("c", 40)):
        q.add_request(QueuedReq(rid, 0.0, prompt, max_tokens=10))
    assert sorted(q.waiting_prompt_tokens()) == [8, 40, 300]
    assert q.pop_request().request_id == "a"          # running now: not waiting
    assert sorted(q.waiting_prompt_tokens()) == [40, 300]


def test_the_oldest_waiting_arrival_is_read_without_the_running_ones():
    q: QueueCore = QueueCore(make_policy("fcfs", {}))
    assert q.oldest_arrival_s() is None
    for rid, arrival, prompt in (("a", 4.0, 8), ("b", 1.5, 300), ("c", 2.0, 40)):
        q.add_request(QueuedReq(rid, arrival, prompt, max_tokens=10))
    assert q.oldest_arrival_s() == 1.5
    assert q.pop_request().request_id == "b"          # running now: not waiting
    assert q.oldest_arrival_s() == 2.0
    assert [q.pop_request().request_id for _ in range(2)] == ["c", "a"]
    assert q.oldest_arrival_s() is None
