"""The fakes and builders tests share, in one place: a fake engine view for the
controller, profile samples shaped like a sweep, and tuned's scheduler built from
vLLM's own config objects (vLLM is imported only by the builders that need it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import time
from pathlib import Path

import numpy as np

from tuned.core.ring import FinishedRequest, Ring, StepSample
from tuned.core.types import Decision
from tuned.curves import models as m
from tuned.curves.profile import STEP_COLUMNS

DATA = Path(__file__).resolve().parent / "data"
V1 = DATA / "profile_v1.json"


class FakeEngine:
    def __init__(self, ceiling=32, running=0, waiting=0):
        self.steps = Ring(1024)
        self.finished = Ring(256)
        self.ceiling = ceiling
        self.max_num_batched_tokens = 2048
        self.kv_capacity_tokens = 1000
        self.block_size = 1
        self.dp_rank = 0
        self.running, self.waiting = running, waiting
        self.policies: list[str] = []
        self.fail_counts = 0

    def counts(self):
        if self.fail_counts > 0:
            self.fail_counts -= 1
            raise RuntimeError("engine view not ready")
        return self.running, self.waiting

    def applied(self):
        return {"cap": 0, "token_budget": 0, "fallback": False, "fallback_cause": None}

    def set_queue_policy(self, name, cfg):
        self.policies.append(name)

    def queue_snapshot(self):
        return None

    def add_step(self, step_s, num_decode, t=None):
        s = self.steps
        s.append(StepSample(s.next_seq, time.monotonic() if t is None else t, step_s,
                            num_decode, 0, 0, num_decode, num_decode, 0.1, 1, 10,
                            self.running, self.waiting, 0))

    def add_finished(self, prompt, output):
        f = self.finished
        f.append(FinishedRequest(f.next_seq, time.monotonic(), f"r{f.next_seq}", prompt,
                                 output, output, 0.0, 0))


def make_samples(seed=0):
    """Request and step samples shaped like a sweep of levels 1..16 on a USL engine."""
    rng = np.random.default_rng(seed)
    req = {k: [] for k in ("concurrency", "prompt_tokens", "output_tokens", "duration_s",
                           "speed_tok_s", "start_s", "load")}
    t = 0.0
    for n in (1, 2, 4, 8, 16):
        for _ in range(4 * n):
            v = float(m.usl_speed(n, 50.0, 0.05, 0.002) * (1 + rng.normal(0, 0.01)))
            out = 64
            req["concurrency"].append(n)
            req["prompt_tokens"].append(int(rng.integers(16, 129)))
            req["output_tokens"].append(out)
            req["duration_s"].append(out / v)
            req["speed_tok_s"].append(v)
            req["start_s"].append(t)
            req["load"].append(float(n))
            t += 0.01
    steps = {k: [] for k in STEP_COLUMNS + ("concurrency",)}
    for _ in range(300):
        b = int(rng.integers(1, 17))
        c = int(rng.choice([0, 0, 0, 64, 128]))
        kv = b * int(rng.integers(50, 200))
        steps["num_decode"].append(b)
        steps["prefill_tokens"].append(c)
        steps["kv_tokens_resident"].append(kv)
        steps["kv_used_blocks"].append(kv // 16 + 1)
        steps["step_s"].append(float(m.step_time(b, c, 0.004, 0.0006, 0.00002)
                                     + rng.normal(0, 0.0001)))
        steps["concurrency"].append(min(16, 1 << int(np.log2(b))))
    return req, steps


META = {"model": {"path": "/models/demo-tiny", "config": {"architecture": "LlamaForCausalLM",
                                                          "num_layers": 2}},
        "hardware": {"cpu_model": "Test CPU", "cpu_cores": 2, "gpu": None},
        "created_at": "2025-06-01T00:00:00+00:00",
        "workload": {"spec": "synthetic:prompt=U(16,128),output=64"},
        "vllm_version": "0.32.0", "tuned_version": "0.1.0"}


BLOCK = 16
NUM_BLOCKS = 64


def make_scheduler(model: str, asynchronous: bool, additional_config: dict | None = None,
                   *, dp_index: int = 0, **overrides):
    """tuned's scheduler (``TunedScheduler``, sync or async base) built from vLLM's own
    config objects with a fake KV-cache config: no GPU, no model run; its controller
    is stopped, so a test drives decisions by hand. The engine runs ``max_num_seqs``
    8, ``max_num_batched_tokens`` 256 and ``max_model_len`` 256; tuned's config is
    handed over as `tuned serve` does, from ``overrides``, unless
    ``additional_config`` is given (vLLM's ``--additional-config`` as is).

    ``dp_index``: the data-parallel rank this engine is, set as vLLM 0.32's
    ``run_engine_core`` sets it for one rank of a dense model: ``data_parallel_index``
    the rank, ``data_parallel_rank`` 0 (``reconfigure_for_independent_dp_rank``)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from tuned import config
    from tuned.engines.vllm import TunedScheduler, tuned_additional_config

    cfg = config.validate({"max_num_seqs": 8, "max_num_batched_tokens": 256,
                           "max_model_len": 256, "metrics_port": 0, "interval_s": 0.1,
                           "fallback_cap": 3, **overrides})
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256,
                         enable_chunked_prefill=True, is_encoder_decoder=False,
                         scheduler_cls="tuned.engines.vllm.TunedScheduler")
    vc = VllmConfig(scheduler_config=sc,
                    model_config=ModelConfig(model=model, dtype="float32", seed=0,
                                             max_model_len=256, skip_tokenizer_init=True),
                    cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
                    additional_config=(tuned_additional_config(cfg) if additional_config
                                       is None else additional_config))
    # The CPU platform forces async scheduling off while finalising the config;
    # set it afterwards to build the GPU default's variant.
    vc.scheduler_config.async_scheduling = asynchronous
    vc.cache_config.num_gpu_blocks = NUM_BLOCKS
    vc.parallel_config.data_parallel_index = dp_index
    vc.parallel_config.data_parallel_rank = 0
    kv = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                      head_size=32, dtype=torch.float32))])
    cls = vc.scheduler_config.get_scheduler_cls()
    assert cls is TunedScheduler
    s = cls(vllm_config=vc, kv_cache_config=kv,
            structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK)
    s.controller.stop()  # the test drives decisions by hand
    return s


