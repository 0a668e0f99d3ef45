"""Moves the bytes of planned batches between the KV tensors and the slots.

The slot side of a batch is always a ``[n, chunk_words]`` word view in slot layout, and
copies move with one batched ``index_select`` (store) or ``index_copy_`` (load) per block
position and layer piece, over all the batch's chunks at once (a CPU load: one numpy
assignment per layer piece, split by slot over torch's intra-op thread count, see
:class:`CpuScatter`); in batches of consecutive block ids, one per run of blocks of a
layer instead. That view is either

* the slots themselves, when they are evenly spaced rows of one slab on the KV device (the
  CPU): one pass, no staging (:func:`slab_rows`); or
* a staging buffer on the KV device, exchanged with each slot by one contiguous copy per
  slot (a DMA on CUDA): shuffled slots, separate buffers, and always on CUDA.

In the compiled build, CPU copies skip all of that: each block of each layer piece moves by
one memcpy straight between the KV tensor and its slot, in one C call per thread without the
GIL, the threads sharing the ranges out as they come (:class:`NativeCopies`); the torch
paths above remain the pure build's and CUDA's.

On CUDA each mover owns a stream: a job first waits for the event recorded on the compute
stream at submit time, then runs every copy on its stream (slot copies are non-blocking,
from or to page-locked memory), and is reported done only after its completion event has
been reached. On the CPU the same code runs synchronously on ordinary memory.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvtier.transfer.copies import ChunkCopy
from kvtier.transfer.plan import Batch
from kvtier.transfer.views import Piece

try:  # the compiled build's batched memcpy (setup.py, NATIVE)
    from kvtier import _native
except ImportError:  # the pure build: torch and numpy copies
    _native = None  # type: ignore[assignment]

ROW_WORDS = 1 << 15
"""Rows of this many words or more copy slowly: torch's CPU ``index_select`` moves rows of
fewer elements by parallel memcpy, longer ones by a per-row element loop (measured: random
256 KiB int64 rows at 0.5-0.7 of a contiguous copy, 128 KiB rows at 0.95-1.0), so runs stop
short of it."""

MIN_PART_BYTES = 1 << 20
"""A CPU copy is split over threads only in parts of at least this many bytes."""

CLAIM_BYTES = 1 << 20
"""Threads sharing a native copy take about this many bytes of ranges at a time: small
enough that a helper which wakes late still finds work, large enough that the prefetch
ahead of each claim's copy (64 KiB, see _native.c) is a small part of it."""

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


