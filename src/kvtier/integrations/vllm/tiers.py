"""The tiers below host memory inside vLLM: the scheduler decides, the workers hold the bytes.

Every worker (tensor-parallel rank ``r``) opens its own lower tiers (``rank_tiers``): the disk
directory ``<disk.path>/rank<r>`` and the Redis namespace ``<redis.namespace>:rank<r>``. A
chunk's key is the same on every rank; each rank stores its own shard of it under its own
directory or namespace, so ranks never collide, and a chunk counts as held below only when
every rank's shard is.

The scheduler holds no bytes, so ``TieredHost`` (the scheduler's host ``ChunkStore`` with the
lower tiers probed behind it, what the ``Planner`` drives) finds what the workers' tiers hold
without opening them:

* disk: a record's path is deterministic (``tiers.disk.directory.record_path``), so a
  ``stat`` per rank tells (on the scheduler thread: local metadata only);
* Redis: ``EXISTS`` of every rank's key, batched per rank, on a probe thread of its own (the
  step never waits on the network); the keys being probed are reported WRITING meanwhile.

Probes cover only the chunks host memory lacks, in the order the planner asks, and stop at
the first chunk no tier holds; a chunk found nowhere is reported ABSENT for ``miss_ttl_s``.

A chunk found below is promoted: ``TieredHost`` reserves host slots for it (a store in
progress: WRITING, so the planner answers WAIT, bounded by ``wait_timeout_s``) and hands the
step's plan a ``Promotion``. Each worker reads its shard from its tier (which verifies the
record) into the slot on its tier thread and reports the job; once every worker reported it
the chunks are READY (a host hit, then an ordinary load), or, if any worker failed (corrupt
or missing record, server down), the slots are freed, the chunks are ABSENT for
``miss_ttl_s`` and the request recomputes them: nothing unverified is ever loaded.

Write-back (``write_policy = "write-back"``): a chunk an engine store put in host memory and
that the scheduler's store evicts is named in the next plan's ``demotions``; every worker
copies exactly that chunk's bytes out of the slot before it runs any of the plan's jobs (no
job in flight touches a slot the store could evict, and the first job that writes it again is
in this plan or a later one), and writes them to its first lower tier; the disk tier hands
its own evictions to Redis. Write-through: a worker writes each store job's chunks to every
lower tier before it reports the job, so the slot is read before the scheduler frees it.
Promoted chunks are already below: evicting them writes nothing (a chunk promoted from Redis
is also written to the disk above it).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path

from kvtier.keys import ChunkKey
from kvtier.planner import TransferJob
from kvtier.store.manager import ChunkStore
from kvtier.store.results import (
    ChunkState,
    EventKind,
    LoadHandle,
    StoreEvent,
    StoreHandle,
    StoreRefusal,
    Subscriber,
)
from kvtier.tiers.build import lower_tiers
from kvtier.tiers.config import TierConfig
from kvtier.tiers.disk.directory import record_path
from kvtier.tiers.lower import LowerTier, Workers

_ABSENT, _WRITING = ChunkState.ABSENT, ChunkState.WRITING


def rank_tiers(config: TierConfig, rank: int) -> TierConfig:
    """``config`` as rank ``rank`` opens it: its own disk directory and Redis namespace
    (every other setting, such as a cluster's start-up nodes, unchanged).

    >>> cfg = TierConfig.from_dict({"host": {"capacity": 1 << 20},
    ...                             "disk": {"path": "/tmp/kv", "capacity": 1 << 30}})
    >>> rank_tiers(cfg, 1).disk.path
    '/tmp/kv/rank1'
    """
    disk, redis = config.disk, config.redis
    if disk is not None:
        disk = dataclasses.replace(disk, path=str(Path(disk.path) / f"rank{rank}"))
    if redis is not None:
        redis = dataclasses.replace(redis, namespace=f"{redis.namespace}:rank{rank}")
    return dataclasses.replace(config, disk=disk, redis=redis)


def has_lower(config: TierConfig) -> bool:
    """Whether ``config`` names any tier below host memory."""
    return config.disk is not None or config.redis is not None


def scheduler_tiers(config: TierConfig, num_workers: int, slot_bytes: int, geometry: bytes,
                    clock: Callable[[], float] = time.monotonic
                    ) -> Callable[[ChunkStore], TieredHost] | None:
    """How the scheduler wraps its host store (``ConnectorScheduler(tiers=...)``), or None
    without lower tiers: with a Redis client per rank for the probes."""
    if not has_lower(config):
        return None
    redis = [t for r in range(num_workers) for t in lower_tiers(
        dataclasses.replace(rank_tiers(config, r), disk=None), slot_bytes, geometry, clock)]

    def wrap(host: ChunkStore) -> TieredHost:
        return TieredHost(host, config, num_workers, redis=redis, clock=clock)

    return wrap


@dataclass(frozen=True)
class Promotion:
    """Read ``keys`` from lower tier ``tier`` (``"disk"``, ``"redis"``) into host ``slots``;
    every worker its own shard. Ids are negative: never a planner job's."""

    id: int
    tier: str
    keys: tuple[ChunkKey, ...]
    slots: tuple[int, ...]


@dataclass(frozen=True)
class Demotion:
    """Write chunk ``key`` of ``group`` (exactly its bytes) from host ``slot`` down, before
    any job of the same plan writes the slot."""

    key: ChunkKey
    slot: int
    group: int


@dataclass
class _Promoting:
    job: Promotion
    handle: StoreHandle
    pending_workers: int
    ok: bool = True


class TieredHost:
    """The scheduler's host store with the workers' lower tiers behind it (module docstring).

    Offers what the planner calls on a store (``StoreProtocol``); everything but ``lookup``
    is the host store's own. ``redis`` holds one client per rank (``rank_tiers``), used for
    ``exists`` only, on the probe thread.
    """

    def __init__(self, host: ChunkStore, config: TierConfig, num_workers: int, *,
                 redis: Sequence[LowerTier] = (), clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.host, self.lock = host, host.lock
        self.write_back = config.write_policy == "write-back"
        ranks = [rank_tiers(config, r) for r in range(num_workers)]
        self._disk = [Path(c.disk.path) for c in ranks if c.disk is not None]
        self._redis = list(redis)
        self._miss_ttl_s, self._clock, self._num_workers = config.miss_ttl_s, clock, num_workers
        self._probe = Workers("probe", 1)
        self._probes: list[tuple[list[ChunkKey], Future[list[bool]], object]] = []
        self._probing: set[ChunkKey] = set()
        # probed and held below, promoted with the next plan: by request (``request``)
        self._found: dict[object, list[ChunkKey]] = {}
        # found on disk, promoted with the next plan: by request, with the host chunks of
        # the lookups that found them (kept from eviction while the slots are made)
        self._disk_found: dict[object, tuple[list[ChunkKey], dict[ChunkKey, None]]] = {}
        self.request: str | None = None
        """The request whose lookup the planner is making, if the caller says
        (``ConnectorScheduler.lookup``): the chunks one request's lookups find below in a
        step are promoted in one job per tier (a lookup asks for the prompt's last chunk,
        then for the rest); each other lookup's in one of its own."""
        self._absent_until: dict[ChunkKey, float] = {}
        self._promoting: dict[int, _Promoting] = {}
        self._planned: list[Promotion] = []
        self._demotions: list[Demotion] = []
        self._groups: dict[ChunkKey, int] = {}  # write-back: stored chunks not yet below
        self._ids = itertools.count(-1, -1)
        self.promoted: Counter[str] = Counter()
        """Chunks promoted into host memory, by the tier they came from."""
        host.subscribe(self._on_event)

    # ---- lookup and probes -------------------------------------------------------------

    def lookup(self, keys: Iterable[ChunkKey]) -> list[ChunkState]:
        """Host states, with chunks held below reported WRITING while promoted or probed."""
        ks = list(keys)
        with self.lock:
            self._take_probes()
            states = self.host.lookup(ks)
            if _ABSENT not in states:
                return states
            return self._below(ks, states)

    def _below(self, ks: list[ChunkKey], states: list[ChunkState]) -> list[ChunkState]:
        now = self._clock()
        held, on_disk, ask = [], [], []
        for k, s in zip(ks, states, strict=True):
            if s is not _ABSENT:
                held.append(k)
            elif k in self._probing:
                continue
            elif self._absent_until.get(k, now) > now:
                break
            elif self._on_disk(k):
                on_disk.append(k)
            elif self._redis_up(k):
                ask.append(k)
            else:
                self._absent_until[k] = now + self._miss_ttl_s
                break  # the first chunk no tier holds: the rest cannot extend a hit
        if on_disk:  # promoted with the step's plan
            self._probing.update(on_disk)
            found, kept = self._disk_found.setdefault(self._asking(), ([], {}))
            found += on_disk
            kept.update(dict.fromkeys(held))
        if ask:
            self._ask_redis(ask)
        states = self.host.lookup(ks)
        return [_WRITING if s is _ABSENT and k in self._probing else s
                for k, s in zip(ks, states, strict=True)]

    def _on_disk(self, key: ChunkKey) -> bool:
        """Whether every rank's disk tier holds ``key`` (a ``stat`` per rank)."""
        return bool(self._disk) and all(os.path.exists(record_path(d, key)) for d in self._disk)

    def _redis_up(self, key: ChunkKey) -> bool:
        return bool(self._redis) and all(t.might_hold(key) for t in self._redis)

    def _ask_redis(self, keys: list[ChunkKey]) -> None:
        self._probing.update(keys)
        self._probes.append((keys, self._probe.submit(self._exists, keys), self._asking()))

    def _asking(self) -> object:
        """Whose finds a lookup's are: its request's, else its own."""
        return object() if self.request is None else self.request

    def _exists(self, keys: list[ChunkKey]) -> list[bool]:
        """On the probe thread: whether every rank's namespace holds each key."""
        found = [True] * len(keys)
        for tier in self._redis:
            answers = tier.exists(keys)  # type: ignore[attr-defined]
            found = [f and bool(a) for f, a in zip(found, answers, strict=True)]
        return found

    def _take_probes(self, promote: bool = False) -> None:
        """Fold in the Redis probes that finished: what no rank holds is absent; what every
        rank holds is promoted when ``promote`` (the step's plan is being made), one
        promotion for each request's probes since the last plan (``request``: a lookup's
        last chunk and the rest, one read instead of two in turn), and reported WRITING
        until then. The chunks the lookups found on disk since the last plan are promoted
        then too, likewise. One job per request: several requests' together could need more
        slots than host memory has where each alone fits, and one bad record would fail
        them all."""
        done: list[tuple[list[ChunkKey], Future[list[bool]], object]] = []
        waiting: list[tuple[list[ChunkKey], Future[list[bool]], object]] = []
        for probe in self._probes:  # each asked once: one finishing meanwhile is not lost
            (done if probe[1].done() else waiting).append(probe)
        if done:
            self._probes = waiting
            until = self._clock() + self._miss_ttl_s
            for keys, future, asking in done:
                found = [False] * len(keys) if future.exception() else future.result()
                for k, f in zip(keys, found, strict=True):
                    if f:
                        self._found.setdefault(asking, []).append(k)
                    else:
                        self._probing.discard(k)
                        self._absent_until[k] = until
        if promote and self._disk_found:
            groups, self._disk_found = self._disk_found.values(), {}
            for on_disk, kept in groups:
                self._probing.difference_update(on_disk)
                looked = list(kept)
                still = self.host.lookup(looked)  # kept only while still in host memory
                self._promote(on_disk, "disk", [k for k, st in zip(looked, still, strict=True)
                                                if st is not _ABSENT])
        if promote and self._found:
            held_below, self._found = self._found.values(), {}
            for keys in held_below:
                self._probing.difference_update(keys)
                self._promote(keys, "redis", [])

    def _promote(self, keys: list[ChunkKey], tier: str, held: list[ChunkKey]) -> None:
        """Reserve host slots for ``keys`` (``held``, the lookup's chunks in host memory,
        protected) and plan their promotion; a refusal leaves them below."""
        handle = self.host.prepare_store(held + keys, promote=True)  # admitted when stored
        if not isinstance(handle, StoreHandle):
            return
        if not handle.keys:
            self.host.complete_store(handle, ok=True)
            return
        job = Promotion(next(self._ids), tier, handle.keys, handle.slots)
        self._promoting[job.id] = _Promoting(job, handle, self._num_workers)
        self._planned.append(job)

    # ---- the plan and the workers' reports ---------------------------------------------

    def take_plan(self, stores: Sequence[TransferJob]) -> tuple[tuple[Promotion, ...],
                                                                 tuple[Demotion, ...]]:
        """This step's promotions and demotions; ``stores``, the step's store jobs, are
        remembered (write-back) so that their chunks are written down when evicted."""
        with self.lock:
            self._take_probes(promote=True)
            if self.write_back:
                self._groups.update((c.key, c.group) for job in stores for c in job.copies)
            plan = tuple(self._planned), tuple(self._demotions)
            self._planned, self._demotions = [], []
            return plan

    def owns(self, job_id: int) -> bool:
        return job_id < 0

    def on_report(self, job_id: int, count: int, ok: bool) -> None:
        """``count`` workers finished promotion ``job_id``; once all have, publish it (or
        free its slots and remember its chunks as absent)."""
        with self.lock:
            entry = self._promoting.get(job_id)
            if entry is None:
                return
            entry.pending_workers -= count
            entry.ok = entry.ok and ok
            if entry.pending_workers > 0:
                return
            del self._promoting[job_id]
            self.host.complete_store(entry.handle, entry.ok)
            if entry.ok:
                self.promoted[entry.job.tier] += len(entry.job.keys)
            else:
                until = self._clock() + self._miss_ttl_s
                self._absent_until.update((k, until) for k in entry.job.keys)

    def forget(self, keys: Iterable[ChunkKey]) -> None:
        """A store of ``keys`` failed: they never reached host memory."""
        with self.lock:
            for k in keys:
                self._groups.pop(k, None)

    def _on_event(self, event: StoreEvent) -> None:
        """Under the host lock: a chunk stored in host memory goes below (write-through at
        once, write-back once evicted), so it is no longer known absent there."""
        self._absent_until.pop(event.key, None)
        if event.kind is EventKind.STORED:
            return
        group = self._groups.pop(event.key, None)
        if event.kind is EventKind.EVICTED and group is not None:
            self._demotions.append(Demotion(event.key, event.slot, group))

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait (bounded) for the probes in flight; the next lookup folds them in (tests,
        and steps in which vLLM scheduled nothing: ``scheduler.IDLE_WAIT_S``)."""
        with self.lock:
            futures = [f for _, f, _ in self._probes]
        wait(futures, timeout=timeout_s)

    def close(self) -> None:
        self._probe.close()
        for tier in self._redis:
            tier.close()

    # ---- the rest of the store protocol: the host store's ------------------------------

    def prepare_load(self, keys: Iterable[ChunkKey]) -> LoadHandle:
        return self.host.prepare_load(keys)

    def complete_load(self, handle: LoadHandle) -> None:
        self.host.complete_load(handle)

    def prepare_store(self, keys: Iterable[ChunkKey],
                      parents: Sequence[ChunkKey | None] | None = None
                      ) -> StoreHandle | StoreRefusal:
        return self.host.prepare_store(keys, parents)

    def complete_store(self, handle: StoreHandle, ok: bool) -> None:
        self.host.complete_store(handle, ok)

    def touch(self, keys: Iterable[ChunkKey]) -> int:
        return self.host.touch(keys)

    def remove(self, keys: Iterable[ChunkKey]) -> list[ChunkKey]:
        return self.host.remove(keys)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        return self.host.subscribe(callback)

    def check_invariants(self) -> None:
        self.host.check_invariants()
