"""vLLM's KV-cache groups and speculative-decoding settings, as one kvtier ``Layout``.

This is the one place where vLLM's vocabulary meets kvtier's (DESIGN section 3). It reads
only plain attributes, so it runs, and is tested, without vLLM installed:

* a group's spec class (by name, along its MRO) picks the group kind: full attention and
  MLA -> ``full``; sliding window (``extra_retained_tokens`` -> ``E``) -> ``sliding_window``;
  chunked local -> ``chunked_local``; Mamba in ``align`` cache mode -> ``state``;
* vLLM's rule for EAGLE/MTP draft groups ("a hit drops the last block, since a draft
  position's KV depends on the next token") becomes the group's *lookahead* ``d``: the
  chunk ending at ``e`` is keyed by tokens ``[0, e + d)``, so a consumer whose tokens agree
  that far may use it, and nothing is dropped. ``d`` is 1 for EAGLE and single-module MTP
  and the number of MTP modules for multi-module MTP;
* anything kvtier cannot serve correctly raises ``UnsupportedConfig`` at start-up.

>>> class Spec:  # what vLLM's SlidingWindowSpec looks like from here
...     block_size, sliding_window, extra_retained_tokens, page_size_bytes = 16, 32, 3, 4096
>>> Spec.__name__ = "SlidingWindowSpec"
>>> class Grp:
...     layer_names, kv_cache_spec, is_eagle_group = ["l0", "l1"], Spec(), False
>>> g = vllm_layout([Grp()], VllmSpecDecode(), chunk_tokens=64).groups[0]
>>> g.kind, g.window, g.extra_retained, g.blocks_per_chunk, g.bytes_per_token
('sliding_window', 32, 3, 4, 512)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.layout import Group, Layout


class UnsupportedConfig(ValueError):
    """A vLLM configuration kvtier refuses to serve, rather than serve wrongly."""


@dataclass(frozen=True)
class VllmSpecDecode:
    """The speculative-decoding settings that decide draft groups' lookahead.

    ``method`` is vLLM's ``speculative_config.method`` (None without speculative decoding);
    ``num_modules`` the number of MTP modules in use (``min(num_nextn_predict_layers,
    num_speculative_tokens)``).
    """

    method: str | None = None
    num_speculative_tokens: int = 0
    num_modules: int = 1

    def draft_lookahead(self) -> int:
        """Lookahead ``d`` of a draft group: how far past a position its KV reads.

        >>> VllmSpecDecode("eagle", 3).draft_lookahead()
        1
        >>> VllmSpecDecode("mtp", 4, 2).draft_lookahead()
        2
        """
        if self.method in ("eagle", "eagle3"):
            return 1
        if self.method == "mtp":
            return max(1, self.num_modules)
        if self.method in ("dflash", "dspark"):
            return 0  # draft KV from the target's hidden state alone
        raise UnsupportedConfig(
            f"speculative method {self.method!r} marks KV-cache groups as draft groups, but "
            "kvtier does not know what the draft KV at a position depends on for it; "
            "supported: eagle, eagle3, mtp, dflash, dspark"
        )


def vllm_layout(
    groups: Sequence[Any], spec_decode: VllmSpecDecode, *, chunk_tokens: int,
    model: str = "vllm-model", kv_dtype: str = "auto",
) -> Layout:
    """The kvtier layout of vLLM's ``kv_cache_config.kv_cache_groups``, in vLLM's order."""
    if not groups:
        raise UnsupportedConfig("the model has no KV-cache groups: nothing for kvtier to store")
    out = tuple(_group(i, g, spec_decode, chunk_tokens) for i, g in enumerate(groups))
    return Layout(out, model=model, kv_dtype=kv_dtype)


MIN_CHUNK_TOKENS = 256
"""Without a state group, the default chunk is the smallest multiple of every group's block
size at least this long."""


def default_chunk_tokens(groups: Sequence[Any]) -> int:
    """``chunk_tokens`` when the user gives none, so that any model starts and never hits
    less than vLLM's native offloading: the least common multiple of the groups' block
    sizes, made at least ``MIN_CHUNK_TOKENS`` by a whole multiple unless a group is a Mamba
    (recurrent-state) group.

    Why one block with a state group: in align mode vLLM keeps a prefill's state only at
    the last block boundary before its last token (any multiple of the block size), and a
    state chunk is stored only where a state is kept at its end; with chunks of several
    blocks most prompts would store no state and hit nothing, where native offloading (one
    block per chunk) hits that boundary.

    Examples: 16-token blocks -> 256; blocks of 96 and 128 -> 384; a Qwen3-Next-class
    model, whose recurrent-state and attention groups vLLM gives 1152-token blocks (align
    mode) -> 1152; a Jamba-class model's 80-token blocks -> 80 (not 320).
    """
    sizes = [int(g.kv_cache_spec.block_size) for g in groups] or [1]
    step = math.lcm(*sizes)
    if any(_is_mamba(g.kv_cache_spec) for g in groups):
        return step
    return -(-MIN_CHUNK_TOKENS // step) * step


def _is_mamba(spec: Any) -> bool:
    return any(cls.__name__ == "MambaSpec" for cls in type(spec).__mro__)


def _group(index: int, group: Any, spec_decode: VllmSpecDecode, chunk_tokens: int) -> Group:
    spec = group.kv_cache_spec
    where = f"KV-cache group {index} ({type(spec).__name__})"
    _check_transferable(group, where)
    block = int(spec.block_size)
    if chunk_tokens % block:
        raise UnsupportedConfig(
            f"{where}: chunk_tokens {chunk_tokens} is not a multiple of its block size {block}; "
            "set kv_connector_extra_config.chunk_tokens to a multiple of every group's block size"
        )
    kind_fields = _kind_fields(spec, where)
    lookahead = spec_decode.draft_lookahead() if getattr(group, "is_eagle_group", False) else 0
    num_layers = max(1, len(group.layer_names))
    sizes = _sizes(spec, kind_fields["kind"], num_layers, block)
    return Group(tokens_per_block=block, blocks_per_chunk=chunk_tokens // block,
                 lookahead=lookahead, num_layers=num_layers, name=f"vllm{index}",
                 **kind_fields, **sizes)


def _check_transferable(group: Any, where: str) -> None:
    if not getattr(group, "enable_kv_transfer", True):
        raise UnsupportedConfig(f"{where}: not transferable (enable_kv_transfer=False)")
    if getattr(group, "host_resident", False):
        raise UnsupportedConfig(f"{where}: host-resident (HiSparse) groups are not supported")


def _full(spec: Any, where: str) -> dict[str, Any]:
    # A merged spec (hybrid allocator off) keeps every block, so a window only narrows what
    # the layer reads, never what the allocator retains: full attention is exact here.
    return {"kind": "full"}


def _sliding(spec: Any, where: str) -> dict[str, Any]:
    if getattr(spec, "bounded_replay", False):
        raise UnsupportedConfig(
            f"{where}: bounded-replay sliding windows recompute part of every hit; kvtier's "
            "coverage contract has no such rule yet"
        )
    return {"kind": "sliding_window", "window": int(spec.sliding_window),
            "extra_retained": int(getattr(spec, "extra_retained_tokens", 0))}


def _chunked(spec: Any, where: str) -> dict[str, Any]:
    return {"kind": "chunked_local", "chunk": int(spec.attention_chunk_size)}


def _mamba(spec: Any, where: str) -> dict[str, Any]:
    mode = getattr(spec, "mamba_cache_mode", None)
    if mode != "align":
        raise UnsupportedConfig(
            f"{where}: Mamba cache mode {mode!r} does not keep one state per block boundary "
            "in a block of its own, so kvtier cannot store or restore it; start vLLM with "
            "prefix caching and mamba_cache_mode='align' (--enable-prefix-caching "
            "--mamba-cache-mode align)"
        )
    return {"kind": "state"}


_KINDS: dict[str, Callable[[Any, str], dict[str, Any]]] = {
    "SlidingWindowSpec": _sliding,
    "ChunkedLocalAttentionSpec": _chunked,
    "MambaSpec": _mamba,
    "FullAttentionSpec": _full,  # MLAAttentionSpec is a subclass
}
"""Spec class name -> kind fields; the first match along the spec's MRO wins."""


