"""docs/kubernetes.md: the documented vLLM command line with tuned's scheduler
(tests/e2e/test_e2e_own_command.py starts it; tests/test_kubernetes.py checks the
Kubernetes example against it)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "kubernetes.md"
DOC_MODEL = "meta-llama/Llama-2-7b-hf"
DOC_CONFIG = "/etc/tuned/tuned.toml"


def _block(lang: str, after: str = "") -> str:
    text = DOC.read_text()
    if after:
        text = text[text.index(after):]
    return re.search(rf"```{lang}\n(.*?)```", text, re.S).group(1)


def documented_command(model: str = DOC_MODEL, config_path: str = DOC_CONFIG) -> list[str]:
    """The command line of docs/kubernetes.md as an argument list, with ``model`` and
    ``config_path`` in place of the documented ones."""
    text = _block("sh", "## The command line").replace("\\\n", " ")
    return [a.replace(DOC_MODEL, model).replace(DOC_CONFIG, config_path)
            for a in shlex.split(text)]


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_documented_command_line():
    cmd = documented_command()
    assert cmd[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(cmd, "--scheduler-cls") == "tuned.engines.vllm.TunedScheduler"
    assert _flag(cmd, "--additional-config") == \
        '{"tuned": {"config_path": "/etc/tuned/tuned.toml"}}'
    # what the e2e test substitutes is there exactly once
    assert " ".join(cmd).count(DOC_MODEL) == 1 and " ".join(cmd).count(DOC_CONFIG) == 1


def test_readme_links_the_kubernetes_doc():
    assert "(docs/kubernetes.md)" in (ROOT / "README.md").read_text()
