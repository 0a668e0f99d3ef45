"""kvtier's vLLM connector, by configuration alone::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"host_bytes": 17179869184}}'

This module imports without vLLM; vLLM is imported only when the connector class is asked
for (which vLLM does when it builds the connector), and its absence is then a clear
``ImportError``. Options: ``KvtierOptions``; see docs/vllm.md.
"""

from __future__ import annotations

from typing import Any

from kvtier.integrations.vllm.config import KvtierOptions
from kvtier.integrations.vllm.layout import UnsupportedConfig, VllmSpecDecode, vllm_layout

__all__ = ["KvtierOptions", "UnsupportedConfig", "VllmSpecDecode", "vllm_layout"]
"""Importable without vLLM; ``KvtierConnector`` and its metadata classes load lazily."""

_LAZY = ("KvtierConnector", "KvtierConnectorMetadata", "KvtierWorkerMetadata", "KvtierStats")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from kvtier.integrations.vllm import connector
    except ImportError as exc:
        raise ImportError(
            f"kvtier's {name} needs vLLM (tested with vllm==0.33.0), which could not be "
            f"imported: {exc}. Install vLLM, or see scripts/install_vllm_test_env.sh"
        ) from exc
    return getattr(connector, name)
