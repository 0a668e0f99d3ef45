"""Chained, incremental keys for stored chunks.

A chunk's key identifies its namespace, its group and every token its KV depends on. The
token stream is hashed once, by one running hash seeded with the namespace, and its digest
is read at every *unit* boundary (``u`` tokens, the gcd of the groups' ``tokens_per_chunk``):
``spine[j] = H(seed || tokens[0 : (j+1)*u])``. Every chunk ends on a unit boundary, so the
key of chunk ``c`` of group ``g`` (``T`` tokens per chunk, lookahead ``d``) is

    group_tag(g) || spine[(c+1)*T/u - 1]                       when d == 0
    group_tag(g) || H(spine[(c+1)*T/u - 1] || tokens[e : e+d])  when d > 0, e = (c+1)*T

so one pass over the tokens serves every group, and a request costs O(tokens) however it
grows. The group tag hashes the namespace with the group's index and the layout's
fingerprint (model, KV dtype, every group's name, sizes, layers and shape), so those
separate keys even when a caller's namespace omits them. The digest
is sha256 (default; hardware-accelerated on current x86 and ARM CPUs) or blake2b: both are
cryptographic, so a party that shares the cache cannot forge a key that collides with
another prefix.

Compiled in the serving build (setup.py's ``COMPILED``); ``Namespace`` and its digests live
in ``kvtier.namespace``, interpreted (that module says why).
"""

from __future__ import annotations

import bisect
import functools
import math
import sys
from array import array
from collections.abc import Iterable
from typing import Any, Final, NewType, cast

import numpy as np

from kvtier.layout import Group, Layout
from kvtier.namespace import (  # re-exported: kvtier.keys is where callers import them from
    DIGEST_SIZE,
    TAG_SIZE,
    HashName,
    Namespace,
    _hasher,
    _xxh3_hasher,
)

try:  # the compiled build's C loop for the sha256 spine (setup.py, NATIVE); same digests
    from kvtier import _native
except ImportError:  # the pure build
    _native = None  # type: ignore[assignment]

__all__ = ["DIGEST_SIZE", "MAX_TOKEN_ID", "TAG_SIZE", "ChunkKey", "HashName", "KeyChain",
           "Namespace"]

ChunkKey = NewType("ChunkKey", bytes)
"""The identity of one stored chunk: an 8-byte group tag and a 32-byte prefix digest."""

MAX_TOKEN_ID: Final = 2**32 - 1
_SMALL: Final = 4096  # segments shorter than this absorb the next append

assert array("I").itemsize == 4, "kvtier keys need a 4-byte unsigned int array type"


def _running(name: HashName, seed: bytes) -> tuple[Any, bytes]:
    """The running hash of a chain, seeded, and the padding its digest needs to reach
    ``DIGEST_SIZE`` (xxh3's raw object: its wrapper would cost a Python call per method)."""
    if name != "xxh3":
        return _hasher(name)(seed), b""
    _xxh3_hasher()  # the clear error when the fast extra is missing
    import xxhash

    return xxhash.xxh3_128(seed), bytes(DIGEST_SIZE - 16)


class _Start:
    """What every chain of one namespace and layout starts from, computed once: the unit,
    the group tags, whether token bytes are kept (draft groups), the digest constructor,
    and the running hash seeded with the namespace (copied, never fed)."""

    def __init__(self, namespace: Namespace, layout: Layout) -> None:
        self.unit = math.gcd(*(g.tokens_per_chunk for g in layout.groups))
        self.tags = tuple(namespace.group_tag(layout, i) for i in range(len(layout.groups)))
        self.keep = any(g.lookahead for g in layout.groups)
        self.new = _hasher(namespace.hash_name)
        seed = namespace.seed()
        self.hash, self.pad = _running(namespace.hash_name, seed)
        # sha256 in the compiled build: the running state as bytes, fed by one C call per
        # extend instead of one hashlib call per unit (keys identical either way)
        self.state = (_native.sha256_start(seed)
                      if _native is not None and namespace.hash_name == "sha256" else None)
        self.per_chunk = tuple(g.tokens_per_chunk for g in layout.groups)  # (properties)
        self.lookahead = tuple(g.lookahead for g in layout.groups)


