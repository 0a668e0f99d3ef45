"""Moves the bytes of planned batches between the KV tensors and the slots.

The slot side of a batch is always a ``[n, chunk_words]`` word view in slot layout, and
copies move with one batched ``index_select`` (store) or ``index_copy_`` (load) per block
position and layer piece, over all the batch's chunks at once (a CPU load: one numpy
assignment per layer piece); in batches of consecutive block ids, one per run of blocks of
a layer instead. On the CPU a batch's slots are split into parts that run on several
threads at once, each thread's torch kernels single-threaded (see :class:`CpuThreads`).
That view is either

* the slots themselves, when they are evenly spaced rows of one slab on the KV device (the
  CPU): one pass, no staging (:func:`slab_rows`); or
* a staging buffer on the KV device, exchanged with each slot by one contiguous copy per
  slot (a DMA on CUDA): shuffled slots, separate buffers, and always on CUDA.

On CUDA each mover owns a stream: a job first waits for the event recorded on the compute
stream at submit time, then runs every copy on its stream (slot copies are non-blocking,
from or to page-locked memory), and is reported done only after its completion event has
been reached. On the CPU the same code runs synchronously on ordinary memory.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from kvtier.transfer.plan import Batch
from kvtier.transfer.spec import ChunkCopy
from kvtier.transfer.views import Piece

ROW_WORDS = 1 << 15
"""Rows of this many words or more copy slowly: torch's CPU ``index_select`` moves rows of
fewer elements by parallel memcpy, longer ones by a per-row element loop (measured: random
256 KiB int64 rows at 0.5-0.7 of a contiguous copy, 128 KiB rows at 0.95-1.0), so runs stop
short of it."""

MIN_PART_BYTES = 1 << 20
"""A CPU job is split over threads only in parts of at least this many bytes."""

PARTS_PER_THREAD = 4
"""A CPU job's parts per thread at most (see :meth:`CpuThreads.run`)."""

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
    slots, ptrs, word = batch.slots, batch.ptrs, batch.view.word_bytes
    first = slots[0]
    steps = np.diff(ptrs)
    spacing = int(steps[0]) if len(steps) else batch.view.chunk_bytes
    if first.device != batch.view.device or spacing <= 0 or spacing % word:
        return None
    if not (steps == spacing).all():
        return None
    storage = first.untyped_storage()
    start = int(ptrs[0]) - storage.data_ptr()
    end = start + spacing * (len(slots) - 1) + batch.view.chunk_bytes
    if start % word or end > storage.nbytes():
        return None
    out = torch.empty(0, dtype=batch.view.word, device=first.device)
    shape = (len(slots), batch.view.chunk_words)
    return out.set_(storage, start // word, shape, (spacing // word, 1))


def slab_index(batch: Batch) -> tuple[np.ndarray, np.ndarray] | None:
    """CPU slots that :func:`slab_rows` cannot view as one: rows of a strided view, and
    each slot's row, when the slots sit inside the first slot's storage at word-aligned
    addresses a common spacing apart (any rows of one slab, in any order, with gaps).

    The slots then move to or from a staging buffer with one numpy call per batch part
    instead of one copy per slot (a Python call each, which waits for the GIL while the
    engine's thread runs Python). Example: rows 5, 9 and 6 of a ``[64, 4096]`` slab, 8-byte
    words: a ``[5, 512]`` view from row 5 with rows ``[0, 4, 1]``.
    """
    slots, ptrs, view = batch.slots, batch.ptrs, batch.view
    first = slots[0]
    if not first.is_cpu or view.device.type != "cpu":
        return None
    storage = first.untyped_storage()
    offsets = ptrs - storage.data_ptr()
    low = int(offsets.min())
    steps = offsets - low
    spacing = int(np.gcd.reduce(steps)) if len(steps) > 1 else view.chunk_bytes
    word = view.word_bytes
    if low < 0 or low % word or spacing <= 0 or spacing % word:
        return None
    at = steps // spacing
    count = int(at.max()) + 1
    if low + spacing * (count - 1) + view.chunk_bytes > storage.nbytes():
        return None
    out = torch.empty(0, dtype=view.word)
    out.set_(storage, low // word, (count, view.chunk_words), (spacing // word, 1))
    return out.numpy(), at


def _staging_to_rows(batch: Batch, staged: torch.Tensor, rows: np.ndarray,
                     at: np.ndarray) -> None:
    """Staging rows -> the batch's slots (rows ``at`` of ``rows``), only the batch's blocks."""
    view, src = batch.view, staged.numpy()
    for lo, hi in view.byte_ranges(batch.first_block, batch.num_blocks):
        a, b = lo // view.word_bytes, hi // view.word_bytes
        if a == 0 and b == view.chunk_words:
            rows[at] = src
        else:
            rows[at, a:b] = src[:, a:b]


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
        self._cpu = CpuThreads(load_threads) if device.type == "cpu" else None

    def close(self) -> None:
        """Stop the helper threads of CPU jobs, if any ran (idempotent)."""
        if self._cpu is not None:
            self._cpu.close()

    def store(self, batches: Sequence[Batch], ready: object | None) -> None:
        """Engine blocks -> slots. ``ready``: a CUDA event the copies must wait for."""
        with self._on_stream(ready):
            for batch in batches:
                direct = slab_rows(batch)
                if direct is not None:
                    self._check_faults(batch)
                    self._gather(batch, direct)
                    continue
                for part in self._parts(batch):
                    staged = self._staging.rows(part)
                    self._gather(part, staged)
                    indexed = slab_index(part) if self._cpu is not None else None
                    if indexed is None:
                        self._staging_to_slots(part, staged)
                        continue
                    self._check_faults(part)
                    _staging_to_rows(part, staged, *indexed)

    def load(self, batches: Sequence[Batch], ready: object | None) -> None:
        """Slots -> engine blocks. ``ready``: a CUDA event the copies must wait for."""
        with self._on_stream(ready):
            for batch in batches:
                direct = slab_rows(batch)
                if direct is not None:
                    self._check_faults(batch)
                    self._scatter(batch, direct)
                    continue
                for part in self._parts(batch):
                    staged = self._staging.rows(part)
                    indexed = slab_index(part) if self._cpu is not None else None
                    if indexed is None:
                        self._slots_to_staging(part, staged)
                    else:  # whole chunks: a slot holds them, and only blocks move on
                        self._check_faults(part)
                        rows, at = indexed
                        np.take(rows, at, axis=0, out=staged.numpy(), mode="clip")
                    self._scatter(part, staged)

    def _gather(self, batch: Batch, staged: torch.Tensor) -> None:
        """KV blocks -> slot-layout rows ``staged`` (a staging buffer or the slots)."""
        if self._cpu is None:
            _gather(batch, staged)
            return
        self._cpu.run(batch, lambda lo, hi: _gather(batch.part(lo, hi), staged[lo:hi]))

    def _scatter(self, batch: Batch, staged: torch.Tensor) -> None:
        """Slot-layout rows ``staged`` -> KV blocks."""
        if self._cpu is not None:  # the CPU: staged and KV are host memory
            moves = list(planes(batch, staged))  # a load writes each block once (checked)
            self._cpu.run(batch, lambda lo, hi: _assign(moves, lo, hi))
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


class CpuThreads:
    """CPU jobs: a batch's slots split into up to ``threads`` parts that run at once.

    A store part is one ``index_select`` per block position and layer piece, a load part
    one numpy assignment per layer piece, each over its own slots; torch and numpy let go
    of the GIL while they copy. Every thread that runs parts runs torch's kernels
    single-threaded (:func:`serial_intra_op`): ``index_select`` would otherwise split each
    call's few rows over torch's OpenMP threads and wait for all of them after each call,
    once per block position and layer (measured on 2 cores, a Llama-3.1-8B-shaped store of
    64 MiB: 0.66 of a contiguous copy that way, 1.0 split by slot over 2 threads).

    The helper threads start with the first split batch, not here; :meth:`close` ends them.
    Example: 256 slots of 256 KiB and 2 threads: slots 0..127 on a helper, 128..255 here.
    """

    def __init__(self, threads: int) -> None:
        self._threads = max(1, threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max(1, self._threads - 1), thread_name_prefix="kvtier-copy",
            initializer=serial_intra_op)

    def run(self, batch: Batch, move: Callable[[int, int], None]) -> None:
        """``move(lo, hi)`` for slot ranges covering the batch, on up to ``threads`` threads;
        returns once every part has ended, raising what a part raised.

        There are up to ``PARTS_PER_THREAD`` parts per thread, which each thread takes in
        turn until none is left: a thread that the machine's other work slows down takes
        fewer of them instead of holding the job up.
        """
        serial_intra_op()
        n = len(batch.copies)
        most = min(n, n * batch.view.chunk_bytes // MIN_PART_BYTES)
        parts = max(1, min(self._threads * PARTS_PER_THREAD, most))
        edges = [n * k // parts for k in range(parts + 1)]
        turns = itertools.count()  # next() is atomic under the GIL

        def take() -> None:
            while (k := next(turns)) < parts:
                move(edges[k], edges[k + 1])

        helpers = [self._pool.submit(take) for _ in range(min(self._threads, parts) - 1)]
        try:
            take()
        finally:  # never report a job done while a helper still moves its bytes
            if helpers:
                concurrent.futures.wait(helpers)
        for helper in helpers:
            helper.result()  # raises what the helper raised

    def close(self) -> None:
        self._pool.shutdown(wait=True)


_serial = threading.local()


def serial_intra_op() -> None:
    """Run torch's CPU kernels single-threaded in the calling thread, and only there.

    OpenMP keeps a thread count per thread (``omp_set_num_threads`` sets the caller's),
    whereas ``torch.set_num_threads`` would also change MKL's and the count of threads
    started later, the engine's compute included. A no-op without an OpenMP runtime.
    """
    if getattr(_serial, "done", False):
        return
    _serial.done = True
    omp = _openmp()
    if omp is not None:
        torch.get_num_threads()  # torch's per-thread setup first, or it resets the count
        omp.omp_set_num_threads(1)


@functools.cache
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (``libgomp``, ``libiomp5``, ``libomp``), if any."""
    try:
        with open(f"/proc/{os.getpid()}/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "omp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith(("libgomp", "libiomp5", "libomp")) and ".so" in name:
            try:
                lib = ctypes.CDLL(path)
                lib.omp_set_num_threads.argtypes = [ctypes.c_int]
                return lib
            except (OSError, AttributeError):
                continue
    return None


def _assign(moves: list[tuple[np.ndarray, ...]], lo: int, hi: int) -> None:
    """Slots ``lo..hi-1`` of every ``(KV rows, block ids, slot plane)`` move."""
    for dst, at, plane in moves:
        dst[at[lo:hi]] = plane[lo:hi]