def slab_rows(batch: Batch) -> torch.Tensor | None:
    """The batch's slots as one ``[n, chunk_words]`` word view, when they allow it.

    They do when they sit at evenly spaced, word-aligned addresses inside the memory of the
    first slot's storage (the usual case: consecutive rows of one slab) on the KV device
    (the CPU). Then copies move between the KV tensors and the slots in one pass, with no
    staging. Only addresses are compared, never each slot's storage: a view of those bytes
    through the first slot's storage is the same memory, whichever tensors the others are.

    Example: slots ``slab[4]``, ``slab[5]``, ``slab[6]`` of a ``[64, 4096]`` slab, 8-byte
    words: a view with strides ``(512, 1)`` starting at word ``4 * 512`` of the slab.
    """
    ptrs, word = batch.ptrs, batch.view.word_bytes
    first = batch.slot(0)
    steps = np.diff(ptrs)
    spacing = int(steps[0]) if len(steps) else batch.view.chunk_bytes
    if first.device != batch.view.device or spacing <= 0 or spacing % word:
        return None
    if not (steps == spacing).all():
        return None
    storage = first.untyped_storage()
    start = int(ptrs[0]) - storage.data_ptr()
    end = start + spacing * (len(ptrs) - 1) + batch.view.chunk_bytes
    if start % word or end > storage.nbytes():
        return None
    out = torch.empty(0, dtype=batch.view.word, device=first.device)
    shape = (len(ptrs), batch.view.chunk_words)
    return out.set_(storage, start // word, shape, (spacing // word, 1))


def runs_of(piece: Piece, count: int) -> torch.Tensor:
    """``[num_blocks - count + 1, count * width]`` rows: row ``b`` is blocks ``b..b+count-1``.

    Rows overlap (row ``b + 1`` starts one block after row ``b``); a job reads or writes
    disjoint ones only. Example: 10 blocks of 4 words, ``count == 3``: 8 rows of 12 words,
    row 7 being words 28..39.
    """
    rows = piece.rows
    size = (int(rows.shape[0]) - count + 1, count * piece.width)
    return rows.as_strided(size, (piece.width, 1), rows.storage_offset())


def placements(batch: Batch, staged: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """``(piece rows, block ids, staging view)`` triples covering every block of a batch.

    For each chunk-relative block position ``p`` of the batch's shape, every layer piece
    yields its ``[num_blocks, width]`` rows, the engine block ids at ``p`` of every copy,
    and the staging columns where position ``p`` of that piece lives (a strided
    ``[len(copies), width]`` view). In a ``consecutive`` batch a one-piece layer yields
    runs instead (:func:`runs_of`) of as many blocks as fit in ``ROW_WORDS - 1`` words, each
    with the ids of its first block and the slot columns it covers: one triple per layer
    when blocks are small. Example: 16 KiB blocks, 4 per chunk: one 64 KiB run per layer;
    128 KiB blocks: four runs of one block.
    """
    view = batch.view
    ids = torch.from_numpy(batch.ids).to(staged.device)
    count = batch.num_blocks
    for li, layer in enumerate(view.layers):
        base = view.block_word(li, batch.first_block)
        if batch.consecutive and len(layer.pieces) == 1:
            piece = layer.pieces[0]
            step = max(1, (ROW_WORDS - 1) // piece.width)  # blocks per run
            for j in range(0, count, step):
                n, col = min(step, count - j), base + j * piece.width
                yield runs_of(piece, n), ids[j], staged[:, col : col + n * piece.width]
            continue
        for j in range(count):
            for piece in layer.pieces:
                col = base + j * layer.words_per_block + piece.offset
                yield piece.rows, ids[j], staged[:, col : col + piece.width]


def planes(batch: Batch, staged: torch.Tensor) -> Iterator[tuple[np.ndarray, ...]]:
    """``(piece rows, block ids, staging view)`` for each layer piece, as CPU ndarrays.

    The same placements as :func:`placements`, every block position at once: ids are
    ``[len(copies), num_blocks]`` and the view ``[len(copies), num_blocks, width]``; in a
    ``consecutive`` batch a one-piece layer moves runs: ids ``[len(copies)]``, the view
    ``[len(copies), num_blocks * width]``.
    Example: 4 layers of one piece each give 4 triples, whatever the number of blocks.
    """
    view, rows_apart, count = batch.view, staged.stride(0), batch.num_blocks
    for li, layer in enumerate(view.layers):
        start = staged.storage_offset() + view.block_word(li, batch.first_block)
        if batch.consecutive and len(layer.pieces) == 1:
            piece = layer.pieces[0]
            run_shape = (staged.shape[0], count * piece.width)
            plane = staged.as_strided(run_shape, (rows_apart, 1), start)
            yield runs_of(piece, count).detach().numpy(), batch.ids[0], plane.detach().numpy()
            continue
        for piece in layer.pieces:
            shape = (staged.shape[0], count, piece.width)
            strides = (rows_apart, layer.words_per_block, 1)
            plane = staged.as_strided(shape, strides, start + piece.offset)
            yield piece.rows.detach().numpy(), batch.ids.T, plane.detach().numpy()


class Mover:
    """Runs store and load batches for one direction, on its own CUDA stream if any.

    ``staging_bytes`` bounds the staging buffer; a batch that needs more runs in parts.
    ``load_threads`` (CPU): how many threads one load batch may spread over.
    """

    def __init__(self, device: torch.device, fault: FaultHook | None, staging_bytes: int,
                 load_threads: int = 1) -> None:
        self._device = device
        self._fault = fault
        self._staging_bytes = staging_bytes
        self._staging = Staging(device)
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        cpu = device.type == "cpu"
        self._native = NativeCopies(load_threads) if cpu and _native is not None else None
        self._cpu_scatter = CpuScatter(load_threads) if cpu and self._native is None else None

    def close(self) -> None:
        """Stop the helper threads of CPU copies, if any ran (idempotent)."""
        if self._cpu_scatter is not None:
            self._cpu_scatter.close()
        if self._native is not None:
            self._native.close()

    def store(self, batches: Sequence[Batch], ready: object | None) -> None:
        """Engine blocks -> slots. ``ready``: a CUDA event the copies must wait for."""
        with self._on_stream(ready):
            for batch in batches:
                if self._native is not None:
                    self._check_faults(batch)
                    self._native(batch, "store")
                    continue
                direct = slab_rows(batch)
                if direct is not None:
                    self._check_faults(batch)
                    _gather(batch, direct)
                    continue
                for part in self._parts(batch):
                    staged = self._staging.rows(part)
                    _gather(part, staged)
                    self._staging_to_slots(part, staged)

    def load(self, batches: Sequence[Batch], ready: object | None) -> None:
        """Slots -> engine blocks. ``ready``: a CUDA event the copies must wait for."""
        with self._on_stream(ready):
            for batch in batches:
                if self._native is not None:
                    self._check_faults(batch)
                    self._native(batch, "load")
                    continue
                direct = slab_rows(batch)
                if direct is not None:
                    self._check_faults(batch)
                    self._scatter(batch, direct)
                    continue
                for part in self._parts(batch):
                    staged = self._staging.rows(part)
                    self._slots_to_staging(part, staged)
                    self._scatter(part, staged)

    def _scatter(self, batch: Batch, staged: torch.Tensor) -> None:
        """Slot-layout rows ``staged`` -> KV blocks."""
        if self._cpu_scatter is not None:  # the CPU: staged and KV are host memory
            self._cpu_scatter(batch, staged)
            return
        for rows, ids, src in placements(batch, staged):
            rows.index_copy_(0, ids, src)

    def _parts(self, batch: Batch) -> list[Batch]:
        return batch.split(self._staging_bytes // batch.view.chunk_bytes)

    def _staging_to_slots(self, batch: Batch, staged: torch.Tensor) -> None:
        raw = staged.view(torch.uint8)
        ranges = batch.view.byte_ranges(batch.first_block, batch.num_blocks)
        for i, (copy, slot) in enumerate(zip(batch.copies, batch.slots, strict=True)):
            self._check_fault(copy)
            for lo, hi in ranges:
                slot[lo:hi].copy_(raw[i, lo:hi], non_blocking=self._stream is not None)

    def _slots_to_staging(self, batch: Batch, staged: torch.Tensor) -> None:
        raw = staged.view(torch.uint8)
        ranges = batch.view.byte_ranges(batch.first_block, batch.num_blocks)
        for i, (copy, slot) in enumerate(zip(batch.copies, batch.slots, strict=True)):
            self._check_fault(copy)
            for lo, hi in ranges:
                raw[i, lo:hi].copy_(slot[lo:hi], non_blocking=self._stream is not None)

    def _check_faults(self, batch: Batch) -> None:
        if self._fault is None:
            return
        for copy in batch.copies:
            self._check_fault(copy)

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


def _gather(batch: Batch, staged: torch.Tensor) -> None:
    """KV blocks -> slot-layout rows ``staged`` (a staging buffer or the slots themselves)."""
    for rows, ids, dst in placements(batch, staged):
        torch.index_select(rows, 0, ids, out=dst)


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


class SlotSplit:
    """Runs ``part(lo, hi)`` over a batch's slots ``0..n-1`` split into up to ``threads``
    parts at once: the last part in the calling thread, the others on helper threads (the
    copies inside let go of the GIL). Parts are at least ``MIN_PART_BYTES`` of chunks.

    The helper threads start with the first split batch, not here; :meth:`close` ends them.
    Example: 256 slots of 256 KiB and 2 threads: slots 0..127 on a helper, 128..255 here.
    """

    def __init__(self, threads: int, name: str) -> None:
        self._threads = max(1, threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max(1, self._threads - 1), thread_name_prefix=name)

    def run(self, n: int, chunk_bytes: int, part: Callable[[int, int], object]) -> None:
        parts = max(1, min(self._threads, n, n * chunk_bytes // MIN_PART_BYTES))
        edges = [n * k // parts for k in range(parts + 1)]
        calls = [functools.partial(part, edges[k], edges[k + 1]) for k in range(parts)]
        together(self._pool, calls[:-1], calls[-1])

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class CpuScatter:
    """CPU loads: one numpy assignment per layer piece moves every block position at memcpy
    speed (``index_copy_`` moves one word per element), the batch's slots split over
    threads (:class:`SlotSplit`; numpy lets go of the GIL while it copies), as
    ``index_select`` spreads a store over torch's intra-op threads.
    """

    def __init__(self, threads: int) -> None:
        self._split = SlotSplit(threads, "kvtier-load")

    def __call__(self, batch: Batch, staged: torch.Tensor) -> None:
        moves = list(planes(batch, staged))  # a load writes each block once (checked at submit)
        self._split.run(int(staged.shape[0]), batch.view.chunk_bytes,
                        lambda lo, hi: _assign(moves, lo, hi))

    def close(self) -> None:
        self._split.close()


def _assign(moves: list[tuple[np.ndarray, ...]], lo: int, hi: int) -> None:
    """Slots ``lo..hi-1`` of every ``(KV rows, block ids, slot plane)`` move."""
    for dst, at, plane in moves:
        dst[at[lo:hi]] = plane[lo:hi]


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
            if batch.consecutive and len(layer.pieces) == 1:
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


class NativeCopies:
    """CPU stores and loads in the compiled build: the batch's byte ranges
    (:func:`addresses`) move by ``kvtier._native.copy``, one memcpy each, without the GIL.
    Straight between the KV tensors and each slot, wherever the slots are: no staging, and
    no pass per block position (a torch ``index_select`` into strided slot columns ran at
    half a contiguous copy's speed).

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

    def __init__(self, threads: int) -> None:
        self._helpers = max(1, threads) - 1
        self._ranges: dict[tuple[int, int, int, bool], Ranges] = {}  # by batch shape
        self._apart = Apart()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max(1, self._helpers), thread_name_prefix="kvtier-copy",
            initializer=self._apart.enlist)

    def __call__(self, batch: Batch, direction: str) -> None:
        assert _native is not None
        copy = _native.copy
        key = (batch.view.index, batch.first_block, batch.num_blocks, batch.consecutive)
        ranges = self._ranges.get(key)
        if ranges is None:
            ranges = self._ranges[key] = Ranges.of(batch)
        kv, slot, lengths = addresses(batch, ranges)
        dst, src = (slot, kv) if direction == "store" else (kv, slot)
        total = int(lengths.sum())
        helpers = min(self._helpers, total // MIN_PART_BYTES - 1)
        if helpers < 1:
            copy(dst, src, lengths)
            return
        cursor = np.zeros(1, np.int64)
        grain = max(1, CLAIM_BYTES * len(lengths) // total)  # ranges per claim
        share = functools.partial(copy, dst, src, lengths, cursor, grain)
        with self._apart(_native.cpu()):
            together(self._pool, [share] * helpers, share)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._apart.clear()


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
