"""The record a chunk travels as below host memory: a fixed header, then the payload.

Disk and Redis are not byte-addressable host memory, so a chunk's bytes go down as one
self-describing record, verified on every read:

    offset  size  field
    0       4     magic  b"KVTR"
    4       2     version (1)
    6       2     seal: 0 plain, 1 HMAC, 2 AES-GCM (``kvtier.tiers.records.seal``)
    8       40    key: the ChunkKey the record claims to hold
    48      8     geometry: a fingerprint of the layout that produced the bytes
    56      8     body length (the bytes after the header)
    64      4     crc32 of the body (plain records; 0 when sealed)
    68      4     crc32 of bytes 0..67 (the header itself)
    72      ...   body: the payload (plain), or what the seal makes of it

A record is served only if the magic, version, seal (the reader's), key (the one asked
for), geometry (the reader's), length (the bytes present) and the body's check match;
anything else is a miss that the tier counts and drops. The checksum is the standard
CRC-32 (zlib's): computed by ISA-L (``isal``, the ``kvtier[fast]`` extra; about 40 GB/s
with carry-less multiply) when installed, else by zlib (about 2.5 GB/s: on a 2 MiB chunk
it costs as much as a quarter of a loopback Redis round trip); both give the same value,
so records written with one read with the other. It catches torn and flipped bytes but
not forgery: anyone who can write the
medium can write a well-formed record. Tiers that others can write to take a seal (a MAC,
or encryption) whose secret a forger does not have; the seal covers the header, so a
record moved under another key fails too.

>>> from kvtier.keys import ChunkKey
>>> k = ChunkKey(bytes(40))
>>> rec = b"".join(encode(k, b"geometry", b"payload"))
>>> len(rec), bytes(decode(rec, k, b"geometry"))
(79, b'payload')
>>> try:
...     decode(rec[:-1], k, b"geometry")
... except RecordError as e:
...     print(e)
record is 78 bytes, its header says 79 (truncated or padded)
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvtier.keys import ChunkKey
from kvtier.layout import Layout
from kvtier.store.backend import BytesLike
from kvtier.store.results import KEY_BYTES
from kvtier.tiers.records.errors import NotARecord, RecordError

if TYPE_CHECKING:
    from kvtier.tiers.records.seal import Seal

MAGIC = b"KVTR"
VERSION = 1
GEOMETRY_BYTES = 8
_HEAD = struct.Struct(f"<4sHH{KEY_BYTES}s{GEOMETRY_BYTES}sQI")
_HEAD_CRC = struct.Struct("<I")
HEADER_BYTES = _HEAD.size + _HEAD_CRC.size
"""72: every record's fixed overhead."""


def _crc32_function() -> tuple[Callable[..., int], str]:
    """The fastest CRC-32 installed, and its name: ISA-L's, else zlib's (the same value)."""
    try:
        from isal.isal_zlib import crc32
    except ImportError:
        return zlib.crc32, "zlib"
    return crc32, "isal"


crc32, CRC32_BY = _crc32_function()
"""The records' checksum (zlib's CRC-32), and which library computes it: "isal" or "zlib"."""


def geometry_of(layout: Layout) -> bytes:
    """An 8-byte hash of ``layout.fingerprint`` (model, KV dtype, groups: what the keys
    hash too): records written for another model, dtype or geometry are misses, whatever
    namespace their keys came from.

    >>> from kvtier.layout import Group, Layout
    >>> a = Layout((Group("full", 16, bytes_per_token=64),), kv_dtype="fp8_e4m3")
    >>> b = Layout((Group("full", 16, bytes_per_token=128),), kv_dtype="fp8_e4m3")
    >>> c = Layout(a.groups, kv_dtype="fp8_e5m2")
    >>> len(geometry_of(a)), geometry_of(a) == geometry_of(b), geometry_of(a) == geometry_of(c)
    (8, False, False)
    """
    identity = repr(layout.fingerprint).encode()
    return hashlib.blake2b(identity, digest_size=GEOMETRY_BYTES).digest()


def _geometry(geometry: bytes) -> bytes:
    if len(geometry) > GEOMETRY_BYTES:
        raise ValueError(f"geometry is at most {GEOMETRY_BYTES} bytes (geometry_of(layout))")
    return geometry.ljust(GEOMETRY_BYTES, b"\0")


def encode(
    key: ChunkKey, geometry: bytes, payload: BytesLike, seal: Seal | None = None
) -> list[BytesLike]:
    """The record of ``payload`` as buffers (the header first): write them all, in order.
    A ``seal`` authenticates (or encrypts) the payload in place of its crc32."""
    view = memoryview(payload).cast("B")  # type: ignore[arg-type]
    ident, extra = (0, 0) if seal is None else (seal.ident, seal.overhead)
    crc = crc32(view) if seal is None else 0
    head = _HEAD.pack(MAGIC, VERSION, ident, key, _geometry(geometry), view.nbytes + extra, crc)
    head += _HEAD_CRC.pack(crc32(head))
    return [head, view] if seal is None else [head, *seal.seal(head, view)]


