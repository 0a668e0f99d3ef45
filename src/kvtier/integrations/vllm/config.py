"""The vLLM connector's configuration: its options and the start-up checks.

``KvtierOptions`` is one typed, frozen record read from ``kv_connector_extra_config``;
unknown keys are refused with the list of known ones, so a typo never silently falls back
to a default. The tiers take the keys of ``kvtier.tiers.config.TierConfig`` (``host``,
``disk``, ``redis``, ``write_policy``, ...), parsed by ``TierConfig.from_dict`` alone, so
one configuration serves the library, the CLI and vLLM; ``host_bytes`` (with ``policy``)
is the shorthand for a host-only ``host`` section.

>>> opts = KvtierOptions.from_extra_config({"host_bytes": 1 << 30, "chunk_tokens": 256})
>>> opts.host_bytes, opts.chunk_tokens, opts.policy, opts.store, opts.tiers.disk
(1073741824, 256, 'lru', 'all', None)
>>> KvtierOptions().chunk_tokens is None  # chosen from the model's block sizes at start-up
True
>>> opts = KvtierOptions.from_extra_config({"host": {"capacity": "64MiB", "policy": "arc"},
...                                         "disk": {"path": "/tmp/kv", "capacity": "1GiB"}})
>>> opts.host_bytes, opts.policy, opts.tiers.disk.path
(67108864, 'arc', '/tmp/kv')

``connector_setup`` turns a ``VllmConfig`` and a ``KVCacheConfig`` into everything the
connector is built from. Both halves (scheduler and every worker) call it with the same
configs, so they agree on the layout and the number of slots without talking. Attributes
are read duck-typed, so this runs without vLLM; refusals are ``UnsupportedConfig`` with a
message that says what to change.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from kvtier.boundaries import BoundaryMode, check_mode
from kvtier.integrations.vllm.layout import (
    UnsupportedConfig,
    VllmSpecDecode,
    default_chunk_tokens,
    vllm_layout,
)
from kvtier.keys import Namespace
from kvtier.layout import Layout
from kvtier.store.policies import ONLINE_POLICIES
from kvtier.tiers.config import TierConfig
from kvtier.tiers.host import slots_for_capacity

StoreWhat = Literal["all", "prompt"]
SaltSource = Literal["cache_salt", "none"]


@dataclass(frozen=True)
class KvtierOptions:
    """Everything a user sets in ``kv_connector_extra_config`` (see docs/vllm.md)."""

    host_bytes: int = 1 << 30
    """Capacity of the host-memory tier, in bytes, on each worker (the shorthand for
    ``host = {capacity = ...}``; with a ``host`` section, its capacity)."""
    policy: str = "lru"
    """Host-memory eviction policy: one of kvtier's online policies (``lru``, ``arc``,
    ``s3fifo``, ``pfreq``); with a ``host`` section, its ``policy``."""
    chunk_tokens: int | None = None
    """Tokens per stored chunk; a multiple of every KV-cache group's block size. Default
    (None): the smallest such multiple that is at least 256, or with a Mamba (recurrent-state)
    group their least common multiple, one block (``default_chunk_tokens``)."""
    store: StoreWhat = "all"
    """``all``: store the prompt and the answer; ``prompt``: the prompt only."""
    tenant_salt: SaltSource = "cache_salt"
    """Where a request's tenant salt comes from: vLLM's per-request ``cache_salt``, or
    ``none`` (every request shares one namespace)."""
    model_revision: str = ""
    """Model revision hashed into every key (weights that change must not share KV)."""
    wait_timeout_s: float = 0.05
    """How long a lookup waits for chunks still being written before taking what is ready."""
    boundaries: BoundaryMode = "dense"
    """Which boundaries a request serves as a producer (``kvtier.boundaries``): ``dense``,
    ``end`` or ``shared``; fewer store fewer sliding-window chunks."""
    prune_chunked_local: bool = False
    """With ``end`` or ``shared``, also store fewer chunked-local chunks (by default they
    are stored as in ``dense``, keeping every hit native offloading has)."""
    sync_loads: bool = True
    """Load a hit from host memory in the step that schedules its request, before that
    step's forward (vLLM's synchronous load), rather than in a step of its own: the first
    token comes a step sooner. Only a model with one KV-cache group loads so: vLLM can tell
    which request a failed synchronous load hurt (and recompute it) only there: a hybrid
    model's loads stay asynchronous, and so do a recurrent-state model's
    (``sync_loads_apply``). (A hit promoted from a tier below waits for its read as
    before, then loads so.)"""
    tiers: TierConfig = field(default=None)  # type: ignore[assignment]
    """The hierarchy (``TierConfig``): host memory, and optionally disk and Redis below it.
    Not a key of its own: built from the ``TierConfig`` keys (or ``host_bytes``)."""

    def __post_init__(self) -> None:
        _positive_int("host_bytes", self.host_bytes)
        if self.chunk_tokens is not None:
            _positive_int("chunk_tokens", self.chunk_tokens)
        if self.tiers is None:
            object.__setattr__(self, "tiers",
                               TierConfig.from_dict({"host": {"capacity": self.host_bytes}}))
        if not isinstance(self.tiers, TierConfig):
            raise ValueError(f"tiers must be a TierConfig, got {self.tiers!r}")
        if self.policy not in ONLINE_POLICIES:
            known = sorted(ONLINE_POLICIES)
            raise ValueError(f"policy must be one of {known}, got {self.policy!r}")
        if self.store not in ("all", "prompt"):
            raise ValueError(f"store must be 'all' or 'prompt', got {self.store!r}")
        if self.tenant_salt not in ("cache_salt", "none"):
            raise ValueError(
                f"tenant_salt must be 'cache_salt' or 'none', got {self.tenant_salt!r}")
        if not isinstance(self.wait_timeout_s, (int, float)) or self.wait_timeout_s < 0:
            raise ValueError(f"wait_timeout_s must be >= 0, got {self.wait_timeout_s!r}")
        check_mode(self.boundaries)
        if not isinstance(self.prune_chunked_local, bool):
            raise ValueError(
                f"prune_chunked_local must be true or false, got {self.prune_chunked_local!r}")
        if not isinstance(self.sync_loads, bool):
            raise ValueError(f"sync_loads must be true or false, got {self.sync_loads!r}")

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> KvtierOptions:
        """Options from vLLM's ``kv_connector_extra_config``; unknown keys are an error, and
        so is a ``host`` section beside its shorthand (``host_bytes``, ``policy``)."""
        extra = dict(extra or {})
        tier_keys = {f.name for f in fields(TierConfig) if f.init}
        own = {f.name for f in fields(cls)} - {"tiers"}
        unknown = sorted(set(extra) - own - tier_keys)
        if unknown:
            raise ValueError(
                f"kvtier vLLM connector: unknown option(s) {unknown} in "
                f"kv_connector_extra_config; known options: {sorted(own | tier_keys)}"
            )
        tiers = {k: extra.pop(k) for k in tier_keys & set(extra)}
        both = sorted({"host_bytes", "policy"} & set(extra))
        if "host" in tiers and both:
            raise ValueError(f"kvtier vLLM connector: give a host section or {both}, not both "
                             "(host_bytes and policy are the shorthand for host)")
        if "host" not in tiers:
            _positive_int("host_bytes", extra.get("host_bytes", 1 << 30))
            tiers["host"] = {"capacity": extra.get("host_bytes", 1 << 30)}
        config = TierConfig.from_dict(tiers)
        extra.setdefault("host_bytes", config.host.capacity_bytes)
        extra.setdefault("policy", config.host.policy)
        return cls(**extra, tiers=config)


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ConnectorSetup:
    layout: Layout
    """The model's groups in vLLM's order, with the chunk size in effect (the option, or
    ``default_chunk_tokens``)."""
    options: KvtierOptions
    namespace: Namespace
    num_slots: int
    """Slots of each worker's host slab, and of the scheduler's (metadata-only) store."""
    num_workers: int
    """Workers that must each report a job before it is done."""

    @property
    def tiers(self) -> TierConfig:
        return self.options.tiers

    @property
    def slot_bytes(self) -> int:
        """Bytes of a host slot: the layout's largest chunk."""
        assert self.layout.max_bytes_per_chunk is not None  # vllm_layout always sets sizes
        return self.layout.max_bytes_per_chunk


