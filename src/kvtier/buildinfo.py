"""Which build of kvtier is running: pure Python, or with modules compiled by mypyc.

``KVTIER_COMPILE=1 pip install kvtier`` compiles the request-path modules (setup.py,
``COMPILED``); both builds run the same code and pass the same tests. Benchmarks print the
build beside their figures, since the two differ in speed.

>>> build() in ("pure", "mypyc")
True
"""

from __future__ import annotations

import sys
from importlib.machinery import EXTENSION_SUFFIXES

import kvtier.planner.planner
import kvtier.store.manager  # noqa: F401  (imported so that the check below sees them)


def compiled_modules() -> list[str]:
    """The loaded ``kvtier`` modules that are compiled extension modules, sorted."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("kvtier.")
        and str(getattr(module, "__file__", "") or "").endswith(tuple(EXTENSION_SUFFIXES))
    )


def build() -> str:
    """``"mypyc"`` when the request-path modules are compiled, else ``"pure"``."""
    return "mypyc" if compiled_modules() else "pure"
