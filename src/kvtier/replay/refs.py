"""What each request of a trace references: a replay stream and its chunk keys.

A trace has no tokens, only block ids (``hash_ids``), each naming one ``block_tokens``-token
block and its whole prefix. The replay gives every request a synthetic token stream in
which block ``j`` is filled with its id (the low and high 32-bit halves of the id,
alternating), so two requests share a token prefix exactly as far as their id lists agree.

>>> stream = token_stream((5, 2**32 + 7), block_tokens=4)
>>> stream.tolist()
[5, 0, 5, 0, 7, 1, 7, 1]

Its keys come from a ``ReplayChain``: a ``KeyChain`` (the same groups, units, tags, draft
tails and forks) whose digests hash each block's id, not its 512 tokens, so that a request
costs a hash of a few dozen bytes per unit rather than of 2 KiB per block (issue 32: "keys
from the trace's block ids"). Two keys are equal exactly when the token hash's would be:
the figures do not move, but for policies that pick cells by the key bytes themselves
(``s3fifo``'s and ``pfreq``'s ghost filters and sketches, ``ghost.stable_hash``). Chunks
whose size is not the trace's block size (256-token presets) work unchanged.

The stream covers every block the trace names, the last one whole even when the prompt
ends inside it (``StoreScope``): a later request that names the same id gets the same
key. ``RequestRefs`` lists, once per request, the chunks it references: exactly
``coverage.store_set`` of every group over the stored scope, in the order the planner
stores them. The replay uses them to read the store before the planner does (the block
hit), to refresh chunks the request references but does not load, and to give Belady
the future.
"""

from __future__ import annotations

import functools
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from kvtier import coverage
from kvtier.keys import ChunkKey, KeyChain, Namespace, _token_bytes
from kvtier.layout import Layout
from kvtier.replay.trace import TraceRequest

try:  # the serving build's C loop for sha256 digests (ReplayChain._feed); the same digests
    from kvtier import _native
except ImportError:  # the pure build
    _native = None  # type: ignore[assignment]

StoreScope = Literal["blocks", "prompt"]
"""What a request stores: ``blocks``, every block the trace names (the last one whole, as
Mooncake's cache keeps it); ``prompt``, only chunks that lie within the prompt."""
STORE_SCOPES: tuple[str, ...] = ("blocks", "prompt")


