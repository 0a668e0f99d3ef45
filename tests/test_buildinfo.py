"""The build kvtier reports is the build that is running.

CI runs the whole suite twice (README, "Compiled build"): once on the editable, pure-Python
install and once on ``KVTIER_COMPILE=1 pip install .`` with ``KVTIER_EXPECT_BUILD=mypyc``,
so that a compile that silently fell back to pure Python fails here, and so does one that
built without ``kvtier._native`` (a compiled build that cannot build it fails at install
time, naming what is missing; ``KVTIER_NATIVE=0`` builds the mypyc modules without it).
"""

from __future__ import annotations

import os
from importlib.machinery import EXTENSION_SUFFIXES

import pytest

import kvtier.coverage
import kvtier.planner.planner
import kvtier.store.manager
import kvtier.store.policies.arc
from kvtier.buildinfo import build, compiled_modules, describe, native

REQUEST_PATH = (kvtier.coverage, kvtier.planner.planner, kvtier.store.manager,
                kvtier.store.policies.arc)


def test_the_reported_build_matches_the_loaded_modules() -> None:
    compiled = [m.__name__ for m in REQUEST_PATH if m.__file__.endswith(tuple(EXTENSION_SUFFIXES))]
    assert set(compiled) <= set(compiled_modules())
    # all of the request path is compiled, or none of it: a partial build would be a bug
    assert compiled in ([], [m.__name__ for m in REQUEST_PATH])
    assert build() == ("mypyc" if compiled else "pure")


@pytest.mark.skipif("KVTIER_EXPECT_BUILD" not in os.environ, reason="set by CI's second run")
def test_the_expected_build_is_running() -> None:
    assert build() == os.environ["KVTIER_EXPECT_BUILD"], compiled_modules()
    if build() == "mypyc":
        assert native(), "the compiled build lacks kvtier._native: is libssl-dev installed?"
        assert describe() == "mypyc, native C loops"


def test_the_native_module_is_not_counted_as_a_mypyc_module() -> None:
    native()  # imports it when it is built
    assert "kvtier._native" not in compiled_modules()
    assert describe().startswith(build())
