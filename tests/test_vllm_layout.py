"""vLLM's KV-cache groups as a kvtier layout, and the connector's options: no vLLM needed.

Spec objects are small stand-ins named like vLLM's classes; the translation reads only
plain attributes. Worked examples follow the seeds (shared/seeds).
"""

from __future__ import annotations

import pytest

from kvtier import coverage
from kvtier.integrations.vllm.config import KvtierOptions
from kvtier.integrations.vllm.layout import UnsupportedConfig, VllmSpecDecode, vllm_layout
from kvtier.integrations.vllm.scheduler import ConnectorScheduler, StepRequest


def spec(name: str, block: int = 16, page: int = 1024, **fields: object) -> object:
    cls = type(name, (), {})
    obj = cls()
    obj.__dict__.update(block_size=block, page_size_bytes=page, **fields)
    return obj


class G:
    def __init__(self, kv_spec: object, layers: int = 2, eagle: bool = False) -> None:
        self.kv_cache_spec, self.is_eagle_group = kv_spec, eagle
        self.layer_names = [f"l{i}" for i in range(layers)]


def test_full_sliding_chunked_and_sizes() -> None:
    groups = [G(spec("FullAttentionSpec")),
              G(spec("SlidingWindowSpec", sliding_window=32, extra_retained_tokens=3)),
              G(spec("ChunkedLocalAttentionSpec", attention_chunk_size=8192))]
    full, swa, local = vllm_layout(groups, VllmSpecDecode(), chunk_tokens=64).groups
    assert (full.kind, full.blocks_per_chunk, full.bytes_per_token) == ("full", 4, 128)
    assert (swa.kind, swa.window, swa.extra_retained) == ("sliding_window", 32, 3)
    assert (local.kind, local.chunk) == ("chunked_local", 8192)


def test_mla_is_full_attention_by_its_base_class() -> None:
    base = type("FullAttentionSpec", (), {})
    mla = type("MLAAttentionSpec", (base,), {})()
    mla.__dict__.update(block_size=16, page_size_bytes=1152)
    assert vllm_layout([G(mla)], VllmSpecDecode(), chunk_tokens=16).groups[0].kind == "full"


def test_seed_000_window_with_mtp_history_needs_chunk_1() -> None:
    """Window 32, E = 3, 16-token chunks, hit at 64: chunks 1, 2, 3 (E = 1: 2, 3)."""
    for extra, want in ((3, [1, 2, 3]), (1, [2, 3]), (0, [2, 3])):
        swa = spec("SlidingWindowSpec", sliding_window=32, extra_retained_tokens=extra)
        group = vllm_layout([G(swa)], VllmSpecDecode(), chunk_tokens=16).groups[0]
        assert list(coverage.required(group, 64)) == want


@pytest.mark.parametrize("method,modules,lookahead",
                         [("eagle", 1, 1), ("eagle3", 1, 1), ("mtp", 1, 1), ("mtp", 2, 2),
                          ("dflash", 1, 0)])
def test_draft_groups_take_a_lookahead_instead_of_dropping_a_chunk(
    method: str, modules: int, lookahead: int
) -> None:
    groups = [G(spec("FullAttentionSpec")), G(spec("FullAttentionSpec"), eagle=True)]
    layout = vllm_layout(groups, VllmSpecDecode(method, 3, modules), chunk_tokens=16)
    assert [g.lookahead for g in layout.groups] == [0, lookahead]


@pytest.mark.parametrize("groups,spec_decode,message", [
    ([G(spec("FullAttentionSpec"), eagle=True)], VllmSpecDecode("ngram", 3), "does not know"),
    ([G(spec("CircularBufferSpec"))], VllmSpecDecode(), "does not know how vLLM"),
    ([G(spec("MambaSpec", mamba_cache_mode="all"))], VllmSpecDecode(), "mamba_cache_mode"),
    ([G(spec("SlidingWindowMLASpec", sliding_window=8, bounded_replay=True))],
     VllmSpecDecode(), "does not know how vLLM"),
    ([], VllmSpecDecode(), "no KV-cache groups"),
])
def test_refused_at_start_up(groups: list[G], spec_decode: VllmSpecDecode, message: str) -> None:
    with pytest.raises(UnsupportedConfig, match=message):
        vllm_layout(groups, spec_decode, chunk_tokens=16)


