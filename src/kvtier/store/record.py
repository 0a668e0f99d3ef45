"""The record a chunk travels as below host memory: a fixed header, then the payload.

Disk and Redis are not byte-addressable host memory, so a chunk's bytes go down as one
self-describing record, verified on every read:

    offset  size  field
    0       4     magic  b"KVTR"
    4       2     version (1)
    6       2     reserved (0)
    8       40    key: the ChunkKey the record claims to hold
    48      8     geometry: a fingerprint of the layout that produced the bytes
    56      8     payload length
    64      4     crc32 of the payload
    68      4     crc32 of bytes 0..67 (the header itself)
    72      ...   payload

A record is served only if the magic, version, key (the one asked for), geometry (the
reader's), length (the bytes present) and both checksums match; anything else is a miss
that the tier counts and drops. crc32 (zlib, about 4 GB/s here, and it releases the GIL)
catches torn and flipped bytes; the key itself is a cryptographic digest, so a checksum
need not resist forgery.

>>> from kvtier.keys import ChunkKey
>>> k = ChunkKey(bytes(40))
>>> rec = b"".join(encode(k, b"geometry", b"payload"))
>>> len(rec), bytes(decode(rec, k, b"geometry"))
(79, b'payload')
>>> decode(rec[:-1], k, b"geometry")
Traceback (most recent call last):
...
kvtier.store.record.RecordError: record is 78 bytes, its header says 79 (truncated or padded)
"""

from __future__ import annotations

import hashlib
import struct
import zlib

from kvtier.keys import ChunkKey
from kvtier.layout import Layout
from kvtier.store.backend import BytesLike
from kvtier.store.results import KEY_BYTES

MAGIC = b"KVTR"
VERSION = 1
GEOMETRY_BYTES = 8
_HEAD = struct.Struct(f"<4sHH{KEY_BYTES}s{GEOMETRY_BYTES}sQI")
_HEAD_CRC = struct.Struct("<I")
HEADER_BYTES = _HEAD.size + _HEAD_CRC.size
"""72: every record's fixed overhead."""


class RecordError(ValueError):
    """A record failed verification: the tier treats it as a miss and drops it."""


def geometry_of(layout: Layout) -> bytes:
    """An 8-byte fingerprint of ``layout``'s groups: records from another layout are misses.

    >>> from kvtier.layout import Group, Layout
    >>> a = Layout((Group("full", 16, bytes_per_token=64),))
    >>> b = Layout((Group("full", 16, bytes_per_token=128),))
    >>> len(geometry_of(a)), geometry_of(a) == geometry_of(b)
    (8, False)
    """
    return hashlib.blake2b(repr(layout.groups).encode(), digest_size=GEOMETRY_BYTES).digest()


def _geometry(geometry: bytes) -> bytes:
    if len(geometry) > GEOMETRY_BYTES:
        raise ValueError(f"geometry is at most {GEOMETRY_BYTES} bytes (geometry_of(layout))")
    return geometry.ljust(GEOMETRY_BYTES, b"\0")


def encode(key: ChunkKey, geometry: bytes, payload: BytesLike) -> tuple[bytes, memoryview]:
    """The record of ``payload`` as (header, payload view): write both, in order."""
    view = memoryview(payload).cast("B")  # type: ignore[arg-type]
    head = _HEAD.pack(MAGIC, VERSION, 0, key, _geometry(geometry), view.nbytes, zlib.crc32(view))
    return head + _HEAD_CRC.pack(zlib.crc32(head)), view


def record_length(header: BytesLike) -> int:
    """The full length the header of a record announces (its first HEADER_BYTES bytes)."""
    view = memoryview(header).cast("B")  # type: ignore[arg-type]
    if view.nbytes < HEADER_BYTES:
        raise RecordError(f"record is {view.nbytes} bytes, shorter than its header")
    return HEADER_BYTES + int(_HEAD.unpack_from(view)[5])


def decode(record: BytesLike, key: ChunkKey, geometry: bytes) -> memoryview:
    """The payload of ``record`` (a view, no copy) if it holds ``key`` for ``geometry``;
    ``RecordError`` naming the first check that failed otherwise."""
    view = memoryview(record).cast("B")  # type: ignore[arg-type]
    total = record_length(view)
    magic, version, _, rkey, rgeo, _, crc = _HEAD.unpack_from(view)
    (head_crc,) = _HEAD_CRC.unpack_from(view, _HEAD.size)
    if magic != MAGIC or head_crc != zlib.crc32(view[: _HEAD.size]):
        raise RecordError("bad magic or header checksum (not a kvtier record, or torn)")
    if version != VERSION:
        raise RecordError(f"record version {version}, this kvtier reads {VERSION}")
    if rkey != key:
        raise RecordError("record holds another key")
    if rgeo != _geometry(geometry):
        raise RecordError("record was written for another layout geometry")
    if view.nbytes != total:
        raise RecordError(
            f"record is {view.nbytes} bytes, its header says {total} (truncated or padded)"
        )
    payload = view[HEADER_BYTES:]
    if zlib.crc32(payload) != crc:
        raise RecordError("payload checksum mismatch (corrupted bytes)")
    return payload