def requests(n: int, prompt: int = 20, max_tokens: int = 5, start: int = 0) -> list:
    """``n`` vLLM Requests of ``prompt`` tokens that each generate ``max_tokens``, named
    r<start> on."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return [Request(request_id=f"r{i}", prompt_token_ids=[i + 1] * prompt,
                    sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    pooling_params=None) for i in range(start, start + n)]


def step(s) -> tuple:
    """One engine step driven by hand: schedule, then a model output with one sampled
    token per decoding request."""
    from vllm.v1.outputs import ModelRunnerOutput

    so = s.schedule()
    ids = list(so.num_scheduled_tokens)
    sampled = [[] if s.requests[r].is_prefill_chunk else [7] for r in ids]
    out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                            sampled_token_ids=sampled)
    s.update_from_output(so, out)
    return so


def decision(cap: int, budget: int = 256) -> Decision:
    return Decision(target=cap, lower=1, upper=cap, cap=cap, batch=cap, token_budget=budget,
                    reason="memory")


def req(rid, prompt=10, max_tokens=100, t=0.0, xargs=None, out=0):
    """A vLLM Request of ``prompt`` tokens arriving at ``t`` (``xargs``: its
    ``vllm_xargs``), with ``out`` tokens already generated."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    r = Request(request_id=rid, prompt_token_ids=[1] * prompt,
                sampling_params=SamplingParams(max_tokens=max_tokens, extra_args=xargs),
                pooling_params=None, arrival_time=t)
    if out:
        r.append_output_token_ids([5] * out)
    return r


@dataclass
class QueuedReq:
    """A waiting request as tuned's queue core reads one (the attributes of vLLM's
    ``Request`` it uses), for queue tests that need no vLLM."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int = 16
    num_output_tokens: int = 0
    priority: int = 0
    extra_args: dict = field(default_factory=dict)


def load_tool(name: str):
    """A script under tools/ (not a package) loaded as a module, ``name`` its file stem."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """tuned's CLI in-process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from tuned.commands import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


class TokenStepModel:
    """A simulator step clock: 1 ms per token a step computes (every prompt token and
    every decode row)."""

    name = "token"

    def step_s(self, shape) -> float:
        return 1e-3 * (shape.prefill_tokens + shape.num_decode)

    def describe(self) -> dict:
        return {"kind": "token"}