def test_chunk_must_be_a_block_multiple() -> None:
    with pytest.raises(UnsupportedConfig, match="multiple of its block size"):
        vllm_layout([G(spec("FullAttentionSpec", block=16))], VllmSpecDecode(), chunk_tokens=24)


class _Dtype:
    def __init__(self, itemsize: int) -> None:
        self.itemsize = itemsize


def test_mamba_align_is_a_state_group_of_the_states_own_bytes() -> None:
    """A 1024-byte conv state and 4096-byte SSM state in pages vLLM pads to 8192 bytes:
    5120 bytes per layer are stored, not the page."""
    mamba = spec("MambaSpec", page=8192, mamba_cache_mode="align",
                 shapes=((4, 128), (8, 256)), dtypes=(_Dtype(2), _Dtype(2)))
    group = vllm_layout([G(mamba)], VllmSpecDecode(), chunk_tokens=16).groups[0]
    assert (group.kind, group.bytes_per_state) == ("state", 2 * 5120)


@pytest.mark.parametrize("mode", ["all", "none"])
def test_other_mamba_modes_are_refused_naming_align(mode: str) -> None:
    with pytest.raises(UnsupportedConfig, match="mamba_cache_mode='align'"):
        vllm_layout([G(spec("MambaSpec", mamba_cache_mode=mode))], VllmSpecDecode(),
                    chunk_tokens=16)


def test_options_reject_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValueError, match="known options"):
        KvtierOptions.from_extra_config({"cpu_bytes_to_use": 1})
    with pytest.raises(ValueError, match="policy"):
        KvtierOptions.from_extra_config({"policy": "belady"})
    with pytest.raises(ValueError, match="tiers"):
        KvtierOptions.from_extra_config({"tiers": ["host", "disk"]})
    opts = KvtierOptions.from_extra_config({"store": "prompt", "tenant_salt": "none"})
    assert (opts.store, opts.tenant_salt) == ("prompt", "none")


def test_plan_seed_000_producer_stores_and_consumer_loads_chunk_1() -> None:
    """The seed's numbers through the connector's scheduler half, without vLLM."""
    swa = spec("SlidingWindowSpec", sliding_window=32, extra_retained_tokens=3, page=256)
    layout = vllm_layout([G(swa, layers=1)], VllmSpecDecode(), chunk_tokens=16)
    sched = ConnectorScheduler(layout, num_slots=16, num_workers=1)
    prompt = list(range(65))
    sched.add_request("p", prompt)
    plan = sched.step([StepRequest("p", (list(range(1, 6)),), True, 65, prompt)])
    stored = {c.chunk for c in plan.stores[0].copies}
    assert stored == {0, 1, 2, 3}
    sched.on_reports({plan.stores[0].id: (1, True)})
    sched.finish("p")
    sched.add_request("c", prompt)
    assert sched.lookup("c", 0) == (64, True)
    sched.after_alloc("c", [[0, 7, 8, 9, 10]], 64)  # vLLM nulls block 0 only
    load = sched.step([]).loads[0]
    assert [(c.chunk, c.first_block, c.block_ids) for c in load.copies] == [
        (1, 0, (7,)), (2, 0, (8,)), (3, 0, (9,))]


def test_boundaries_option_is_validated():
    assert KvtierOptions.from_extra_config({"boundaries": "shared"}).boundaries == "shared"
    with pytest.raises(ValueError, match="dense, end, shared"):
        KvtierOptions.from_extra_config({"boundaries": "stride"})
