"""kvtier: a tiered KV cache for LLM serving, correct for hybrid attention and speculative
decoding.

The public API, by layer (DESIGN section 2):

* the contract: ``Layout`` and ``Group`` (``kvtier.layout``), keys (``ChunkKey``,
  ``KeyChain``, ``Namespace``), and the ``coverage`` module itself (``kvtier.coverage``:
  ``retained``, ``required``, ``store_set``, ``load_set``, ...);
* the planner: ``Planner``, ``Lookup``, ``Outcome``, ``RequestLimits``, ``TransferJob``;
* the store: ``ChunkStore`` over a ``HostSlab``, ``TieredStore`` with its ``TierConfig``
  (host memory, disk, Redis), and the eviction-policy registry (``POLICIES``,
  ``make_policy``).

Names load on first use, so ``import kvtier.coverage`` (or ``keys``, ``layout``) loads the
contract and nothing above it. The core needs only numpy; the data plane and the reference
engine need the ``torch`` extra and are imported from their subpackages
(``kvtier.transfer``, ``kvtier.engine``).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# A library only emits: an application that configures logging sees kvtier's warnings (a
# Redis login refused, ...); one that does not gets no stray lines on stderr.
logging.getLogger(__name__).addHandler(logging.NullHandler())

_EXPORTS: dict[str, str] = {
    "coverage": "kvtier",
    "ChunkKey": "kvtier.keys",
    "KeyChain": "kvtier.keys",
    "Namespace": "kvtier.keys",
    "Group": "kvtier.layout",
    "Layout": "kvtier.layout",
    "load_layout": "kvtier.layoutfile",
    "PRESETS": "kvtier.presets",
    "preset": "kvtier.presets",
    "with_eagle": "kvtier.presets",
    "with_mtp": "kvtier.presets",
    "Lookup": "kvtier.planner",
    "Outcome": "kvtier.planner",
    "Planner": "kvtier.planner",
    "RequestLimits": "kvtier.planner",
    "TransferJob": "kvtier.planner",
    "ChunkState": "kvtier.store",
    "ChunkStore": "kvtier.store",
    "HostSlab": "kvtier.tiers.host",
    "StoreRefusal": "kvtier.store",
    "POLICIES": "kvtier.store",
    "make_policy": "kvtier.store",
    "TieredStore": "kvtier.tiers.tiered",
    "TierConfig": "kvtier.tiers.config",
}
"""Public name -> the module that defines it (``coverage`` is itself a module)."""

__all__ = [
    "POLICIES",
    "PRESETS",
    "ChunkKey",
    "ChunkState",
    "ChunkStore",
    "Group",
    "HostSlab",
    "KeyChain",
    "Layout",
    "Lookup",
    "Namespace",
    "Outcome",
    "Planner",
    "RequestLimits",
    "StoreRefusal",
    "TierConfig",
    "TieredStore",
    "TransferJob",
    "__version__",
    "coverage",
    "load_layout",
    "make_policy",
    "preset",
    "with_eagle",
    "with_mtp",
]


def __getattr__(name: str) -> Any:
    home = _EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"module 'kvtier' has no attribute {name!r}")
    if home == __name__:
        value: Any = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name loads on first use
    from kvtier import coverage
    from kvtier.keys import ChunkKey, KeyChain, Namespace
    from kvtier.layout import Group, Layout
    from kvtier.layoutfile import load_layout
    from kvtier.planner import Lookup, Outcome, Planner, RequestLimits, TransferJob
    from kvtier.presets import PRESETS, preset, with_eagle, with_mtp
    from kvtier.store import (
        POLICIES,
        ChunkState,
        ChunkStore,
        StoreRefusal,
        make_policy,
    )
    from kvtier.tiers.config import TierConfig
    from kvtier.tiers.host import HostSlab
    from kvtier.tiers.tiered import TieredStore
