"""Replay a trace through kvtier's real planner and store, one request after another.

For each request, in trace order (``replay``):

1. read where its referenced chunks are (``ReplayStore.locate``, any tier): the block hit,
   by prefix semantics over every group's required chunks (``block_hit``);
2. the planner's lookup decides the hit (whole chunks, at most ``prompt - 1`` tokens, by
   ``kvtier.coverage``); a hit is accepted and its load completed at once;
3. chunks the request references that are cached but not loaded are held (pinned, so its
   own stores cannot evict them) and refreshed in the request's order, interleaved with
   the planner's stores of the absent ones: every chunk of the request is used once, in
   its order, as in an engine that re-offers its whole prompt;
4. the planner stores the rest (``coverage.store_set`` of the stored scope) and finishes.

So with ``lru`` a hit refreshes, a new chunk enters as most recent, both in the request's
order, and the result equals a plain LRU simulation of the trace's blocks (tested).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from itertools import chain, count
from typing import Protocol

from kvtier import coverage
from kvtier.keys import TAG_SIZE, ChunkKey
from kvtier.layout import Layout
from kvtier.planner import Lookup, Outcome, RequestLimits, TransferJob
from kvtier.planner.at_once import AtOncePlanner
from kvtier.replay.hits import HitPlans, block_hit
from kvtier.replay.metadata import metadata_store
from kvtier.replay.policies import INFINITE, ReplayBelady, build_policy
from kvtier.replay.refs import RequestRefs, replay_namespace, token_span
from kvtier.replay.stats import GroupCounts, ReplayStats
from kvtier.replay.store import DISK, HOST, ReplayStore
from kvtier.replay.trace import TraceRequest
from kvtier.replay.workload import ReplayConfig, Workload
from kvtier.store import Policy
from kvtier.store.results import EventKind
from kvtier.tiers.lower import LowerTier


class VirtualClock:
    """Seconds that pass only when the replay says so (``now``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay_policy(workload: Workload, policy: str, host_slots: int, disk_slots: int
                  ) -> tuple[Policy, int, int]:
    """The host policy for one replay and the slots of host memory and disk: ``infinite``
    gets a host slot for every distinct chunk and no disk, ``belady`` the future."""
    if policy == INFINITE:
        host_slots, disk_slots = max(1, workload.num_distinct_chunks()), 0
    future = workload.future() if policy == "belady" else ()
    return build_policy(policy, host_slots, future), host_slots, disk_slots


def make_store(workload: Workload, policy: str, host_slots: int, disk_slots: int = 0,
               below: Sequence[LowerTier] = ()) -> ReplayStore:
    """The metadata tiers for one replay (``replay_policy``), above the tiers ``below``."""
    built, host_slots, disk_slots = replay_policy(workload, policy, host_slots, disk_slots)
    return metadata_store(host_slots, policy=built, disk_slots=disk_slots, below=below,
                          admission=workload.config.admission)


def replay(
    workload: Workload, policy: str, host_slots: int, disk_slots: int = 0,
    progress: Callable[[int], None] | None = None,
) -> ReplayStats:
    """Replay ``workload`` sequentially with ``policy`` over the given tier slots."""
    started = time.perf_counter()
    store = make_store(workload, policy, host_slots, disk_slots)
    driver = Driver(workload.config, store, policy)
    threshold = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *threshold[1:])
    try:
        for i, (req, refs) in enumerate(workload.items(progress)):
            driver.run(f"r{i}", req, refs)
    finally:
        gc.set_threshold(*threshold)
    driver.stats.wall_s = time.perf_counter() - started
    return driver.stats


YOUNG_COLLECTION_EVERY = 50_000
"""Allocations between the cyclic collector's young collections during a replay (Python's
default is 700): a replay allocates short-lived tuples and lists by the million and almost
no cycles, and the default cost about 5% of its time. Restored when the replay ends."""


