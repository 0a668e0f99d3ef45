"""Recurrent-state groups in the vLLM connector's scheduler half, without vLLM: the store
reads the block vLLM names for a boundary, never the block at that boundary's position, and
a hit restores the state into the block vLLM allocates for it."""

from __future__ import annotations

import pytest

from kvtier import coverage
from kvtier.integrations.vllm.layout import default_chunk_tokens
from kvtier.integrations.vllm.scheduler import ConnectorScheduler, StepRequest
from kvtier.integrations.vllm.state import state_blocks
from kvtier.layout import Group, Layout

LAYOUT = Layout((Group("state", 16, 1, bytes_per_state=64),
                 Group("full", 16, 1, bytes_per_token=8)))
PROMPT = list(range(40))


class _Spec:
    def __init__(self, block: int) -> None:
        self.block_size = block


class MambaSpec(_Spec):
    """Named as vLLM's: the default chunk reads the spec class's name."""


class _G:
    def __init__(self, block: int, spec: type[_Spec] = _Spec) -> None:
        self.kv_cache_spec = spec(block)


@pytest.mark.parametrize("blocks,want", [([16], 256), ([16, 16], 256), ([1152, 1152], 1152),
                                         ([96, 128], 384), ([128], 256), ([300], 300)])
def test_default_chunk_is_the_least_block_multiple_of_at_least_256(
    blocks: list[int], want: int
) -> None:
    assert default_chunk_tokens([_G(b) for b in blocks]) == want


@pytest.mark.parametrize("blocks,want", [([80, 80], 80), ([144, 144], 144), ([16], 16),
                                         ([1040, 1040], 1040), ([1152, 1152], 1152)])
def test_with_a_mamba_group_the_default_chunk_is_one_block(blocks: list[int], want: int) -> None:
    """vLLM keeps a prefill's state only at the last block boundary before its last token,
    any multiple of the block size: a chunk of several blocks would store no state for most
    prompts (Jamba's 80-token blocks: 320-token chunks hit nothing on a 280-token prompt
    repeated, where native offloading hits 240; tests/vllm/test_vllm_hybrid_parity.py)."""
    groups = [_G(blocks[0], MambaSpec), *(_G(b) for b in blocks[1:])]
    assert default_chunk_tokens(groups) == want


def _stored(sched: ConnectorScheduler, state: tuple[tuple[int, int, int], ...]
            ) -> dict[tuple[int, int], tuple[int, ...]]:
    sched.add_request("p", PROMPT)
    # vLLM's align-mode table for the state group: positions say nothing about boundaries
    table = ([3, 4, 5], [11, 12, 13])
    plan = sched.step([StepRequest("p", table, True, len(PROMPT), PROMPT, state)])
    copies = [c for job in plan.stores for c in job.copies]
    for job in plan.stores:
        sched.on_reports({job.id: (1, True)})
    sched.finish("p")
    return {(c.group, c.chunk): c.block_ids for c in copies}


def test_a_state_chunk_is_stored_from_the_block_vllm_names() -> None:
    sched = ConnectorScheduler(LAYOUT, num_slots=16, num_workers=1)
    named = state_blocks(LAYOUT, [(0, 9, 32), (0, 8, 16), (0, 7, 39)])  # 39: no boundary
    stored = _stored(sched, named)
    assert stored == {(0, 0): (8,), (0, 1): (9,), (1, 0): (11,), (1, 1): (12,)}


def test_without_a_hand_off_no_state_chunk_is_stored_and_no_hit_claimed() -> None:
    """Negative control: vLLM's table alone (block 4 at position 1) is never trusted."""
    sched = ConnectorScheduler(LAYOUT, num_slots=16, num_workers=1)
    assert _stored(sched, ()) == {(1, 0): (11,), (1, 1): (12,)}
    sched.add_request("c", PROMPT)
    assert sched.lookup("c", 0) == (0, False)


def test_a_hit_restores_the_state_into_the_block_vllm_allocates() -> None:
    sched = ConnectorScheduler(LAYOUT, num_slots=16, num_workers=1)
    _stored(sched, state_blocks(LAYOUT, [(0, 9, 32), (0, 8, 16)]))
    sched.add_request("c", PROMPT)
    hit, asynchronous = sched.lookup("c", 0)
    assert (hit, asynchronous) == (32, True)  # a multiple of the block size, below 40
    assert hit == coverage.admissible_boundaries(LAYOUT, len(PROMPT), len(PROMPT))[-1]
    sched.after_alloc("c", [[0, 21], [22, 23]], hit)  # align mode: the hit's state block last
    load = sched.step([]).loads[0]
    assert {(c.group, c.chunk, c.block_ids) for c in load.copies} == {
        (0, 1, (21,)), (1, 0, (22,)), (1, 1, (23,))}
