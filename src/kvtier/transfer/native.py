"""The native copier: the compiled build's CPU copies, by ``kvtier._native`` (C).

Each block of each layer piece moves by one memcpy straight between the KV tensor and its
slot, wherever the slots are, in one C call per batch and thread without the GIL, in
ascending engine block order, the threads sharing the work out as it comes
(:class:`NativeCopier`). The engine chooses it once, when it is
built, on the CPU wherever ``kvtier._native`` is installed (:func:`available`); the pure
build, and CUDA in every build, use :class:`kvtier.transfer.torch_copier.TorchCopier`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvtier.transfer.mover import MIN_PART_BYTES, FaultHook, check_faults, together
from kvtier.transfer.plan import Batch

try:  # the compiled build's batched memcpy (setup.py, NATIVE)
    from kvtier import _native
except ImportError:  # the pure build: the torch copier only
    _native = None  # type: ignore[assignment]

CLAIM_BYTES = 1 << 20
"""Threads sharing a native copy take about this many bytes of work at a time: small
enough that a helper which wakes late still finds work, large enough that the prefetch
ahead of each claim's copy (64 KiB, see _native.c) is a small part of it."""


def available() -> bool:
    """Whether this build has the native copies (``kvtier._native``: the compiled build)."""
    return _native is not None


@dataclass(frozen=True)
class Lanes:
    """A batch shape's ranges, one row per (layer, piece) of its group: ``kv_base``,
    ``kv_step``, ``slot_base``, ``slot_step``, ``length``, ``positions`` (``_native.c``,
    ``copy_lanes``). Lane ``l`` moves, for block position ``j < positions`` of each copy
    ``c``, ``length`` bytes at ``kv_base + ids[j, c] * kv_step`` in a KV tensor and at
    ``ptrs[c] + slot_base + j * slot_step`` in the copy's slot.

    A layer piece is a lane of ``num_blocks`` positions; in a ``consecutive`` batch a
    one-piece layer is a lane of one position, the run of a copy's blocks as one range.
    Example: a 4-block chunk of 4 one-piece layers: 4 lanes of 4 positions (16 ranges per
    copy), or 4 lanes of 1 with consecutive ids (4 ranges per copy).
    """

    table: np.ndarray  # int64 [lanes * 6]: the rows, flat
    count: int
    bytes_per_copy: int

    @classmethod
    def of(cls, batch: Batch) -> Lanes:
        view, wb, count = batch.view, batch.view.word_bytes, batch.num_blocks
        rows: list[tuple[int, int, int, int, int, int]] = []
        for li, layer in enumerate(view.layers):
            start = view.block_word(li, batch.first_block) * wb
            if batch.consecutive and layer.runs:
                run = layer.pieces[0].rows  # contiguous: a run of blocks is one range
                rows.append((run.data_ptr(), run.stride(0) * wb, start, 0,
                             count * run.shape[1] * wb, 1))
                continue
            for piece in layer.pieces:
                r = piece.rows
                rows.append((r.data_ptr(), r.stride(0) * wb, start + piece.offset * wb,
                             layer.words_per_block * wb, piece.width * wb, count))
        table = np.array(rows, np.int64).reshape(-1, 6)
        return cls(table.reshape(-1), len(rows), int((table[:, 4] * table[:, 5]).sum()))


