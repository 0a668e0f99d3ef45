"""The SGLang backend's configuration, read from ``--hicache-storage-backend-extra-config``.

The tiers take the keys of ``kvtier.tiers.config.TierConfig`` that lie below host memory
(``disk``, ``redis``, ``write_policy``, ``admit_after``, ``admit_window``), parsed by
``TierConfig.from_dict`` alone, exactly as the vLLM connector reads them. Host memory is
SGLang's own host pool (``--hicache-ratio`` / ``--hicache-size``), so a ``host`` section is
refused. SGLang's own keys (``backend_name``, ``module_path``, ``class_name``,
``interface_v1``, ...) are passed over; anything else unknown is an error naming the known
keys, so a typo never silently falls back to a default.

>>> opts = SglangOptions.from_extra_config({"backend_name": "kvtier", "interface_v1": 1,
...     "disk": {"path": "/tmp/kv", "capacity": "1GiB"}, "deadline_s": 1.5})
>>> opts.tiers.disk.capacity_bytes, opts.tiers.redis, opts.deadline_s
(1073741824, None, 1.5)
>>> SglangOptions.from_extra_config({"disk": {"path": "/tmp/kv", "capacity": 1}, "dsik": 1})
Traceback (most recent call last):
...
ValueError: kvtier SGLang backend: unknown option(s) ['dsik'] in the extra config; known ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kvtier.tiers.config import TierConfig, check_number
from kvtier.tiers.pages import DEFAULT_DEADLINE_S

TIER_KEYS = ("disk", "redis", "write_policy", "admit_after", "admit_window")
"""The ``TierConfig`` keys this backend takes (those below host memory)."""
SGLANG_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size",
    "file_storage_path", "prefetch_threshold", "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token", "hicache_storage_pass_prefix_keys",
})
"""Keys of the same extra config that SGLang itself reads: passed over."""
_PLACEHOLDER_HOST = {"capacity": 1}  # TierConfig requires a host section; SGLang owns host memory


@dataclass(frozen=True)
class SglangOptions:
    """Everything a user sets for kvtier in the extra config (see docs/sglang.md)."""

    deadline_s: float = DEFAULT_DEADLINE_S
    """Bound on each storage call: what the tiers have not answered by then is a miss."""
    model_revision: str = ""
    """Model revision hashed into every key (weights that change must not share pages)."""
    tenant_salt: str = ""
    """A salt hashed into every key: deployments with different salts never share a page."""
    metrics_port: int | None = None
    """Serve kvtier's Prometheus metrics on this port plus the rank's index (needs
    ``prometheus_client``); None: ``stats()`` only."""
    tiers: TierConfig = field(default=None)  # type: ignore[assignment]
    """The tiers below SGLang's host pool: built from the ``TierConfig`` keys."""

    def __post_init__(self) -> None:
        check_number("deadline_s", self.deadline_s, low=1e-3, high=3600)
        for name in ("model_revision", "tenant_salt"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if self.metrics_port is not None:
            check_number("metrics_port", self.metrics_port, low=1, high=65535, integer=True)
        if not isinstance(self.tiers, TierConfig):
            raise ValueError("tiers: give a disk or a redis section (TierConfig keys)")
        if self.tiers.disk is None and self.tiers.redis is None:
            raise ValueError("kvtier SGLang backend: give a disk or a redis section (or "
                             "both): SGLang's host pool is the tier above them")

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> SglangOptions:
        """Options from SGLang's storage extra config (a parsed JSON or TOML table)."""
        if extra is not None and not isinstance(extra, Mapping):
            raise ValueError(f"kvtier SGLang backend: the extra config must be a table of "
                             f"keys, got {extra!r:.60}")
        ours = {k: v for k, v in (extra or {}).items() if k not in SGLANG_KEYS}
        if "host" in ours:
            raise ValueError("kvtier SGLang backend: no host section: SGLang's host pool is "
                             "host memory (size it with --hicache-ratio or --hicache-size)")
        own = {f.name for f in fields(cls)} - {"tiers"}
        unknown = sorted(set(ours) - own - set(TIER_KEYS))
        if unknown:
            raise ValueError(
                f"kvtier SGLang backend: unknown option(s) {unknown} in the extra config; "
                f"known options: {sorted(own | set(TIER_KEYS))}")
        tiers = {k: ours.pop(k) for k in TIER_KEYS if k in ours}
        return cls(**ours, tiers=TierConfig.from_dict({"host": _PLACEHOLDER_HOST, **tiers}))
