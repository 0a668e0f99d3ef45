"""The side-by-side table (``kvtier.integrations.vllm.parity``): kvtier hits at least
native's tokens in every row, in every boundary mode, on vLLM's real Scheduler."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")

from kvtier.integrations.vllm.parity import parity_rows, render, shortfalls

pytestmark = pytest.mark.vllm


def test_every_row_hits_at_least_native() -> None:
    rows = parity_rows()
    for config in ("kvtier", "kvtier-shared", "kvtier-end"):
        assert shortfalls(rows, config) == [], f"{config} short of native:\n{render(rows)}"
    by = {(r.scenario, r.geometry): r for r in rows}
    # the examples, matched
    assert by[("repeat 256", "full")].hits["kvtier"] == 255  # vLLM computes token 255 only
    assert by[("first 478 of 547", "full+local256")].hits["kvtier-end"] == 448
    assert by[("resumed (369 known)", "full")].hits["kvtier"] == 320
    # end stores, with a sliding window, what native stores: its own rule
    swa = by[("first 478 of 547", "full+swa128")]
    assert swa.stored_bytes["kvtier-end"] == swa.stored_bytes["native"]
    assert "| repeat 256 | full |" in render(rows)
