"""Runs a job's planned batches through one copier, on the mover's CUDA stream if any.

A :class:`Copier` moves the bytes of one batch between the KV tensors and the slots; which
one is chosen once, when the engine is built (:func:`kvtier.transfer.jobs.copier_maker`):

* :class:`kvtier.transfer.torch_copier.TorchCopier`: torch and numpy copies, the pure
  build's and CUDA's; and
* :class:`kvtier.transfer.native.NativeCopier`: the compiled build's CPU copies, one memcpy
  per byte range in C without the GIL.

On CUDA each mover owns a stream: a job first waits for the event recorded on the compute
stream at submit time, then runs every copy on its stream (slot copies are non-blocking,
from or to page-locked memory), and is reported done only after its completion event has
been reached. On the CPU the same code runs synchronously on ordinary memory.

Also here, what both copiers share: the fault hook (:data:`FaultHook`), the smallest part
of a copy worth a thread (:data:`MIN_PART_BYTES`) and running helpers at once
(:func:`together`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch

from kvtier.transfer.copies import ChunkCopy
from kvtier.transfer.plan import Batch

MIN_PART_BYTES = 1 << 20
"""A CPU copy is split over threads only in parts of at least this many bytes."""

FaultHook = Callable[[ChunkCopy], None]
"""Called with each copy just before its slot bytes move; raising fails the job (tests)."""


class Copier(Protocol):
    """Moves the bytes of one batch; calls its fault hook, if any, with each copy just
    before that copy's slot bytes move. Its helper threads, if any, end at :meth:`close`."""

    def store(self, batch: Batch) -> None:
        """Engine blocks -> slots."""

    def load(self, batch: Batch) -> None:
        """Slots -> engine blocks."""

    def close(self) -> None:
        """Stop the helper threads, if any ran (idempotent)."""


class Mover:
    """Runs store and load jobs for one direction by ``copier``, on its own CUDA stream if
    ``device`` is a CUDA device."""

    def __init__(self, device: torch.device, copier: Copier) -> None:
        self._copier = copier
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def close(self) -> None:
        """Stop the copier's helper threads, if any ran (idempotent)."""
        self._copier.close()

    def store(self, batches: Sequence[Batch], ready: object | None) -> None:
        """Engine blocks -> slots. ``ready``: a CUDA event the copies must wait for."""
        self._run(batches, ready, self._copier.store)

    def load(self, batches: Sequence[Batch], ready: object | None) -> None:
        """Slots -> engine blocks. ``ready``: a CUDA event the copies must wait for."""
        self._run(batches, ready, self._copier.load)

    def _run(self, batches: Sequence[Batch], ready: object | None,
             move: Callable[[Batch], None]) -> None:
        with self._on_stream(ready):
            for batch in batches:
                move(batch)

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


def check_faults(fault: FaultHook | None, batch: Batch) -> None:
    """Calls ``fault`` with every copy of ``batch``, in order (before a copy moving them all)."""
    if fault is not None:
        for copy in batch.copies:
            fault(copy)


def together(pool: concurrent.futures.Executor, helpers: Sequence[Callable[[], object]],
             own: Callable[[], object]) -> None:
    """Runs each of ``helpers`` on ``pool`` and ``own`` here, at once; returns when all are
    done, raising what any raised. It never returns, nor raises, while a helper still runs
    (one writing into a job's memory after the job was reported would corrupt it), even
    when handing one to the pool fails."""
    futures: list[concurrent.futures.Future[object]] = []
    try:
        for helper in helpers:
            futures.append(pool.submit(helper))
        own()
    finally:
        concurrent.futures.wait(futures)
    for future in futures:
        future.result()  # raises what the helper raised
