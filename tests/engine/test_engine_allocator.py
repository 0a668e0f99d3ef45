"""The allocator keeps exactly ``retained_blocks(group, horizon)`` and frees the rest."""

from __future__ import annotations

import pytest
from engine_doubles import SnapshotCache, mixed_config, prompt

from kvtier.coverage import retained_blocks
from kvtier.engine import (
    Engine,
    EngineConfig,
    GroupSpec,
    NullOffloader,
    OutOfBlocksError,
    Request,
    RequestStatus,
)


def held(engine: Engine, request_id: str) -> list[list[int]]:
    """Logical blocks the request holds, per group, through the public API."""
    return [[i for i, b in enumerate(t) if b is not None] for t in engine.block_tables(request_id)]


def expected(engine: Engine, n: int) -> list[list[int]]:
    return [list(retained_blocks(g, n)) for g in engine.layout.groups]


@pytest.mark.parametrize("max_prefill_tokens", [1, 5, 16])
def test_after_every_step_exactly_the_retained_blocks_are_held(max_prefill_tokens: int) -> None:
    engine = Engine(mixed_config(max_prefill_tokens=max_prefill_tokens, num_blocks=40))
    ids = [engine.add_request(prompt(n, n), max_tokens=6) for n in (3, 14, 25)]
    while engine.has_unfinished():
        engine.step()
        live = [engine.get_request(r) for r in ids]
        for request in live:
            if request.status is RequestStatus.RUNNING:
                n = request.num_computed_tokens
                assert held(engine, request.request_id) == expected(engine, n), n
        for g in range(len(engine.layout.groups)):
            in_use = sum(len(held(engine, r)[g]) for r in ids)
            assert engine.num_free_blocks(g) == 40 - in_use
    assert all(engine.num_free_blocks(g) == 40 for g in range(3))


@pytest.mark.parametrize("max_prefill_tokens", [1, 5, 16])
def test_a_state_group_holds_one_block_the_state_after_the_last_token(
    max_prefill_tokens: int,
) -> None:
    groups = (GroupSpec("full", tokens_per_block=4), GroupSpec("state", tokens_per_block=4))
    engine = Engine(EngineConfig(groups=groups, max_prefill_tokens=max_prefill_tokens,
                                 num_blocks=24))
    rid = engine.add_request(prompt(23, 0), max_tokens=5)
    while engine.has_unfinished():
        engine.step()
        request = engine.get_request(rid)
        if request.status is RequestStatus.RUNNING:
            n = request.num_computed_tokens
            assert held(engine, rid)[1] == [(n - 1) // 4] == list(retained_blocks(
                engine.layout.groups[1], n))
            assert engine.num_free_blocks(1) == 23
    assert engine.num_free_blocks(1) == 24


def test_sliding_window_frees_behind_the_window_during_decode() -> None:
    # W = 6, E = 0, 4-token blocks: at n = 30, retained is [25, 30), blocks 6 and 7.
    config = EngineConfig(groups=(GroupSpec("sliding_window", tokens_per_block=4, window=6),),
                          num_blocks=8)
    engine = Engine(config)
    rid = engine.add_request(prompt(26, 0), max_tokens=10)
    while engine.get_request(rid).num_computed_tokens < 30:
        engine.step()
    assert engine.block_tables(rid) == ((None,) * 6 + engine.block_tables(rid)[0][6:8],)
    assert engine.num_free_blocks(0) == 6


def test_chunked_local_frees_everything_at_a_chunk_boundary() -> None:
    config = EngineConfig(groups=(GroupSpec("chunked_local", tokens_per_block=4, chunk=8),),
                          max_prefill_tokens=8)
    engine = Engine(config)
    rid = engine.add_request(prompt(16, 0), max_tokens=2)
    engine.step()
    engine.step()  # n = 16: retained [16, 16) is empty
    assert engine.get_request(rid).num_computed_tokens == 16
    assert held(engine, rid) == [[]]
    assert engine.num_free_blocks(0) == config.num_blocks


class FreeSpy(NullOffloader):
    """Records what the engine hands the hooks: tables at on_computed, ids at before_free."""

    def __init__(self) -> None:
        self.computed: list[tuple[int, tuple[tuple[int | None, ...], ...]]] = []
        self.freed: list[tuple[tuple[int, ...], ...]] = []

    def on_computed(self, request: Request, num_computed_tokens: int,
                    block_tables: tuple[tuple[int | None, ...], ...]) -> None:
        self.computed.append((num_computed_tokens, block_tables))

    def before_free(self, request: Request, block_ids: tuple[tuple[int, ...], ...]) -> None:
        self.freed.append(block_ids)


def test_on_computed_still_sees_blocks_that_are_freed_right_after() -> None:
    spy = FreeSpy()
    config = EngineConfig(groups=(GroupSpec("sliding_window", tokens_per_block=4, window=6),),
                          max_prefill_tokens=20)
    engine = Engine(config, spy)
    engine.generate([prompt(20, 0)], max_tokens=1)
    n, tables = spy.computed[0]
    assert n == 20
    assert tables[0] == (0, 1, 2, 3, 4)  # all five blocks, though only 3 and 4 are retained
    assert spy.freed[0] == ((0, 1, 2),)  # fenced before going back to the pool
    assert spy.freed[-1] == ((3, 4),)  # the rest, at finish


def test_a_hit_allocates_only_its_retained_blocks() -> None:
    config = mixed_config(max_prefill_tokens=8)
    cache = SnapshotCache(config.layout())
    engine = Engine(config, cache)
    p = prompt(29, 4)
    engine.generate([p], max_tokens=2)
    engine.reset_device_cache()
    rid = engine.add_request(p, max_tokens=2)
    engine.step()
    [(_, _, tables)] = [c for c in cache.events.calls if c[:2] == ("on_allocated", rid)]
    hit = engine.get_request(rid).num_restored_tokens
    assert hit == 24
    got = [[i for i, b in enumerate(t) if b is not None] for t in tables]  # type: ignore[attr-defined]
    assert got == expected(engine, 24) == [[0, 1, 2, 3, 4, 5], [4, 5], []]


def test_running_out_of_blocks_is_a_clear_error() -> None:
    config = EngineConfig(groups=(GroupSpec("full", tokens_per_block=4),), num_blocks=3)
    engine = Engine(config)
    engine.add_request(prompt(13, 0), max_tokens=1)
    with pytest.raises(OutOfBlocksError, match=r"raise EngineConfig\.num_blocks"):
        engine.step()
