"""What each request of a trace references: a synthetic token stream and its chunk keys.

A trace has no tokens, only block ids (``hash_ids``), each naming one ``block_tokens``-token
block and its whole prefix. The replay gives every request a synthetic token stream in
which block ``j`` is filled with its id (the low and high 32-bit halves of the id,
alternating), so two requests share a token prefix exactly as far as their id lists agree,
and lets the real ``KeyChain`` hash it: chunk keys are the ones an engine would compute,
for any chunk size, and layouts whose chunks are not trace blocks (256-token presets)
work unchanged.

>>> stream = token_stream((5, 2**32 + 7), block_tokens=4)
>>> stream.tolist()
[5, 0, 5, 0, 7, 1, 7, 1]

The stream covers every block the trace names, the last one whole even when the prompt
ends inside it (``StoreScope``): a later request that names the same id gets the same
key. ``RequestRefs`` lists, once per request, the chunks it references: exactly
``coverage.store_set`` of every group over the stored scope, in the order the planner
stores them. The replay uses them to read the store before the planner does (the block
hit), to refresh chunks the request references but does not load, and to give Belady
the future.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from kvtier import coverage
from kvtier.keys import ChunkKey, KeyChain, Namespace
from kvtier.layout import Layout
from kvtier.replay.trace import TraceRequest

StoreScope = Literal["blocks", "prompt"]
"""What a request stores: ``blocks``, every block the trace names (the last one whole, as
Mooncake's cache keeps it); ``prompt``, only chunks that lie within the prompt."""
STORE_SCOPES: tuple[str, ...] = ("blocks", "prompt")


def token_stream(hash_ids: tuple[int, ...], block_tokens: int) -> npt.NDArray[np.uint32]:
    """``block_tokens`` tokens per id: its low and high 32-bit halves, alternating."""
    ids = np.asarray(hash_ids, dtype=np.uint64)
    pair = np.stack([ids & np.uint64(0xFFFFFFFF), ids >> np.uint64(32)], axis=1)
    reps = -(-block_tokens // 2)
    fill = np.tile(pair.astype(np.uint32), (1, reps)).reshape(len(ids), -1)[:, :block_tokens]
    return fill.reshape(-1)


def replay_namespace(layout: Layout) -> Namespace:
    """The namespace the replay's planner and its references share. Its group tags hash
    each group's own geometry only (``layout_fields="group"``), as before keys covered the
    whole layout: a replay shares no tier with anyone, and its figures (which follow the
    key bytes through hashing policies) stay comparable with earlier runs."""
    return Namespace(layout.model, kv_dtype=layout.kv_dtype, layout_fields="group")


@dataclass(frozen=True)
class RequestRefs:
    """The chunks one request references, in the planner's store order.

    ``keys[i]`` is chunk ``chunks[i]`` of group ``groups[i]``; it becomes storable once
    ``horizons[i]`` tokens are computed. ``store_tokens`` is the stored scope (the whole
    stream, or the prompt); ``num_prompt`` the prompt's tokens.
    """

    num_prompt: int
    store_tokens: int
    keys: list[ChunkKey]
    groups: list[int]
    chunks: list[int]
    horizons: list[int]


def store_tokens_of(req: TraceRequest, block_tokens: int, scope: StoreScope) -> int:
    """Tokens a request's producer stores up to (``StoreScope``)."""
    if scope == "prompt":
        return req.input_length
    return len(req.hash_ids) * block_tokens


def request_refs(
    layout: Layout, namespace: Namespace, req: TraceRequest, block_tokens: int,
    scope: StoreScope,
) -> RequestRefs:
    """Hash one request's stream and list the chunks of its store sets, in store order."""
    top = store_tokens_of(req, block_tokens, scope)
    chain = KeyChain(layout, namespace, token_stream(req.hash_ids, block_tokens)[:top])
    entries: list[tuple[int, int, int, ChunkKey]] = []
    for gi in range(len(layout.groups)):
        chunks = list(coverage.store_set(layout, gi, top))
        for c, key in zip(chunks, chain.keys(gi, chunks), strict=True):
            entries.append((min(top, coverage.store_horizon(layout, gi, c)), gi, c, key))
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    return RequestRefs(
        req.input_length, top, [e[3] for e in entries], [e[1] for e in entries],
        [e[2] for e in entries], [e[0] for e in entries],
    )


def all_refs(
    layout: Layout, requests: Iterable[TraceRequest], block_tokens: int, scope: StoreScope,
    progress: Callable[[int], None] | None = None,
) -> Iterator[RequestRefs]:
    """``request_refs`` of every request, in trace order."""
    ns = replay_namespace(layout)
    for req in requests:
        yield request_refs(layout, ns, req, block_tokens, scope)
        if progress is not None:
            progress(1)
