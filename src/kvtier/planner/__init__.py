"""The planner: a request's lifecycle over the coverage contract and the store."""

from kvtier.planner.planner import BlockTable, Planner
from kvtier.planner.types import (
    ChunkCopy,
    LoadResult,
    Lookup,
    Metrics,
    Outcome,
    RequestLimits,
    TransferJob,
)

__all__ = [
    "BlockTable",
    "ChunkCopy",
    "LoadResult",
    "Lookup",
    "Metrics",
    "Outcome",
    "Planner",
    "RequestLimits",
    "TransferJob",
]
