"""Which build of kvtier is running: pure Python, or with modules compiled by mypyc.

``KVTIER_COMPILE=1 pip install kvtier`` compiles the request-path modules (setup.py,
``COMPILED``) and builds ``kvtier._native``, the C loops for byte copies and SHA-256 prefix
digests (``NATIVE``); both builds run the same code and pass the same tests. Benchmarks print
the build beside their figures, since the two differ in speed.

>>> build() in ("pure", "mypyc"), isinstance(native(), bool)
(True, True)
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
        if name.startswith("kvtier.") and name != "kvtier._native"
        and str(getattr(module, "__file__", "") or "").endswith(tuple(EXTENSION_SUFFIXES))
    )


def build() -> str:
    """``"mypyc"`` when the request-path modules are compiled, else ``"pure"``."""
    return "mypyc" if compiled_modules() else "pure"


def native() -> bool:
    """Whether ``kvtier._native`` (C, built only by a compiled build) is installed."""
    try:
        import kvtier._native  # noqa: F401
    except ImportError:
        return False
    return True


def describe() -> str:
    """One line for benchmark output: ``"mypyc, native C loops"`` or ``"pure"``."""
    return build() + (", native C loops" if native() else "")
