import os
import sys
from collections.abc import Iterator
from pathlib import Path

# The reference engine's models are tiny: with torch's default threads on a busy 2-core
# machine, idle threads spin and the engine suites run ten times slower. Set before any
# test module imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("ci")

from redis_cluster import HAVE_CLUSTER_TOOLS, LocalRedisCluster  # noqa: E402


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[LocalRedisCluster]:
    """A fresh three-master Redis Cluster on loopback (``tests/redis_cluster.py``), killed
    at teardown; skips where redis-server or redis-cli is missing."""
    if not HAVE_CLUSTER_TOOLS:
        pytest.skip("redis-server/redis-cli not on PATH (CI installs Debian's redis-server)")
    with LocalRedisCluster(tmp_path / "cluster") as cluster:
        yield cluster
