"""kvtier's PEP 517 build backend: setuptools, plus mypyc when a compiled build is asked for.

A plain ``pip install kvtier`` (or ``-e .``) builds pure Python in seconds. With
``KVTIER_COMPILE=1`` in the environment, ``setup.py`` compiles the hot modules (the store,
its policies, the planner and the coverage contract; ``COMPILED`` in setup.py) with mypyc,
and this backend adds mypy, which carries mypyc, to the isolated build environment. The
compiled and the pure build run the same code and pass the same test suite (``.ci/run``
runs it against both).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import setuptools.build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the PEP 517 hooks we do not change)

MYPYC = ["mypy==2.4.1", "numpy>=1.24,<3"]
"""What a compiled build adds to the isolated build environment: mypy (which carries mypyc)
and numpy, whose type stubs mypyc needs to check the modules that name numpy types (without
it ``npt.NDArray`` is unknown and the build fails while preparing metadata)."""


_METADATA_ONLY = "_KVTIER_METADATA_ONLY"
"""Set while the backend prepares metadata only: nothing is compiled for that."""


def compile_requested() -> bool:
    """``KVTIER_COMPILE=1``, outside a metadata-only step (``compile`` in setup.py)."""
    if os.environ.get(_METADATA_ONLY):
        return False
    return os.environ.get("KVTIER_COMPILE", "").strip().lower() in {"1", "true", "yes"}


def native_declined() -> bool:
    """``KVTIER_NATIVE=0``: a compiled build without the C module (by default a compiled
    build that cannot build it fails, saying what is missing)."""
    return os.environ.get("KVTIER_NATIVE", "").strip().lower() in {"0", "false", "no"}


def _extra() -> list[str]:
    return list(MYPYC) if compile_requested() else []


# setuptools' own hooks would run setup.py to ask, and setup.py imports mypyc when a compiled
# build is asked for; kvtier declares no setup_requires, so the answer is just ours.
def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return _extra()


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    return _extra()



def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Any = None
) -> str:
    """setuptools' hook, without mypyc: the metadata does not depend on what is compiled,
    and analysing the modules for it would double a compiled build's time."""
    return _metadata_only(_setuptools.prepare_metadata_for_build_wheel, metadata_directory,
                          config_settings)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: Any = None
) -> str:
    """As ``prepare_metadata_for_build_wheel``, for ``pip install -e``."""
    return _metadata_only(_setuptools.prepare_metadata_for_build_editable, metadata_directory,
                          config_settings)


def _metadata_only(hook: Callable[[str, Any], str], directory: str, settings: Any) -> str:
    os.environ[_METADATA_ONLY] = "1"
    try:
        return hook(directory, settings)
    finally:
        del os.environ[_METADATA_ONLY]
