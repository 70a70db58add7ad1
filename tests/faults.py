"""Fault injection for the real-engine tests (tests/e2e/test_e2e_faults.py).

Two pieces, both driven by small files the test writes while the engine runs:

* :class:`FaultPolicy`, a batch-policy plugin (``batch_policy =
  "faults:FaultPolicy"``; the EngineCore imports it from ``PYTHONPATH``). Its
  ``decide`` reads the mode file named by ``TUNED_FAULT_MODE_FILE`` on every tick
  and behaves as told:

  ==================  ==========================================================
  ``normal``          a valid decision: cap ``NORMAL_CAP``, the full token budget
  ``raise``           raises ``RuntimeError`` (cause ``controller_error``)
  ``nan``             cap ``float("nan")`` (cause ``invalid_decision``)
  ``negative``        cap ``-3`` (``invalid_decision``)
  ``huge``            cap ``10**9`` (``invalid_decision``)
  ``slow:S``          sleeps ``S`` seconds, then a valid decision (``S`` >
                      ``interval_s``: ``slow_decision``; ``S`` > ``stale_after_s``:
                      the controller stops ticking for ``S``)
  ``slow_build:S``    a valid decision; building the policy (a reload) sleeps ``S``
  ==================  ==========================================================

  Each tick appends ``{"mode", "t_wall", "t_mono", "phase"}`` to
  ``<mode file>.events`` when the mode it saw differs from the previous tick's, so
  the test knows when the fault really began inside the engine.

* :data:`FAKE_PYNVML`, the source of a ``pynvml`` module the test writes into a
  temp dir put first on the engine's ``PYTHONPATH``. vLLM 0.32 uses its own copy
  (``vllm.third_party.pynvml``), so only tuned's ``import pynvml`` sees the fake:
  the narrowest boundary there is. Its state file holds one word: ``ok`` (one
  24 GiB device), ``init_fail`` (``nvmlInit`` raises "Driver Not Loaded"),
  ``error`` (memory queries raise "Unknown Error"), ``gone`` (memory queries raise
  "GPU is lost", NVML's word for a device that fell off the bus).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from tuned.policies.batch import Decision

NORMAL_CAP = 6
MODE_ENV = "TUNED_FAULT_MODE_FILE"


def read_mode(path: str | os.PathLike) -> tuple[str, float]:
    """(mode, argument) from the mode file; ("normal", 0) when it is missing."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return "normal", 0.0
    mode, _, arg = text.partition(":")
    try:
        value = float(arg) if arg else 0.0
    except ValueError:
        value = 0.0
    return mode or "normal", value


def write_mode(path: str | os.PathLike, mode: str) -> float:
    """Write ``mode`` atomically (the engine reads the file on every tick); return
    the wall time just before it became visible (taken before the rename: the engine
    may act on it before this process runs again)."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(mode)
    t = time.time()
    os.replace(tmp, path)
    return t


def read_events(path: str | os.PathLike) -> list[dict]:
    try:
        lines = Path(str(path) + ".events").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


class FaultPolicy:
    """A batch policy whose behaviour follows the mode file (module docstring)."""

    wants_active = False

    def __init__(self, *, cfg, ceiling: int, max_num_batched_tokens: int, block_size: int,
                 profile=None) -> None:
        self.path = os.environ[MODE_ENV]
        self.ceiling = ceiling
        self.cap = min(NORMAL_CAP, ceiling)
        self.budget = max_num_batched_tokens
        self.profile = profile
        self._last_mode: str | None = None
        mode, arg = read_mode(self.path)
        if mode == "slow_build":
            self._event(mode, "build_start")
            time.sleep(arg)
            self._event(mode, "build_end")

    def _event(self, mode: str, phase: str) -> None:
        line = json.dumps({"mode": mode, "t_wall": time.time(), "t_mono": time.monotonic(),
                           "phase": phase})
        with open(self.path + ".events", "a") as f:
            f.write(line + "\n")

    def decide(self, obs) -> Decision:
        mode, arg = read_mode(self.path)
        if mode != self._last_mode:
            self._event(mode, "decide")
            self._last_mode = mode
        cap: object = self.cap
        if mode == "raise":
            raise RuntimeError("injected fault: the decision function raised")
        if mode == "nan":
            cap = math.nan
        elif mode == "negative":
            cap = -3
        elif mode == "huge":
            cap = 10 ** 9
        elif mode == "slow":
            time.sleep(arg)
        return Decision(target=cap, lower=1, upper=self.ceiling, cap=cap,  # type: ignore[arg-type]
                        batch=max(self.cap, obs.num_running), token_budget=self.budget,
                        reason=f"fault_{mode}", inputs={"mode": mode})


FAKE_PYNVML = '''"""A fake pynvml for tuned's tests: state from {state_path!r}."""
import time
from pathlib import Path
from types import SimpleNamespace

NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
_TEXT = {{9: "Driver Not Loaded", 15: "GPU is lost", 999: "Unknown Error"}}
_STATE = Path({state_path!r})
GIB = 1 << 30


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _TEXT.get(self.value, "NVML error %d" % self.value)


def _state():
    try:
        return _STATE.read_text().strip()
    except OSError:
        return "ok"


def nvmlInit():
    if _state() == "init_fail":
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(i):
    return ("fake-handle", i)


def nvmlDeviceGetName(handle):
    return "Fake GPU 24GB"


def nvmlDeviceGetMemoryInfo(handle):
    state = _state()
    if state == "error":
        raise NVMLError(NVML_ERROR_UNKNOWN)
    if state == "gone":
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    if state.startswith("used="):   # another tenant: this share of the device used
        used = int(float(state[5:]) * 24 * GIB)
        return SimpleNamespace(total=24 * GIB, used=used, free=24 * GIB - used)
    used = (6 + int(time.monotonic()) % 4) * GIB
    return SimpleNamespace(total=24 * GIB, used=used, free=24 * GIB - used)
'''


def write_fake_pynvml(directory: Path, state_path: Path, state: str = "ok") -> Path:
    """Write the fake ``pynvml`` module into ``directory`` (to put first on the
    engine's PYTHONPATH) and its state file; return ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pynvml.py").write_text(FAKE_PYNVML.format(state_path=str(state_path)))
    state_path.write_text(state)
    return directory
