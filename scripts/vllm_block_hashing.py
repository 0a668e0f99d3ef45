"""How long vLLM 0.33 takes to hash a 131,072-token prompt into its prefix-cache block hashes.

Run in the vLLM test environment: ``.venv-vllm/bin/python scripts/vllm_block_hashing.py``.
vLLM computes these hashes when a request is created, outside its scheduler; its native
offloading connector's lookup then only slices them. kvtier's planner benchmark counts its
own key building (hashing every token) inside the lookup, so this is the figure to set
beside the difference (see ``benchmarks/planner.py``).
"""

from __future__ import annotations

import time

import numpy as np
from vllm.utils.hashing import sha256  # vLLM 0.33's default prefix_caching_hash_algo
from vllm.v1.core import kv_cache_utils

PROMPT, BLOCK = 131072, 16


def main() -> None:
    kv_cache_utils.init_none_hash(sha256)
    tokens = np.random.default_rng(0).integers(0, 150_000, PROMPT).tolist()
    times = []
    for _ in range(5):
        start, parent = time.perf_counter(), None
        for i in range(0, PROMPT, BLOCK):
            parent = kv_cache_utils.hash_block_tokens(sha256, parent, tokens[i : i + BLOCK], None)
        times.append(time.perf_counter() - start)
    print(f"vLLM block hashes of {PROMPT} tokens ({PROMPT // BLOCK} blocks of {BLOCK}, "
          f"sha256): {min(times) * 1e3:.1f} ms (best of 5)")


if __name__ == "__main__":
    main()
