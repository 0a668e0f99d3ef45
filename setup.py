"""Pure Python by default; ``KVTIER_COMPILE=1`` compiles the hot modules with mypyc and
builds ``kvtier._native`` (batched byte copies and SHA-256 prefix digests, in C over OpenSSL).

Everything else about the package is in ``pyproject.toml``. See README, "Compiled build".
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent / "build_backend"))
from kvtier_build import compile_requested, native_declined  # the one reading of each

# Not kvtier.integrations.vllm.scheduled: it runs once a step, right after the forward,
# and interpreted it read a quiet step in half the time (cold code: docs/vllm.md).
COMPILED = [
    "src/kvtier/boundaries.py",
    "src/kvtier/coverage.py",
    "src/kvtier/integrations/vllm/scheduler.py",
    "src/kvtier/integrations/vllm/state.py",
    "src/kvtier/integrations/vllm/tracked.py",
    "src/kvtier/keys.py",
    "src/kvtier/planner/at_once.py",
    "src/kvtier/planner/binding.py",
    "src/kvtier/planner/jobs.py",
    "src/kvtier/planner/lookup.py",
    "src/kvtier/planner/planner.py",
    "src/kvtier/planner/requests.py",
    "src/kvtier/planner/serving.py",
    "src/kvtier/planner/types.py",
    "src/kvtier/replay/conversations.py",
    "src/kvtier/replay/driver.py",
    "src/kvtier/replay/hits.py",
    "src/kvtier/replay/refs.py",
    "src/kvtier/replay/stats.py",
    "src/kvtier/replay/store.py",
    "src/kvtier/replay/ttft.py",
    "src/kvtier/retention.py",
    "src/kvtier/store/allocator.py",
    "src/kvtier/store/checks.py",
    "src/kvtier/store/manager.py",
    "src/kvtier/store/offers.py",
    "src/kvtier/store/pins.py",
    "src/kvtier/store/results.py",
    "src/kvtier/store/policies/arc.py",
    "src/kvtier/store/policies/base.py",
    "src/kvtier/store/policies/belady.py",
    "src/kvtier/store/policies/ghost.py",
    "src/kvtier/store/policies/lru.py",
    "src/kvtier/store/policies/pfreq.py",
    "src/kvtier/store/policies/queue.py",
    "src/kvtier/store/policies/s3fifo.py",
    "src/kvtier/store/policies/slots.py",
    "src/kvtier/tiers/tiered.py",
    "src/kvtier/tiers/writedown.py",
]
"""The modules on the request path: per-key and per-step work in the store and planner,
and the replay's per-request loop (``kvtier replay`` runs them once per trace request)."""


NATIVE = Extension(
    "kvtier._native",
    sources=["src/kvtier/_native.c", "src/kvtier/_native_copy.c", "src/kvtier/_native_lanes.c",
             "src/kvtier/_native_plan.c", "src/kvtier/_native_resp.c",
             "src/kvtier/_native_offers.c", "src/kvtier/_native_order.c",
             "src/kvtier/_native_order_core.c"],
    depends=["src/kvtier/_native.h", "src/kvtier/_native_order.h"],
    libraries=["crypto"],  # OpenSSL's libcrypto, as CPython's hashlib; headers: libssl-dev
    extra_compile_args=["-O2", "-fvisibility=hidden"],  # the module exports PyInit only
)
"""The copy and hashing loops (``kvtier.buildinfo.native()`` says whether it was built)."""

NATIVE_HELP = (
    "kvtier: KVTIER_COMPILE=1 builds the native module kvtier._native, which needs a C "
    "compiler, Python's headers and OpenSSL's (Debian: apt-get install build-essential "
    "python3-dev libssl-dev). Install those, or set KVTIER_NATIVE=0 to build the compiled "
    "modules without it (CPU copies and key hashing then run at the pure build's speed)."
)


class BuildExt(build_ext):
    """A compiled build that asked for the native module fails loudly when it cannot build
    it, naming what is missing, rather than installing without it in silence."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            if ext.name != NATIVE.name:
                raise
            raise SystemExit(f"{NATIVE_HELP}\nThe compiler said: {e}") from e


def ext_modules() -> list:
    if not compile_requested():
        return []
    from mypyc.build import mypycify  # the backend put mypy in the build environment

    native = [] if native_declined() else [NATIVE]
    config = ["--config-file", str(Path(__file__).resolve().parent / "build_backend" / "mypyc.ini")]
    return [*mypycify([*config, *COMPILED], opt_level="3", debug_level="0"), *native]


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
