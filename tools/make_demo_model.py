#!/usr/bin/env python3
"""Build tuned's random-weight demo Llama into a folder.

    python tools/make_demo_model.py --size tiny|small --out DIR [--seed N] [--force]

Prints one line per stage, then the model folder and its parameter count.  A
folder that already holds the same size and seed is left as is (use --force to
rebuild).  Needs no network: the tokenizer is trained on a generated corpus.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    from tuned.base.demo_model import SIZES, build_demo_model, read_manifest
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tuned.base.demo_model import SIZES, build_demo_model, read_manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--out", type=Path, required=True, help="model folder to create")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)

    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    path = build_demo_model(args.out, size=args.size, seed=args.seed, force=args.force,
                            log=log)
    m = read_manifest(path) or {}
    print(f"{path}")
    print(f"size={m.get('size')} seed={m.get('seed')} dtype={m.get('dtype')} "
          f"params={m.get('param_count', 0):,} sha256={m.get('weights_sha256', '?')[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
