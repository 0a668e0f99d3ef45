"""What a chunk key's namespace is: everything that must match for two processes to share a
chunk's bytes (``Namespace``), and the digests that hash it into a chain's seed and each
group's tag (``kvtier.keys`` builds the keys).

Interpreted in the compiled build (``kvtier.keys`` is compiled): a dataclass compiled by
mypyc coerces its fields (a wrong type a ``TypeError``, not ``__post_init__``'s
``ValueError``), has no ``vars()``, and compiled code compares instances of a class defined
in a compiled module by identity unless the class itself spells out ``__eq__``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvtier.layout import LAYOUT_VERSION, Layout

HashName = Literal["blake2b", "sha256", "xxh3"]
DIGEST_SIZE = 32
TAG_SIZE = 8


def _hasher(name: HashName) -> Callable[[bytes], Any]:
    if name == "blake2b":
        return functools.partial(hashlib.blake2b, digest_size=DIGEST_SIZE)
    if name == "sha256":
        return hashlib.sha256
    if name == "xxh3":
        return _xxh3_hasher()
    raise ValueError(f"hash must be 'blake2b', 'sha256' or 'xxh3', got {name!r}")


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


def _encode_fields(fields: Sequence[str]) -> bytes:
    """Length-prefixed encoding, so that ('ab', 'c') and ('a', 'bc') differ."""
    out = bytearray()
    for f in fields:
        raw = f.encode()
        out += len(raw).to_bytes(4, "little") + raw
    return bytes(out)
