#!/usr/bin/env bash
# Build (or refresh) a virtual environment that runs kvtier's vLLM connector tests.
#
# vLLM 0.33.0 on PyPI is a CUDA wheel pinning torch 2.14 and many CUDA-only packages. Its
# scheduler half (Scheduler, KVCacheManager, the KV-connector interface and the native
# offloading connector) is pure Python, so on a CPU-only machine we install:
#   1. the CPU build of torch 2.13.0,
#   2. vllm==0.33.0 without its dependencies,
#   3. vllm's own Requires-Dist, minus torch and the CUDA-only packages, with torch pinned,
#   4. kvtier itself (editable) and the test tools.
# Idempotent: rerunning it on an existing environment only installs what is missing.
#
# Usage: scripts/install_vllm_test_env.sh [VENV_DIR]     (default: .venv-vllm)
# Then:  VENV_DIR/bin/pytest -m vllm tests/vllm
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.33.0"
# Packages vLLM requires that only make sense with CUDA (or that would replace CPU torch).
SKIP="torch torchaudio torchvision torchcodec flashinfer-python apache-tvm-ffi tilelang \
nvidia-cudnn-frontend nvtx fastsafetensors instanttensor nvidia-cutlass-dsl quack-kernels \
tokenspeed-mla humming-kernels pynvvideocodec"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "torch==$TORCH_VERSION" > "$WORK/constraints.txt"

"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" --no-deps "vllm==$VLLM_VERSION"

# vLLM's unconditional requirements (no extras), minus the skipped ones.
SKIP="$SKIP" "$VENV/bin/python" - "$WORK/requirements.txt" <<'PY'
import os
import re
import sys
from importlib.metadata import requires

skip = {name.lower() for name in os.environ["SKIP"].split()}
kept = []
for line in requires("vllm") or []:
    if "extra ==" in line:
        continue
    name = re.split(r"[\s<>=!~;\[(]", line, maxsplit=1)[0].lower().replace("_", "-")
    if name not in skip:
        kept.append(line)
with open(sys.argv[1], "w") as out:
    out.write("\n".join(kept) + "\n")
print(f"installing {len(kept)} of vLLM's requirements")
PY
"${PIP[@]}" -c "$WORK/constraints.txt" -r "$WORK/requirements.txt"

"${PIP[@]}" -c "$WORK/constraints.txt" --no-deps -e "$REPO"
# redis: the connector's shared tier in the scheduler tests.
"${PIP[@]}" -c "$WORK/constraints.txt" "redis>=5.0" "isal>=1.0" "mypy_extensions>=1.0" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100"

VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c \
    "import vllm, kvtier, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
