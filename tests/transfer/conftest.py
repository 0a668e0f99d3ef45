"""Every transfer test runs on each CPU copier the build has: the torch copier (always), and
the compiled build's native one (``kvtier._native``'s memcpy loop, when it is built).

The engine picks its copier once, when it is built (``kvtier.transfer.jobs.copier_maker``):
with ``kvtier.transfer.native._native`` taken away, engines built in the test get the torch
copier; with ``kvtier.transfer.plan._native`` taken away too, jobs are planned as in the
pure build (copies read in Python, not by ``_native.read_copies``)."""

from __future__ import annotations

import pytest

from kvtier.transfer import native, plan

PATHS = ["torch"] + (["native"] if native.available() else [])


@pytest.fixture(autouse=True, params=PATHS)
def copy_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setattr(native, "_native", None)
        monkeypatch.setattr(plan, "_native", None)
    return str(request.param)
