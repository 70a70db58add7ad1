"""How late this host lets a process run while vLLM's CPU engine is busy.

Starts plain vLLM on the demo model, then, ``--reps`` times: ``--streams`` streamed
completions of ``--tokens`` tokens each (``ignore_eos``), while a thread here asks
``/v1/models`` every 0.2 s and a separate sleeping process (50 ms naps) records
every nap that overran by more than ``--stall-s``, with the machine's steal time
(``/proc/stat``) over that nap. Prints, per repeat and stream, when its first and last
chunk arrived and its largest gaps between chunks, how many polls got through, and
at the end the watcher's overruns. A stream whose chunks all arrive in its last
instant, or a poll count far below the repeat's length / 0.2 s, is this host keeping
the client (or vLLM's API server) off the cores while the engine runs. Example::

    .venv/bin/python tools/host_stalls.py --reps 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuned.launch import launcher  # noqa: E402
from tuned.base.demo_model import resolve_model  # noqa: E402
from tuned.base.netutil import free_port  # noqa: E402
from tuned.launch.serve import DEFAULT_MODEL_CACHE  # noqa: E402

WATCHER = r"""
import sys, time
def stat():
    f = open("/proc/stat").readline().split()
    return int(f[8]), sum(int(x) for x in f[1:9])
end = time.monotonic() + float(sys.argv[1]); lim = float(sys.argv[2]); t0 = time.monotonic()
while time.monotonic() < end:
    a = stat(); s = time.monotonic(); time.sleep(0.05); late = time.monotonic() - s - 0.05
    if late > lim:
        b = stat()
        print([round(s - t0, 2), round(late, 2), b[0] - a[0], b[1] - a[1]], flush=True)
"""


def stream_summary(times: list[float]) -> dict:
    """First and last chunk arrival and the three largest gaps between chunks."""
    gaps = sorted((b - a for a, b in zip(times, times[1:])), reverse=True)[:3]
    return {"chunks": len(times), "first_s": round(times[0], 2) if times else None,
            "last_s": round(times[-1], 2) if times else None,
            "largest_gaps_s": [round(g, 2) for g in gaps]}


def overruns(rows: list[list], threshold_s: float) -> list[dict]:
    """The watcher's naps that overran ``threshold_s``: when (s after its start), by
    how much, and the steal and total CPU jiffies (all cores) over the nap."""
    return [{"at_s": at, "late_s": late, "steal_jiffies": steal, "cpu_jiffies": total}
            for at, late, steal, total in rows if late > threshold_s]


def one_rep(base: str, model: str, streams: int, tokens: int, seed: int) -> dict:
    t0 = time.monotonic()
    arrivals: list[list[float]] = [[] for _ in range(streams)]

    def stream(i: int) -> None:
        body = {"model": model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
                "temperature": 1.0, "prompt": [10 + (seed * 97 + i * 13 + k) % 1900
                                               for k in range(20)]}
        req = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    arrivals[i].append(time.monotonic() - t0)

    polls: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            with urllib.request.urlopen(f"{base}/v1/models", timeout=120) as r:
                r.read()
            polls.append(time.monotonic() - t0)
            time.sleep(0.2)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    poller = threading.Thread(target=poll)
    poller.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stop.set()
    poller.join()
    took = time.monotonic() - t0
    return {"took_s": round(took, 2), "polls": len(polls), "polls_expected": int(took / 0.2),
            "streams": [stream_summary(a) for a in arrivals]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo:tiny")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--stall-s", type=float, default=0.3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="one more vLLM argument (repeatable), e.g. "
                         "--vllm-arg=--speculative-config='{\"method\": \"ngram\", ...}'")
    args = ap.parse_args(argv)
    model_path = resolve_model(args.model, Path(DEFAULT_MODEL_CACHE),
                               log=lambda m: print(m, file=sys.stderr))
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="host-stalls-")) / "vllm.log"
    cmd = launcher.vllm_command(model_path, host="127.0.0.1", port=port,
                              max_num_seqs=args.streams, max_num_batched_tokens=args.budget,
                              max_model_len=1024,
                              args=["--dtype", args.dtype, "--enforce-eager", *args.vllm_arg])
    proc = launcher.spawn(cmd, log_path=log)
    base = f"http://127.0.0.1:{port}"
    try:
        launcher.wait_ready(base, proc, 900, log)
        print(f"vLLM ready (log {log})", file=sys.stderr)
        with urllib.request.urlopen(f"{base}/v1/models", timeout=60) as r:
            served = json.loads(r.read())["data"][0]["id"]
        watcher = subprocess.Popen([sys.executable, "-c", WATCHER, "100000",
                                    str(args.stall_s)], stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        for rep in range(args.reps):
            r = one_rep(base, served, args.streams, args.tokens, rep)
            print(f"rep {rep}: {r['took_s']} s, {r['polls']} of ~{r['polls_expected']} "
                  f"polls of /v1/models got through", flush=True)
            for i, s in enumerate(r["streams"]):
                print(f"  stream {i}: {s['chunks']} chunks, first {s['first_s']} s, last "
                      f"{s['last_s']} s, largest gaps {s['largest_gaps_s']} s", flush=True)
        watcher.terminate()
        out, _ = watcher.communicate(timeout=30)
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    finally:
        launcher.stop_process(proc)
    print(f"watcher over {time.monotonic() - t0:.0f} s: naps of 50 ms late by more than "
          f"{args.stall_s} s:")
    for o in overruns(rows, args.stall_s):
        print(f"  at {o['at_s']} s: {o['late_s']} s late (steal {o['steal_jiffies']} of "
              f"{o['cpu_jiffies']} CPU jiffies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
