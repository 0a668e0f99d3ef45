"""Workload replay and capacity planning (``kvtier replay``; docs/replay.md).

* ``trace``: Mooncake-format traces, read with line-numbered errors; the bundled trace;
* ``synth``: synthetic multi-round conversation traces in the same format;
* ``refs``: each request's synthetic token stream and the chunks it references;
* ``driver``: the sequential replay through the real ``Planner`` and store;
* ``concurrent``: the replay at the trace's timestamps, prefill and decoding overlapping;
* ``store``: the replay's store, the real ``TieredStore`` plus the driver's queries;
  ``metadata``: it over tiers that keep only keys; ``bytes_store``: it over real tiers,
  with a verifying data plane; ``bytes_run``: ``--bytes``, its options and report;
* ``policies``, ``timing``, ``options``, ``stats``: what a replay compares, the TTFT
  model, ``key=value`` option strings, and the counts;
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