class DataPlane(Protocol):
    """What moves bytes for the planner's jobs (``--bytes``: ``kvtier.replay.bytes_store``);
    a metadata replay has none."""

    def store(self, job: TransferJob) -> None:
        """Fill the slots of a store job's chunks, before the job completes."""

    def load(self, job: TransferJob) -> list[ChunkKey]:
        """Read and verify the slots of a load job's chunks; the chunks that did not verify."""

    def settle(self, rounds: int) -> None:
        """Complete background work (promotions) after the ``rounds``-th WAIT of a lookup;
        after enough rounds, let the planner's wait deadline pass."""


class Driver:
    """One planner over one store; ``run`` replays one request, the steps serve
    ``kvtier.replay.concurrent``, which calls them at simulated times."""

    def __init__(
        self, config: ReplayConfig, store: ReplayStore, policy: str,
        clock: Callable[[], float] | None = None, plane: DataPlane | None = None,
    ) -> None:
        self.config, self.layout, self.store, self.plane = config, config.layout, store, plane
        # over host memory alone, a metadata replay's planner asks the host store itself:
        # the tiered store above it then only passes calls through and keeps stats that
        # only a --bytes replay reads (its events reach the driver from the host store)
        planned = store.host if not store.lower and plane is None else store
        self.planner = AtOncePlanner(config.layout, planned, replay_namespace(config.layout),
                                     clock=clock or time.monotonic)
        slots = store.tier_slots()
        self.stats = ReplayStats(policy, slots, [GroupCounts.of(g) for g in config.layout.groups])
        self.belady = store.policy if isinstance(store.policy, ReplayBelady) else None
        self._chunk_bytes = chunk_bytes_by_tag(config.layout)
        self._group_bytes = [g.bytes_per_chunk or 0 for g in config.layout.groups]
        # every group's chunks the same size (one group, the usual case): no key read
        self._same_bytes = (self._group_bytes[0] if len(set(self._group_bytes)) == 1
                            else None)
        store.subscribe_tier_batches(self._on_tier_batch)
        self._hits = HitPlans()  # block_hit's plans
        self._limits: dict[int, RequestLimits] = {}  # per block hit (frozen: shared)
        self._cold: dict[int, float] = {}  # modelled TTFT without the cache, per prompt length
        self._dense: dict[int, list[int]] = {}  # per stored scope: each group's dense chunks
        self._ttft = config.timing.arithmetic()

    def _cold_ttft(self, prompt: int) -> float:
        """``timing.ttft_s(prompt, 0, {})``, computed once per prompt length."""
        cold = self._cold.get(prompt)
        if cold is None:
            if len(self._cold) >= 1 << 16:
                self._cold.clear()
            cold = self._cold[prompt] = self._ttft.ttft_s(prompt, 0, {})
        return cold

    def run(self, rid: str, req: TraceRequest, refs: RequestRefs) -> None:
        """The whole request: look up, load, store, finish (module docstring)."""
        where = self.begin(rid, req, refs)
        loaded, by_tier, hit = self.load(rid, self.lookup(rid))
        cold = self._cold_ttft(req.input_length)
        self.stats.add_ttft(cold, self._ttft.ttft_s(req.input_length, hit, by_tier)
                            if hit else cold)  # a miss loads nothing: its cold time
        # where the chunks are has not changed since ``begin`` unless a lower tier promoted
        # some (a lookup's) or a data plane dropped corrupt ones: no other request ran
        still = where if not self.store.lower and self.plane is None else None
        self.store_all(rid, req, refs, loaded, still)
        self.end(rid, refs)

    def begin(self, rid: str, req: TraceRequest, refs: RequestRefs) -> list[str]:
        """Register the request and count its block hit, just before its lookup; where
        each of its chunks is (``ReplayStore.locate``).

        No boundary past the block hit can hit (the replay's stores complete at once, so
        no chunk is ever being written at a lookup): the planner need not try them.
        """
        if self.belady is not None:
            self.belady.begin(refs.keys)
        where = self.store.locate_checked(refs.keys)
        self.store.promoted.clear()
        reach = block_hit(self.layout, refs, where, self._hits)
        self._count_refs(req, refs, reach)
        limits = self._limits.get(reach)
        if limits is None:
            limits = self._limits[reach] = RequestLimits(max_load_tokens=reach,
                                                         boundaries=self.config.boundaries)
        self.planner.add_request(rid, refs.prompt, limits=limits)  # hashed once, by refs
        return where

    def lookup(self, rid: str) -> Lookup:
        """The planner's lookup. Only a real store's promotions make it WAIT (``--bytes``):
        the data plane completes them and the planner is asked again."""
        found = self.planner.lookup(rid, 0)
        for rounds in count(1):
            if found.outcome is not Outcome.WAIT:
                break
            assert self.plane is not None, "a metadata store never makes the planner wait"
            self.stats.waits += 1
            self.plane.settle(rounds)
            found = self.planner.lookup(rid, 0)
        return found

    def load(self, rid: str, found: Lookup) -> tuple[set[object], dict[str, int], int]:
        """Accept and complete a hit: the keys loaded, bytes per tier, tokens restored."""
        if found.outcome is not Outcome.HIT:
            return set(), {}, 0
        if self.plane is None:  # nothing to move: the load completes within the call
            keys = self.planner.load_at_once(rid)
        else:
            job = self.planner.accept_hit(rid, _table(self.layout, found.hit_tokens))
            corrupt = self.plane.load(job)
            self.planner.complete_load(job.id, not corrupt, corrupt)
            if corrupt:  # a kvtier bug: counted by the plane, the hit recomputed
                return set(), {}, 0
            keys = [[] for _ in self.layout.groups]
            for c in job.copies:
                keys[c.group].append(c.key)
        by_tier = self._count_load(keys, found.hit_tokens)
        return set(chain.from_iterable(keys)), by_tier, found.hit_tokens

    def store_all(
        self, rid: str, req: TraceRequest, refs: RequestRefs, loaded: set[object],
        where: list[str] | None = None,
    ) -> None:
        """Hold the cached chunks not loaded, store the rest in order, release. ``where``:
        the chunks' ``locate``, when the caller knows it is still true."""
        if where is None:
            where = self.store.locate_checked(refs.keys)
        # where: one per key (locate); a bare zip, which mypyc compiles into a loop
        held = [(k, w) for k, w in zip(refs.keys, where) if w and k not in loaded]  # noqa: B905
        hold = self.store.hold([k for k, _ in held], [w for _, w in held]) if held else None
        if refs.store_tokens > refs.num_prompt:  # the rest of the stored scope
            top, width = refs.store_tokens, self.config.block_tokens
            rest = (refs.stored if refs.stored.num_tokens == top else  # hashed with the refs
                    token_span(req.hash_ids, width, refs.num_prompt, top))  # a truncated scope
            self.planner.append_tokens(rid, rest)
        self._store_in_order(rid, refs, where, loaded)
        if hold is not None:
            self.store.complete_load(hold)

    def end(self, rid: str, refs: RequestRefs) -> None:
        offered = self.planner.request_metrics(rid).chunks_offered_by_group
        for gi, n in offered.items():
            self.stats.groups[gi].offered += n
        self.planner.finish(rid)
        if self.belady is not None:
            self.belady.end(refs.keys)

    def _on_tier_batch(self, tier: str, kind: EventKind, keys: Sequence[ChunkKey],
                       slots: Sequence[int]) -> None:
        """Count every chunk a tier writes, with its group's bytes (write amplification)."""
        if kind is not EventKind.STORED:
            return
        s, by_tag, same = self.stats, self._chunk_bytes, self._same_bytes
        written = (len(keys) * same if same is not None else
                   sum([by_tag.get(k[:TAG_SIZE], 0) for k in keys]))
        s.chunks_written_by_tier[tier] = s.chunks_written_by_tier.get(tier, 0) + len(keys)
        s.bytes_written_by_tier[tier] = s.bytes_written_by_tier.get(tier, 0) + written

    def _count_refs(self, req: TraceRequest, refs: RequestRefs, reach: int) -> None:
        s = self.stats
        s.requests += 1
        s.prompt_tokens += req.input_length
        s.block_refs += len(req.hash_ids)
        s.block_hits += reach // self.config.block_tokens
        dense = self._dense.get(refs.store_tokens)
        if dense is None:  # the same for every request storing as many tokens
            if len(self._dense) >= 1 << 16:
                self._dense.clear()
            dense = self._dense[refs.store_tokens] = [
                coverage.dense_chunks(g, refs.store_tokens) for g in self.layout.groups]
        for counts, n in zip(s.groups, dense):  # noqa: B905  (one per group)
            counts.dense += n

    def _count_load(self, keys: list[list[ChunkKey]], hit_tokens: int) -> dict[str, int]:
        """Count a hit that loaded ``keys`` (per group): bytes per tier."""
        s, per_chunk, promoted = self.stats, self._group_bytes, self.store.promoted
        s.hit_requests += 1
        s.hit_tokens += hit_tokens
        if not promoted:  # every chunk from host memory (always, without a lower tier)
            chunks = nbytes = 0
            for gi, group_keys in enumerate(keys):
                s.groups[gi].loaded += len(group_keys)
                chunks += len(group_keys)
                nbytes += per_chunk[gi] * len(group_keys)
            if chunks:
                s.add_load(HOST, chunks, nbytes)
            return {HOST: nbytes, DISK: 0}
        by_tier: dict[str, int] = {HOST: 0, DISK: 0}
        counts: dict[str, int] = {}
        for gi, group_keys in enumerate(keys):
            s.groups[gi].loaded += len(group_keys)
            for key in group_keys:
                tier = promoted.get(key, HOST)
                counts[tier] = counts.get(tier, 0) + 1
                by_tier[tier] = by_tier.get(tier, 0) + per_chunk[gi]
        for tier, n in counts.items():
            if not n:
                continue
            s.add_load(tier, n, by_tier[tier])
        return by_tier

    def _store_in_order(
        self, rid: str, refs: RequestRefs, where: list[str], loaded: set[object]
    ) -> None:
        """Store absent chunks and refresh cached ones, alternating in the request's order."""
        horizon = 0
        refresh: list = []
        for key, w, h in zip(refs.keys, where, refs.horizons):  # noqa: B905  (one each)
            if not w:
                if refresh:
                    self.store.refresh(refresh)
                    refresh = []
                horizon = h
            elif key not in loaded:
                if horizon:
                    self._store(rid, horizon)
                    horizon = 0
                refresh.append(key)
        if refresh:
            self.store.refresh(refresh)
        self._store(rid, refs.store_tokens)

    def _store(self, rid: str, horizon: int) -> None:
        m, groups = self.planner.metrics, self.stats.groups
        refusals, declined = m.store_refusals, m.chunks_not_admitted
        if self.plane is None:  # nothing to move: the store completes within the call
            stored = self.planner.store_at_once(rid, horizon)
        else:
            job = self.planner.on_computed(rid, horizon, _table(self.layout, horizon))
            if job is not None:
                self.plane.store(job)
                self.planner.complete_store(job.id, True)
            stored = [(c.group, c.chunk) for c in job.copies] if job is not None else []
        self.stats.store_refusals += m.store_refusals - refusals
        self.stats.chunks_not_admitted += m.chunks_not_admitted - declined
        if len(groups) == 1:
            groups[0].stored += len(stored)
            return
        for gi, _ in stored:
            groups[gi].stored += 1


def chunk_bytes_by_tag(layout: Layout) -> dict[bytes, int]:
    """Bytes of a chunk of each group, by the group tag its keys start with (the replay's
    namespace; a group without a byte size counts 0)."""
    ns = replay_namespace(layout)
    return {ns.group_tag(layout, gi): g.bytes_per_chunk or 0
            for gi, g in enumerate(layout.groups)}


def _table(layout: Layout, num_tokens: int) -> list[range]:
    """A block table holding every block of ``num_tokens`` tokens (metadata: any ids)."""
    return [range(-(-num_tokens // g.tokens_per_block)) for g in layout.groups]
