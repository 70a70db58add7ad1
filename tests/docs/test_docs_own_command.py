"""docs/kubernetes.md: the documented vLLM command line with tuned's scheduler
(tests/e2e/test_e2e_own_command.py starts it; tests/deploy/test_kubernetes.py checks the
Kubernetes example against it)."""

from __future__ import annotations

from doc_readers import DOC_CONFIG, DOC_MODEL, ROOT, documented_command, flag_value as _flag


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
