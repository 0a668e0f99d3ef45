"""The native copier: the compiled build's CPU copies, by ``kvtier._native`` (C).

Each block of each layer piece moves by one memcpy straight between the KV tensor and its
slot, wherever the slots are, in one C call per thread without the GIL, the threads sharing
the ranges out as they come (:class:`NativeCopier`). The engine chooses it once, when it is
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
"""Threads sharing a native copy take about this many bytes of ranges at a time: small
enough that a helper which wakes late still finds work, large enough that the prefetch
ahead of each claim's copy (64 KiB, see _native.c) is a small part of it."""


def available() -> bool:
    """Whether this build has the native copies (``kvtier._native``: the compiled build)."""
    return _native is not None


@dataclass(frozen=True)
class Ranges:
    """The byte ranges of one copy of a batch shape, as arrays: entry ``e`` is ``length[e]``
    bytes at ``kv_base[e] + ids[pos[e]] * kv_step[e]`` in a KV tensor (``ids``: the copy's
    engine block ids) and at byte ``slot_off[e]`` of its slot.

    One entry per (layer, block, piece), layer-major: a block of a layer piece, or in a
    ``consecutive`` batch a one-piece layer's whole run of blocks (``pos`` 0, the run's
    length). Example: a 4-block chunk of 4 one-piece layers: 16 entries, or 4 with
    consecutive ids.
    """

    pos: np.ndarray
    kv_base: np.ndarray
    kv_step: np.ndarray
    slot_off: np.ndarray
    length: np.ndarray

    @classmethod
    def of(cls, batch: Batch) -> Ranges:
        view, wb, count = batch.view, batch.view.word_bytes, batch.num_blocks
        rows_: list[tuple[int, int, int, int, int]] = []
        for li, layer in enumerate(view.layers):
            start = view.block_word(li, batch.first_block) * wb
            if batch.consecutive and layer.runs:
                rows = layer.pieces[0].rows  # contiguous: a run of blocks is one range
                step = rows.stride(0) * wb
                rows_.append((0, rows.data_ptr(), step, start, count * rows.shape[1] * wb))
                continue
            for j in range(count):
                for piece in layer.pieces:
                    rows = piece.rows
                    off = start + (j * layer.words_per_block + piece.offset) * wb
                    rows_.append((j, rows.data_ptr(), rows.stride(0) * wb, off, piece.width * wb))
        cols = np.array(rows_, np.int64).T
        return cls(*(np.ascontiguousarray(c) for c in cols))


def addresses(batch: Batch, ranges: Ranges) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(kv, slot, lengths)``: one byte range per (copy, entry of ``ranges``), copy-major.

    Every address is inside memory :mod:`plan` checked (block ids below ``num_blocks``,
    slots at least ``chunk_bytes`` long). Example: 2 copies of a 4-block chunk, 4 one-piece
    layers, shuffled ids: 32 entries, those of copy 0 first, in slot order.
    """
    ids = batch.ids.T[:, ranges.pos]  # [copies, entries]: the block id each entry moves
    kv = ranges.kv_base + ids * ranges.kv_step
    slot = batch.ptrs[:, None] + ranges.slot_off
    lengths = np.broadcast_to(ranges.length, kv.shape)
    return kv.ravel(), slot.ravel(), lengths.ravel()


class NativeCopier:
    """CPU stores and loads in the compiled build: the batch's byte ranges
    (:func:`addresses`) move by ``kvtier._native.copy``, one memcpy each, without the GIL.
    Straight between the KV tensors and each slot, wherever the slots are: no staging, and
    no pass per block position (a torch ``index_select`` into strided slot columns ran at
    half a contiguous copy's speed). ``fault``, if any, is called with every copy of a batch
    before its bytes move.

    Up to ``threads`` threads share a batch: the calling one starts at once, helpers join
    when they wake, and each takes the next ``CLAIM_BYTES`` of ranges from a shared cursor
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
        self._copy, self._cpu = _native.copy, _native.cpu
        self._fault = fault
        self._helpers = max(1, threads) - 1
        self._ranges: dict[tuple[int, int, int, bool], Ranges] = {}  # by batch shape
        self._apart = Apart()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max(1, self._helpers), thread_name_prefix="kvtier-copy",
            initializer=self._apart.enlist)

    def store(self, batch: Batch) -> None:
        kv, slot, lengths = self._addresses(batch)
        self._run(slot, kv, lengths)

    def load(self, batch: Batch) -> None:
        kv, slot, lengths = self._addresses(batch)
        self._run(kv, slot, lengths)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._apart.clear()

    def _addresses(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch's ``(kv, slot, lengths)`` (:func:`addresses`), after its fault checks."""
        check_faults(self._fault, batch)
        key = (batch.view.index, batch.first_block, batch.num_blocks, batch.consecutive)
        ranges = self._ranges.get(key)
        if ranges is None:
            ranges = self._ranges[key] = Ranges.of(batch)
        return addresses(batch, ranges)

    def _run(self, dst: np.ndarray, src: np.ndarray, lengths: np.ndarray) -> None:
        """``lengths[e]`` bytes from ``src[e]`` to ``dst[e]`` for every ``e``, on this thread
        and as many helpers as the bytes are worth."""
        total = int(lengths.sum())
        helpers = min(self._helpers, total // MIN_PART_BYTES - 1)
        if helpers < 1:
            self._copy(dst, src, lengths)
            return
        cursor = np.zeros(1, np.int64)
        grain = max(1, CLAIM_BYTES * len(lengths) // total)  # ranges per claim
        share = functools.partial(self._copy, dst, src, lengths, cursor, grain)
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
