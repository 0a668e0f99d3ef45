"""Independent replays in worker processes (``kvtier replay --jobs N``).

``--policy all``, ``--sweep``, ``--target``'s grid and a fleet's router comparisons run
replays that share nothing but the trace: each builds its own store and planner. ``run_all``
runs them in ``jobs`` processes (``spawn``: the same in every start method, no state
inherited by accident) and returns their results in the order given, so what is printed
does not depend on ``jobs``: ``jobs=1`` runs them one after another in this process, as
before. A task is a module-level function and its arguments (both pickled to the worker);
it is called with ``progress=`` a function that counts requests replayed, which reaches
the caller's one progress bar for the whole, in batches.

>>> run_all([Task(divmod, (7, 2), progress=False)], jobs=1)
[(3, 1)]
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

Progress = Callable[[int], None]
PROGRESS_BATCH = 64
"""Requests a worker counts before it reports them (one queue message each batch)."""

_reports: Any = None
"""In a worker process: the queue its progress goes to (set by ``_start_worker``)."""


@dataclass(frozen=True)
class Task:
    """``fn(*args, progress=...)``; ``progress=False`` for a function that takes none."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    progress: bool = True

    def run(self, advance: Progress | None) -> Any:
        return self.fn(*self.args, progress=advance) if self.progress else self.fn(*self.args)


def default_jobs() -> int:
    """One worker per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def check_jobs(jobs: int | None) -> int:
    """``jobs`` as given (an integer >= 1), or ``default_jobs()`` for None."""
    if jobs is None:
        return default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1 (worker processes), got {jobs!r}")
    return jobs


def run_all(tasks: Sequence[Task], jobs: int | None = None,
            advance: Progress | None = None) -> list[Any]:
    """Every task's result, in order, from ``jobs`` processes (module docstring)."""
    workers = min(check_jobs(jobs), len(tasks))
    if workers <= 1:
        return [t.run(advance) for t in tasks]
    ctx = multiprocessing.get_context("spawn")
    # a SimpleQueue writes each put at once (no feeder thread): a task's reports are all in
    # the pipe before its result is sent, so the last drain counts every request
    reports = ctx.SimpleQueue()
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                             initargs=(reports,)) as pool:
        futures = [pool.submit(_run_task, t) for t in tasks]
        _follow(futures, reports, advance)
        return [f.result() for f in futures]


def _follow(futures: list[Future[Any]], reports: Any, advance: Progress | None) -> None:
    """Pass the workers' progress on until every task is done (or one failed)."""
    pending: set[Future[Any]] = set(futures)
    while pending:
        done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        _drain(reports, advance)
        if any(f.exception() is not None for f in done):
            return  # result() raises it
    _drain(reports, advance)


def _drain(reports: Any, advance: Progress | None) -> None:
    while not reports.empty():
        n = reports.get()
        if advance is not None:
            advance(n)


def _start_worker(reports: Any) -> None:
    global _reports
    _reports = reports


def _run_task(task: Task) -> Any:
    """In a worker: the task, its progress sent to the parent in batches."""
    counted = [0]

    def advance(n: int) -> None:
        counted[0] += n
        if counted[0] >= PROGRESS_BATCH:
            _reports.put(counted[0])
            counted[0] = 0

    try:
        return task.run(advance)
    finally:
        if counted[0]:
            _reports.put(counted[0])
