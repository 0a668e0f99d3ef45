"""The planner's transfer jobs in flight: the store handles they complete, the engine
blocks store jobs still read (fences), and the keys load jobs bring in.

Kept apart from the request lifecycle (``kvtier.planner.planner``) because a job outlives
the step that made it: the data plane completes it later, and ``reset`` cancels what is
left, whose late completions are then ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from kvtier.keys import ChunkKey
from kvtier.planner.types import TransferJob
from kvtier.store.results import LoadHandle, StoreHandle

JobEntry = tuple[TransferJob, LoadHandle | StoreHandle]


class JobBook:
    """Jobs in flight by id, with their fences and the keys being loaded."""

    def __init__(self, num_groups: int) -> None:
        self._jobs: dict[int, JobEntry] = {}
        self._loading: dict[ChunkKey, int] = {}  # keys in load jobs in flight: counts
        self._fences = Fences(num_groups)
        self._cancelled: set[int] = set()
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def add(self, job: TransferJob, handle: LoadHandle | StoreHandle) -> None:
        """A job handed to the data plane: a load's keys count as loading, a store's
        blocks are fenced."""
        self._jobs[job.id] = (job, handle)
        if job.direction == "load":
            loading = self._loading  # a plain loop: Counter.update is interpreted
            for c in job.copies:
                loading[c.key] = loading.get(c.key, 0) + 1
        else:
            self._fences.add(job)

    def take(self, job_id: int, direction: str) -> JobEntry | None:
        """The job the data plane completed, no longer in flight; None for one cancelled by
        ``cancel_all``; ValueError for one not in flight."""
        if job_id in self._cancelled:
            self._cancelled.discard(job_id)
            return None
        entry = self._jobs.get(job_id)
        if entry is None or entry[0].direction != direction:
            raise ValueError(f"no {direction} job {job_id} in flight (completed twice?)")
        del self._jobs[job_id]
        job = entry[0]
        if direction == "load":
            loading = self._loading  # positive counts only: a key in it is being loaded
            for c in job.copies:
                n = loading.get(c.key, 0) - 1
                if n > 0:
                    loading[c.key] = n
                else:
                    loading.pop(c.key, None)
        else:
            self._fences.remove(job_id)
        return entry

    def cancel_all(self) -> list[JobEntry]:
        """Every job in flight, forgotten; their later completions are ignored."""
        entries = list(self._jobs.values())
        self._cancelled.update(self._jobs)
        self._jobs.clear()
        self._fences.clear()
        self._loading.clear()
        return entries

    def loading(self) -> Callable[[ChunkKey], bool] | None:
        """Whether a key is being loaded by a job in flight; None while nothing is. The
        counts are positive (``take`` drops a key at zero), so membership answers it, in C."""
        return self._loading.__contains__ if self._loading else None

    def reading(self, group: int, block_ids: Iterable[int]) -> list[int]:
        """Store jobs still reading any of ``block_ids`` of ``group``, in id order."""
        return self._fences.jobs_reading(group, block_ids)

    def __len__(self) -> int:
        return len(self._jobs)

    def check_quiescent(self) -> None:
        """Assert nothing is in flight: no jobs, fences or loads."""
        assert not self._jobs, f"{len(self._jobs)} jobs still in flight"
        assert not self._fences, f"{len(self._fences)} fences left"
        assert not self._loading, "loads still counted"


class Fences:
    """Engine blocks that store jobs in flight still read, per job and group."""

    def __init__(self, num_groups: int) -> None:
        self._num_groups = num_groups
        self._jobs: dict[int, list[frozenset[int]]] = {}

    def add(self, job: TransferJob) -> None:
        per_group: list[set[int]] = [set() for _ in range(self._num_groups)]
        for c in job.copies:
            per_group[c.group].update(c.block_ids)
        self._jobs[job.id] = [frozenset(s) for s in per_group]

    def remove(self, job_id: int) -> None:
        del self._jobs[job_id]

    def jobs_reading(self, group: int, block_ids: Iterable[int]) -> list[int]:
        """Store jobs still reading any of ``block_ids`` of ``group``, in id order."""
        wanted = set(block_ids)
        return sorted(j for j, blocks in self._jobs.items() if not blocks[group].isdisjoint(wanted))

    def clear(self) -> None:
        self._jobs.clear()

    def __len__(self) -> int:
        return len(self._jobs)
