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
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NewType, cast

import numpy as np

from kvtier.layout import LAYOUT_VERSION, Group, Layout

try:  # the compiled build's C loop for the sha256 spine (setup.py, NATIVE); same digests
    from kvtier import _native
except ImportError:  # the pure build
    _native = None  # type: ignore[assignment]

ChunkKey = NewType("ChunkKey", bytes)
"""The identity of one stored chunk: an 8-byte group tag and a 32-byte prefix digest."""

HashName = Literal["blake2b", "sha256", "xxh3"]
DIGEST_SIZE = 32
TAG_SIZE = 8
MAX_TOKEN_ID = 2**32 - 1
_SMALL = 4096  # segments shorter than this absorb the next append

assert array("I").itemsize == 4, "kvtier keys need a 4-byte unsigned int array type"


def _hasher(name: HashName) -> Callable[[bytes], Any]:
    if name == "blake2b":
        return functools.partial(hashlib.blake2b, digest_size=DIGEST_SIZE)
    if name == "sha256":
        return hashlib.sha256
    if name == "xxh3":
        return _xxh3_hasher()
    raise ValueError(f"hash must be 'blake2b', 'sha256' or 'xxh3', got {name!r}")


def _running(name: HashName, seed: bytes) -> tuple[Any, bytes]:
    """The running hash of a chain, seeded, and the padding its digest needs to reach
    ``DIGEST_SIZE`` (xxh3's raw object: its wrapper would cost a Python call per method)."""
    if name != "xxh3":
        return _hasher(name)(seed), b""
    _xxh3_hasher()  # the clear error when the fast extra is missing
    import xxhash

    return xxhash.xxh3_128(seed), bytes(DIGEST_SIZE - 16)


def _xxh3_hasher() -> Callable[[bytes], Any]:
    """xxh3-128, opt-in and NOT cryptographic: only where no untrusted party shares the
    cache (DESIGN section 4). About 2x faster than sha256 for a long prompt's keys. Its
    16-byte digest is padded to the 32 bytes every key carries."""
    try:
        import xxhash
    except ImportError:
        raise ValueError(
            "hash 'xxh3' needs the xxhash package: pip install 'kvtier[fast]'"
        ) from None
    pad = bytes(DIGEST_SIZE - 16)

    class Xxh3:
        __slots__ = ("_h",)

        def __init__(self, data: bytes = b"") -> None:
            self._h = xxhash.xxh3_128(data)

        def update(self, data: Any) -> None:
            self._h.update(data)

        def digest(self) -> bytes:
            return bytes(self._h.digest()) + pad

    return Xxh3


@dataclass(frozen=True)
class Namespace:
    """Everything that must match for two processes to share a chunk's bytes."""

    model: str
    """Model identity, e.g. ``meta-llama/Llama-3.1-8B``."""
    revision: str = ""
    """Model revision (weights version); different revisions never share KV."""
    kv_dtype: str = "bfloat16"
    """KV-cache dtype."""
    parallel: str = "tp1"
    """Parallel layout of the KV cache (tensor/pipeline parallel rank and size)."""
    tenant_salt: str = ""
    """Optional per-tenant salt: tenants with different salts never share a hit."""
    hash_name: HashName = "sha256"
    """Digest used for the chain: ``sha256`` or ``blake2b`` (cryptographic), or the opt-in,
    faster, non-cryptographic ``xxh3`` (needs the ``fast`` extra) for a cache no untrusted
    party shares."""
    layout_version: int = LAYOUT_VERSION
    """kvtier's layout version."""
    layout_fields: Literal["all", "group"] = "all"
    """What of the layout a group tag hashes: ``all`` (default), its whole fingerprint
    (``Layout.fingerprint``), so two layouts whose chunks differ never share a key;
    ``group``, only the group's own geometry with the model and KV dtype, as kvtier did
    before: the trace replay keeps it so that its figures stay comparable with earlier
    runs. Never share a tier between deployments under ``group``."""

    def __post_init__(self) -> None:
        _hasher(self.hash_name)
        for name in ("model", "revision", "kv_dtype", "parallel", "tenant_salt"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"namespace: {name} must be a string")
        if not self.model:
            raise ValueError("namespace: model must name the model (e.g. its Hugging Face id)")
        if self.layout_fields not in ("all", "group"):
            raise ValueError(f"namespace: layout_fields must be 'all' or 'group', got "
                             f"{self.layout_fields!r}")

    def seed(self) -> bytes:
        """The chain's starting digest: a hash of every field."""
        fields = (
            self.model, self.revision, self.kv_dtype, self.parallel,
            self.tenant_salt, self.hash_name, str(self.layout_version),
        )
        return _hasher(self.hash_name)(_encode_fields(("kvtier-ns", *fields))).digest()

    def group_tag(self, layout: Layout, group_index: int) -> bytes:
        """8 bytes naming one group of one layout within this namespace.

        The whole layout's fingerprint (``Layout.fingerprint``: model, KV dtype, every
        group's name, sizes, layers and shape) is hashed in, whatever this namespace says:
        a caller who leaves the namespace at its defaults still never shares a key between
        two layouts whose chunks differ, so two deployments never read, nor delete as
        corrupt, each other's chunks. ``extra_retained`` is left out on purpose: it changes
        what the engine keeps, not the bytes of a chunk, so producers and consumers with
        different ``E`` share chunks.
        """
        if self.layout_fields == "all":
            fields = (*layout.fingerprint, str(group_index))
        else:
            fields = _group_fields(layout, group_index)
        digest = _hasher(self.hash_name)(_encode_fields(fields) + self.seed()).digest()
        return digest[:TAG_SIZE]


