"""A second OS process for the SGLang tests (run as a script, not collected).

    sglang_producer.py '<extra config JSON>' <out.json>

Builds an SGLang cache with kvtier's backend (``hicache_kit``), backs ``TOKENS`` up to the
tiers the extra config names on the controller's backup thread, closes the backend, and
writes the pages it stored (hex) to ``out.json``.
"""

from __future__ import annotations

import json
import sys

import hicache_kit as hk

TOKENS = list(range(500, 532))  # 8 pages of 4 tokens


def main(extra: str, out: str) -> None:
    with hk.sglang_cache(json.loads(extra)) as prod:
        leaf = hk.insert(prod, TOKENS)
        pages = hk.fill_host(prod, hk.host_indices(prod, leaf), seed=7)
        hk.back_up(prod, leaf)
        stats = prod.backend.stats()
    with open(out, "w") as f:
        json.dump({"pages": [p.hex() for p in pages], "stats": stats}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
