"""Fixtures of the store tests."""

from __future__ import annotations

import pytest

from kvtier.store import POLICIES


@pytest.fixture(params=sorted(POLICIES))
def policy_name(request: pytest.FixtureRequest) -> str:
    """Every registered policy (the contract suite runs against each)."""
    return str(request.param)
