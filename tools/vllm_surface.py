"""Which of the vLLM internals tuned relies on a vLLM release still has, as tuned
expects them: read from the release's source, without importing (or installing) it.

    .venv/bin/python tools/vllm_surface.py                  # the installed vLLM
    .venv/bin/python tools/vllm_surface.py vllm-0.33.0-...whl --json docs/vllm-surface/0.33.0.json
    .venv/bin/python tools/vllm_surface.py /path/to/site-packages --json OUT

Prints one line per internal (``tuned/engines/vllm_surface.py`` lists them): present,
changed (there, but not as tuned expects: why) or missing, then the counts. The exit
status is 0 when every internal is present, 1 when any is changed or missing, 2 when
the path holds no vLLM source. Get a release's wheel without installing it with
``pip download vllm==X.Y.Z --no-deps -d DIR``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuned.engines.vllm_surface_check import (SurfaceSourceError, check, counts,  # noqa: E402
                                              report, table)


def installed_vllm_dir() -> str | None:
    """The installed ``vllm`` package's folder, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="?", help="a vLLM wheel (.whl), a folder holding the "
                   "vllm package, or the package folder (default: the installed vLLM)")
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON here")
    args = p.parse_args(argv)
    source = args.source or installed_vllm_dir()
    if source is None:
        print("vllm_surface: vLLM is not installed here; name a wheel or a folder",
              file=sys.stderr)
        return 2
    try:
        version, findings = check(source)
    except SurfaceSourceError as e:
        print(f"vllm_surface: {e}", file=sys.stderr)
        return 2
    print(f"vLLM {version or '(version not found)'} from {source}")
    print(table(findings))
    c = counts(findings)
    print(f"{c['present']} present, {c['changed']} changed, {c['missing']} missing "
          f"of {len(findings)}")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        rep = report(version, Path(source).name, findings)
        out.write_text(json.dumps(rep, indent=1) + "\n")
        print(f"wrote {out}")
    return 0 if c["changed"] == c["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
