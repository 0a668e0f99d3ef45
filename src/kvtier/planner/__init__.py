"""The planner: a request's lifecycle over the coverage contract and the store."""

from kvtier.planner.planner import BlockTable, Planner
from kvtier.planner.types import (
    LoadResult,
    Lookup,
    Metrics,
    Outcome,
    PlannedCopy,
    RequestLimits,
    TransferJob,
)

__all__ = [
    "BlockTable",
    "LoadResult",
    "Lookup",
    "Metrics",
    "Outcome",
    "PlannedCopy",
    "Planner",
    "RequestLimits",
    "TransferJob",
]
