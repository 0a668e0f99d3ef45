#!/usr/bin/env bash
# Build (or refresh) a virtual environment that runs kvtier's SGLang HiCache backend tests
# against the real sglang package on a CPU-only machine.
#
# sglang 0.5.23 on PyPI pins CUDA-only packages (sglang-kernel, flashinfer, flash-attn, ...),
# so we install:
#   1. sglang==0.5.23 without its dependencies,
#   2. an explicit, pinned list of what its imports need (scripts/sglang/requirements.txt;
#      torchvision brings torch 2.14.1, which runs on the CPU here), every transitive package
#      pinned too (scripts/sglang/constraints.txt): nothing is resolved unpinned,
#   3. kvtier itself (editable, without dependencies) and the test tools.
# About 6 GB. Idempotent: rerunning it on an existing environment installs only what is
# missing. The first HiCache hash call compiles a small C++ extension (gcc, libssl-dev).
#
# Usage: scripts/install_sglang_test_env.sh [VENV_DIR]     (default: .venv-sglang)
# Then:  VENV_DIR/bin/pytest -m sglang tests/sglang
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv-sglang}"
PYTHON="${PYTHON:-python3}"
SGLANG_VERSION="0.5.23"
PINS="$REPO/scripts/sglang"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)

"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
"${PIP[@]}" -c "$PINS/constraints.txt" -r "$PINS/requirements.txt"
"${PIP[@]}" --no-deps -e "$REPO"

"$VENV/bin/python" -c "import sglang, kvtier, torch; \
print('sglang', sglang.__version__, 'torch', torch.__version__)"