def token_stream(hash_ids: tuple[int, ...], block_tokens: int) -> npt.NDArray[np.uint32]:
    """``block_tokens`` tokens per id: its low and high 32-bit halves, alternating."""
    ids = np.asarray(hash_ids, dtype="<u8")  # little-endian: its 32-bit halves low first
    reps = -(-block_tokens // 2)
    if block_tokens % 2 == 0:  # whole pairs: one repeat, faster than np.tile or the fill below
        return np.repeat(ids.view("<u4").reshape(len(ids), 1, 2), reps, axis=1).reshape(-1)
    fill = np.empty((len(ids), reps, 2), dtype=np.uint32)
    fill[:] = ids.view("<u4").reshape(len(ids), 1, 2)
    return fill.reshape(len(ids), 2 * reps)[:, :block_tokens].reshape(-1)


def token_span(hash_ids: tuple[int, ...], block_tokens: int, start: int, stop: int
               ) -> npt.NDArray[np.uint32]:
    """``token_stream(hash_ids, block_tokens)[start:stop]``, made of the blocks it covers
    only (a prompt's last, partial block, without the prompt before it).

    >>> token_span((5, 2**32 + 7, 9), block_tokens=4, start=6, stop=9).tolist()
    [7, 1, 9]
    """
    first, last = start // block_tokens, -(-stop // block_tokens)
    skip = first * block_tokens
    return token_stream(hash_ids[first:last], block_tokens)[start - skip : stop - skip]


class ReplayChain(KeyChain):
    """A ``KeyChain`` over a replay stream that hashes each block's id rather than its tokens.

    In a replay stream block ``b`` (tokens ``[b*B, (b+1)*B)``) is its id's two halves
    repeated, so the tokens before a position ``t`` inside it are fixed by the blocks before
    ``b`` and by ``b``'s first ``min(t - b*B, 2)`` tokens (its *head*) and ``t - b*B``. The
    digest at a unit boundary ``t`` is therefore ``H(P_b || head || t - b*B)``, where ``P_b``
    is the digest at the end of block ``b - 1`` (the namespace's seed for block 0): equal
    exactly when the tokens before ``t`` are, as ``KeyChain``'s ``H(seed || tokens[:t])``
    is. Only replay streams may be fed (``extend``, ``extend_blocks``): it reads no token
    of a block past its head.
    """

    def __init__(self, layout: Layout, namespace: Namespace, block_tokens: int,
                 origin: bytes | None = None) -> None:
        """``origin``: ``namespace.seed()``, where the caller has it (a namespace's hash
        is a Python call: ``RefsPlanner`` asks once, not per request)."""
        self.block_tokens = block_tokens
        # P of the block the stream ends in
        self._prefix = _origin(namespace) if origin is None else origin
        self._head = b""  # that block's head, as far as it is known (at most 8 bytes)
        self._pending = (b"", b"")  # extend's heads, for _advance_spine
        super().__init__(layout, namespace)

    def _blank(self) -> KeyChain:
        twin = ReplayChain(self.layout, self.namespace, self.block_tokens, self._prefix)
        twin._head = self._head
        return twin

    def extend_blocks(self, hash_ids: Sequence[int], stop: int, packed: bytes | None = None
                      ) -> None:
        """Extend to ``stop`` tokens of the replay stream of ``hash_ids`` (every block's id
        from block 0): ``extend(token_span(hash_ids, block_tokens, num_tokens, stop))``,
        with no token made (but for draft groups, whose keys read tokens back).
        ValueError if the ids name fewer than ``stop`` tokens. ``packed``: the ids as
        little-endian uint64s (``_u64_bytes``), where the caller packed them once."""
        start, width = self.num_tokens, self.block_tokens
        self._check_open()
        if stop > len(hash_ids) * width:
            raise ValueError(f"ReplayChain.extend_blocks: {len(hash_ids)} ids of {width} "
                             f"tokens name {len(hash_ids) * width} tokens, not {stop}")
        if packed is not None and len(packed) != 8 * len(hash_ids):
            raise ValueError(f"ReplayChain.extend_blocks: {len(packed)} packed bytes for "
                             f"{len(hash_ids)} ids; pack 8 per id (or pass none)")
        if stop <= start:
            return
        if self._keep:
            self.extend(token_span(tuple(hash_ids), width, start, stop))
            return
        first, last = start // width, (stop - 1) // width
        heads = (_u64_bytes(hash_ids[first : last + 1]) if packed is None  # = the heads
                 else packed[8 * first : 8 * (last + 1)])
        self._num_bytes += 4 * (stop - start)
        self._feed(start, stop, first, heads)
        self._head = heads[-8:][: 4 * min(2, width)] if stop % width else b""

    def extend(self, tokens: Iterable[int]) -> None:
        """``KeyChain.extend``; ValueError, with the chain unchanged, for tokens that are not
        the replay stream's (each block its first two tokens repeated)."""
        data = _token_bytes(tokens)
        if len(data):
            self._pending = self._read_heads(data)
            self._append(data)

    def _read_heads(self, data: bytes | memoryview) -> tuple[bytes, bytes]:
        """The heads of the blocks ``data`` (tokens from ``num_tokens`` on) reaches, 8 bytes
        each (zeros past the tokens known: ``_feed`` reads none of them), and the last
        one as far as it is known; checks that each block repeats its head."""
        start, width = self.num_tokens, self.block_tokens
        end, size = start + len(data) // 4, 4 * min(2, width)
        heads, head = bytearray(), b""
        for b in range(start // width, (end - 1) // width + 1):
            at = (b * width - start) * 4  # where block b begins in data, in bytes
            head = (bytes(data[at : at + size]) if at >= 0 else
                    (self._head + bytes(data[: max(0, size + at)]))[:size])
            padded = head.ljust(8, b"\0")
            lo, hi = max(at, 0), min(at + 4 * width, len(data))
            if bytes(data[lo:hi]) != (padded * (width // 2 + 1))[lo - at : hi - at]:
                raise ValueError(
                    f"ReplayChain: tokens {start + lo // 4}..{start + hi // 4 - 1} do not "
                    f"repeat block {b}'s first two: it keys replay streams only "
                    "(token_stream); use a KeyChain for other tokens")
            heads += padded
        return bytes(heads), head

    def _advance_spine(self, data: bytes | memoryview) -> None:
        """``KeyChain.extend``'s hashing, from the heads ``extend`` read."""
        heads, head = self._pending
        end = self._num_bytes // 4
        start = end - len(data) // 4
        self._feed(start, end, start // self.block_tokens, heads)
        self._head = head if end % self.block_tokens else b""

    def _feed(self, start: int, end: int, first: int, heads: bytes) -> None:
        """The digests at every unit boundary in ``(start, end]``, block ``first + i``'s
        head being ``heads[8*i : 8*i + 8]``; ``P`` carried over every block end."""
        if self._state is not None:  # sha256 in the serving build: the same loop in C
            digests, self._prefix = _native.sha256_blocks(self._prefix, heads, start, end,
                                                          first, self.block_tokens, self._unit)
            self._spine += digests
            return
        width, unit, new, spine = self.block_tokens, self._unit, self._new, self._spine
        prefix, b0, i = self._prefix, first * width, 0
        while b0 < end:
            head, block_end = heads[i : i + 8], b0 + width
            stop = min(end, block_end)
            t = (max(start, b0) // unit + 1) * unit
            while t <= stop:
                off = t - b0
                spine.append(new(prefix + head[: 4 * min(off, 2)]
                                 + off.to_bytes(8, "little")).digest())
                t += unit
            if stop == block_end:
                prefix = (spine[-1] if block_end % unit == 0 else
                          new(prefix + head[: 4 * min(width, 2)]
                              + width.to_bytes(8, "little")).digest())
            b0, i = block_end, i + 8
        self._prefix = prefix


def _u64_bytes(ids: Sequence[int]) -> bytes:
    """``ids`` as little-endian uint64s (``np.asarray(ids, "<u8").tobytes()``, without
    numpy's fixed cost per call, about that of hashing a block); OverflowError for an id
    outside [0, 2**64) (a trace's ids are checked when it is read)."""
    words = array("Q", ids)
    if _BIG_ENDIAN:
        words.byteswap()
    return words.tobytes()


_BIG_ENDIAN: Final = sys.byteorder == "big"


@functools.lru_cache(maxsize=64)
def _origin(namespace: Namespace) -> bytes:
    """What a replay chain's block 0 starts from: the namespace's seed (a digest)."""
    return namespace.seed()


@functools.lru_cache(maxsize=64)
def replay_namespace(layout: Layout) -> Namespace:
    """The namespace the replay's planner and its references share. Its group tags hash
    each group's own geometry only (``layout_fields="group"``), as before keys covered the
    whole layout: a replay shares no tier with anyone, and its figures (which follow the
    key bytes through hashing policies) stay comparable with earlier runs. One object per
    layout: the planner tells a reference's chain is its own by identity (comparing two
    namespaces is a Python call, once per request)."""
    return Namespace(layout.model, kv_dtype=layout.kv_dtype, layout_fields="group")


class RequestRefs:
    """The chunks one request references, in the planner's store order.

    ``keys[i]`` is chunk ``chunks[i]`` of group ``groups[i]``; it becomes storable once
    ``horizons[i]`` tokens are computed. ``store_tokens`` is the stored scope (the whole
    stream, or the prompt); ``num_prompt`` the prompt's tokens. ``groups``, ``chunks``
    and ``horizons`` depend on ``store_tokens`` only, and are shared by every request with
    the same (``RefsPlanner``). ``prompt`` is the prompt's ``KeyChain``, in the replay's
    namespace: the planner takes it as the prompt (``Planner.add_request``), so that the
    stream is hashed once per request. Not to be changed once built (a plain class, not a
    frozen dataclass: one is built per request, and a dataclass's ``__init__`` is
    interpreted even in the serving build). ``stored`` is the chain over the stored scope,
    a fork of ``prompt`` extended: the planner takes it in place of the prompt's once the
    request has been looked up (``Planner.append_tokens``), so the rest is not hashed
    again either.
    """

    __slots__ = ("chunks", "groups", "horizons", "keys", "num_prompt", "prompt", "store_tokens",
                 "stored")

    def __init__(self, num_prompt: int, store_tokens: int, keys: list[ChunkKey],
                 groups: tuple[int, ...], chunks: tuple[int, ...], horizons: tuple[int, ...],
                 prompt: KeyChain, stored: KeyChain) -> None:
        self.num_prompt, self.store_tokens, self.keys = num_prompt, store_tokens, keys
        self.groups, self.chunks, self.horizons = groups, chunks, horizons
        self.prompt, self.stored = prompt, stored


def store_tokens_of(req: TraceRequest, block_tokens: int, scope: StoreScope) -> int:
    """Tokens a request's producer stores up to (``StoreScope``)."""
    if scope == "prompt":
        return req.input_length
    return len(req.hash_ids) * block_tokens


@dataclass(frozen=True)
class _Plan:
    """What every request that stores ``top`` tokens references, but its keys: per group,
    the chunks of its store set; over all groups, in store order, each chunk's group,
    index and horizon, and where its key is in the per-group lists (``order``)."""

    per_group: tuple[range | list[int], ...]
    groups: tuple[int, ...]
    chunks: tuple[int, ...]
    horizons: tuple[int, ...]
    order: tuple[tuple[int, int], ...] | None
    """(group, position in that group's list) per entry; None when that is the
    concatenation of the groups in order (one group, the usual case)."""


class RefsPlanner:
    """``request_refs`` for one layout, namespace, block size and scope: the store order
    of a stored scope is computed once per distinct ``store_tokens`` (traces name whole
    blocks: a few hundred distinct values), so a request costs its hashing only: once,
    its prompt's chain forked to extend over the rest of the stored scope."""

    def __init__(self, layout: Layout, namespace: Namespace, block_tokens: int,
                 scope: StoreScope) -> None:
        self.layout, self.namespace = layout, namespace
        self.block_tokens, self.scope = block_tokens, scope
        self._plans: dict[int, _Plan] = {}
        self._origin = _origin(namespace)
        self._widths = [(g.tokens_per_chunk, g.lookahead) for g in layout.groups]

    def refs(self, req: TraceRequest) -> RequestRefs:
        """Hash one request's stream and list the chunks of its store sets, in store order."""
        top = store_tokens_of(req, self.block_tokens, self.scope)
        plan = self._plans.get(top)
        if plan is None:
            plan = self._plans[top] = _plan(self.layout, top)
        prompt = ReplayChain(self.layout, self.namespace, self.block_tokens, self._origin)
        num_prompt = min(req.input_length, top)
        packed = _u64_bytes(req.hash_ids)  # once for both chains
        prompt.extend_blocks(req.hash_ids, num_prompt, packed)
        for gi, chunks in enumerate(plan.per_group):  # the prompt's keys, shared (below)
            per, lookahead = self._widths[gi]
            if isinstance(chunks, range) and chunks.start == 0:
                prompt.keys(gi, range(min(chunks.stop, (num_prompt - lookahead) // per)))
        # the stored scope: the prompt hashed once for both, and its keys built once, so
        # that the planner's lookup and the references read the same key objects (hashed
        # once, each); the prompt frozen, so that the planner takes it without a fork
        chain = prompt.fork()
        prompt.freeze()
        assert isinstance(chain, ReplayChain)  # _blank's kind
        chain.extend_blocks(req.hash_ids, top, packed)
        per_group = [chain.keys(gi, chunks) for gi, chunks in enumerate(plan.per_group)]
        keys = (per_group[0] if plan.order is None and len(per_group) == 1 else
                [k for ks in per_group for k in ks] if plan.order is None else
                [per_group[gi][j] for gi, j in plan.order])
        return RequestRefs(req.input_length, top, keys, plan.groups, plan.chunks,
                           plan.horizons, prompt, chain)


def _plan(layout: Layout, top: int) -> _Plan:
    """The store order of every chunk of every group's store set up to ``top`` tokens:
    by horizon, then group, then chunk."""
    if len(layout.groups) == 1:  # one group: its chunks in order, if their horizons are
        ranges = coverage.store_set(layout, 0, top).ranges
        chunks = range(*ranges[0]) if len(ranges) == 1 else [c for r in ranges
                                                               for c in range(*r)]
        horizons = [min(top, coverage.store_horizon(layout, 0, c)) for c in chunks]
        if all(a <= b for a, b in pairwise(horizons)):
            return _Plan((chunks,), (0,) * len(chunks), tuple(chunks), tuple(horizons), None)
    per_group: list[range | list[int]] = []
    entries: list[tuple[int, int, int, int]] = []
    for gi in range(len(layout.groups)):
        ranges = coverage.store_set(layout, gi, top).ranges
        chunks = range(*ranges[0]) if len(ranges) == 1 else [c for r in ranges
                                                               for c in range(*r)]
        per_group.append(chunks)
        entries.extend((min(top, coverage.store_horizon(layout, gi, c)), gi, c, j)
                       for j, c in enumerate(chunks))
    entries.sort()  # by horizon, group, chunk: (group, chunk) is distinct, so j never decides
    order = tuple((e[1], e[3]) for e in entries)
    concatenated = tuple((gi, j) for gi, ks in enumerate(per_group) for j in range(len(ks)))
    return _Plan(tuple(per_group), tuple(e[1] for e in entries), tuple(e[2] for e in entries),
                 tuple(e[0] for e in entries), None if order == concatenated else order)


def request_refs(
    layout: Layout, namespace: Namespace, req: TraceRequest, block_tokens: int,
    scope: StoreScope,
) -> RequestRefs:
    """Hash one request's stream and list the chunks of its store sets, in store order
    (``RefsPlanner.refs``, for one request)."""
    return RefsPlanner(layout, namespace, block_tokens, scope).refs(req)


def all_refs(
    layout: Layout, requests: Iterable[TraceRequest], block_tokens: int, scope: StoreScope,
    progress: Callable[[int], None] | None = None,
) -> Iterator[RequestRefs]:
    """``request_refs`` of every request, in trace order."""
    planner = RefsPlanner(layout, replay_namespace(layout), block_tokens, scope)
    for req in requests:
        yield planner.refs(req)
        if progress is not None:
            progress(1)
