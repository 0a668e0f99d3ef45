"""``benchmarks/null_connector.py``: the connector that does nothing, which
``vllm_engine.py --control null`` decodes with to measure vLLM's connector plumbing alone.
vLLM builds an engine around it (so vLLM's connector interface has not moved under it), it is
the engine's connector while that runs, and the engine generates what one without a
connector generates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from engine_env import ENGINE_MISSING

if ENGINE_MISSING is not None:
    pytest.skip(ENGINE_MISSING, allow_module_level=True)

import tiny_models
from engine_helpers import Engine, tokens
from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import null_connector

pytestmark = pytest.mark.vllm_engine


def test_an_engine_with_the_null_connector_generates_what_one_without_does(
        tmp_path: Path) -> None:
    model = tiny_models.llama(tmp_path / "llama")
    prompts = [tokens(1, 300), tokens(2, 40)]
    bare = Engine(model, num_blocks=24, connector=False)
    try:
        assert not has_kv_transfer_group()
        expected = [o.tokens for o in bare.generate(prompts, 6)]
    finally:
        bare.close()
    null = Engine(model, num_blocks=24, connector=null_connector.TRANSFER_CONFIG)
    try:
        assert type(get_kv_transfer_group()).__name__ == "NullConnector"
        assert [o.tokens for o in null.generate(prompts, 6)] == expected
        null.reset()  # vLLM asks the connector to reset too
        again = null.generate(prompts, 6)
        assert [o.tokens for o in again] == expected
        assert [o.num_cached for o in again] == [0, 0]  # no hit from a connector of nothing
    finally:
        null.close()
