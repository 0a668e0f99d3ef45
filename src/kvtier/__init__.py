"""kvtier: a tiered KV cache for LLM serving, correct for hybrid attention and speculative
decoding.

The core (layout, keys, coverage, store, planner) needs only numpy; the data plane and the
reference engine need the ``torch`` extra and are imported from their subpackages
(``kvtier.transfer``, ``kvtier.engine``).
"""

from kvtier.coverage import (
    BlockRun,
    ChunkRanges,
    Span,
    admissible_boundaries,
    load_chunks,
    load_set,
    required,
    retained,
    retained_blocks,
    store_blocks,
    store_delta,
    store_set,
    store_sets,
)
from kvtier.keys import ChunkKey, KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.layoutfile import load_layout
from kvtier.planner import Lookup, Outcome, Planner, RequestLimits, TransferJob
from kvtier.presets import PRESETS, preset, with_eagle, with_mtp
from kvtier.store import ChunkState, ChunkStore, HostSlab, StoreRefusal

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "BlockRun",
    "ChunkKey",
    "ChunkRanges",
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
    "Span",
    "StoreRefusal",
    "TransferJob",
    "__version__",
    "admissible_boundaries",
    "load_chunks",
    "load_layout",
    "load_set",
    "preset",
    "required",
    "retained",
    "retained_blocks",
    "store_blocks",
    "store_delta",
    "store_set",
    "store_sets",
    "with_eagle",
    "with_mtp",
]
