"""kvtier behind SGLang: a HiCache storage backend over kvtier's disk and Redis tiers.

Load it with ``--hicache-storage-backend dynamic`` and, in
``--hicache-storage-backend-extra-config``, ``"backend_name": "kvtier", "module_path":
"kvtier.integrations.sglang", "class_name": "KvtierHiCacheStorage"`` plus the tiers
(``disk``, ``redis``: the ``TierConfig`` keys the vLLM connector takes). docs/sglang.md
has a command line to copy.

Importing this package imports SGLang (its ``HiCacheStorage`` is the base class); without
SGLang it raises an ImportError that says what to install. Nothing else in kvtier imports it.
"""

try:
    import sglang.srt.mem_cache.hicache_storage  # noqa: F401
except ImportError as e:
    raise ImportError(
        "kvtier.integrations.sglang needs SGLang (the HiCache storage interface of sglang "
        "0.5.23): pip install sglang==0.5.23, or for the tests on a CPU-only machine run "
        f"scripts/install_sglang_test_env.sh (docs/sglang.md). The import failed with: {e}"
    ) from e

from kvtier.integrations.sglang.hybrid import KvtierHiCacheStorage
from kvtier.integrations.sglang.options import SglangOptions

__all__ = ["KvtierHiCacheStorage", "SglangOptions"]
