"""Replay benchmark: the whole bundled trace with one policy, against a plain simulation.

One run measures, on the bundled Mooncake conversation trace (12,031 requests, 288,500
block references) for one full-attention group of 512-token chunks and LRU:

* ``refs_s``: hashing every request's synthetic token stream once (``Workload``), shared
  by every policy a replay compares;
* ``replay_s``: the replay itself, through the real ``Planner`` and ``ChunkStore`` (the
  planner hashes the prompt again, as an engine would);
* ``plain_s``: a straightforward ``OrderedDict`` LRU over the block ids, in the same
  process; ``ratio`` is ``(refs_s + replay_s) / plain_s`` (the machine is shared and noisy:
  compare ratios, not seconds).

Targets: the whole replay (references and one policy) in under 60 s, "seconds, not
minutes", and the replay's block hit count equal to the plain simulation's.
Prints a table, then as its last line one JSON object.

    python benchmarks/replay.py [--capacity N] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import OrderedDict
from collections.abc import Sequence

from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, TraceRequest, Workload, read_trace, replay

MAX_TOTAL_S = 60.0


def plain_lru(requests: Sequence[TraceRequest], capacity: int) -> int:
    """Block hits of a plain LRU over block ids (prefix semantics)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for r in requests:
        for h in r.hash_ids:
            if h not in cache:
                break
            hits += 1
        for h in r.hash_ids:
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=3000, help="host chunks (default 3000)")
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    args = parser.parse_args()
    requests = read_trace(limit=args.limit)
    t0 = time.perf_counter()
    workload = Workload(requests, ReplayConfig(Layout((Group("full", 512),))))
    t1 = time.perf_counter()
    stats = replay(workload, "lru", args.capacity)
    t2 = time.perf_counter()
    plain_hits = plain_lru(requests, args.capacity)
    t3 = time.perf_counter()
    refs_s, replay_s, plain_s = t1 - t0, t2 - t1, t3 - t2
    total = refs_s + replay_s
    figures = {"requests": len(requests), "block_refs": stats.block_refs,
               "refs_s": refs_s, "replay_s": replay_s, "total_s": total, "plain_s": plain_s,
               "ratio": total / plain_s, "block_hit_rate": stats.block_hit_rate,
               "token_hit_rate": stats.token_hit_rate,
               "plain_block_hit_rate": plain_hits / stats.block_refs}
    met = total <= MAX_TOTAL_S and stats.block_hits == plain_hits
    print(f"{'figure':<22}{'value':>14}")
    for name, value in figures.items():
        print(f"{name:<22}{value:>14.4f}" if isinstance(value, float) else f"{name:<22}{value:>14}")
    print(json.dumps({"benchmark": "replay", "figures": figures,
                      "targets": {"total_s": MAX_TOTAL_S, "block_hit_rate": "equal to plain"},
                      "met": bool(met)}))


if __name__ == "__main__":
    main()
