"""Chained, incremental keys for stored chunks.

A chunk's key identifies its namespace, its group and every token its KV depends on. The
token stream is hashed once, as a chain over *units* of ``u`` tokens (``u`` the gcd of the
groups' ``tokens_per_chunk``): ``spine[j] = H(spine[j-1] || tokens[j*u : (j+1)*u])`` with
``spine[-1]`` the namespace seed. Every chunk ends on a unit boundary, so the key of
chunk ``c`` of group ``g`` (``T`` tokens per chunk, lookahead ``d``) is

    group_tag(g) || spine[(c+1)*T/u - 1]                       when d == 0
    group_tag(g) || H(spine[(c+1)*T/u - 1] || tokens[e : e+d])  when d > 0, e = (c+1)*T

so one pass over the tokens serves every group, and a request costs O(tokens) however it
grows. The digest is blake2b (default) or sha256: both are cryptographic, so a party that
shares the cache cannot forge a key that collides with another prefix.
"""

from __future__ import annotations

import hashlib
import math
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NewType

from kvtier.layout import LAYOUT_VERSION, Group, Layout

ChunkKey = NewType("ChunkKey", bytes)
"""The identity of one stored chunk: an 8-byte group tag and a 32-byte prefix digest."""

HashName = Literal["blake2b", "sha256"]
DIGEST_SIZE = 32
TAG_SIZE = 8
MAX_TOKEN_ID = 2**32 - 1


def _hasher(name: HashName) -> Callable[[bytes], Any]:
    if name == "blake2b":
        return lambda data: hashlib.blake2b(data, digest_size=DIGEST_SIZE)
    if name == "sha256":
        return hashlib.sha256
    raise ValueError(f"hash must be 'blake2b' or 'sha256', got {name!r}")


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
    hash_name: HashName = "blake2b"
    """Digest used for the chain."""
    layout_version: int = LAYOUT_VERSION
    """kvtier's layout version."""

    def __post_init__(self) -> None:
        _hasher(self.hash_name)
        for name in ("model", "revision", "kv_dtype", "parallel", "tenant_salt"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"namespace: {name} must be a string")
        if not self.model:
            raise ValueError("namespace: model must name the model (e.g. its Hugging Face id)")

    def seed(self) -> bytes:
        """The chain's starting digest: a hash of every field."""
        fields = (
            self.model, self.revision, self.kv_dtype, self.parallel,
            self.tenant_salt, self.hash_name, str(self.layout_version),
        )
        return _hasher(self.hash_name)(_encode_fields(("kvtier-ns", *fields))).digest()

    def group_tag(self, layout: Layout, group_index: int) -> bytes:
        """8 bytes naming one group's geometry within this namespace.

        ``extra_retained`` is left out on purpose: it changes what the engine keeps, not
        the bytes of a chunk, so producers and consumers with different ``E`` share chunks.
        """
        g = layout.groups[group_index]
        geometry = (
            str(group_index), g.kind, str(g.tokens_per_block), str(g.blocks_per_chunk),
            str(g.window), str(g.chunk), str(g.lookahead), str(g.bytes_per_token),
            str(g.bytes_per_state),
        )
        return _hasher(self.hash_name)(_encode_fields((*geometry,)) + self.seed()).digest()[:TAG_SIZE]


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
    """

    def __init__(self, layout: Layout, namespace: Namespace, tokens: Iterable[int] = ()) -> None:
        self.layout = layout
        self.namespace = namespace
        self._unit = _gcd_unit(layout)
        self._new = _hasher(namespace.hash_name)
        self._tags = [namespace.group_tag(layout, i) for i in range(len(layout.groups))]
        self._tokens = array("I")
        self._bytes = bytearray()
        self._spine: list[bytes] = []
        self._seed = namespace.seed()
        self.extend(tokens)

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> Sequence[int]:
        """The tokens so far (read-only view; do not modify)."""
        return self._tokens

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens and hash every unit they complete."""
        new = _to_array(tokens)
        self._tokens.extend(new)
        if sys.byteorder == "big":
            new.byteswap()
        self._bytes += new.tobytes()
        self._advance_spine()

    def _advance_spine(self) -> None:
        step = self._unit * 4
        data = self._bytes
        prev = self._spine[-1] if self._spine else self._seed
        start = len(self._spine) * step
        new = self._new
        while start + step <= len(data):
            prev = new(prev + data[start : start + step]).digest()
            self._spine.append(prev)
            start += step

    def key(self, group_index: int, chunk: int) -> ChunkKey | None:
        """The key of ``chunk`` of group ``group_index``; None until its tokens are known."""
        group: Group = self.layout.groups[group_index]
        if chunk < 0:
            raise ValueError(f"chunk index must be >= 0, got {chunk}")
        end = (chunk + 1) * group.tokens_per_chunk
        if end + group.lookahead > len(self._tokens):
            return None
        base = self._spine[end // self._unit - 1]
        if group.lookahead:
            tail = self._bytes[end * 4 : (end + group.lookahead) * 4]
            base = self._new(base + tail).digest()
        return ChunkKey(self._tags[group_index] + base)

    def keys(self, group_index: int, chunks: Iterable[int]) -> list[ChunkKey]:
        """Keys of several chunks; raises if any chunk's tokens are not all known yet."""
        out = []
        for c in chunks:
            k = self.key(group_index, c)
            if k is None:
                raise ValueError(f"chunk {c} of group {group_index} needs tokens not known yet")
            out.append(k)
        return out


def _to_array(tokens: Iterable[int]) -> array[int]:
    if hasattr(tokens, "dtype") and hasattr(tokens, "tolist"):
        tokens = tokens.tolist()  # numpy or torch: validate as Python ints
    try:
        return array("I", tokens)
    except (OverflowError, TypeError) as e:
        raise ValueError(
            f"token ids must be integers in [0, {MAX_TOKEN_ID}]: {e}"
        ) from None
