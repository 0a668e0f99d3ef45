"""Per-request state kept by the planner, and binding chunk blocks to engine block ids."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from kvtier.coverage import BlockRun
from kvtier.keys import ChunkKey, KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.planner.types import Lookup, Metrics, RequestLimits
from kvtier.store.results import LoadHandle


@dataclass
class PendingHit:
    """A hit from ``lookup``: pinned from lookup until its load completes or is declined."""

    lookup: Lookup
    on_device: int
    keys: list[list[ChunkKey]]
    """Per group, the key of each chunk to load, in ``load_set`` order."""
    handle: LoadHandle
    job_id: int | None

    def __init__(self, lookup: Lookup, on_device: int, keys: list[list[ChunkKey]],
                 handle: LoadHandle, job_id: int | None = None) -> None:
        # written out (the class's __init__ is kept by @dataclass): the generated one would
        # run interpreted even in the serving build, and one is made per hit (and below,
        # per request; so are ``Lookup`` and ``Metrics``)
        self.lookup, self.on_device, self.keys, self.handle = lookup, on_device, keys, handle
        self.job_id = job_id


@dataclass
class RequestState:
    request_id: str
    chain: KeyChain
    num_prompt: int
    limits: RequestLimits
    stored_horizon: int
    """Store planning has covered every chunk up to this (capped) horizon."""
    served: list[int]
    """Boundaries served so far (``kvtier.boundaries``), ascending; unused when dense."""
    shared_point: int
    """Where the lookup saw the request share a prefix (``boundaries.shared_point``)."""
    pending: list[tuple[int, int]]
    """(group, chunk) planned but not yet handed to a store job (refused: retried)."""
    hit: PendingHit | None
    load_jobs: set[int]
    store_jobs: set[int]
    wait_deadline: float | None
    expired: bool
    closed: bool
    metrics: Metrics

    def __init__(self, request_id: str, chain: KeyChain, num_prompt: int,
                 limits: RequestLimits) -> None:
        self.request_id, self.chain, self.num_prompt, self.limits = (
            request_id, chain, num_prompt, limits)
        self.stored_horizon = self.shared_point = 0
        self.served, self.pending = [], []
        self.hit = None
        self.load_jobs, self.store_jobs = set(), set()
        self.wait_deadline = None
        self.expired = self.closed = False
        self.metrics = Metrics()

    def store_cap(self, horizon: int) -> int:
        """The horizon store planning may use, after the request's limits."""
        cap = horizon
        if self.limits.store == "none":
            return 0
        if self.limits.store == "prompt":
            cap = min(cap, self.num_prompt)
        if self.limits.max_store_tokens is not None:
            cap = min(cap, self.limits.max_store_tokens)
        return cap

    @property
    def idle(self) -> bool:
        """No hit pinned and no job in flight."""
        return self.hit is None and not self.store_jobs and not self.load_jobs


def prompt_chain(
    request_id: str, prompt: Iterable[int] | KeyChain, layout: Layout, namespace: Namespace,
    salt: str | None = None,
) -> KeyChain:
    """A request's chain: hashed from its prompt's tokens, or a fork of the caller's chain
    over them (``Planner.add_request``; the chain itself when it is frozen, as
    ``KeyChain.freeze`` says), whose keys must be this planner's: ``ValueError``
    unless it was built for the same layout and namespace, ``salt`` as its tenant salt.
    ``ValueError`` for an empty prompt."""
    ns = Namespace(**{**vars(namespace), "tenant_salt": salt}) if salt else namespace
    if not isinstance(prompt, KeyChain):
        chain = KeyChain(layout, ns, prompt)
    elif ((prompt.layout is not layout and prompt.layout != layout)
          or (prompt.namespace is not ns and prompt.namespace != ns)):
        raise ValueError(
            f"request {request_id!r}: its prompt KeyChain was built for another layout or "
            "namespace than this planner's; build it as KeyChain(planner.layout, "
            "planner.namespace, prompt), with the request's salt as tenant_salt, or pass "
            "the prompt's tokens")
    else:  # a frozen chain is never extended: shared until the request extends it
        chain = prompt if prompt.frozen else prompt.fork()
    if chain.num_tokens == 0:
        raise ValueError(f"request {request_id!r} has an empty prompt")
    return chain


