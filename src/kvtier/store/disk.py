"""The local-disk tier: one file per chunk under a directory, published by atomic rename.

Format. ``<path>/chunks/<key hex>`` holds one record (``kvtier.store.record``: header with
key, geometry, length and checksums, then the payload). One file per chunk, rather than
slots in preallocated files, because the file system then does the hard parts: a rename
publishes a chunk atomically, a crash can leave only unpublished temporary files (deleted
at the next open), and the directory itself is the persistent index, so no second index can
disagree with the data. Chunks are megabytes (16 tokens of an 8B model are 2 MiB), so a
file per chunk costs little. See docs/tiers.md.

Writing a chunk: write the record to ``<key hex>.tmp-<pid>-<n>``, ``fsync`` it (``fsync=True``,
the default), rename it over ``<key hex>``, ``fsync`` the directory once per batch, and only
then mark it ready in the index: a reader never sees a chunk whose bytes are not durable.

Reading a chunk verifies the whole record; a mismatch (flipped byte, truncated file, other
key or geometry) is a miss, counted in ``stats.corrupt``, and the file is dropped.

Accounting is a metadata-only ``ChunkStore`` (one slot per chunk, a slot being a record of
the layout's largest chunk), so eviction uses the same policies and the same one eviction
loop as host memory; ``capacity_bytes`` is never exceeded. Evicted files are renamed aside
under the index lock and deleted (or first handed to ``set_demote``'s callback, for
write-back to the next tier) after it, so a reader holds the lock only for bookkeeping.

Opening a directory takes an exclusive ``flock`` on ``<path>/LOCK`` (one process at a time;
a killed process releases it), deletes leftovers, and indexes every chunk file, oldest
first, so a new process serves what an earlier one stored. No threads start before the first
``*_async`` call.

>>> import tempfile
>>> from kvtier.keys import ChunkKey
>>> k = ChunkKey(bytes(40))
>>> with tempfile.TemporaryDirectory() as d:
...     tier = DiskTier(d, capacity_bytes=1 << 20, slot_bytes=1024)
...     tier.put([(k, b"kv" * 4)]) == [k]
...     bytes(tier.get([k])[k]), tier.might_hold(k)
...     tier.close()
True
(b'kvkvkvkv', True)
"""

from __future__ import annotations

import fcntl
import itertools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from kvtier.keys import ChunkKey
from kvtier.store.backend import BytesLike
from kvtier.store.host import slots_for_capacity
from kvtier.store.lower import AsyncTwins, Demote, Item, TierStats, Workers
from kvtier.store.manager import ChunkStore
from kvtier.store.policies import Policy
from kvtier.store.record import HEADER_BYTES, RecordError, decode, encode
from kvtier.store.results import KEY_BYTES, EventKind, StoreEvent, StoreHandle, StoreRefusal

Writer = Callable[[int, Sequence[BytesLike]], None]
"""Writes buffers, in order, to an open file descriptor (a seam for fault tests)."""


def write_all(fd: int, buffers: Sequence[BytesLike]) -> None:
    """Write every buffer to ``fd`` in order, retrying short writes."""
    for buf in buffers:
        view = memoryview(buf).cast("B")  # type: ignore[arg-type]
        while view:
            view = view[os.write(fd, view):]


