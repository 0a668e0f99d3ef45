"""A tiny engine stand-in for planner tests: block tables and explicit job completion.

Jobs complete only when a test says so (``finish``), so every interleaving is explicit.
"""

from __future__ import annotations

import itertools

from kvtier import coverage
from kvtier.keys import Namespace
from kvtier.layout import Layout
from kvtier.planner import Planner, TransferJob
from kvtier.store import ChunkStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, layout: Layout, num_slots: int = 1000, wait_timeout_s: float = 1.0,
                 policy: str = "lru") -> None:
        self.layout = layout
        self.clock = Clock()
        self.store = ChunkStore(num_slots, policy=policy)
        self.planner = Planner(layout, self.store, Namespace("test"), clock=self.clock,
                               wait_timeout_s=wait_timeout_s)
        self._ids = itertools.count(1)

    def table(self, num_tokens: int, upto_position: int | None = None) -> list[list[int | None]]:
        """A block table with a fresh block id at every position the engine keeps.

        ``upto_position``: blocks the engine retains when it has computed that many tokens
        (sliding-window blocks before the window are None, as an engine that frees them).
        """
        out = []
        for g in self.layout.groups:
            n = -(-num_tokens // g.tokens_per_block)
            keep = range(n) if upto_position is None else coverage.retained_blocks(g, upto_position)
            out.append([next(self._ids) if i in keep else None for i in range(n)])
        return out

    def produce(self, rid: str, tokens: list[int], *, complete: bool = True) -> TransferJob | None:
        """Run a producer to the end of its prompt and (optionally) complete its stores."""
        p = self.planner
        p.add_request(rid, tokens)
        job = p.on_computed(rid, len(tokens), self.table(len(tokens)))
        if complete and job is not None:
            p.complete_store(job.id, True)
            p.finish(rid)
        return job


def loaded(job: TransferJob) -> dict[int, list[int]]:
    """Chunks per group in a job."""
    out: dict[int, list[int]] = {}
    for c in job.copies:
        out.setdefault(c.group, []).append(c.chunk)
    return out
