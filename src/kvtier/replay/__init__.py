"""Workload replay and capacity planning (``kvtier replay``; docs/replay.md).

* ``trace``: Mooncake-format traces, read with line-numbered errors; the bundled trace;
* ``synth``: synthetic multi-round conversation traces in the same format;
* ``refs``: each request's synthetic token stream and the chunks it references;
* ``sim``: the sequential replay through the real ``Planner`` and store;
* ``concurrent``: the replay at the trace's timestamps, prefill and decoding overlapping;
* ``policies``, ``tiers``, ``timing``, ``stats``: what a replay compares, where chunks
  live, the TTFT model, and the counts;
* ``sweep``: hit rate against capacity, as CSV, JSON and a plot.
"""

from kvtier.replay.driver import ReplayConfig, Workload, replay
from kvtier.replay.stats import ReplayStats
from kvtier.replay.timing import TimingModel
from kvtier.replay.trace import TraceError, TraceRequest, read_trace

__all__ = [
    "ReplayConfig",
    "ReplayStats",
    "TimingModel",
    "TraceError",
    "TraceRequest",
    "Workload",
    "read_trace",
    "replay",
]