def extended(request_id: str, chain: KeyChain, more: Iterable[int] | KeyChain) -> KeyChain:
    """The request's chain after ``append_tokens(more)``: ``chain`` extended by the tokens
    ``more``, or ``more`` itself when it is a chain that ``continues`` ``chain`` (a fork of
    the chain the request was added with, made before the request, then extended: every
    key the two share is equal); ``ValueError`` for a chain that does not."""
    if not isinstance(more, KeyChain):
        if chain.frozen:  # the caller's (``prompt_chain``): this request's own from now on
            chain = chain.fork()
        chain.extend(more)
        return chain
    if not more.continues(chain):
        raise ValueError(
            f"request {request_id!r}: append_tokens got a KeyChain that does not continue "
            "the request's own (fork the chain given to add_request before adding the "
            "request, then extend the fork), or pass the new tokens")
    return more


def load_block_ids(
    table: Sequence[Sequence[int | None]], gi: int, group: Group, run: BlockRun, request_id: str
) -> tuple[int, ...]:
    """Engine block ids of ``run`` for a load: every block must be allocated."""
    ids = store_block_ids(table, gi, group, run)
    if ids is None:
        first = run.chunk * group.blocks_per_chunk + run.first_block
        raise ValueError(
            f"request {request_id!r}: group {gi} has no block allocated at positions "
            f"{first}..{first + run.num_blocks - 1}; allocate the hit's retained blocks "
            "(coverage.retained_blocks) before accept_hit"
        )
    return ids


def store_block_ids(
    table: Sequence[Sequence[int | None]], gi: int, group: Group, run: BlockRun
) -> tuple[int, ...] | None:
    """Engine block ids of ``run``, or None when the engine no longer holds one of them."""
    first = run.chunk * group.blocks_per_chunk + run.first_block
    return block_ids_at(table, gi, first, run.num_blocks)


def block_ids_at(
    table: Sequence[Sequence[object]], gi: int, first: int, num: int
) -> tuple[int, ...] | None:
    """Engine block ids of group ``gi`` at block positions ``first .. first + num - 1``, or
    None when the engine no longer holds one of them (None or a negative id there).
    ``ValueError`` for an id that is not an integer. Typed as taking any objects, so that
    the compiled build reaches the check (mypyc checks the types it is told)."""
    if gi >= len(table):
        raise ValueError(f"block table has {len(table)} groups; the layout has group {gi}")
    row = table[gi]
    if isinstance(row, range):  # ids with nothing to check (the replay's tables): no loop
        part = row[first : first + num]
        if len(part) < num or (len(part) > 0 and min(part[0], part[-1]) < 0):
            return None
        return tuple(part)
    span = tuple(row[first : first + num])
    if len(span) == num:  # the common case, ints only: one plain loop (the compiled build
        negative = False  # runs it several times faster than all() and min())
        for b in span:
            if type(b) is not int:
                break
            negative = negative or cast(int, b) < 0
        else:
            return None if negative else cast("tuple[int, ...]", span)
    ids: list[int] = []
    for b in span:
        if b is None:
            return None
        if isinstance(b, bool) or not hasattr(b, "__index__"):
            raise ValueError(f"block table: group {gi} holds {b!r:.40} ({type(b).__name__}); "
                             "a block id is an integer, or None for a block the engine freed")
        ids.append(b.__index__())
    if len(ids) < num or (ids and min(ids) < 0):
        return None
    return tuple(ids)


def check_horizon(call: str, req: RequestState, horizon: object) -> int:
    """``horizon`` if it is a count of tokens within the ones known for ``req``;
    ``ValueError`` naming ``call`` otherwise."""
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
        raise ValueError(f"{call}({req.request_id!r}): horizon must be a token count >= 0, "
                         f"got {horizon!r:.40}")
    if horizon > req.chain.num_tokens:
        raise ValueError(f"horizon {horizon} is past the {req.chain.num_tokens} tokens known "
                         f"for {req.request_id!r}; append_tokens first")
    return horizon


def check_computed(
    groups: Sequence[Group], req: RequestState, horizon: object,
    table: Sequence[Sequence[object]],
) -> None:
    """``ValueError`` for an ``on_computed`` that cannot be right: a horizon that is not a
    count of tokens or is past the tokens known, a block table without a row for each
    group, or a row too short to hold the ``horizon`` tokens computed (freed blocks stay in
    it as None)."""
    request_id = req.request_id
    tokens = check_horizon("on_computed", req, horizon)
    if isinstance(table, (str, bytes)) or len(table) != len(groups):
        raise ValueError(f"on_computed({request_id!r}): the block table needs one row per "
                         f"group ({len(groups)}), got {len(table)}")
    for gi, g in enumerate(groups):
        need = -(-tokens // g.tokens_per_block)
        if len(table[gi]) < need:
            raise ValueError(
                f"on_computed({request_id!r}): group {gi}'s row has {len(table[gi])} blocks, "
                f"{tokens} tokens fill {need}; keep freed blocks in it as None")