class DiskTier(AsyncTwins):
    """Chunks as checksummed files under ``path`` (see the module docstring).

    ``slot_bytes``: the largest payload (the layout's largest chunk); each chunk is charged
    ``HEADER_BYTES + slot_bytes`` of ``capacity_bytes``. ``geometry``: the layout's
    fingerprint (``record.geometry_of``). ``writer``: how record bytes reach a file; tests
    inject a failing or stalling one.
    """

    name = "disk"

    def __init__(
        self, path: str | os.PathLike[str], capacity_bytes: int, slot_bytes: int, *,
        geometry: bytes = b"", policy: str | Policy = "lru", workers: int = 2,
        fsync: bool = True, writer: Writer | None = None,
    ) -> None:
        self.slot_bytes, self.geometry, self.fsync = slot_bytes, geometry, fsync
        slots = slots_for_capacity(capacity_bytes, HEADER_BYTES + slot_bytes)
        self.path = Path(path)
        self._dir = self.path / "chunks"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lockfile = _lock_directory(self.path)
        self.stats = TierStats(self.name)
        self._index = ChunkStore(slots, policy=policy)
        self._index.subscribe(self._on_drop)
        self._dropped: list[tuple[ChunkKey, Path, bool]] = []  # (key, renamed file, evicted)
        self._demote: Demote | None = None
        self._workers = Workers(self.name, workers)
        self._writer = writer or write_all
        self._names = itertools.count()
        self._recover()

    # ---- queries -----------------------------------------------------------------------

    @property
    def capacity_chunks(self) -> int:
        return self._index.num_slots

    def __len__(self) -> int:
        return self._index.num_ready

    def might_hold(self, key: ChunkKey) -> bool:
        """Whether ``key`` is indexed (no I/O)."""
        return self._index.lookup([key])[0].readable

    def _file(self, key: ChunkKey) -> Path:
        return self._dir / key.hex()

    # ---- reads -------------------------------------------------------------------------

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """The verified payloads of the held ``keys``; corrupt files are dropped."""
        start = time.perf_counter()
        with self._index.lock:
            held = [k for k, s in zip(keys, self._index.lookup(keys), strict=True) if s.readable]
            handle = self._index.prepare_load(held) if held else None
        out: dict[ChunkKey, memoryview] = {}
        corrupt, failed = [], []
        try:
            for k in held:
                try:
                    out[k] = decode(self._read(self._file(k)), k, self.geometry)
                except RecordError:
                    corrupt.append(k)
                except OSError:
                    failed.append(k)
        finally:
            if handle is not None:
                self._index.complete_load(handle)
        self._index.remove(corrupt + failed)
        self._finish_drops()
        self.stats.add(
            hits=len(out), misses=len(keys) - len(held), corrupt=len(corrupt),
            errors=len(failed), bytes_read=sum(v.nbytes for v in out.values()),
            reads=1 if held else 0, read_seconds=time.perf_counter() - start if held else 0.0,
        )
        return out

    def _read(self, path: Path) -> bytes:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size > HEADER_BYTES + self.slot_bytes:
                raise RecordError(f"{path.name}: {size} bytes is larger than any record here")
            return f.read()  # a length the header disagrees with fails decode

    # ---- writes ------------------------------------------------------------------------

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        """Write ``items`` durably; the keys now held. A chunk that cannot be written (no
        room, disk full, I/O error) is refused and counted; nothing else changes."""
        start = time.perf_counter()
        sizes = {k: _nbytes(p) for k, p in items}
        if sizes and max(sizes.values()) > self.slot_bytes:
            raise ValueError(
                f"disk tier: a {max(sizes.values())}-byte chunk does not fit "
                f"slot_bytes={self.slot_bytes}; size the tier for the layout's largest chunk"
            )
        held, written = self._write_files(items)
        self._finish_drops()
        new_bytes = sum(sizes[k] for k in written)
        self.stats.add(
            stored=len(written), refused=len(items) - len(held) - len(written),
            bytes_written=new_bytes, writes=1 if written else 0,
            write_seconds=time.perf_counter() - start if written else 0.0,
        )
        return held + written

    def _write_files(self, items: Sequence[Item]) -> tuple[list[ChunkKey], list[ChunkKey]]:
        """(keys already held, keys written and published). Chunks are published in
        batches (one directory fsync each); a batch is published early when the index needs
        its slots to be evictable to make room."""
        held: list[ChunkKey] = []
        written: list[ChunkKey] = []
        batch: list[StoreHandle] = []
        for k, payload in items:
            handle = self._index.prepare_store([k])
            if isinstance(handle, StoreRefusal) and handle.retryable and batch:
                written += self._publish(batch)
                batch = []
                handle = self._index.prepare_store([k])
            if not isinstance(handle, StoreHandle):
                continue
            if not handle.keys:
                self._index.complete_store(handle, ok=True)
                held.append(k)
            elif self._try_write(handle, payload):
                batch.append(handle)
        return held, written + self._publish(batch)

    def _try_write(self, handle: StoreHandle, payload: BytesLike) -> bool:
        try:
            self._write_file(handle.keys[0], payload)
        except OSError:
            self._index.complete_store(handle, ok=False)
            self.stats.add(errors=1)
            return False
        return True

    def _write_file(self, key: ChunkKey, payload: BytesLike) -> None:
        final = self._file(key)
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}-{next(self._names)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                self._writer(fd, encode(key, self.geometry, payload))
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _publish(self, written: list[StoreHandle]) -> list[ChunkKey]:
        """Make the renames durable, then the chunks visible; on failure, none of them."""
        ok = True
        if written and self.fsync:
            try:
                _fsync_dir(self._dir)
            except OSError:
                ok = False
                self.stats.add(errors=1)
        for handle in written:
            self._index.complete_store(handle, ok=ok)
            if not ok:
                self._file(handle.keys[0]).unlink(missing_ok=True)
        return [h.keys[0] for h in written] if ok else []

    def remove(self, keys: Sequence[ChunkKey]) -> None:
        """Drop the held ``keys`` that no read or write is using."""
        self._index.remove(keys)
        self._finish_drops()

    # ---- drops: rename aside under the lock, delete (or demote) after it ----------------

    def _on_drop(self, event: StoreEvent) -> None:
        """Index subscriber (under the index lock): move a dropped chunk's file aside."""
        if event.kind is EventKind.STORED:
            return
        final = self._file(event.key)
        aside = final.with_name(f"{final.name}.drop-{os.getpid()}-{next(self._names)}")
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            return
        self._dropped.append((event.key, aside, event.kind is EventKind.EVICTED))

    def _finish_drops(self) -> None:
        with self._index.lock:
            dropped, self._dropped = self._dropped, []
        evicted = sum(1 for _, _, e in dropped if e)
        if evicted:
            self.stats.add(evicted=evicted)
        for key, path, was_evicted in dropped:
            demote = self._demote
            if was_evicted and demote is not None:
                self._hand_down(key, path, demote)
            path.unlink(missing_ok=True)

    def _hand_down(self, key: ChunkKey, path: Path, demote: Demote) -> None:
        try:
            payload = decode(self._read(path), key, self.geometry)
        except (OSError, RecordError):
            return  # a chunk that cannot be read back is not worth keeping below
        demote(key, bytes(payload))

    def set_demote(self, demote: Demote | None) -> None:
        """Hand evicted chunks to ``demote`` (write-back to the next tier) before deleting."""
        self._demote = demote

    # ---- asynchronous twins, recovery, checks, close -----------------------------------

    def _recover(self) -> None:
        """Delete leftovers of killed processes; index every chunk file, oldest first."""
        found = []
        for entry in os.scandir(self._dir):
            key = _key_of(entry.name)
            size = entry.stat().st_size if key is not None else 0
            if key is None or not HEADER_BYTES <= size <= HEADER_BYTES + self.slot_bytes:
                os.unlink(entry.path)  # a temporary, a renamed-aside drop, or not a record
                continue
            found.append((entry.stat().st_mtime_ns, key))
        for _, key in sorted(found):
            handle = self._index.prepare_store([key])
            assert isinstance(handle, StoreHandle), handle  # one key always fits
            self._index.complete_store(handle, ok=True)
        self._finish_drops()

    def check_invariants(self) -> None:
        self._index.check_invariants()

    def close(self) -> None:
        """Finish queued work, stop the workers and release the directory."""
        self._workers.close()
        if not self._lockfile.closed:
            self._lockfile.close()


def _nbytes(payload: BytesLike) -> int:
    return memoryview(payload).nbytes  # type: ignore[arg-type]


def _key_of(name: str) -> ChunkKey | None:
    if len(name) != 2 * KEY_BYTES:
        return None
    try:
        return ChunkKey(bytes.fromhex(name))
    except ValueError:
        return None


def _lock_directory(path: Path) -> BinaryIO:
    f = open(path / "LOCK", "a+b")  # noqa: SIM115 - held open for the tier's lifetime
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ValueError(
            f"disk tier: {path} is in use by another process; give each process its own path"
        ) from None
    return f


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
