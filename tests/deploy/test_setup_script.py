"""tools/setup.sh picks vLLM's build from the host: the GPU build where an NVIDIA GPU
answers, the CPU build elsewhere, TUNED_EXTRA overriding; it says which and why."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _detect(tmp_path: Path, *, nvidia_smi: str | None, extra: str | None = None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho '{nvidia_smi}'\n")
        fake.chmod(0o755)
    # no ldconfig on this PATH: only the fake driver tool decides
    for tool in ("bash", "grep", "cat", "sha256sum", "cut", "dirname"):
        for d in ("/usr/bin", "/bin"):
            if (Path(d) / tool).exists() and not (bin_dir / tool).exists():
                (bin_dir / tool).symlink_to(Path(d) / tool)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    if extra is not None:
        env["TUNED_EXTRA"] = extra
    return subprocess.run([str(bin_dir / "bash"), str(ROOT / "tools" / "setup.sh"), "--detect"],
                          capture_output=True, text=True, timeout=30, env=env)


def test_a_host_with_an_nvidia_gpu_gets_the_gpu_build(tmp_path):
    r = _detect(tmp_path, nvidia_smi="GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    assert r.returncode == 0, r.stderr
    assert "[setup] vLLM build: gpu (an NVIDIA GPU was found" in r.stdout


def test_a_host_without_one_gets_the_cpu_build(tmp_path):
    r = _detect(tmp_path, nvidia_smi=None)
    assert r.returncode == 0, r.stderr
    assert "[setup] vLLM build: cpu (no NVIDIA GPU was found" in r.stdout
    # nvidia-smi present but no GPU behind it (a driver without a device)
    r = _detect(tmp_path, nvidia_smi="No devices were found")
    assert "[setup] vLLM build: cpu" in r.stdout


def test_tuned_extra_overrides_and_is_checked(tmp_path):
    r = _detect(tmp_path, nvidia_smi=None, extra="gpu")
    assert "[setup] vLLM build: gpu (TUNED_EXTRA=gpu)" in r.stdout
    r = _detect(tmp_path, nvidia_smi=None, extra="tpu")
    assert r.returncode == 2
    assert "TUNED_EXTRA must be cpu or gpu, got 'tpu'" in r.stderr
