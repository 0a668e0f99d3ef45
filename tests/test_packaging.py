"""The source distribution carries what its build needs.

``pyproject.toml`` names an in-tree build backend (``backend-path``); setuptools does not
put files outside the package into an sdist by itself, so ``MANIFEST.in`` must, or every
install from the sdist fails before it starts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_the_build_backend_is_shipped_in_the_sdist() -> None:
    system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    backend_dirs = system["backend-path"]
    module = system["build-backend"]
    files = [f"{d}/{module.replace('.', '/')}.py" for d in backend_dirs]
    assert any((ROOT / f).is_file() for f in files), files
    manifest = (ROOT / "MANIFEST.in").read_text().split("\n")
    assert any(f"include {f}" in manifest for f in files), (files, manifest)


def test_the_native_sources_are_shipped_in_the_sdist() -> None:
    """Every C file setup.py compiles into ``kvtier._native`` (and the header they share):
    a compiled install from the sdist needs them all."""
    setup = (ROOT / "setup.py").read_text()
    sources = set(re.findall(r'"(src/kvtier/_native[\w.]*\.[ch])"', setup))
    assert {"src/kvtier/_native.c", "src/kvtier/_native.h"} <= sources
    manifest = set((ROOT / "MANIFEST.in").read_text().split("\n"))
    assert {f"include {f}" for f in sources} <= manifest
    assert all((ROOT / f).is_file() for f in sources)
