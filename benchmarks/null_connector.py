"""A vLLM KV connector that does nothing, and no connector at all (``connector_cleared``).

``vllm_engine.py --control null`` decodes with it in kvtier's place, against the same bare
engine: any connector pays for what vLLM does around one (per attention layer, a check and
two calls; per step, the metadata built, bound and cleared, the transfer results asked for,
its stats), so kvtier's decoding figure is read against this floor. A helper module, not a
benchmark (``run_quick.HELPERS``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from vllm.distributed.kv_transfer import kv_transfer_state
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

TRANSFER_CONFIG = {"kv_connector": "NullConnector", "kv_connector_module_path": "null_connector",
                   "kv_role": "kv_both"}
"""``LLM(kv_transfer_config=...)`` for it (this directory on ``sys.path``, as it is for a
benchmark run as a script)."""


class NullConnector(KVConnectorBase_V1):
    """Every hook answers at once: no hit, nothing to load, store or wait for."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int
                                 ) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()


@contextlib.contextmanager
def connector_cleared() -> Iterator[None]:
    """Within: vLLM's process-wide KV connector is unset, so that an engine built or run
    here has none (``vllm_engine.py``'s engine without a connector, beside kvtier's)."""
    saved = kv_transfer_state._KV_CONNECTOR_AGENT
    kv_transfer_state._KV_CONNECTOR_AGENT = None
    try:
        yield
    finally:
        kv_transfer_state._KV_CONNECTOR_AGENT = saved
