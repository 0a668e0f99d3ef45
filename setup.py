"""Pure Python by default; ``KVTIER_COMPILE=1`` compiles the hot modules with mypyc and
builds ``kvtier._native`` (batched byte copies and SHA-256 prefix digests, in C over OpenSSL).

Everything else about the package is in ``pyproject.toml``. See README, "Compiled build".
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Extension, setup

sys.path.insert(0, str(Path(__file__).resolve().parent / "build_backend"))
from kvtier_build import compile_requested  # the one reading of KVTIER_COMPILE

COMPILED = [
    "src/kvtier/boundaries.py",
    "src/kvtier/coverage.py",
    "src/kvtier/integrations/vllm/scheduler.py",
    "src/kvtier/planner/binding.py",
    "src/kvtier/planner/lookup.py",
    "src/kvtier/planner/planner.py",
    "src/kvtier/planner/requests.py",
    "src/kvtier/planner/types.py",
    "src/kvtier/store/manager.py",
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
]
"""The modules on the request path: per-key and per-step work in the store and planner."""


NATIVE = Extension(
    "kvtier._native",
    sources=["src/kvtier/_native.c"],
    libraries=["crypto"],  # OpenSSL's libcrypto, as CPython's hashlib; headers: libssl-dev
    extra_compile_args=["-O2"],
    optional=True,  # without a C compiler or OpenSSL's headers: the pure-Python paths
)
"""The copy and hashing loops (``kvtier.buildinfo.native()`` says whether it was built)."""


def ext_modules() -> list:
    if not compile_requested():
        return []
    from mypyc.build import mypycify  # the backend put mypy in the build environment

    return [*mypycify(COMPILED, opt_level="3", debug_level="0"), NATIVE]


setup(ext_modules=ext_modules())