def encode_pair(
    key: ChunkKey, geometry: bytes, payload: BytesLike, seal: Seal | None = None
) -> tuple[bytes, memoryview]:
    """``encode`` as (header, body): a plain body is the payload itself (no copy), a sealed
    one is joined into one buffer (one copy), for a medium that takes two buffers."""
    head, *body = encode(key, geometry, payload, seal)
    joined = body[0] if len(body) == 1 else b"".join(body)  # type: ignore[arg-type]
    return bytes(head), memoryview(joined).cast("B")  # type: ignore[arg-type]


def claimed_key(header: BytesLike) -> ChunkKey | None:
    """The key a kvtier record header claims (magic and header checksum intact), or None
    for bytes that are not the start of a kvtier record."""
    view = memoryview(header).cast("B")  # type: ignore[arg-type]
    if view.nbytes < HEADER_BYTES:
        return None
    magic, _, _, rkey, _, _, _ = _HEAD.unpack_from(view)
    (head_crc,) = _HEAD_CRC.unpack_from(view, _HEAD.size)
    if magic != MAGIC or head_crc != crc32(view[: _HEAD.size]):
        return None
    return ChunkKey(rkey)


def torn_header_of(start: bytes, key: ChunkKey) -> bool:
    """Whether ``start``, shorter than a header, is how a header for ``key`` begins as far
    as it goes (magic, version, key; the fields after the key cannot be told): a write
    killed before its header was whole. Empty bytes qualify.

    >>> k = ChunkKey(bytes(range(40)))
    >>> head = b"".join(encode(k, b"geometry", b"payload"))[:36]
    >>> other = ChunkKey(bytes(40))
    >>> torn_header_of(head, k), torn_header_of(head, other), torn_header_of(b"KVTX", k)
    (True, False, False)
    """
    if len(start) >= HEADER_BYTES:
        return False
    known = MAGIC + struct.pack("<H", VERSION)
    return (start[:len(known)] == known[:len(start)]
            and start[8:8 + KEY_BYTES] == key[:max(0, len(start) - 8)])


def record_length(header: BytesLike) -> int:
    """The full length the header of a record announces (its first HEADER_BYTES bytes)."""
    view = memoryview(header).cast("B")  # type: ignore[arg-type]
    if view.nbytes < HEADER_BYTES:
        raise NotARecord(f"record is {view.nbytes} bytes, shorter than its header")
    return HEADER_BYTES + int(_HEAD.unpack_from(view)[5])


def decode(
    record: BytesLike, key: ChunkKey, geometry: bytes, seal: Seal | None = None
) -> memoryview:
    """The payload of ``record`` if it holds ``key`` for ``geometry``, sealed as ``seal``
    (a view, no copy, for plain and MAC records); ``RecordError`` naming the first check
    that failed otherwise (``NotARecord`` for bytes that are not a kvtier record)."""
    view = memoryview(record).cast("B")  # type: ignore[arg-type]
    return decode_parts(view[:HEADER_BYTES], view[HEADER_BYTES:], key, geometry, seal)


def decode_parts(
    head: BytesLike, body: BytesLike, key: ChunkKey, geometry: bytes, seal: Seal | None = None
) -> memoryview:
    """``decode`` of a record read as two pieces, its first ``HEADER_BYTES`` bytes (fewer
    when the record is shorter) and the rest: the same checks, in the same order, and the
    payload a view of ``body`` for plain and MAC records (a body read straight into the
    host slot it is promoted into is not copied again)."""
    view = memoryview(head).cast("B")  # type: ignore[arg-type]
    rest = memoryview(body).cast("B")  # type: ignore[arg-type]
    total = record_length(view)
    if claimed_key(view) is None:
        raise NotARecord("bad magic or header checksum (not a kvtier record, or torn)")
    _, version, ident, rkey, rgeo, _, crc = _HEAD.unpack_from(view)
    if version != VERSION:
        raise RecordError(f"record version {version}, this kvtier reads {VERSION}")
    want = 0 if seal is None else seal.ident
    if ident != want:
        raise RecordError(f"record seal {ident}, this tier reads seal {want} (0: plain)")
    if rkey != key:
        raise RecordError("record holds another key")
    if rgeo != _geometry(geometry):
        raise RecordError("record was written for another layout geometry")
    if view.nbytes + rest.nbytes != total:
        raise RecordError(f"record is {view.nbytes + rest.nbytes} bytes, its header says "
                          f"{total} (truncated or padded)")
    if seal is not None:
        return seal.open(bytes(view), rest)
    if crc32(rest) != crc:
        raise RecordError("payload checksum mismatch (corrupted bytes)")
    return rest
