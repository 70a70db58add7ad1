"""The closed-loop sweep over concurrency levels: N requests kept in flight per
level, each a load-speed sample; the requests as profile columns."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tuned.curves.profile import REQUEST_COLUMNS, empty_columns, time_weighted_load
from tuned.launch.launcher import EngineError
from tuned.profiler.lengths import SweepLengths
from tuned.profiler.steps import StepCollector
from tuned.launch.prompts import PromptFactory


@dataclass
class RequestRecord:
    concurrency: int
    start_s: float
    duration_s: float
    prompt_tokens: int
    output_tokens: int


#: send(prompt_token_ids, max_tokens) -> (prompt_tokens, output_tokens) reported by the server
SendFn = Callable[[list[int], int], tuple[int, int]]


def openai_send(base_url: str, model: str, timeout_s: float = 600.0) -> SendFn:
    """A :data:`SendFn` using the official ``openai`` client on ``/v1/completions`` with
    ``ignore_eos`` so that every request generates exactly ``max_tokens`` tokens."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0,
                    timeout=timeout_s)

    def send(prompt: list[int], max_tokens: int) -> tuple[int, int]:
        r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                      extra_body={"ignore_eos": True})
        return int(r.usage.prompt_tokens), int(r.usage.completion_tokens)

    return send


class Sweep:
    """The closed-loop sweep over concurrency levels.

    ``send`` is the only contact with the engine (injected, so tests use a fake);
    each level runs N daemon threads that loop "next request, send, record" until the
    level has issued ``level_requests`` requests or ``level_s`` seconds have passed,
    then waits for the in-flight ones. Ctrl-C during a level abandons that level and
    keeps the ones already measured.
    """

    def __init__(self, send: SendFn, workload: SweepLengths, prompts: PromptFactory,
                 levels: list[int], level_s: float, level_requests: Callable[[int], int],
                 steps: StepCollector | None = None, progress: bool = True,
                 clock: Callable[[], float] = time.monotonic, max_error_fraction: float = 0.1):
        self.send = send
        self.workload = workload
        self.prompts = prompts
        self.levels = levels
        self.level_s = level_s
        self.level_requests = level_requests
        self.steps = steps
        self.progress = progress
        self.clock = clock
        self.max_error_fraction = max_error_fraction
        self.records: list[RequestRecord] = []
        self.measured: list[int] = []
        self.interrupted = False
        self.failure: str | None = None
        self.errors: list[str] = []
        self.t0 = 0.0

    def run(self) -> "Sweep":
        self.t0 = self.clock()
        try:
            for n in self.levels:
                if self.steps is not None:
                    self.steps.flush(n)
                records = self.run_level(n)
                if self.steps is not None:
                    self.steps.flush(0)
                self.records.extend(records)
                self.measured.append(n)
        except KeyboardInterrupt:
            self.interrupted = True
        except EngineError as e:
            self.failure = str(e)
        return self

    def run_level(self, n: int) -> list[RequestRecord]:
        budget = max(int(self.level_requests(n)), n)
        deadline = self.clock() + self.level_s
        lock = threading.Lock()
        state = {"issued": 0, "failed": 0}
        done: list[RequestRecord] = []
        stop = threading.Event()
        bar = _bar(n, budget, self.progress)

        def take() -> bool:
            with lock:
                if stop.is_set() or state["issued"] >= budget or self.clock() >= deadline:
                    return False
                state["issued"] += 1
                return True

        def worker() -> None:
            while take():
                p_len, o_len = self.workload.next()
                prompt = self.prompts.make(p_len)
                t_start = self.clock()
                try:
                    p_tok, o_tok = self.send(prompt, o_len)
                except Exception as e:  # engine error: count it, stop if too many
                    with lock:
                        state["failed"] += 1
                        self.errors.append(f"N={n}: {type(e).__name__}: {e}")
                        if state["failed"] > max(2, self.max_error_fraction * budget):
                            stop.set()
                    continue
                t_end = self.clock()
                rec = RequestRecord(n, t_start - self.t0, t_end - t_start, p_tok, o_tok)
                with lock:
                    done.append(rec)
                bar.update(1)

        threads = [threading.Thread(target=worker, name=f"tuned-profile-{n}-{i}", daemon=True)
                   for i in range(n)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.2)  # short joins keep Ctrl-C responsive
                    if done:
                        tot = sum(r.output_tokens for r in done)
                        dur = sum(r.duration_s for r in done)
                        bar.set_postfix_str(f"{n * tot / dur:.0f} tok/s" if dur > 0 else "")
        except KeyboardInterrupt:
            stop.set()
            raise
        finally:
            bar.close()
        if stop.is_set() and state["failed"]:
            raise EngineError(f"level N={n}: {state['failed']} requests failed, last: "
                              f"{self.errors[-1]}")
        if not done:
            raise EngineError(f"level N={n}: no request completed"
                              + (f"; last error: {self.errors[-1]}" if self.errors else ""))
        return sorted(done, key=lambda r: r.start_s)

    def request_columns(self) -> dict[str, list]:
        """The measured requests as profile columns (with start times and load L)."""
        cols = empty_columns(REQUEST_COLUMNS + ("start_s", "load"))
        for n in self.measured:
            recs = [r for r in self.records if r.concurrency == n]
            if not recs:
                continue
            start = np.array([r.start_s for r in recs])
            end = start + np.array([r.duration_s for r in recs])
            load = time_weighted_load(start, end)
            for r, L in zip(recs, load):
                cols["concurrency"].append(r.concurrency)
                cols["prompt_tokens"].append(r.prompt_tokens)
                cols["output_tokens"].append(r.output_tokens)
                cols["duration_s"].append(round(r.duration_s, 6))
                cols["speed_tok_s"].append(round(r.output_tokens / r.duration_s, 4)
                                           if r.duration_s > 0 else 0.0)
                cols["start_s"].append(round(r.start_s, 6))
                cols["load"].append(round(float(L), 4))
        return cols


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix_str(self, s: str) -> None: ...
    def close(self) -> None: ...


def _bar(n: int, total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=f"N={n:>3}", unit="req", leave=True, file=sys.stderr,
                dynamic_ncols=True)
