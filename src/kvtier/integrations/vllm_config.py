"""From a ``VllmConfig`` and a ``KVCacheConfig`` to everything the connector is built from.

Both halves (scheduler and every worker) call ``connector_setup`` with the same configs,
so they agree on the layout and the number of slots without talking. Attributes are read
duck-typed, so this runs without vLLM; refusals are ``UnsupportedConfig`` with a message
that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.integrations.vllm_layout import UnsupportedConfig, VllmSpecDecode, vllm_layout
from kvtier.integrations.vllm_options import KvtierOptions
from kvtier.keys import Namespace
from kvtier.layout import Layout
from kvtier.store.host import slots_for_capacity


@dataclass(frozen=True)
class ConnectorSetup:
    layout: Layout
    options: KvtierOptions
    namespace: Namespace
    num_slots: int
    """Slots of each worker's host slab, and of the scheduler's (metadata-only) store."""
    num_workers: int
    """Workers that must each report a job before it is done."""


def connector_setup(vllm_config: Any, kv_cache_config: Any) -> ConnectorSetup:
    """Options, layout, namespace and sizes; raises ``UnsupportedConfig`` or ``ValueError``."""
    transfer = vllm_config.kv_transfer_config
    options = KvtierOptions.from_extra_config(transfer.kv_connector_extra_config)
    parallel = vllm_config.parallel_config
    _refuse_parallel(parallel)
    model = vllm_config.model_config
    kv_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    layout = vllm_layout(kv_cache_config.kv_cache_groups, spec_decode(vllm_config),
                         chunk_tokens=options.chunk_tokens, model=str(model.model),
                         kv_dtype=kv_dtype)
    if any(g.kind == "state" for g in layout.groups):
        raise UnsupportedConfig(
            "recurrent-state (Mamba) groups translate to kvtier state groups, but restoring "
            "them through vLLM's scheduler is not yet verified; refusing rather than risk "
            "wrong state (use kvtier's own engine for these models)"
        )
    slot_bytes = layout.max_bytes_per_chunk
    assert slot_bytes is not None  # vllm_layout always sets sizes
    namespace = Namespace(
        model=str(model.model), revision=options.model_revision or str(model.revision or ""),
        kv_dtype=kv_dtype, parallel=f"tp{parallel.tensor_parallel_size}",
    )
    return ConnectorSetup(layout, options, namespace,
                          slots_for_capacity(options.host_bytes, slot_bytes),
                          int(parallel.world_size))


def spec_decode(vllm_config: Any) -> VllmSpecDecode:
    """The speculative settings that decide draft groups' lookahead (none without one)."""
    spec = vllm_config.speculative_config
    if spec is None:
        return VllmSpecDecode()
    k = int(spec.num_speculative_tokens or 0)
    modules = 1
    if spec.method == "mtp" and spec.draft_model_config is not None:
        layers = getattr(spec.draft_model_config.hf_config, "num_nextn_predict_layers", 1)
        modules = max(1, min(int(layers or 1), k))
    return VllmSpecDecode(spec.method, k, modules)


def _refuse_parallel(parallel: Any) -> None:
    for name in ("pipeline_parallel_size", "decode_context_parallel_size",
                 "prefill_context_parallel_size"):
        if int(getattr(parallel, name, 1) or 1) > 1:
            raise UnsupportedConfig(
                f"{name}={getattr(parallel, name)}: kvtier's vLLM connector supports tensor "
                "parallelism only; each rank's KV shard is stored under its own slab"
            )
