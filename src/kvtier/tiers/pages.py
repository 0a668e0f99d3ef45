"""Pages over kvtier's lower tiers, for an engine that keeps its own host memory.

SGLang's HiCache (``kvtier.integrations.sglang``) owns its host pool and asks a storage
backend for pages by key, from several threads, expecting an answer for every call. A
``PageTiers`` is that backend's storage: the disk and Redis tiers of a ``TierConfig``
(``tiers.build.lower_tiers``), chained as the hierarchy chains them (write-back: the disk
tier hands its evictions to Redis; write-through: every page goes to every tier), with
admission (``TierConfig.admit_after``) gating what is written at all.

Every call is bounded by ``deadline_s``. A tier that fails, stalls past the deadline, or
returns a record that does not verify (its checksum, key, geometry, length or seal) costs a
miss: ``get`` leaves the page out, ``exists`` stops the run of hits there, ``put`` reports
the page unwritten. No exception from a tier reaches the caller, and no page is returned
that its tier did not verify. Work a deadline abandoned finishes (or fails) on the tier's
own workers; its result is dropped.

>>> import tempfile
>>> from kvtier.tiers.config import TierConfig
>>> k = ChunkKey(bytes(40))
>>> with tempfile.TemporaryDirectory() as d:
...     cfg = TierConfig.from_dict({"host": {"capacity": 1},
...                                 "disk": {"path": d, "capacity": "1MiB", "fsync": False}})
...     pages = PageTiers(cfg, slot_bytes=8)
...     pages.put([(k, b"kvkvkvkv")]), pages.exists([k, ChunkKey(bytes(39) + b"x")])
...     bytes(pages.get([k])[k])
...     pages.close()
([True], 1)
b'kvkvkvkv'
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from kvtier.keys import ChunkKey
from kvtier.tiers.build import lower_tiers
from kvtier.tiers.config import TierConfig, check_number
from kvtier.tiers.lower import Item, LowerTier, Workers

_log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_DEADLINE_S = 1.0
"""How long one call may wait on the tiers before what is missing counts as a miss."""
ADMISSION_SLOTS = 1 << 16
"""Slots admission sizes its default window by when no tier has a fixed capacity."""


class PageTiers:
    """Pages (payloads of at most ``slot_bytes``) by ``ChunkKey`` in the lower tiers that
    ``config`` names (module docstring); ``geometry`` fingerprints what produced them
    (records of another geometry are misses)."""

    def __init__(self, config: TierConfig, slot_bytes: int, geometry: bytes = b"", *,
                 deadline_s: float = DEFAULT_DEADLINE_S,
                 clock: Callable[[], float] = time.monotonic,
                 tiers: Sequence[LowerTier] | None = None) -> None:
        check_number("deadline_s", deadline_s, low=1e-3, high=3600)
        self.slot_bytes, self.deadline_s, self._clock = slot_bytes, deadline_s, clock
        self.lower = list(tiers) if tiers is not None else lower_tiers(
            config, slot_bytes, geometry, clock)
        if not self.lower:
            raise ValueError("the configuration names no tier: give a disk or a redis section")
        self.write_through = config.write_policy == "write-through"
        if not self.write_through:
            for upper, below in itertools.pairwise(self.lower):
                upper.set_demote(_demoter(below))
        self._admit = config.admission().filter(_num_slots(self.lower))
        self._admit_lock = threading.Lock()
        self._probe = Workers("pages-probe", 2)
        self.declined = 0
        """Pages admission kept out (offered fewer than ``admit_after`` times)."""
        self.late = 0
        """Tier calls abandoned at the deadline (their pages counted as misses)."""

    # ---- queries -----------------------------------------------------------------------

    def exists(self, keys: Sequence[ChunkKey]) -> int:
        """How many of ``keys``, from the first, some tier holds (the leading run of hits)."""
        held = self.held(keys)
        return held.index(False) if False in held else len(held)

    def held(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether some tier holds each key: a disk tier answers from its index, a Redis
        tier in one round trip for the keys the faster tiers lack, within the deadline
        (a late or failed answer: not held)."""
        end = self._clock() + self.deadline_s
        held = [False] * len(keys)
        for tier in self.lower:
            rest = [i for i, h in enumerate(held) if not h]
            if not rest:
                break
            for i, h in zip(rest, self._holds(tier, [keys[i] for i in rest], end), strict=True):
                held[i] = h
        return held

    def _holds(self, tier: LowerTier, keys: list[ChunkKey], end: float) -> list[bool]:
        probe: Callable[[Sequence[ChunkKey]], list[bool]] | None = getattr(tier, "exists", None)
        if probe is None:
            return [tier.might_hold(k) for k in keys]
        answer = self._within(self._probe.submit(probe, keys), end)
        return [False] * len(keys) if answer is None else [bool(a) for a in answer]

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """The verified payload of every key a tier holds, fastest tier first; what no tier
        returns in time is left out. A page found in a slower tier is written to the
        faster ones (without waiting)."""
        end = self._clock() + self.deadline_s
        out: dict[ChunkKey, memoryview] = {}
        for level, tier in enumerate(self.lower):
            rest = [k for k in keys if k not in out and tier.might_hold(k)]
            if not rest:
                continue
            found = self._within(tier.get_async(rest), end) or {}
            out.update(found)
            if found and level:
                for upper in self.lower[:level]:
                    upper.put_async(list(found.items()))
        return out

    # ---- writes ------------------------------------------------------------------------

    def put(self, items: Sequence[Item]) -> list[bool]:
        """Write each page (write-back: to the first tier; write-through: to every tier);
        per page, whether it is now held or admission declined it (a clean "not stored",
        as a full cache is). False: a tier refused it or did not answer in time."""
        admitted = self._admitted([k for k, _ in items])
        todo = [(k, p) for k, p in items if k in admitted]
        end = self._clock() + self.deadline_s
        targets = self.lower if self.write_through else self.lower[:1]
        futures = [t.put_async(todo) for t in targets] if todo else []
        written: set[ChunkKey] = set()
        for f in futures:
            done: list[ChunkKey] | None = self._within(f, end)
            written.update(done or [])
        return [k not in admitted or k in written for k, _ in items]

    def _admitted(self, keys: list[ChunkKey]) -> set[ChunkKey]:
        if self._admit is None:
            return set(keys)
        with self._admit_lock:
            fps = self._admit.fingerprints(keys)
            admitted, declined = self._admit.split(keys, fps)
            self._admit.record(keys, fps)
            self.declined += len(declined)
        return set(admitted)

    # ---- deadlines, stats, close -------------------------------------------------------

    def _within(self, future: Future[T], end: float) -> T | None:
        """The future's result by ``end``, or None (late, or failed: both logged)."""
        try:
            return future.result(timeout=max(0.0, end - self._clock()))
        except FutureTimeout:
            self.late += 1
            _log.warning("kvtier: a tier call missed its %.3fs deadline; counted as misses",
                         self.deadline_s)
        except Exception:
            _log.exception("kvtier: a tier call failed; counted as misses")
        return None

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each tier's counters (``TierStats.snapshot``), and this store's own."""
        out = {t.name: t.stats.snapshot() for t in self.lower}
        out["pages"] = {"declined": self.declined, "late": self.late}
        return out

    def remove_all(self, keys: Sequence[ChunkKey]) -> None:
        """Drop ``keys`` from every tier (best effort, waits for no tier)."""
        for tier in self.lower:
            tier.remove_async(list(keys))

    def close(self) -> None:
        """Finish queued work and close every tier (a disk tier releases its directory)."""
        self._probe.close()
        for tier in self.lower:
            tier.close()


def _num_slots(tiers: Sequence[LowerTier]) -> int:
    fixed = [int(t.capacity_chunks) for t in tiers if hasattr(t, "capacity_chunks")]
    return max(fixed) if fixed else ADMISSION_SLOTS


def _demoter(below: LowerTier) -> Callable[[ChunkKey, bytes], None]:
    def demote(key: ChunkKey, payload: bytes) -> None:
        below.put_async([(key, payload)])

    return demote
