"""Keys carry the layout's fingerprint: two deployments whose layouts (or namespaces) differ
in any one field that changes a chunk's bytes never share a key, so neither reads, nor
deletes as corrupt, the other's chunks; equal layouts share every key; and wherever keys
are shared the records' geometry agrees too (no valid chunk refused)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from kvtier.keys import ChunkKey, KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.tiers.records.format import geometry_of


def base_groups() -> tuple[Group, ...]:
    return (
        Group("full", 16, bytes_per_token=4096, num_layers=32, name="attn"),
        Group("sliding_window", 16, window=64, bytes_per_token=2048, num_layers=8,
              name="swa", extra_retained=2),
        Group("full", 16, lookahead=1, bytes_per_token=1024, name="draft"),
        Group("state", 16, bytes_per_state=65536, num_layers=4, name="ssm"),
    )


def base_layout() -> Layout:
    return Layout(base_groups(), model="org/model-8B", kv_dtype="bfloat16")


def with_group(i: int, **changes: object) -> Layout:
    groups = list(base_groups())
    groups[i] = replace(groups[i], **changes)  # type: ignore[arg-type]
    return replace(base_layout(), groups=tuple(groups))


NS = Namespace("org/model-8B", revision="abc123", parallel="tp2-rank0")

LAYOUT_CHANGES: dict[str, Callable[[], Layout]] = {
    "model": lambda: replace(base_layout(), model="org/model-70B"),
    "kv_dtype": lambda: replace(base_layout(), kv_dtype="fp8_e4m3"),
    "num_layers": lambda: with_group(0, num_layers=40),
    "group name": lambda: with_group(0, name="attention"),
    "bytes_per_token (shape)": lambda: with_group(0, bytes_per_token=8192),
    "bytes_per_state (shape)": lambda: with_group(3, bytes_per_state=131072),
    "tokens_per_block": lambda: with_group(0, tokens_per_block=8, blocks_per_chunk=2),
    "window": lambda: with_group(1, window=128),
    "lookahead": lambda: with_group(2, lookahead=2),
    "draft_tail": lambda: with_group(2, draft_tail="recomputed"),
    "kind": lambda: with_group(0, kind="chunked_local", chunk=64),
    "one more group": lambda: Layout((*base_groups(), Group("full", 16, name="extra")),
                                     model="org/model-8B"),
    "one group fewer": lambda: Layout(base_groups()[:3], model="org/model-8B"),
}
"""Each a layout differing from ``base_layout()`` in exactly one field."""

NAMESPACE_CHANGES: dict[str, Namespace] = {
    "namespace model": replace(NS, model="org/other-8B"),
    "revision": replace(NS, revision="def456"),
    "TP rank": replace(NS, parallel="tp2-rank1"),
    "TP size": replace(NS, parallel="tp4-rank0"),
    "namespace kv_dtype": replace(NS, kv_dtype="fp8_e4m3"),
    "tenant salt": replace(NS, tenant_salt="tenant-b"),
}

SHARING_CHANGES: dict[str, Callable[[], Layout]] = {
    "rebuilt equal": base_layout,
    "extra_retained (the engine keeps more, the bytes are the same)":
        lambda: with_group(1, extra_retained=7),
    "hit_granularity": lambda: replace(base_layout(), hit_granularity=32),
}
"""Layouts whose chunks are the base's: they share keys and records."""

TOKENS = range(200)


def all_keys(layout: Layout, ns: Namespace = NS) -> set[ChunkKey]:
    chain = KeyChain(layout, ns, TOKENS)
    keys: set[ChunkKey] = set()
    for gi in range(len(layout.groups)):
        k, chunk = chain.key(gi, 0), 0
        while k is not None:
            keys.add(k)
            chunk += 1
            k = chain.key(gi, chunk)
    return keys


@pytest.mark.parametrize("field", sorted(LAYOUT_CHANGES))
def test_layouts_differing_in_one_field_share_no_key_and_refuse_each_others_records(
    field: str,
) -> None:
    other = LAYOUT_CHANGES[field]()
    assert other != base_layout()
    assert all_keys(other).isdisjoint(all_keys(base_layout()))
    assert geometry_of(other) != geometry_of(base_layout())


@pytest.mark.parametrize("field", sorted(NAMESPACE_CHANGES))
def test_namespaces_differing_in_one_field_share_no_key(field: str) -> None:
    assert all_keys(base_layout(), NAMESPACE_CHANGES[field]).isdisjoint(all_keys(base_layout()))


@pytest.mark.parametrize("change", sorted(SHARING_CHANGES))
def test_equal_chunks_share_every_key_and_accept_each_others_records(change: str) -> None:
    """The control: the comparison above can find keys equal."""
    other = SHARING_CHANGES[change]()
    base = all_keys(base_layout())
    assert len(base) > 20 and all_keys(other) == base
    assert geometry_of(other) == geometry_of(base_layout())


def test_the_replay_namespace_keeps_its_earlier_keys_and_still_separates_the_old_fields() -> None:
    """``layout_fields="group"`` (the replay's) hashes a group's own geometry only: a
    group's name or layer count no longer separates keys there, its model and sizes do."""
    old = replace(NS, layout_fields="group")
    assert all_keys(with_group(0, num_layers=40), old) == all_keys(base_layout(), old)
    assert all_keys(with_group(0, bytes_per_token=8192), old) != all_keys(base_layout(), old)
    assert all_keys(base_layout(), old).isdisjoint(all_keys(base_layout()))
    with pytest.raises(ValueError, match="layout_fields must be 'all' or 'group'"):
        Namespace("m", layout_fields="none")  # type: ignore[arg-type]