def sync_loads_apply(options: KvtierOptions, layout: Layout) -> bool:
    """Whether hits load synchronously (``sync_loads``): only on one attention group. vLLM
    maps a failed synchronous load's blocks back to its request only with one KV-cache group
    (it raises with more), and computes the request again from the first failed block; in a
    recurrent-state group the blocks before it hold no state (vLLM's null block), so the
    request would resume from none: such models load asynchronously (a failure restarts
    them from a state they have)."""
    return options.sync_loads and len(layout.groups) == 1 and layout.groups[0].kind != "state"


def connector_setup(vllm_config: Any, kv_cache_config: Any) -> ConnectorSetup:
    """Options, layout, namespace and sizes; raises ``UnsupportedConfig`` or ``ValueError``."""
    transfer = vllm_config.kv_transfer_config
    options = KvtierOptions.from_extra_config(transfer.kv_connector_extra_config)
    if options.tiers.disk is not None:
        check_writable(options.tiers.disk.path)
    parallel = vllm_config.parallel_config
    _refuse_parallel(parallel)
    model = vllm_config.model_config
    kv_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    groups = kv_cache_config.kv_cache_groups
    chunk_tokens = options.chunk_tokens or default_chunk_tokens(groups)
    layout = vllm_layout(groups, spec_decode(vllm_config), chunk_tokens=chunk_tokens,
                         model=str(model.model), kv_dtype=kv_dtype)
    namespace = Namespace(
        model=str(model.model), revision=options.model_revision or str(model.revision or ""),
        kv_dtype=kv_dtype, parallel=f"tp{parallel.tensor_parallel_size}",
    )
    slot_bytes = layout.max_bytes_per_chunk
    assert slot_bytes is not None  # vllm_layout always sets sizes
    return ConnectorSetup(layout, options, namespace,
                          slots_for_capacity(options.host_bytes, slot_bytes),
                          int(parallel.world_size))


def check_writable(path: str) -> None:
    """``ValueError`` at start-up unless ``path`` is (or can be made) a writable directory:
    every rank opens its own directory under it (``kvtier.integrations.vllm.tiers``)."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"[disk].path {path!r}: cannot create the directory ({e.strerror}); "
                         "give a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"[disk].path {path!r}: the directory is not writable; give a "
                         "writable directory")


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
