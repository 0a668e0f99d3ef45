"""How much of the replay's ratio to a plain LRU its references alone take (issue 32).

``benchmarks/replay.py`` divides the single-group replay's time by a plain ``OrderedDict``
LRU over the same block ids. The replay also hashes every request's synthetic token stream
(``Workload.items``); the plain LRU hashes nothing. This prints, best of ``--repeats`` runs
on the benchmark's workload, each of these over the plain LRU's time: the references
(``items``: ``ReplayChain``s over the block ids, since issue 32's eighth round), the
``ReplayChain``s alone, and what they replaced: the token streams alone and ``KeyChain``s
over prebuilt streams (SHA-256, with the native loop in the serving build). A profiling
script, not a benchmark: one JSON line.

    python scripts/replay_floor.py [--limit N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from kvtier.keys import KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, Workload, read_trace
from kvtier.replay.refs import ReplayChain, replay_namespace, token_stream
from replay import KV_BYTES_PER_TOKEN, plain_lru


def replay_chain(layout: Layout, namespace: Namespace, ids: tuple[int, ...]) -> ReplayChain:
    """The chain of every block ``ids`` name."""
    chain = ReplayChain(layout, namespace, 512)
    chain.extend_blocks(ids, 512 * len(ids))
    return chain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="the first N requests (default: all)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each (default 5)")
    args = parser.parse_args()
    requests = read_trace(limit=args.limit)
    layout = Layout((Group("full", 512, bytes_per_token=KV_BYTES_PER_TOKEN),))
    workload, namespace = Workload(requests, ReplayConfig(layout)), replay_namespace(layout)
    streams = [token_stream(r.hash_ids, 512) for r in requests]
    runs: dict[str, Callable[[], object]] = {
        "plain_lru": lambda: plain_lru(requests, 3000),
        "references": lambda: [None for _ in workload.items()],
        "replay_chains": lambda: [replay_chain(layout, namespace, r.hash_ids)
                                  for r in requests],
        "token_streams": lambda: [token_stream(r.hash_ids, 512) for r in requests],
        "key_chains": lambda: [KeyChain(layout, namespace, s) for s in streams],
    }
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    print(json.dumps({"requests": len(requests),
                      "stream_mb": round(sum(s.nbytes for s in streams) / 1e6, 1),
                      "seconds": {k: round(v, 4) for k, v in best.items()},
                      "over_plain_lru": {k: round(v / best["plain_lru"], 1)
                                         for k, v in best.items()}}))


if __name__ == "__main__":
    main()
