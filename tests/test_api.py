"""The public API is pinned: a change to it is a deliberate change to this test."""

import subprocess
import sys

import kvtier

PUBLIC = {
    "PRESETS", "BlockRun", "ChunkKey", "ChunkRanges", "ChunkState", "ChunkStore", "Group",
    "HostSlab", "KeyChain", "Layout", "Lookup", "Namespace", "Outcome", "Planner",
    "RequestLimits", "Span", "StoreRefusal", "TransferJob", "__version__",
    "admissible_boundaries", "load_chunks", "load_layout", "load_set", "preset", "required",
    "retained", "retained_blocks", "store_blocks", "store_delta", "store_set", "store_sets",
    "with_eagle", "with_mtp",
}


def test_all_is_pinned():
    assert set(kvtier.__all__) == PUBLIC
    for name in kvtier.__all__:
        assert hasattr(kvtier, name), name


def test_core_imports_without_torch():
    code = "import sys, kvtier, kvtier.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
