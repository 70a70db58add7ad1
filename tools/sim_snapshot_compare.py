"""Compare two folders written by tools/sim_snapshot.sh: every result.json must be
identical except ``config.source_path`` (where the config file lay),
``config.reload_token`` (a secret, no longer written since issue 20) and config keys
that exist on one side only (a key added since, at its default; listed). Exit 0 when all
match; otherwise name each file and the first differing key path, exit 1.

    python tools/sim_snapshot_compare.py BEFORE AFTER
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(p: Path) -> dict:
    doc = json.loads(p.read_text())
    doc.get("config", {}).pop("source_path", None)
    doc.get("config", {}).pop("reload_token", None)
    return doc


def _first_diff(a, b, path: str = "") -> str | None:
    if type(a) is not type(b):
        return path or "/"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}"
            d = _first_diff(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def main(argv: list[str]) -> int:
    before, after = Path(argv[0]), Path(argv[1])
    names = sorted(p.parent.name for p in before.glob("*/result.json"))
    bad = 0
    for name in names:
        other = after / name / "result.json"
        if not other.is_file():
            print(f"{name}: missing in {after}")
            bad += 1
            continue
        a, b = _load(before / name / "result.json"), _load(other)
        new_keys = sorted(set(a.get("config", {})) ^ set(b.get("config", {})))
        for k in new_keys:
            a.get("config", {}).pop(k, None)
            b.get("config", {}).pop(k, None)
        if new_keys and name == names[0]:
            print(f"config keys on one side only (not compared): {', '.join(new_keys)}")
        d = _first_diff(a, b)
        print(f"{name}: {'identical' if d is None else 'DIFFERS at ' + d}")
        bad += d is not None
    print(f"{len(names) - bad} of {len(names)} identical")
    return 1 if bad or not names else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
