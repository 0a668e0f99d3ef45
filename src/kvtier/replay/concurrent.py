"""Replay a trace at its timestamps, prefill and decoding overlapping (``--concurrent``).

A discrete-event simulation on a virtual clock (the planner gets it too), with the same
planner, store and per-request steps as the sequential replay (``sim.Driver``):

* a request arrives at its ``timestamp`` and joins its engine's FIFO prefill queue (one
  engine here; a fleet's router picks one per request, ``kvtier.replay.fleet``);
* the engine prefills up to ``prefill_slots`` requests at once, each at the timing model's
  ``prefill_tokens_per_s``; a request's lookup (and load) happens when it is scheduled, so
  a request scheduled while another is still prefilling the same prefix misses it;
* its chunks are stored when its prefill ends (store transfers are not timed: they run on
  their own stream, off the critical path), then it decodes for ``first_token_ms`` plus
  ``decode_s(output_length)``, overlapping other requests' prefills, and finishes.

TTFT counts the time queued: ``ttft = queued + load + prefill(L - hit) + first_token``;
the no-cache estimate is the same request with ``hit = 0`` and the same queueing (a
conservative saving: without the cache, queues would be longer too).

The trace is read as it arrives (``Workload.items``, one request ahead): the simulation
holds only the requests between arrival and finish (``Sim.window``), with their references.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator

from kvtier.replay.driver import Driver, VirtualClock, Workload, make_store
from kvtier.replay.refs import RequestRefs
from kvtier.replay.stats import ReplayStats
from kvtier.replay.trace import TraceRequest

Route = Callable[[int], int]
"""``route(request index) -> engine index``, asked once per request, at its arrival."""


class Sim:
    """The event loop: arrivals, prefill completions and finishes, over one ``Driver`` per
    engine, each with its own FIFO queue and ``prefill_slots`` (``kvtier.replay.fleet``
    routes a fleet's requests through it; a single engine is a fleet of one).

    ``outstanding[e]`` is engine ``e``'s prefill work not yet done, in tokens: a queued
    request's prompt, a prefilling request's prompt less its hit (a router's load signal).
    """

    def __init__(self, workload: Workload, drivers: list[Driver], clock: VirtualClock,
                 route: Route) -> None:
        self.workload, self.drivers, self.clock, self.route = workload, drivers, clock, route
        self.timing = workload.config.timing
        self.slots = self.timing.prefill_slots
        self.ttft = self.timing.arithmetic()  # asked per request: built once
        # (time, 0 for an arrival else 1, order, kind, request index): arrivals are read
        # one ahead, yet ordered as if all had been queued first (by index), as they were
        self.events: list[tuple[float, int, int, str, int]] = []
        self.seq = itertools.count()
        self.window: dict[int, tuple[TraceRequest, RequestRefs]] = {}
        """Requests between arrival and finish, with their references: all that is held."""
        self._arrivals: Iterator[tuple[int, tuple[TraceRequest, RequestRefs]]] = iter(())
        self.queues: list[deque[int]] = [deque() for _ in drivers]
        self.busy = [0] * len(drivers)
        self.outstanding = [0] * len(drivers)
        self.engine: dict[int, int] = {}  # request index -> engine, until it finishes
        self.loaded: dict[int, tuple[set[object], int]] = {}  # keys loaded, hit tokens

    def push(self, at: float, kind: str, index: int) -> None:
        heapq.heappush(self.events, (at, 1, next(self.seq), kind, index))

    def _next_arrival(self) -> None:
        """Read the next request of the trace into the window and schedule its arrival."""
        for i, (req, refs) in self._arrivals:
            self.window[i] = req, refs
            heapq.heappush(self.events, (req.timestamp_ms / 1000.0, 0, i, "arrive", i))
            return

    def run(self, progress: Callable[[int], None] | None) -> None:
        self._arrivals = enumerate(self.workload.items())
        self._next_arrival()
        while self.events:
            at, _, _, kind, i = heapq.heappop(self.events)
            self.clock.now = at
            if kind == "arrive":
                self._next_arrival()
                e = self.engine[i] = self.route(i)
                self.queues[e].append(i)
                self.outstanding[e] += self.window[i][0].input_length
            elif kind == "prefilled":
                self._prefilled(i)
            else:
                self.drivers[self.engine.pop(i)].end(f"r{i}", self.window.pop(i)[1])
                if progress is not None:
                    progress(1)
                continue
            self._schedule(self.engine[i])

    def _schedule(self, e: int) -> None:
        driver, queue = self.drivers[e], self.queues[e]
        while self.busy[e] < self.slots and queue:
            i = queue.popleft()
            (req, refs), rid = self.window[i], f"r{i}"
            driver.begin(rid, req, refs)
            loaded, by_tier, hit = driver.load(rid, driver.planner.lookup(rid, 0))
            self.loaded[i] = loaded, hit
            self.outstanding[e] -= hit
            queued = self.clock.now - req.timestamp_ms / 1000.0
            busy_s = self.ttft.load_s(by_tier) + self.ttft.prefill_s(req.input_length - hit)
            first = self.timing.first_token_ms / 1000.0
            driver.stats.add_ttft(queued + self.ttft.prefill_s(req.input_length) + first,
                                  queued + busy_s + first)
            self.busy[e] += 1
            self.push(self.clock.now + busy_s, "prefilled", i)

    def _prefilled(self, i: int) -> None:
        e = self.engine[i]
        self.busy[e] -= 1
        req, refs = self.window[i]
        loaded, hit = self.loaded.pop(i)
        self.outstanding[e] -= req.input_length - hit
        self.drivers[e].store_all(f"r{i}", req, refs, loaded)
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
    Sim(workload, [driver], clock, lambda i: 0).run(progress)
    driver.stats.wall_s = time.perf_counter() - started
    return driver.stats
