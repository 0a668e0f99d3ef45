"""Chained keys: identity of prefixes, namespaces, lookahead and incremental hashing."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.keys import KeyChain, Namespace
from kvtier.layout import Group, Layout

LAYOUT = Layout((Group("full", 16), Group("sliding_window", 4, window=8),
                 Group("full", 16, lookahead=2, name="draft")))
NS = Namespace("test-model")


def chain(tokens, layout=LAYOUT, ns=NS) -> KeyChain:
    return KeyChain(layout, ns, tokens)


def test_key_needs_every_token_including_lookahead():
    c = chain(range(17))
    assert c.key(0, 0) is not None
    assert c.key(2, 0) is None  # draft chunk 0 covers tokens [0, 18)
    c.extend([17])
    assert c.key(2, 0) is not None
    with pytest.raises(ValueError, match="not known yet"):
        c.keys(0, [0, 1])


def test_same_prefix_same_key_and_divergence_changes_later_keys():
    a, b = chain(list(range(64))), chain([*range(40), 999, *range(41, 64)])
    assert a.key(0, 1) == b.key(0, 1)  # chunk 1 ends at 32, before the divergence at 40
    assert a.key(0, 2) != b.key(0, 2)
    assert a.key(0, 3) != b.key(0, 3)
    assert a.key(1, 9) == b.key(1, 9)  # 4-token chunk 9 ends at 40
    assert a.key(1, 10) != b.key(1, 10)
    # draft chunk 1 covers tokens [0, 34): equal; chunk 2 [0, 50) differs
    assert a.key(2, 1) == b.key(2, 1) and a.key(2, 2) != b.key(2, 2)


def test_divergence_right_after_a_boundary_changes_only_draft_key():
    a, b = chain([*range(32), 5, 6]), chain([*range(32), 7, 8])
    assert a.key(0, 1) == b.key(0, 1)
    assert a.key(2, 1) != b.key(2, 1)


def test_groups_and_namespaces_never_share_keys():
    c = chain(range(64))
    keys = {c.key(g, 0) for g in range(2)}
    assert len(keys) == 2
    others = [
        Namespace("test-model", tenant_salt="tenant-b"),
        Namespace("other-model"),
        Namespace("test-model", revision="v2"),
        Namespace("test-model", kv_dtype="float8_e4m3fn"),
        Namespace("test-model", hash_name="blake2b"),
    ]
    for ns in others:
        assert chain(range(64), ns=ns).key(0, 0) != c.key(0, 0)


def test_the_layouts_model_and_kv_dtype_separate_keys_whatever_the_namespace():
    """A library caller who leaves the namespace at its defaults still never gets an
    fp8_e4m3 writer's key for an fp8_e5m2 reader, or another model's."""
    base = Layout((Group("full", 16),), model="model-a", kv_dtype="fp8_e4m3")
    ns = Namespace("shared")
    key = chain(range(16), base, ns).key(0, 0)
    for other in (replace(base, kv_dtype="fp8_e5m2"), replace(base, model="model-b")):
        assert chain(range(16), other, ns).key(0, 0) != key
    assert chain(range(16), replace(base), ns).key(0, 0) == key


def test_keys_are_deterministic_across_processes():
    """The documented scheme, computed independently: a chunk's key is its group tag and
    sha256(seed || every token up to the chunk's end). A change to the key scheme must
    bump LAYOUT_VERSION."""
    ns = Namespace("test-model")
    layout = Layout((Group("full", 16),))
    tokens = np.arange(40, dtype=np.int64)
    c = chain(tokens, layout, ns)
    data = tokens.astype("<u4").tobytes()
    for chunk in (0, 1):
        key = c.key(0, chunk)
        assert key is not None and len(key) == 40
        assert key[:8] == ns.group_tag(layout, 0)
        assert key[8:] == hashlib.sha256(ns.seed() + data[: (chunk + 1) * 64]).digest()
    assert key == chain(list(range(40)), layout, ns).key(0, 1)


def test_blake2b_keys_follow_the_same_scheme():
    """The same check with blake2b (32-byte digests), which never takes the compiled
    build's sha256 loop: its keys are blake2b's, prompt-sized appends or decoding-sized."""
    ns = Namespace("test-model", hash_name="blake2b")
    layout = Layout((Group("full", 16),))
    tokens = np.arange(5000, dtype=np.uint32)
    c = chain(tokens[:3000], layout, ns)
    for i in range(3000, 5000, 7):
        c.extend(tokens[i : i + 7].tolist())
    data = tokens.astype("<u4").tobytes()
    for chunk in (0, 1, 187, 311):
        want = hashlib.blake2b(ns.seed() + data[: (chunk + 1) * 64], digest_size=32).digest()
        assert c.key(0, chunk) == ns.group_tag(layout, 0) + want


@settings(max_examples=200)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=200),
       st.lists(st.integers(1, 50), min_size=1, max_size=8))
def test_incremental_equals_one_shot(tokens: list[int], cuts: list[int]) -> None:
    whole = chain(tokens)
    grown = chain([])
    pos = 0
    for cut in [*cuts, len(tokens)]:
        grown.extend(tokens[pos : pos + cut])
        pos += cut
    grown.extend(tokens[pos:])
    assert grown.num_tokens == len(tokens)
    for g, group in enumerate(LAYOUT.groups):
        for c in range(len(tokens) // group.tokens_per_chunk + 1):
            assert grown.key(g, c) == whole.key(g, c)


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.5], ["a"]])
def test_bad_tokens_are_rejected(bad):
    with pytest.raises(ValueError, match="token ids must be integers"):
        chain(bad)


def test_bad_namespace_and_chunk():
    with pytest.raises(ValueError, match="hash must be"):
        Namespace("m", hash_name="md5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model must name"):
        Namespace("")
    with pytest.raises(ValueError, match="chunk index"):
        chain(range(16)).key(0, -1)


def test_opt_in_xxh3_keys_are_deterministic_and_distinct():
    pytest.importorskip("xxhash")
    ns = Namespace("test-model", hash_name="xxh3")
    a, b = chain(range(64), ns=ns), chain(range(64), ns=ns)
    assert a.key(0, 1) == b.key(0, 1) and len(a.key(0, 1)) == 40
    assert a.key(0, 1) != chain(range(64)).key(0, 1)
    assert a.key(0, 1) != chain([*range(31), 5, *range(32, 64)], ns=ns).key(0, 1)


def test_xxh3_without_the_package_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xxhash", None)
    with pytest.raises(ValueError, match=r"pip install 'kvtier\[fast\]'"):
        Namespace("m", hash_name="xxh3")