@functools.lru_cache(maxsize=1024)
def _start_of(namespace: Namespace, layout: Layout) -> _Start:
    return _Start(namespace, layout)


_STARTS: Final[dict[tuple[int, int], tuple[Namespace, Layout, _Start]]] = {}


def _start(namespace: Namespace, layout: Layout) -> _Start:
    """``_Start``, once per namespace and layout (every request of a tenant shares it):
    found by the objects' identity first (a request's chains share them; hashing a layout
    and a namespace is a Python call each), else by their value."""
    known = _STARTS.get((id(namespace), id(layout)))
    if known is not None and known[0] is namespace and known[1] is layout:
        return known[2]
    start = _start_of(namespace, layout)
    if len(_STARTS) >= 1024:
        _STARTS.clear()
    _STARTS[(id(namespace), id(layout))] = (namespace, layout, start)  # kept: ids stay theirs
    return start


class KeyChain:
    """Keys of one request's chunks, extended as tokens arrive.

    >>> from kvtier.layout import Group, Layout
    >>> chain = KeyChain(Layout((Group("full", 16),)), Namespace("demo"))
    >>> chain.extend(range(40))
    >>> chain.num_tokens, chain.key(0, 1) is not None, chain.key(0, 2)
    (40, True, None)

    Tokens are kept as the segments they arrived in (a long prompt is not copied), and the
    spine is hashed as units complete.
    """

    def __init__(self, layout: Layout, namespace: Namespace, tokens: Iterable[int] = ()) -> None:
        self.layout = layout
        self.namespace = namespace
        start = _start(namespace, layout)
        self._unit = start.unit
        self._per_chunk, self._lookahead = start.per_chunk, start.lookahead
        self._new = start.new
        self._tags = start.tags
        # The tokens, little-endian uint32, as appended: only draft groups' keys read them
        # again (their lookahead tails), so a layout without any keeps none.
        self._keep = start.keep
        self._segments: list[bytes] = []
        self._offsets: list[int] = []  # byte offset of each segment
        self._num_bytes = 0
        self._filled = 0  # bytes of the unit in progress already in the running hash
        self._drafts: dict[tuple[int, int], ChunkKey] = {}  # draft groups' keys, once hashed
        self._built: list[list[ChunkKey]] = [[] for _ in layout.groups]
        self._spine: list[bytes] = []
        # the C loop's state when kvtier._native is there now (a test takes it away)
        self._state = (bytearray(start.state) if start.state is not None and _native is not None
                       else None)
        # the running hash, fed only where there is no C state (else the start's, never fed)
        self._hash = start.hash.copy() if self._state is None else start.hash
        self._pad = start.pad
        self._origin: tuple[KeyChain, int] | None = None
        """The chain this one is a fork of and its tokens then (``continues``)."""
        self._frozen = False
        if type(tokens) is not tuple or tokens:  # () (a fork's blank): nothing to convert
            self.extend(tokens)

    @property
    def num_tokens(self) -> int:
        return self._num_bytes // 4

    def fork(self) -> KeyChain:
        """An independent copy: the same tokens and keys so far, extended apart from this
        chain from now on, with nothing hashed again (a prompt's chain forked to extend
        over its answer, the prompt's own kept for the planner)."""
        # a fresh chain (a compiled class has no __new__ that skips __init__), then a
        # copy of what changes as it extends
        twin = self._blank()
        twin._segments, twin._offsets = self._segments.copy(), self._offsets.copy()
        twin._num_bytes, twin._filled = self._num_bytes, self._filled
        twin._drafts = dict(self._drafts)
        twin._built = [built.copy() for built in self._built]
        twin._spine = self._spine.copy()
        twin._hash = self._hash.copy() if self._state is None else self._hash
        twin._state = None if self._state is None else bytearray(self._state)
        origin = self._origin
        twin._origin = (origin if origin is not None and origin[1] == self.num_tokens
                        else (self, self.num_tokens))
        return twin

    def freeze(self) -> None:
        """No more tokens: extending raises ``ValueError`` from now on (a fork may extend),
        so a planner given this chain takes it as it is (``Planner.add_request``) where
        it would fork it, and forks it only to extend it."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def _check_open(self) -> None:
        if self._frozen:
            raise ValueError("this KeyChain is frozen (KeyChain.freeze): extend a fork of it")

    def continues(self, other: KeyChain) -> bool:
        """Whether this chain is ``other`` extended: both are forks of one chain at the same
        length (or this one a fork of ``other``), and ``other`` has not been extended since
        (``Planner.append_tokens`` takes such a chain without hashing its tokens again)."""
        at = other._origin if other._origin is not None else (other, other.num_tokens)
        mine = self._origin
        return (mine is not None and mine[0] is at[0] and mine[1] == at[1]
                and other.num_tokens == at[1] and self.num_tokens >= at[1])

    def _blank(self) -> KeyChain:
        """A chain of this one's kind, layout and namespace with no tokens (``fork``'s
        start; a subclass that hashes otherwise returns one of its own, with its state)."""
        return KeyChain(self.layout, self.namespace)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens and hash every unit they complete (no copy of long inputs)."""
        self._append(_token_bytes(tokens))

    def _append(self, data: bytes | memoryview) -> None:
        """``extend`` of tokens already made little-endian uint32 bytes."""
        self._check_open()
        if not len(data):
            return
        if self._keep and self._segments and len(self._segments[-1]) < _SMALL:
            self._segments[-1] += data  # decoding: merge small appends
        elif self._keep:
            self._segments.append(bytes(data))
            self._offsets.append(self._num_bytes)
        self._num_bytes += len(data)
        self._advance_spine(data)

    def _advance_spine(self, data: bytes | memoryview) -> None:
        """Feed the running hash; read its digest at every unit boundary ``data`` crosses."""
        if self._state is not None:
            digests, self._filled = _native.sha256_spine(self._state, data, self._filled,
                                                         self._unit * 4)
            self._spine += digests
            return
        step, n = self._unit * 4, len(data)
        view, h, pad, append = memoryview(data), self._hash, self._pad, self._spine.append
        pos = step - self._filled
        if pos > n:
            h.update(data)
            self._filled += n
            return
        h.update(view[:pos])
        append(h.digest() + pad)
        if pad:
            while pos + step <= n:
                h.update(view[pos : pos + step])
                append(h.digest() + pad)
                pos += step
        else:  # the cryptographic hashes: the loop every long prompt runs, kept bare
            while pos + step <= n:
                h.update(view[pos : pos + step])
                append(h.digest())
                pos += step
        h.update(view[pos:])
        self._filled = n - pos

    def _byte_slice(self, lo: int, hi: int) -> bytes:
        """Token bytes ``[lo, hi)`` across segments."""
        i = bisect.bisect_right(self._offsets, lo) - 1
        out = bytearray()
        while lo < hi:
            seg, start = self._segments[i], self._offsets[i]
            piece = seg[lo - start : hi - start]
            out += piece
            lo += len(piece)
            i += 1
        return bytes(out)

    def key(self, group_index: int, chunk: int) -> ChunkKey | None:
        """The key of ``chunk`` of group ``group_index``; None until its tokens are known."""
        group: Group = self.layout.groups[group_index]
        if chunk < 0:
            raise ValueError(f"chunk index must be >= 0, got {chunk}")
        end = (chunk + 1) * group.tokens_per_chunk
        if end + group.lookahead > self.num_tokens:
            return None
        if group.lookahead:
            known = self._drafts.get((group_index, chunk))
            if known is None:
                tail = self._byte_slice(end * 4, (end + group.lookahead) * 4)
                digest = self._new(self._spine[end // self._unit - 1] + tail).digest()
                known = self._drafts[(group_index, chunk)] = ChunkKey(self._tags[group_index]
                                                                     + digest)
            return known
        return ChunkKey(self._tags[group_index] + self._spine[end // self._unit - 1])

    def keys(self, group_index: int, chunks: Iterable[int]) -> list[ChunkKey]:
        """Keys of several chunks; raises if any chunk's tokens are not all known yet."""
        per_chunk, lookahead = self._per_chunk[group_index], self._lookahead[group_index]
        if isinstance(chunks, range) and chunks.step == 1:  # the common case: no scan
            if not chunks:
                return []
            low, high = chunks.start, chunks.stop - 1
        else:
            chunks = list(chunks)
            if not chunks:
                return []
            low, high = min(chunks), max(chunks)
        if low < 0:
            raise ValueError(f"chunk index must be >= 0, got {low}")
        if (high + 1) * per_chunk + lookahead > self.num_tokens:
            raise ValueError(f"chunk {high} of group {group_index} needs tokens not known yet")
        if lookahead:
            return [self.key(group_index, c) for c in chunks]  # type: ignore[misc]
        built = self._built[group_index]  # this group's keys from chunk 0, built once
        tag, per = self._tags[group_index], per_chunk // self._unit
        if len(built) + _NEAR < low:  # far past the built prefix (a long prompt's window)
            keys = _tagged(tag, self._spine[(low + 1) * per - 1 : (high + 1) * per : per])
            return keys if isinstance(chunks, range) else [keys[c - low] for c in chunks]
        if len(built) <= high:
            built += _tagged(tag, self._spine[(len(built) + 1) * per - 1 : (high + 1) * per : per])
        if isinstance(chunks, range):  # the common case: one slice
            return built[low : high + 1]
        return [built[c] for c in chunks]


_NEAR: Final = 64
"""A window's chunks at most this far past a group's built keys extend them (cached for
the next lookup) rather than being built apart each time."""


def _tagged(tag: bytes, digests: list[bytes]) -> list[ChunkKey]:
    """``[tag + d for d in digests]``: one group's keys (in C when kvtier._native is built)."""
    if _native is not None:
        return cast(list[ChunkKey], _native.prefixed(tag, digests))
    return cast(list[ChunkKey], [tag + d for d in digests])  # NewType: no call


def _token_bytes(tokens: Iterable[int]) -> bytes | memoryview:
    """Token ids as little-endian uint32 bytes (a numpy array's own memory when it already
    is; read at once, never kept); ValueError for anything else."""
    if isinstance(tokens, np.ndarray):
        return _numpy_bytes(tokens)
    if hasattr(tokens, "dtype") and hasattr(tokens, "tolist"):
        tokens = tokens.tolist()  # torch and friends: validate as Python ints
    try:
        arr = array("I", tokens)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"token ids must be integers in [0, {MAX_TOKEN_ID}]: {e}") from None
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def _numpy_bytes(tokens: np.ndarray) -> memoryview:
    """Fast path: validate bounds vectorised, then convert once."""
    bad = f"token ids must be integers in [0, {MAX_TOKEN_ID}]"
    if tokens.dtype.kind not in "iu":
        raise ValueError(f"{bad}, got dtype {tokens.dtype}")
    fits = tokens.dtype.kind == "u" and tokens.dtype.itemsize <= 4  # no bound to check
    if tokens.size and not fits and (int(tokens.min()) < 0 or int(tokens.max()) > MAX_TOKEN_ID):
        raise ValueError(bad)
    contiguous = np.ascontiguousarray(tokens.ravel(), dtype="<u4")
    return memoryview(contiguous.data).cast("B")
