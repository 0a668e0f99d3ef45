"""The local-disk tier: one file per chunk under a directory, published by atomic rename.

Format. ``<path>/chunks/<key hex>`` holds one record (``kvtier.tiers.records.format``: header with
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
key or geometry, a forged record under a ``seal``) is a miss, counted in ``stats.corrupt``,
and the file is dropped.

The tier owns only what it wrote (``kvtier.tiers.disk.directory``): symlinks at ``chunks`` or
``LOCK`` are refused, never followed, and an entry of ``chunks/`` that is not provably one
of its records (a user's file, a subdirectory, a symlink) is foreign: never read as a chunk,
renamed, replaced or deleted, only counted in ``stats.foreign`` and logged once at open. A
directory that turns read-only refuses stores and misses reads (counted in
``stats.errors``); no ``OSError`` escapes.

Accounting is a metadata-only ``ChunkStore`` (one slot per chunk, a slot being a record of
the layout's largest chunk), so eviction uses the same policies and the same one eviction
loop as host memory; ``capacity_bytes`` is never exceeded. Evicted files are renamed aside
under the index lock and deleted (or first handed to ``set_demote``'s callback, for
write-back to the next tier) after it, so a reader holds the lock only for bookkeeping.

Opening a directory takes an exclusive ``flock`` on ``<path>/LOCK`` (one process at a time;
a killed process releases it), deletes its own leftovers, and indexes every one of its chunk
files, oldest first, so a new process serves what an earlier one stored. No threads start
before the first ``*_async`` call or the first read of several megabytes (``READ_APART``).

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

import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtier.keys import ChunkKey
from kvtier.store.backend import BytesLike
from kvtier.store.manager import ChunkStore
from kvtier.store.policies import Policy
from kvtier.store.results import EventKind, StoreEvent, StoreHandle, StoreRefusal, checked_keys
from kvtier.tiers.disk.directory import ChunkDir, Entry, NotOurs, Writer, write_all
from kvtier.tiers.host import slots_for_capacity
from kvtier.tiers.lower import (
    AsyncTwins,
    Demote,
    IndexEvents,
    Item,
    TierStats,
    Workers,
    copied_into,
    outcomes,
)
from kvtier.tiers.records.format import (
    HEADER_BYTES,
    NotARecord,
    RecordError,
    decode,
    decode_parts,
    encode,
)
from kvtier.tiers.records.seal import Seal

_log = logging.getLogger(__name__)

READ_APART = 4 << 20
"""A read of at least this many bytes of records (by the largest record) is split in two,
the second half read on a thread of the tier's while the caller reads the first: copying
out of the page cache runs at a few GB/s per core, and a promotion waits on it (15 records of
1 MiB: 7.3 ms on one thread of a 2-core VM, in the pure build inside vLLM's engine)."""


class DiskTier(AsyncTwins, IndexEvents):
    """Chunks as checksummed files under ``path`` (see the module docstring).

    ``slot_bytes``: the largest payload (the layout's largest chunk); each chunk is charged
    a record of it (``record_bytes``) of ``capacity_bytes``. ``geometry``: the layout's
    fingerprint (``records.format.geometry_of``). ``seal``: authenticate (or encrypt) records
    (``kvtier.tiers.records.seal``); then only sealed records under the same secret are read.
    ``writer``: how record bytes reach a file; tests inject a failing or stalling one.
    """

    name = "disk"

    def __init__(
        self, path: str | os.PathLike[str], capacity_bytes: int, slot_bytes: int, *,
        geometry: bytes = b"", policy: str | Policy = "lru", workers: int = 2,
        fsync: bool = True, writer: Writer | None = None, seal: Seal | None = None,
    ) -> None:
        self.slot_bytes, self.geometry, self.fsync, self.seal = slot_bytes, geometry, fsync, seal
        self.record_bytes = HEADER_BYTES + slot_bytes + (seal.overhead if seal else 0)
        """The largest record: what each chunk is charged."""
        slots = slots_for_capacity(capacity_bytes, self.record_bytes)
        self.path = Path(path)
        self._dir = ChunkDir(self.path)
        self.stats = TierStats(self.name)
        self._index = ChunkStore(slots, policy=policy)
        self._index.subscribe(self._on_drop)
        self._dropped: list[tuple[ChunkKey, str, bool]] = []  # (key, renamed file, evicted)
        self._disowned: set[ChunkKey] = set()  # unindexed, but their file is not ours
        self._demote: Demote | None = None
        self._workers = Workers(self.name, workers)
        self._reader = Workers(f"{self.name}-read", 1)
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

    # ---- reads -------------------------------------------------------------------------

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """The verified payloads of the held ``keys``; corrupt files are dropped."""
        return self._read(keys, self._load)

    def get_into(self, keys: Sequence[ChunkKey], views: Sequence[memoryview]
                 ) -> dict[ChunkKey, memoryview]:
        """``get``, each payload read straight into its entry of ``views`` (writable bytes,
        at least ``slot_bytes`` each: the host slots a promotion fills), not into a buffer
        of its own that the caller copies again; the payloads returned are views of
        ``views``. A view whose key is not returned holds bytes that mean nothing. A sealed
        tier (its payload is opened into new bytes) reads as ``get`` and copies."""
        if len(views) != len(keys) or any(v.nbytes < self.slot_bytes for v in views):
            raise ValueError(f"disk tier: get_into needs one view of at least {self.slot_bytes}"
                             f" bytes per key ({len(keys)} keys, {len(views)} views)")
        if self.seal is not None:
            return copied_into(self.get(keys), keys, views)
        into = dict(zip(keys, views, strict=True))
        return self._read(keys, lambda name, key: self._load_into(name, key, into[key]))

    def _read(self, keys: Sequence[ChunkKey], load: Callable[[str, ChunkKey], memoryview]
              ) -> dict[ChunkKey, memoryview]:
        start = time.perf_counter()
        with self._index.lock:
            held = [k for k, s in zip(keys, self._index.lookup(keys), strict=True) if s.readable]
            handle = self._index.prepare_load(held) if held else None
        out: dict[ChunkKey, memoryview] = {}
        corrupt, failed, foreign = [], [], []
        try:
            def one(k: ChunkKey) -> memoryview:
                return load(k.hex(), k)

            apart = len(held) > 1 and len(held) * self.record_bytes >= READ_APART
            for k, got in zip(held, self._reader.halves(one, held) if apart
                              else outcomes(one, held), strict=True):
                if isinstance(got, NotARecord | NotOurs):
                    foreign.append(k)
                elif isinstance(got, RecordError):
                    corrupt.append(k)
                elif isinstance(got, OSError):
                    failed.append(k)
                elif isinstance(got, Exception):
                    raise got
                else:
                    out[k] = got
        finally:
            if handle is not None:
                self._index.complete_load(handle)
        self._disown(foreign)
        self._index.remove(corrupt + failed)
        self._finish_drops()
        self.stats.add(
            hits=len(out), misses=len(keys) - len(held), corrupt=len(corrupt),
            errors=len(failed), foreign=len(foreign),
            bytes_read=sum(v.nbytes for v in out.values()),
            reads=1 if held else 0, read_seconds=time.perf_counter() - start if held else 0.0,
        )
        return out

    def _load(self, name: str, key: ChunkKey) -> memoryview:
        """The verified payload of file ``name`` (a length the header disagrees with, or one
        past the largest record, fails ``decode``)."""
        return decode(self._dir.read(name, self.record_bytes), key, self.geometry, self.seal)

    def _load_into(self, name: str, key: ChunkKey, view: memoryview) -> memoryview:
        """``_load`` with the payload read into ``view``: the header apart, then the body,
        then one byte more, so that a file past the largest record shows as such (and,
        like every record ``_load`` refuses, fails the same check of ``decode``)."""
        head, body, over = bytearray(HEADER_BYTES), view[: self.slot_bytes], bytearray(1)
        n = self._dir.read_into(name, [memoryview(head), body, memoryview(over)])
        if n > HEADER_BYTES + self.slot_bytes:  # too long: checked on a copy, as _load does
            return decode(bytes(head) + bytes(body) + bytes(over), key, self.geometry)
        return decode_parts(memoryview(head)[:n], body[: max(0, n - HEADER_BYTES)], key,
                            self.geometry)

    def _disown(self, keys: list[ChunkKey]) -> None:
        """Unindex ``keys`` whose file turned out not to be the tier's: left where it is."""
        with self._index.lock:
            self._disowned.update(keys)
            self._index.remove(keys)
            self._disowned.difference_update(keys)

    # ---- writes ------------------------------------------------------------------------

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        """Write ``items`` durably; the keys now held. A chunk that cannot be written (no
        room, disk full, I/O error) is refused and counted; nothing else changes."""
        start = time.perf_counter()
        checked_keys([k for k, _ in items])  # a clear ValueError, as get's, not a TypeError
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
        except OSError as e:  # full, read-only, an I/O error, or a foreign file in the way
            self._index.complete_store(handle, ok=False)
            self.stats.add(errors=1, foreign=int(isinstance(e, NotOurs)))
            return False
        return True

    def _write_file(self, key: ChunkKey, payload: BytesLike) -> None:
        tmp = self._aside(key, "tmp")
        record = encode(key, self.geometry, payload, self.seal)
        self._dir.create(tmp, record, self._writer, self.fsync)
        self._dir.publish(tmp, key.hex())

    def _aside(self, key: ChunkKey, kind: str) -> str:
        """A fresh name beside ``key``'s file for a temporary or a drop (diskdir's pattern)."""
        return f"{key.hex()}.{kind}-{os.getpid()}-{next(self._names)}"

    def _publish(self, written: list[StoreHandle]) -> list[ChunkKey]:
        """Make the renames durable, then the chunks visible; on failure, none of them."""
        ok = True
        if written and self.fsync:
            try:
                self._dir.sync()
            except OSError:
                ok = False
                self.stats.add(errors=1)
        for handle in written:
            self._index.complete_store(handle, ok=ok)
            if not ok:
                self._dir.unlink(handle.keys[0].hex())
        return [h.keys[0] for h in written] if ok else []

    def remove(self, keys: Sequence[ChunkKey]) -> None:
        """Drop the held ``keys`` that no read or write is using."""
        self._index.remove(keys)
        self._finish_drops()

    # ---- drops: rename aside under the lock, delete (or demote) after it ----------------

    def _on_drop(self, event: StoreEvent) -> None:
        """Index subscriber (under the index lock): move a dropped chunk's file aside."""
        if event.kind is EventKind.STORED or event.key in self._disowned:
            return
        aside = self._aside(event.key, "drop")
        try:
            self._dir.rename(event.key.hex(), aside)
        except FileNotFoundError:
            return
        except OSError:  # a read-only directory: the file stays, unindexed, until reopened
            self.stats.add(errors=1)
            return
        self._dropped.append((event.key, aside, event.kind is EventKind.EVICTED))

    def _finish_drops(self) -> None:
        with self._index.lock:
            dropped, self._dropped = self._dropped, []
        evicted = sum(1 for _, _, e in dropped if e)
        if evicted:
            self.stats.add(evicted=evicted)
        for key, name, was_evicted in dropped:
            if not self._dir.claims(name, key):  # replaced by someone else's: put it back
                self._restore(name, key)
                continue
            demote = self._demote
            if was_evicted and demote is not None:
                self._hand_down(key, name, demote)
            if not self._dir.unlink(name):
                self.stats.add(errors=1)  # left for the next open to clean up

    def _restore(self, name: str, key: ChunkKey) -> None:
        """Give a foreign file moved aside by a drop its name back (unless taken again)."""
        self.stats.add(foreign=1)
        try:
            self._dir.publish(name, key.hex(), keep=True)
        except OSError:
            self.stats.add(errors=1)

    def _hand_down(self, key: ChunkKey, name: str, demote: Demote) -> None:
        try:
            payload = self._load(name, key)
        except (OSError, RecordError):
            return  # a chunk that cannot be read back is not worth keeping below
        demote(key, bytes(payload))

    def set_demote(self, demote: Demote | None) -> None:
        """Hand evicted chunks to ``demote`` (write-back to the next tier) before deleting."""
        self._demote = demote

    # ---- asynchronous twins, recovery, checks, close -----------------------------------

    def _recover(self) -> None:
        """Delete the tier's own leftovers of killed processes; index each of its chunk
        files, oldest first; count (and log) foreign entries, touching none."""
        found, foreign, oversized = [], [], 0
        for entry in self._dir.scan():
            if entry.key is None:
                foreign.append(entry.name)
            elif entry.leftover or entry.size > self.record_bytes:
                self._dir.unlink(entry.name)  # its header proves it is the tier's
                oversized += not entry.leftover  # another slot size or seal: unreadable
            else:
                found.append(entry)
        self.stats.add(corrupt=oversized)
        for entry in sorted(found, key=_age):
            handle = self._index.prepare_store([entry.key])  # type: ignore[list-item]
            assert isinstance(handle, StoreHandle), handle  # one key always fits
            self._index.complete_store(handle, ok=True)
        self._finish_drops()
        if foreign:
            self.stats.add(foreign=len(foreign))
            _log.warning("disk tier %s: %d entries in chunks/ are not kvtier records; left "
                         "untouched (e.g. %s)", self.path, len(foreign), sorted(foreign)[:3])

    def check_invariants(self) -> None:
        self._index.check_invariants()

    def close(self) -> None:
        """Finish queued work, stop the workers and release the directory."""
        self._workers.close()
        self._reader.close()
        self._dir.close()


def _nbytes(payload: BytesLike) -> int:
    return memoryview(payload).nbytes  # type: ignore[arg-type]


def _age(entry: Entry) -> tuple[int, str]:
    return entry.mtime_ns, entry.name
