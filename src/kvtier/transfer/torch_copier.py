"""The torch copier: the pure build's copies, and CUDA's in every build.

The slot side of a batch is always a ``[n, chunk_words]`` word view in slot layout, and
copies move with one batched ``index_select`` (store) or ``index_copy_`` (load) per block
position and layer piece, over all the batch's chunks at once (a CPU load: one numpy
assignment per layer piece, split by slot over the load threads, see :class:`CpuScatter`);
in batches of consecutive block ids, one per run of blocks of a layer instead. That view is
either

* the slots themselves, when they are evenly spaced rows of one slab on the KV device (the
  CPU): one pass, no staging (:func:`slab_rows`); or
* a staging buffer on the KV device, exchanged with each slot by one contiguous copy per
  byte range and slot (a DMA on CUDA): shuffled slots, separate buffers, and always on CUDA.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
from collections.abc import Callable, Iterator

import numpy as np
import torch

from kvtier.transfer.mover import MIN_PART_BYTES, FaultHook, check_faults, together
from kvtier.transfer.plan import Batch
from kvtier.transfer.views import Piece

ROW_WORDS = 1 << 15
"""Rows of this many words or more copy slowly: torch's CPU ``index_select`` moves rows of
fewer elements by parallel memcpy, longer ones by a per-row element loop (measured: random
256 KiB int64 rows at 0.5-0.7 of a contiguous copy, 128 KiB rows at 0.95-1.0), so runs stop
short of it."""

KvSide = Callable[[Batch, torch.Tensor], None]
"""Moves between a batch's KV blocks and its ``[n, chunk_words]`` slot-layout rows."""


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
    ids = torch.from_numpy(batch.ids)
    if staged.is_cuda:  # from page-locked memory: a pageable copy would wait for the stream
        ids = ids.pin_memory().to(staged.device, non_blocking=True)
    count = batch.num_blocks
    for li, layer in enumerate(view.layers):
        base = view.block_word(li, batch.first_block)
        if batch.consecutive and layer.runs:
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
        if batch.consecutive and layer.runs:
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


class TorchCopier:
    """Moves each batch through the slots themselves (:func:`slab_rows`) or, where they do
    not allow it, through a staging buffer on ``device`` of at most ``staging_bytes`` (a
    batch that needs more runs in parts). ``threads`` (CPU): how many threads one load
    batch may spread over (a store spreads over torch's intra-op threads instead).
    """

    def __init__(self, device: torch.device, fault: FaultHook | None, staging_bytes: int,
                 threads: int = 1) -> None:
        self._fault = fault
        self._staging_bytes = staging_bytes
        self._staging = Staging(device)
        self._non_blocking = device.type == "cuda"  # slots are page-locked: DMA
        self._cpu_scatter = CpuScatter(threads) if device.type == "cpu" else None

    def close(self) -> None:
        if self._cpu_scatter is not None:
            self._cpu_scatter.close()

    def store(self, batch: Batch) -> None:
        if self._direct(batch, _gather):
            return
        for part, staged in self._staged(batch):
            _gather(part, staged)
            self._exchange(part, staged, "store")

    def load(self, batch: Batch) -> None:
        if self._direct(batch, self._scatter):
            return
        for part, staged in self._staged(batch):
            self._exchange(part, staged, "load")
            self._scatter(part, staged)

    def _direct(self, batch: Batch, kv_side: KvSide) -> bool:
        """Moves ``batch`` in one pass when its slots are rows of one slab; else False."""
        direct = slab_rows(batch)
        if direct is None:
            return False
        check_faults(self._fault, batch)
        kv_side(batch, direct)
        return True

    def _staged(self, batch: Batch) -> Iterator[tuple[Batch, torch.Tensor]]:
        """The parts of ``batch`` that fit the staging buffer, each with its staging rows."""
        for part in batch.split(self._staging_bytes // batch.view.chunk_bytes):
            yield part, self._staging.rows(part)

    def _scatter(self, batch: Batch, staged: torch.Tensor) -> None:
        """Slot-layout rows ``staged`` -> KV blocks."""
        if self._cpu_scatter is not None:  # the CPU: staged and KV are host memory
            self._cpu_scatter(batch, staged)
            return
        for rows, ids, src in placements(batch, staged):
            rows.index_copy_(0, ids, src)

    def _exchange(self, batch: Batch, staged: torch.Tensor, direction: str) -> None:
        """Staging rows -> slots (``store``) or slots -> staging rows (``load``): one copy
        per byte range of the batch's shape and slot; whole chunks in slots that follow
        one another in memory move as one copy per run of such slots (on CUDA each copy is
        a DMA with a fixed cost of microseconds: 16 KiB chunks one at a time moved at a
        fiftieth of a plain copy's speed)."""
        raw = staged.view(torch.uint8)
        ranges = batch.view.byte_ranges(batch.first_block, batch.num_blocks)
        whole = ranges == [(0, batch.view.chunk_bytes)]
        runs = _runs(batch) if whole else ((i, i + 1) for i in range(len(batch.refs)))
        for start, stop in runs:
            if self._fault is not None:
                for copy in batch.copies[start:stop]:
                    self._fault(copy)
            slot, span = batch.slot(start), (stop - start) * batch.view.chunk_bytes
            if stop - start > 1 and _holds(slot, span):  # whole chunks, back to back
                rows = raw[start:stop].reshape(-1)  # staging rows are contiguous
                host = slot.as_strided((span,), (1,))
                dst, src = (host, rows) if direction == "store" else (rows, host)
                dst.copy_(src, non_blocking=self._non_blocking)
                continue
            for i in range(start, stop):  # one by one
                one = batch.slot(i)
                for lo, hi in ranges:
                    row = raw[i, lo:hi]
                    dst, src = (one[lo:hi], row) if direction == "store" else (row, one[lo:hi])
                    dst.copy_(src, non_blocking=self._non_blocking)


def _runs(batch: Batch) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of each run of the batch's copies whose slots follow one another in
    memory, each a whole chunk after the last (slots are sorted by address)."""
    breaks = np.flatnonzero(np.diff(batch.ptrs) != batch.view.chunk_bytes) + 1
    return itertools.pairwise([0, *breaks.tolist(), len(batch.ptrs)])


def _holds(slot: torch.Tensor, span: int) -> bool:
    """Whether ``span`` bytes from ``slot``'s start lie in its own storage (slots that only
    happen to sit side by side in memory, in different storages, do not count)."""
    start = slot.storage_offset() * slot.element_size()
    return slot.dtype == torch.uint8 and start + span <= slot.untyped_storage().nbytes()


def _gather(batch: Batch, staged: torch.Tensor) -> None:
    """KV blocks -> slot-layout rows ``staged`` (a staging buffer or the slots themselves)."""
    for rows, ids, dst in placements(batch, staged):
        torch.index_select(rows, 0, ids, out=dst)



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
