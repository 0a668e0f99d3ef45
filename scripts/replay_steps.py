"""CPU seconds of each step of the replay's request loop (issue 32), for one policy.

Runs ``kvtier replay`` with the given arguments (``--json`` implied), but times the
driver's steps apart with ``time.process_time``: reading a request and hashing its
references (``items``), ``begin`` (where its chunks are, the block hit, ``add_request``),
the planner's ``lookup``, the hit's ``load``, ``store_all`` (the planner's store path and
the store's) and ``end``. The same calls as ``kvtier.replay.driver.replay``, so the same
figures; prints one JSON line of seconds. Compare builds back to back, interleaved: a
shared machine's speed drifts between runs.

    python scripts/replay_steps.py --limit 3000
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import sys
import time
from collections.abc import Callable

import kvtier.cli.replay as cli_replay
from kvtier.cli.main import build_parser
from kvtier.replay import driver
from kvtier.replay.stats import ReplayStats
from kvtier.replay.workload import Workload

STEPS = ("items", "begin", "lookup", "load", "store_all", "end")


def timed_replay(seconds: dict[str, float]) -> Callable[..., ReplayStats]:
    """``driver.replay`` with each step's CPU seconds added to ``seconds``."""

    def replay(workload: Workload, policy: str, host_slots: int, disk_slots: int = 0,
               progress: Callable[[int], None] | None = None) -> ReplayStats:
        clock, start = time.process_time, time.process_time()
        store = driver.make_store(workload, policy, host_slots, disk_slots)
        run = driver.Driver(workload.config, store, policy)
        threshold = gc.get_threshold()
        gc.set_threshold(driver.YOUNG_COLLECTION_EVERY, *threshold[1:])
        items, i = iter(workload.items(progress)), 0
        try:
            while True:
                t0 = clock()
                try:
                    req, refs = next(items)
                except StopIteration:
                    break
                rid, i = f"r{i}", i + 1
                t1 = clock()
                where = run.begin(rid, req, refs)
                t2 = clock()
                found = run.lookup(rid)
                t3 = clock()
                loaded, by_tier, hit = run.load(rid, found)
                t4 = clock()
                timing = run.config.timing
                run.stats.add_ttft(timing.ttft_s(req.input_length, 0, {}),
                                   timing.ttft_s(req.input_length, hit, by_tier))
                still = where if not run.store.lower and run.plane is None else None
                run.store_all(rid, req, refs, loaded, still)
                t5 = clock()
                run.end(rid, refs)
                t6 = clock()
                for step, a, b in zip(STEPS, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6),
                                      strict=True):
                    seconds[step] += b - a
        finally:
            gc.set_threshold(*threshold)
        seconds["total"] += time.process_time() - start
        return run.stats

    return replay


def main() -> None:
    seconds = dict.fromkeys((*STEPS, "total"), 0.0)
    cli_replay.replay = timed_replay(seconds)  # type: ignore[assignment]
    args = build_parser().parse_args(["replay", "--json", *sys.argv[1:]])
    if args.concurrent or args.instances or args.bytes:
        raise SystemExit("replay_steps times the sequential metadata replay only")
    with contextlib.redirect_stdout(io.StringIO()):
        cli_replay.run(args)
    print(json.dumps({k: round(v, 3) for k, v in seconds.items()}))


if __name__ == "__main__":
    main()
