#!/usr/bin/env python3
"""Write tuned's package data (``tuned/data/``) from the full upstream files.

    python tools/build_package_data.py --source DIR [--out tuned/data] [--check]

``DIR`` holds ``vidur-profiling/{a100,h100}/{Llama-2-7b-hf,Llama-2-70b-hf}/mlp.csv``
with its ``LICENSE`` and ``decode_step_llama2_7b.md``, and
``traces/azure_conv_2023.csv`` (the project's shared data folder). Each ``mlp.csv`` is
reduced to the columns :func:`tuned.sim.gpu.read_operator_profile` reads
(:data:`tuned.sim.gpu.PROFILE_COLUMNS`, in that order), every row kept and every cell
copied as text, so the simulator computes the same numbers from either copy; the
other files are copied byte for byte. ``--check`` writes nothing and exits 1 when a
packaged file differs from what this script would write.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

try:
    from tuned.data import TRACES_DIR, VIDUR_DIR
    from tuned.sim.gpu import PROFILE_COLUMNS, VIDUR_HARDWARE, profile_relpath
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tuned.data import TRACES_DIR, VIDUR_DIR
    from tuned.sim.gpu import PROFILE_COLUMNS, VIDUR_HARDWARE, profile_relpath

VIDUR_SOURCE = "vidur-profiling"
COPIED = {  # packaged path -> source path, both relative
    "LICENSE": f"{VIDUR_SOURCE}/LICENSE",
    f"{VIDUR_DIR}/decode_step_llama2_7b.md": f"{VIDUR_SOURCE}/decode_step_llama2_7b.md",
    f"{TRACES_DIR}/azure_conv_2023.csv": "traces/azure_conv_2023.csv",
}


def reduce_profile(text: str, columns: tuple[str, ...] = PROFILE_COLUMNS) -> str:
    """The CSV ``text`` with only ``columns`` (in that order), cells unchanged."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    missing = [c for c in columns if c not in header]
    if missing:
        raise ValueError(f"profile lacks columns {', '.join(missing)}")
    idx = [header.index(c) for c in columns]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in reader:
        if row:
            writer.writerow([row[i] for i in idx])
    return out.getvalue()


def package_files(source: Path) -> dict[str, bytes]:
    """Packaged path (relative to ``tuned/data``) -> the bytes it should hold."""
    out: dict[str, bytes] = {}
    for name in VIDUR_HARDWARE:
        rel = profile_relpath(name)
        text = (source / VIDUR_SOURCE / rel).read_text()
        out[f"{VIDUR_DIR}/{rel}"] = reduce_profile(text).encode()
    for dest, src in COPIED.items():
        out[dest] = (source / src).read_bytes()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True,
                    help="folder with vidur-profiling/ and traces/")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parent.parent / "tuned" / "data")
    ap.add_argument("--check", action="store_true",
                    help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args(argv)
    try:
        files = package_files(args.source)
    except (OSError, ValueError) as e:
        print(f"build_package_data: {e}", file=sys.stderr)
        return 2
    stale = []
    for rel, data in sorted(files.items()):
        path = args.out / rel
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    if stale:
        print("build_package_data: differs from the source: " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
