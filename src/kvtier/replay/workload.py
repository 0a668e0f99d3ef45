"""A trace to replay, streamed: each request's references computed as it is replayed.

A ``Workload`` is a trace source and a ``ReplayConfig``. The source is opened afresh for
every pass (``TraceSource``: a function returning an iterable of requests; a list works
too, held by its caller), and ``items()`` yields each request with its references
(``RequestRefs``), computed then and dropped after: a replay holds only what its store,
planner and in-flight requests hold, never the trace. What each replay keeps beyond that:

* sequential, an online policy: nothing (one pass);
* ``belady``: the future, as each chunk key's next-use positions (``FutureIndex``: one
  entry per distinct chunk, 8 bytes per reference), from a first pass (``future``);
* ``infinite`` and ``--sweep``: the distinct chunk count and the largest request, from
  that same first pass (``summary``); the index is kept for later replays of the workload;
* ``--concurrent``: the requests between arrival and finish (``kvtier.replay.concurrent``).

Hashing a request's stream is repeated by every pass over it: memory is traded for time.

>>> from kvtier.layout import Group, Layout
>>> from kvtier.replay.workload import ReplayConfig
>>> from kvtier.replay.trace import TraceRequest, TraceSource
>>> reqs = [TraceRequest(0.0, 600, 1, (7, 8)), TraceRequest(1.0, 600, 1, (7, 9))]
>>> w = Workload(lambda: iter(reqs), ReplayConfig(Layout((Group("full", 512),))))
>>> [len(refs.keys) for _, refs in w.items()], w.summary()
([2, 2], Summary(requests=2, references=4, distinct_chunks=3, max_request_chunks=2))
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from kvtier.boundaries import BoundaryMode
from kvtier.layout import Layout
from kvtier.replay.refs import RefsPlanner, RequestRefs, StoreScope, replay_namespace
from kvtier.replay.timing import TimingModel
from kvtier.replay.trace import BLOCK_TOKENS, TraceRequest, TraceSource
from kvtier.store.admission import Admission
from kvtier.store.policies.belady import FutureIndex

Progress = Callable[[int], None]


@dataclass(frozen=True)
class ReplayConfig:
    """How to replay: the layout, the stored scope, the time model."""

    layout: Layout
    block_tokens: int = BLOCK_TOKENS
    """Tokens per trace block (512 in Mooncake's traces)."""
    scope: StoreScope = "blocks"
    """What a request stores (``kvtier.replay.refs.StoreScope``)."""
    timing: TimingModel = field(default_factory=TimingModel)
    boundaries: BoundaryMode = "dense"
    """Which boundaries a producer serves (``kvtier.boundaries``)."""
    admission: Admission = field(default_factory=Admission)
    """When the host store admits a new chunk (``kvtier.store.admission``; ``--admit``)."""


@dataclass(frozen=True)
class Summary:
    """What a first pass over a workload counts."""

    requests: int
    references: int
    """Chunk references, over every request."""
    distinct_chunks: int
    max_request_chunks: int
    """The most chunks one request references."""


def count_requests(source: TraceSource) -> int:
    """The requests of one pass over ``source``: every line read and checked (a bad one
    raises ``TraceError``), none held."""
    return sum(1 for _ in source())


class Workload:
    """A trace source and how to replay it (module docstring)."""

    def __init__(
        self, requests: Sequence[TraceRequest] | TraceSource, config: ReplayConfig,
        progress: Progress | None = None,
    ) -> None:
        """``requests``: a source, or a sequence (then held by the caller); ``progress``
        is told of each request of the first pass, when one runs (``future``)."""
        self.source: TraceSource = (requests if callable(requests)
                                    else functools.partial(iter, requests))
        self.config, self._progress = config, progress
        self._future: FutureIndex | None = None
        self._summary: Summary | None = None
        self._held: tuple[list[TraceRequest], list[RequestRefs]] | None = None

    def __getstate__(self) -> dict[str, object]:
        """What a worker process gets (``kvtier.replay.parallel``): the source, the config
        and the first pass's summary; the future is rebuilt there if a replay needs it."""
        return {**self.__dict__, "_progress": None, "_future": None, "_held": None}

    def stream(self) -> Iterator[TraceRequest]:
        """The requests, one pass."""
        return iter(self.source())

    def items(self, progress: Progress | None = None) -> Iterator[tuple[TraceRequest, RequestRefs]]:
        """Each request with its references, in trace order, computed one at a time."""
        c = self.config
        planner = RefsPlanner(c.layout, replay_namespace(c.layout), c.block_tokens, c.scope)
        for req in self.stream():
            yield req, planner.refs(req)
            if progress is not None:
                progress(1)

    def future(self) -> FutureIndex:
        """Every reference in replay order, as each key's positions: Belady's future.
        Built by one pass, then kept (with ``summary``) for every later replay."""
        if self._future is None:
            index, largest, requests = FutureIndex(), 0, 0
            for _, refs in self.items(self._progress):
                index.add(refs.keys)
                largest, requests = max(largest, len(refs.keys)), requests + 1
            self._future = index
            self._summary = Summary(requests, len(index), index.num_keys(), largest)
        return self._future

    def summary(self) -> Summary:
        """Requests, references, distinct chunks, the largest request (``future``'s pass)."""
        if self._summary is None:
            self.future()
        assert self._summary is not None
        return self._summary

    def num_distinct_chunks(self) -> int:
        return self.summary().distinct_chunks

    def max_request_chunks(self) -> int:
        return self.summary().max_request_chunks

    @property
    def requests(self) -> list[TraceRequest]:
        """Every request, held (the whole trace, as before streaming): for small traces and
        tests; replays use ``items``."""
        return self._hold()[0]

    @property
    def refs(self) -> list[RequestRefs]:
        """Every request's references, held (``requests``)."""
        return self._hold()[1]

    def _hold(self) -> tuple[list[TraceRequest], list[RequestRefs]]:
        if self._held is None:
            pairs = list(self.items())
            self._held = [p[0] for p in pairs], [p[1] for p in pairs]
        return self._held

