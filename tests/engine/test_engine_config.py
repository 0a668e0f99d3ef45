"""Config validation, the matching kvtier layout, masks, and the pinned public API."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from engine_doubles import mixed_config, prompt

import kvtier.engine
from kvtier.engine import Engine, EngineConfig, GroupSpec
from kvtier.engine.attention import attention_mask


def test_layout_matches_the_model() -> None:
    config = mixed_config()
    layout = config.layout()
    assert [g.kind for g in layout.groups] == ["full", "sliding_window", "chunked_local"]
    # 2 * layers * kv_heads 2 * head_dim 16 * fp32 4
    assert [g.bytes_per_token for g in layout.groups] == [256, 512, 256]
    assert [g.num_layers for g in layout.groups] == [1, 2, 1]
    assert layout.groups[1].window == 6 and layout.groups[1].extra_retained == 1
    assert layout.groups[2].chunk == 6
    assert layout.hit_granularity == 8 and layout.kv_dtype == "float32"
    assert layout.model == config.model_id != mixed_config(seed=1).model_id
    assert config.layer_groups == (0, 1, 2, 1)


def test_a_state_group_is_recurrent_layers_with_one_state_per_block() -> None:
    config = EngineConfig(groups=(GroupSpec("full", tokens_per_block=4, blocks_per_chunk=2),
                                  GroupSpec("state", num_layers=2, tokens_per_block=4)),
                          linear_num_heads=2, linear_head_dim=8, conv_kernel=4, num_blocks=10)
    state = config.layout().groups[1]
    # conv state 3 taps x (q, k, v of 2 heads of 8) + delta-rule state 2 x 8 x 8, fp32
    assert state.kind == "state" and state.bytes_per_token is None
    assert state.bytes_per_state == 2 * (3 * 48 + 2 * 8 * 8) * 4 == 2176
    assert config.layer_groups == (0, 1, 1)
    assert [config.is_recurrent(i) for i in range(3)] == [False, True, True]
    engine = Engine(config)
    assert [t.shape for t in engine.kv_caches[1]] == [(10, 272), (10, 272)]
    assert config.model_id != EngineConfig(groups=config.groups, conv_kernel=3).model_id
    # models without recurrent layers keep their identity whatever the recurrent settings
    assert mixed_config().model_id == mixed_config(conv_kernel=3).model_id


def test_kv_tensors_follow_the_layout() -> None:
    engine = Engine(mixed_config(num_blocks=10))
    for group, tensors in zip(engine.layout.groups, engine.kv_caches, strict=True):
        for t in tensors:
            assert t.shape == (10, 2, group.tokens_per_block, 2, 16)
            assert t.dtype == torch.float32
            assert t[0].numel() * 4 * len(tensors) == group.bytes_per_block


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GroupSpec("recurrent"), "kind must be one of"),  # type: ignore[arg-type]
        (lambda: GroupSpec("state", window=4), "window is only"),
        (lambda: EngineConfig(groups=(GroupSpec("state"),), conv_kernel=1), "conv_kernel"),
        (lambda: EngineConfig(groups=(GroupSpec("state"),), linear_head_dim=0),
         "linear_head_dim"),
        (lambda: GroupSpec("sliding_window"), "window"),
        (lambda: GroupSpec("full", window=4), "window is only"),
        (lambda: GroupSpec("full", num_layers=0), "num_layers"),
        (lambda: EngineConfig(groups=()), "non-empty"),
        (lambda: EngineConfig(groups=(GroupSpec("full"),), num_kv_heads=3), "divide"),
        (lambda: EngineConfig(groups=(GroupSpec("full"),), head_dim=15), "even"),
        (lambda: EngineConfig(groups=(GroupSpec("full", num_layers=2),), layer_groups=(0,)),
         "num_layers"),
        (lambda: EngineConfig(groups=(GroupSpec("full"),), layer_groups=(1,)), "0..0"),
    ],
)
def test_bad_configs_say_what_to_fix(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("args", "message"),
    [(([], 1), "at least one"), (([256], 1), r"\[0, 256\)"), (([1], 0), "max_tokens")],
)
def test_bad_requests_say_what_to_fix(args: tuple[list[int], int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Engine(mixed_config()).add_request(*args)


def test_masks_worked_examples() -> None:
    q, k = torch.tensor([5]), torch.arange(0, 8)
    window = attention_mask(GroupSpec("sliding_window", window=3), q, k)
    assert window[0].tolist() == [False, False, False, True, True, True, False, False]
    local = attention_mask(GroupSpec("chunked_local", chunk=4), q, k)
    assert local[0].tolist() == [False, False, False, False, True, True, False, False]
    full = attention_mask(GroupSpec("full"), q, k)
    assert full[0].tolist() == [True] * 6 + [False] * 2


def test_reset_device_cache_poisons_every_block_and_frees_the_pools() -> None:
    engine = Engine(mixed_config())
    engine.add_request(prompt(9, 0), max_tokens=2)
    engine.step()
    with pytest.raises(RuntimeError, match="finish them first"):
        engine.reset_device_cache()
    while engine.has_unfinished():
        engine.step()
    engine.reset_device_cache()
    assert all(torch.isnan(t).all() for tensors in engine.kv_caches for t in tensors)
    assert all(engine.num_free_blocks(g) == 64 for g in range(3))


def test_public_api_is_pinned() -> None:
    assert kvtier.engine.__all__ == [
        "AttentionKind", "BlockIds", "BlockTables", "Completion", "Engine", "EngineConfig",
        "GroupSpec", "NullOffloader", "Offloader", "OutOfBlocksError", "Request",
        "RequestStatus", "TinyModel", "dense_logits", "reference_generate",
    ]


def test_core_package_does_not_import_torch() -> None:
    code = "import sys, kvtier; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
