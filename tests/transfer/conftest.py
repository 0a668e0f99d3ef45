"""Every transfer test runs on each CPU copy path the build has: torch and numpy copies
(always), and the compiled build's ``kvtier._native`` memcpy loop (when it is built)."""

from __future__ import annotations

import pytest

import kvtier.transfer.mover as mover

PATHS = ["torch"] + (["native"] if mover._native is not None else [])


@pytest.fixture(autouse=True, params=PATHS)
def copy_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setattr(mover, "_native", None)
    return str(request.param)
