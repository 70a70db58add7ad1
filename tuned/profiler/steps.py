"""Per-step samples from ``tuned serve`` during a sweep: the client of tuned's
``/steps`` endpoint and the collector that tags each busy step with its level."""

from __future__ import annotations

import threading
from typing import Any

from tuned.curves.profile import STEP_COLUMNS, empty_columns


class StepsClient:
    """Client of tuned's ``GET /steps?since=SEQ`` endpoint (on the metrics port).

    Answer: ``{"next": SEQ, "block_size": int, "num_gpu_blocks": int, "samples":
    [{"seq", "t", "step_s", "num_decode", "num_prefill_reqs", "prefill_tokens",
    "scheduled_tokens", "kv_usage", "kv_used_blocks", "kv_tokens_resident",
    "num_running", "num_waiting", "preempted"}, ...]}``.
    """

    def __init__(self, base_url: str, session=None, timeout_s: float = 5.0):
        self.base_url = base_url.rstrip("/")
        if session is None:
            import requests

            session = requests.Session()
        self.http = session
        self.timeout_s = timeout_s

    def fetch(self, since: int | None = None) -> dict[str, Any]:
        params = {} if since is None else {"since": since}
        r = self.http.get(f"{self.base_url}/steps", params=params, timeout=self.timeout_s)
        r.raise_for_status()
        d = r.json()
        if not isinstance(d, dict) or "next" not in d or not isinstance(d.get("samples"), list):
            raise ValueError("unexpected /steps answer (no 'next' or 'samples')")
        return d

    def probe(self) -> tuple[bool, str]:
        """(available, reason) — False for a plain vLLM server or nothing listening."""
        try:
            self.fetch()
            return True, "ok"
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"


def _seq_end_running(s: dict) -> tuple[int, float, int] | None:
    try:
        return int(s["seq"]), float(s["t"]), int(s.get("num_running", 0))
    except (KeyError, TypeError, ValueError):
        return None


def _step_gap(prev: tuple[int, float, int] | None, s: dict) -> float:
    """Engine time between two back-to-back steps that no step measured: from the end
    of the previous step (its ``update_from_output``) to the start of this one (the end
    of its ``schedule()``): the scheduler itself, output processing, the busy loop.
    -1 where unknown: the previous step is not the one just before, or it left nothing
    running (the engine may have waited for a request)."""
    try:
        seq, t, step_s = int(s["seq"]), float(s["t"]), float(s["step_s"])
    except (KeyError, TypeError, ValueError):
        return -1.0
    if prev is None or prev[0] != seq - 1 or prev[2] < 1:
        return -1.0
    return round(max(t - step_s - prev[1], 0.0), 7)


class StepCollector:
    """Polls ``/steps`` in a background thread and keeps the busy steps as columns,
    each tagged with the concurrency level that was running when it was fetched;
    :meth:`flush` fetches synchronously at a level boundary so that tags are exact."""

    def __init__(self, client: StepsClient, poll_s: float = 0.25):
        self.client = client
        self.poll_s = poll_s
        self.columns = empty_columns(STEP_COLUMNS + ("concurrency", "gap_s"))
        self.level = 0
        self._prev: tuple[int, float, int] | None = None   # seq, end time, running after
        self.since: int | None = None
        self.dropped = 0
        self.errors = 0
        self.block_size: int | None = None
        self.num_gpu_blocks: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        d = self.client.fetch()  # skip whatever happened before the sweep (warm-up)
        self.since = int(d["next"])
        self.block_size = d.get("block_size")
        self.num_gpu_blocks = d.get("num_gpu_blocks")
        self._thread = threading.Thread(target=self._run, name="tuned-steps", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:
                self.errors += 1

    def poll(self) -> int:
        """Fetch new samples; returns how many busy steps were kept."""
        with self._lock:
            d = self.client.fetch(self.since)
            kept = 0
            since = self.since if self.since is not None else 0
            # "next" may be read before samples appended during the answer: skip repeats.
            samples = [s for s in d["samples"] if int(s.get("seq", since)) >= since]
            if samples and int(samples[0].get("seq", since)) > since:
                self.dropped += int(samples[0]["seq"]) - since  # the ring wrapped
            for s in samples:
                prev, self._prev = self._prev, _seq_end_running(s)
                if not self.level:
                    continue
                if not s.get("num_decode") and not s.get("prefill_tokens"):
                    continue  # idle step
                for k in STEP_COLUMNS:
                    v = s.get(k, 0)
                    self.columns[k].append(round(float(v), 7) if k == "step_s"
                                           else int(v))
                self.columns["concurrency"].append(self.level)
                self.columns["gap_s"].append(_step_gap(prev, s))
                kept += 1
            last = int(samples[-1].get("seq", since)) + 1 if samples else since
            self.since = max(int(d["next"]), last)
            return kept

    def flush(self, next_level: int) -> None:
        """Collect everything up to now under the current level, then switch level."""
        try:
            self.poll()
        except Exception:
            self.errors += 1
        with self._lock:
            self.level = next_level

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
