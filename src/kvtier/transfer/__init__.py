"""The data plane: moves chunks between an engine's KV tensors and host slots.

Needs torch (the ``torch`` extra); nothing outside ``kvtier.transfer`` imports torch.
See :mod:`kvtier.transfer.copies` for the slot byte layout and :mod:`kvtier.transfer.jobs`
for the job protocol.
"""

from kvtier.transfer.copies import ChunkCopy, Direction, GroupKV, JobResult, Slot, SlotRef
from kvtier.transfer.jobs import DEFAULT_STAGING_BYTES, TransferEngine
from kvtier.transfer.mover import FaultHook
from kvtier.transfer.slots import allocate_slab

__all__ = [
    "DEFAULT_STAGING_BYTES",
    "ChunkCopy",
    "Direction",
    "FaultHook",
    "GroupKV",
    "JobResult",
    "Slot",
    "SlotRef",
    "TransferEngine",
    "allocate_slab",
]
