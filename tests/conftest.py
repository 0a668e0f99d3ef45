import os
import sys
from pathlib import Path

# The reference engine's models are tiny: with torch's default threads on a busy 2-core
# machine, idle threads spin and the engine suites run ten times slower. Set before any
# test module imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("ci")
