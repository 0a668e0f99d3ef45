"""kvtier: a tiered KV cache for LLM serving, correct for hybrid attention and speculative
decoding."""

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

__version__ = "0.1.0"

__all__ = [
    "BlockRun",
    "ChunkKey",
    "ChunkRanges",
    "Group",
    "KeyChain",
    "Layout",
    "Namespace",
    "Span",
    "__version__",
    "admissible_boundaries",
    "load_chunks",
    "load_set",
    "required",
    "retained",
    "retained_blocks",
    "store_blocks",
    "store_delta",
    "store_set",
    "store_sets",
]
