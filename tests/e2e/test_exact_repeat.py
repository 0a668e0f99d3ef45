"""An exact repeat of a prompt that ends on a boundary: the whole-prompt hit.

The repeat restores every token but the last (``coverage.consumer_hit``) and the engine
computes that one again; tokens and logits equal a cold run. A corrupted last chunk is
restored and caught by the same comparison (the negative control).
"""

from __future__ import annotations

import pytest
from e2e_helpers import HOST_BYTES, LAYOUTS, assert_same_generation, prompt, run
from test_restore_controls import flip_chunk

from kvtier.engine import Engine
from kvtier.integrations.reference import KvtierOffloader


def _repeat(layout: str, tokens: list[int], corrupt_group: int | None = None):
    config = LAYOUTS[layout]()
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    engine = Engine(config, offloader)
    [cold] = run(engine, [tokens])
    if corrupt_group is not None:  # chunk 3: tokens 24..31, the prompt's last chunk
        flip_chunk(offloader, tokens, corrupt_group, chunk=3)
    engine.reset_device_cache()
    [warm] = run(engine, [tokens])
    return cold, warm, offloader


@pytest.mark.parametrize("layout", ["full", "window-E0", "window-E1", "chunked-local"])
def test_a_repeat_restores_all_but_the_last_token(layout: str) -> None:
    cold, warm, offloader = _repeat(layout, prompt(32))  # 8-token chunks: 32 is a boundary
    assert warm.num_restored_tokens == 31 and offloader.metrics.hit_tokens == 31
    assert_same_generation(warm, cold)
    offloader.close()


@pytest.mark.parametrize(("layout", "group"), [("window-E1", 1), ("chunked-local", 1),
                                               ("full", 0)])
def test_negative_control_a_flipped_last_chunk_fails_the_comparison(layout: str, group: int):
    _, warm, _ = _repeat(layout, prompt(32), corrupt_group=group)
    cold = run(Engine(LAYOUTS[layout]()), [prompt(32)])[0]
    assert warm.num_restored_tokens == 31  # the corrupt chunk was restored ...
    with pytest.raises(AssertionError):  # ... and the comparison sees it
        assert_same_generation(warm, cold)
