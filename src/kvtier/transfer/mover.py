"""Moves the bytes of planned batches, through a staging buffer on the KV device.

A store gathers every block of a batch from every layer into staging rows laid out exactly
like slots (``index_select`` into a strided view, one call per block position and layer
piece, over all the batch's chunks at once), then copies each row's live byte ranges into
its slot. A load does the reverse: slot ranges into staging rows, then ``index_copy_``
into the engine's blocks. Staging makes the device-side work a few large batched kernels
and the host side one contiguous copy per slot (a DMA on CUDA).

On CUDA each mover owns a stream: a job first waits for the event recorded on the compute
stream at submit time, then runs every copy on its stream (slot copies are non-blocking,
from or to page-locked memory), and is reported done only after its completion event has
been reached. On the CPU the same code runs synchronously on ordinary memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from kvtier.transfer.plan import Batch
from kvtier.transfer.spec import ChunkCopy

FaultHook = Callable[[ChunkCopy], None]
"""Called with each copy just before its slot bytes move; raising fails the job (tests)."""


class Staging:
    """A reusable byte buffer on the KV device, grown on demand, viewed as word rows."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._buf = torch.empty(0, dtype=torch.uint8, device=device)

    def rows(self, batch: Batch) -> torch.Tensor:
        """``[len(batch.copies), chunk_words]`` word rows (contents unspecified)."""
        view = batch.view
        need = len(batch.copies) * view.chunk_bytes
        if self._buf.numel() < need:
            self._buf = torch.empty(need, dtype=torch.uint8, device=self._device)
        return self._buf[:need].view(view.word).view(len(batch.copies), view.chunk_words)


def placements(batch: Batch, staged: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """``(piece rows, block ids, staging view)`` triples covering every block of a batch.

    For each run of same-shape copies and each chunk-relative block position ``p`` in it,
    every layer piece yields its ``[num_blocks, width]`` rows, the engine block ids at
    ``p`` of the run's copies, and the staging columns where position ``p`` of that piece
    lives (a strided ``[rows_in_run, width]`` view).
    """
    view = batch.view
    device = staged.device
    for first, count, lo, hi in batch.shapes():
        ids = batch.block_ids(lo, hi).to(device)
        for li, layer in enumerate(view.layers):
            for j in range(count):
                base = view.block_word(li, first + j)
                for piece in layer.pieces:
                    col = base + piece.offset
                    yield piece.rows, ids[j], staged[lo:hi, col : col + piece.width]


class Mover:
    """Runs store and load batches for one direction, on its own CUDA stream if any."""

    def __init__(self, device: torch.device, fault: FaultHook | None) -> None:
        self._device = device
        self._fault = fault
        self._staging = Staging(device)
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def store(self, batches: Sequence[Batch], ready: object | None) -> None:
        """Engine blocks -> slots. ``ready``: a CUDA event the copies must wait for."""
        with self._on_stream(ready):
            for batch in batches:
                staged = self._staging.rows(batch)
                for rows, ids, dst in placements(batch, staged):
                    torch.index_select(rows, 0, ids, out=dst)
                self._staging_to_slots(batch, staged)

    def load(self, batches: Sequence[Batch], ready: object | None) -> None:
        """Slots -> engine blocks. ``ready``: a CUDA event the copies must wait for."""
        with self._on_stream(ready):
            for batch in batches:
                staged = self._staging.rows(batch)
                self._slots_to_staging(batch, staged)
                for rows, ids, src in placements(batch, staged):
                    rows.index_copy_(0, ids, src)

    def _staging_to_slots(self, batch: Batch, staged: torch.Tensor) -> None:
        raw = staged.view(torch.uint8)
        for i, (copy, slot) in enumerate(zip(batch.copies, batch.slots, strict=True)):
            self._check_fault(copy)
            for lo, hi in batch.view.byte_ranges(copy.first_block, copy.num_blocks):
                slot[lo:hi].copy_(raw[i, lo:hi], non_blocking=self._stream is not None)

    def _slots_to_staging(self, batch: Batch, staged: torch.Tensor) -> None:
        raw = staged.view(torch.uint8)
        for i, (copy, slot) in enumerate(zip(batch.copies, batch.slots, strict=True)):
            self._check_fault(copy)
            for lo, hi in batch.view.byte_ranges(copy.first_block, copy.num_blocks):
                raw[i, lo:hi].copy_(slot[lo:hi], non_blocking=self._stream is not None)

    def _check_fault(self, copy: ChunkCopy) -> None:
        if self._fault is not None:
            self._fault(copy)

    @contextlib.contextmanager
    def _on_stream(self, ready: object | None) -> Iterator[None]:
        """Run the body on this mover's stream after ``ready``; return once it is done."""
        if self._stream is None:
            yield
            return
        with torch.cuda.stream(self._stream):
            if ready is not None:
                self._stream.wait_event(ready)  # type: ignore[arg-type]
            try:
                yield
            finally:
                done = torch.cuda.Event()
                done.record(self._stream)
                done.synchronize()