class NativeCopier:
    """CPU stores and loads in the compiled build: each batch moves by one
    ``kvtier._native.copy_lanes`` call per thread, one memcpy per block of each layer piece,
    without the GIL. Straight between the KV tensors and each slot, wherever the slots are:
    no staging, no address tables (the ranges are computed in C from the batch's block ids,
    slot addresses and :class:`Lanes`), and no pass per block position. ``fault``, if any,
    is called with every copy of a batch before its bytes move.

    Each lane's blocks move in ascending engine block order (``_native.sorted_blocks``,
    which also gives each block its slot address and position, so that the C loop finds
    every address by a multiply and an add, no division per block): a
    fragmented block pool is then read (stores) or written (loads) in one monotone sweep per
    layer, a few blocks per page, rather than at random, one page-table walk per block; the
    scattered side is the slab's (kvtier's own memory, :func:`~kvtier.transfer.views.
    allocate_slab`, huge pages where the system gives them).

    Up to ``threads`` threads share a batch: the calling one starts at once, helpers join
    when they wake, and each takes the next ``CLAIM_BYTES`` of items from a shared cursor
    until none are left. A fixed split would make the job wait for the slowest thread to
    wake: measured on a 2-core VM, a pool thread started its half 0.4-1.1 ms late, a sixth
    of a 64 MiB job. A batch wakes one helper per ``MIN_PART_BYTES`` beyond the first.

    While they copy, helpers may run on any CPU but the calling thread's (:class:`Apart`):
    Linux wakes a thread on its waker's CPU when it can, and then leaves the two busy
    threads sharing that CPU (a task that just ran is not migrated), which halves the
    copy's speed; measured on a 2-core VM, 9 of 15 jobs ran so, 8-10 ms against 5.5 ms.
    """

    def __init__(self, fault: FaultHook | None, threads: int) -> None:
        if _native is None:
            raise RuntimeError("kvtier._native is not built: only a compiled build "
                               "(KVTIER_COMPILE=1) has the native copier; see available()")
        self._copy, self._sorted, self._cpu = _native.copy_lanes, _native.sorted_blocks, _native.cpu
        self._fault = fault
        self._helpers = max(1, threads) - 1
        self._lanes: dict[tuple[int, int, int, bool], Lanes] = {}  # by batch shape
        self._apart = Apart()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max(1, self._helpers), thread_name_prefix="kvtier-copy",
            initializer=self._apart.enlist)

    def store(self, batch: Batch) -> None:
        self._run(False, batch)

    def load(self, batch: Batch) -> None:
        self._run(True, batch)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._apart.clear()

    def _run(self, to_kv: bool, batch: Batch) -> None:
        """Moves ``batch`` (into the KV tensors when ``to_kv``), on this thread and as many
        helpers as its bytes are worth, after its fault checks."""
        check_faults(self._fault, batch)
        key = (batch.view.index, batch.first_block, batch.num_blocks, batch.consecutive)
        lanes = self._lanes.get(key)
        if lanes is None:
            lanes = self._lanes[key] = Lanes.of(batch)
        ids = np.ascontiguousarray(batch.ids, np.int64).reshape(-1)
        ptrs = np.ascontiguousarray(batch.ptrs, np.int64)
        blocks = np.frombuffer(self._sorted(ids, ptrs, batch.view.num_blocks), np.int64)
        args = (to_kv, blocks, lanes.table)
        total = lanes.bytes_per_copy * len(ptrs)
        helpers = min(self._helpers, total // MIN_PART_BYTES - 1)
        if helpers < 1:
            self._copy(*args)
            return
        items = lanes.count * len(ids)
        cursor = np.zeros(1, np.int64)
        grain = max(1, CLAIM_BYTES * items // max(1, total))  # items per claim
        share = functools.partial(self._copy, *args, cursor, grain)
        with self._apart(self._cpu()):
            together(self._pool, [share] * helpers, share)


class Apart:
    """Keeps the enlisted helper threads off one CPU for a while.

    ``with apart(cpu):`` lets every enlisted thread run on any allowed CPU but ``cpu``, and
    on all of them again after; set before the helpers are woken, so the kernel places them
    elsewhere from the start (a thread that enlists meanwhile, a helper starting with the
    job, moves itself). Does nothing where thread affinity cannot be set (not Linux), where
    ``cpu`` is unknown (-1), or where no other CPU is allowed. One holder at a time: each
    mover has one worker thread. Example: 2 CPUs, the copying thread on CPU 1: its helper
    runs on CPU 0 for the job.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: list[int] = []  # native thread ids
        self._cpu = -1  # the CPU kept free while held, else -1
        self._moved: list[tuple[int, set[int]]] = []  # (thread, its mask before)

    def enlist(self) -> None:
        """Called by each helper thread as it starts."""
        tid = threading.get_native_id()
        with self._lock:
            self._threads.append(tid)
            if self._cpu >= 0:
                self._move(tid)

    def clear(self) -> None:
        """Forget the enlisted threads (they have ended)."""
        with self._lock:
            self._threads.clear()

    @contextlib.contextmanager
    def __call__(self, cpu: int) -> Iterator[None]:
        with self._lock:
            self._cpu = cpu
            if cpu >= 0:
                for tid in self._threads:
                    self._move(tid)
        try:
            yield
        finally:
            with self._lock:
                self._cpu = -1
                moved, self._moved = self._moved, []
            for tid, allowed in moved:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(tid, allowed)

    def _move(self, tid: int) -> None:
        try:
            allowed = os.sched_getaffinity(tid)
            if self._cpu in allowed and len(allowed) > 1:
                os.sched_setaffinity(tid, allowed - {self._cpu})
                self._moved.append((tid, allowed))
        except (AttributeError, OSError):  # no thread affinity here, or the thread is gone
            pass
