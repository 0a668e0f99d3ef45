"""Replay a trace at its timestamps, prefill and decoding overlapping (``--concurrent``).

A discrete-event simulation on a virtual clock (the planner gets it too), with the same
planner, store and per-request steps as the sequential replay (``sim.Driver``):

* a request arrives at its ``timestamp`` and joins one FIFO prefill queue;
* the engine prefills up to ``prefill_slots`` requests at once, each at the timing model's
  ``prefill_tokens_per_s``; a request's lookup (and load) happens when it is scheduled, so
  a request scheduled while another is still prefilling the same prefix misses it;
* its chunks are stored when its prefill ends (store transfers are not timed: they run on
  their own stream, off the critical path), then it decodes for ``first_token_ms`` plus
  ``decode_s(output_length)``, overlapping other requests' prefills, and finishes.

TTFT counts the time queued: ``ttft = queued + load + prefill(L - hit) + first_token``;
the no-cache estimate is the same request with ``hit = 0`` and the same queueing (a
conservative saving: without the cache, queues would be longer too).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable

from kvtier.replay.driver import Driver, VirtualClock, Workload, make_store
from kvtier.replay.stats import ReplayStats


class _Sim:
    """The event loop: arrivals, prefill completions and finishes."""

    def __init__(self, workload: Workload, driver: Driver, clock: VirtualClock, slots: int) -> None:
        self.workload, self.driver, self.clock, self.slots = workload, driver, clock, slots
        self.timing = workload.config.timing
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = itertools.count()
        self.queue: deque[int] = deque()
        self.busy = 0
        self.loaded: dict[int, set[object]] = {}

    def push(self, at: float, kind: str, index: int) -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, index))

    def run(self, progress: Callable[[int], None] | None) -> None:
        for i, req in enumerate(self.workload.requests):
            self.push(req.timestamp_ms / 1000.0, "arrive", i)
        while self.events:
            at, _, kind, i = heapq.heappop(self.events)
            self.clock.now = at
            if kind == "arrive":
                self.queue.append(i)
            elif kind == "prefilled":
                self._prefilled(i)
            else:
                self.driver.end(f"r{i}", self.workload.refs[i])
                if progress is not None:
                    progress(1)
            self._schedule()

    def _schedule(self) -> None:
        while self.busy < self.slots and self.queue:
            i = self.queue.popleft()
            req, refs, rid = self.workload.requests[i], self.workload.refs[i], f"r{i}"
            self.driver.begin(rid, req, refs)
            loaded, by_tier, hit = self.driver.load(rid, self.driver.planner.lookup(rid, 0))
            self.loaded[i] = loaded
            queued = self.clock.now - req.timestamp_ms / 1000.0
            busy_s = self.timing.load_s(by_tier) + self.timing.prefill_s(req.input_length - hit)
            stats, first = self.driver.stats, self.timing.first_token_ms / 1000.0
            stats.ttft_s += queued + busy_s + first
            stats.ttft_cold_s += queued + self.timing.prefill_s(req.input_length) + first
            self.busy += 1
            self.push(self.clock.now + busy_s, "prefilled", i)

    def _prefilled(self, i: int) -> None:
        self.busy -= 1
        req, refs = self.workload.requests[i], self.workload.refs[i]
        self.driver.store_all(f"r{i}", req, refs, self.loaded.pop(i))
        done = self.timing.first_token_ms / 1000.0 + self.timing.decode_s(req.output_length)
        self.push(self.clock.now + done, "finish", i)


def replay_concurrent(
    workload: Workload, policy: str, host_slots: int, disk_slots: int = 0,
    progress: Callable[[int], None] | None = None,
) -> ReplayStats:
    """Replay ``workload`` at its timestamps (module docstring) with ``policy``."""
    started = time.perf_counter()
    clock = VirtualClock()
    store = make_store(workload, policy, host_slots, disk_slots)
    driver = Driver(workload.config, store, policy, clock=clock)
    _Sim(workload, driver, clock, workload.config.timing.prefill_slots).run(progress)
    driver.stats.wall_s = time.perf_counter() - started
    return driver.stats