def _kind_fields(spec: Any, where: str) -> dict[str, Any]:
    for cls in type(spec).__mro__:
        if cls.__name__ in _KINDS:
            return _KINDS[cls.__name__](spec, where)
    raise UnsupportedConfig(
        f"{where}: kvtier does not know how vLLM's allocator retains blocks of this spec "
        f"type; supported: {sorted(_KINDS)} (and their subclasses, e.g. MLAAttentionSpec)"
    )


def state_bytes(spec: Any) -> int:
    """Bytes of one layer's recurrent state: its tensors' own bytes (``MambaSpec.shapes``
    and ``dtypes``: conv state plus SSM or gated-delta-net state), without the padding
    vLLM adds to make a state page as large as an attention page.

    Example: GDN with conv ``(3, 1024)`` bf16 and state ``(4, 128, 128)`` fp32 -> 6144 +
    262144 = 268288 bytes, in a page vLLM pads to 294912.
    """
    total = 0
    for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
        total += math.prod(int(n) for n in shape) * int(dtype.itemsize)
    return total


def _sizes(spec: Any, kind: str, num_layers: int, block: int) -> dict[str, Any]:
    if kind == "state":
        return {"bytes_per_state": state_bytes(spec) * num_layers}
    page = int(spec.page_size_bytes)
    if page % block:
        raise UnsupportedConfig(f"page size {page} bytes is not a whole number of bytes per token")
    return {"bytes_per_token": page // block * num_layers}