def _group_fields(layout: Layout, group_index: int) -> tuple[str, ...]:
    """What ``layout_fields="group"`` hashes: the group's geometry, the model and KV dtype."""
    g = layout.groups[group_index]
    return (layout.model, layout.kv_dtype,
            str(group_index), g.kind, str(g.tokens_per_block), str(g.blocks_per_chunk),
            str(g.window), str(g.chunk), str(g.lookahead), str(g.bytes_per_token),
            str(g.bytes_per_state))


@functools.lru_cache(maxsize=1024)
def _seed(namespace: Namespace) -> bytes:
    """``namespace.seed()``, once per namespace (every request of a tenant shares it)."""
    return namespace.seed()


@functools.lru_cache(maxsize=1024)
def _group_tags(namespace: Namespace, layout: Layout) -> tuple[bytes, ...]:
    """Every group's ``group_tag``, once per namespace and layout."""
    return tuple(namespace.group_tag(layout, i) for i in range(len(layout.groups)))


def _encode_fields(fields: Sequence[str]) -> bytes:
    """Length-prefixed encoding, so that ('ab', 'c') and ('a', 'bc') differ."""
    out = bytearray()
    for f in fields:
        raw = f.encode()
        out += len(raw).to_bytes(4, "little") + raw
    return bytes(out)


def _gcd_unit(layout: Layout) -> int:
    return math.gcd(*(g.tokens_per_chunk for g in layout.groups))


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
        self._unit = _gcd_unit(layout)
        self._new = _hasher(namespace.hash_name)
        self._tags = _group_tags(namespace, layout)
        # The tokens, little-endian uint32, as appended: only draft groups' keys read them
        # again (their lookahead tails), so a layout without any keeps none.
        self._keep = any(g.lookahead for g in layout.groups)
        self._segments: list[bytes] = []
        self._offsets: list[int] = []  # byte offset of each segment
        self._num_bytes = 0
        self._filled = 0  # bytes of the unit in progress already in the running hash
        self._drafts: dict[tuple[int, int], ChunkKey] = {}  # draft groups' keys, once hashed
        self._built: list[list[ChunkKey]] = [[] for _ in layout.groups]
        self._spine: list[bytes] = []
        self._hash, self._pad = _running(namespace.hash_name, _seed(namespace))
        # sha256 in the compiled build: the running state as bytes, fed by one C call per
        # extend instead of one hashlib call per unit (keys identical either way)
        self._state = (_native.sha256_start(_seed(namespace))
                       if _native is not None and namespace.hash_name == "sha256" else None)
        self.extend(tokens)

    @property
    def num_tokens(self) -> int:
        return self._num_bytes // 4

    def fork(self) -> KeyChain:
        """An independent copy: the same tokens and keys so far, extended apart from this
        chain from now on, with nothing hashed again (a prompt's chain forked to extend
        over its answer, the prompt's own kept for the planner)."""
        twin = KeyChain.__new__(KeyChain)  # copy.copy, without its generic protocol (5x)
        twin.__dict__.update(self.__dict__)  # then a copy of what changes as it extends
        twin._segments, twin._offsets = self._segments.copy(), self._offsets.copy()
        twin._drafts = dict(self._drafts)
        twin._built = [built.copy() for built in self._built]
        twin._spine = self._spine.copy()
        twin._hash = self._hash.copy()
        twin._state = None if self._state is None else bytearray(self._state)
        return twin

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens and hash every unit they complete (no copy of long inputs)."""
        data = _token_bytes(tokens)
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
        group = self.layout.groups[group_index]
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
        if (high + 1) * group.tokens_per_chunk + group.lookahead > self.num_tokens:
            raise ValueError(f"chunk {high} of group {group_index} needs tokens not known yet")
        if group.lookahead:
            return [self.key(group_index, c) for c in chunks]  # type: ignore[misc]
        built = self._built[group_index]  # this group's keys from chunk 0, built once
        tag, per = self._tags[group_index], group.tokens_per_chunk // self._unit
        if len(built) + _NEAR < low:  # far past the built prefix (a long prompt's window)
            keys = _tagged(tag, self._spine[(low + 1) * per - 1 : (high + 1) * per : per])
            return keys if isinstance(chunks, range) else [keys[c - low] for c in chunks]
        if len(built) <= high:
            built += _tagged(tag, self._spine[(len(built) + 1) * per - 1 : (high + 1) * per : per])
        if isinstance(chunks, range):  # the common case: one slice
            return built[low : high + 1]
        return [built[c] for c in chunks]


_NEAR = 64
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
