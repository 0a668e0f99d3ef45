"""The reference engine's one typed config, and the kvtier ``Layout`` that matches it.

A model is described group by group: each ``GroupSpec`` is a KV-cache group (layers that
share one block table and one attention kind). ``EngineConfig.layout()`` turns the same
specs into a ``kvtier.layout.Layout``, so the engine and kvtier can never disagree about
block sizes, windows or bytes per token.

Example::

    cfg = EngineConfig(groups=(
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=2),
        GroupSpec("sliding_window", num_layers=2, tokens_per_block=4, window=6),
    ))
    cfg.layer_groups   # (0, 1, 1): round robin, group 0 runs out after one layer
    cfg.layout().groups[1].bytes_per_token   # 2 * 2 layers * 2 kv heads * 16 * 4 = 512

A ``state`` group is recurrent layers (``kvtier.engine.recurrent``, a gated delta net): no
per-token KV, one state per sequence, kept by the engine at each block boundary in a block of
its own (the state after the block's last token), so kvtier stores one state per chunk.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal, get_args

from kvtier.engine.recurrent import RecurrentShape
from kvtier.engine.speculative_config import SpeculativeConfig, speculative_layout
from kvtier.layout import Group, Layout

AttentionKind = Literal["full", "sliding_window", "chunked_local", "state"]
ATTENTION_KINDS: tuple[str, ...] = get_args(AttentionKind)

#: Bytes of one KV element: the reference engine computes and caches in fp32.
KV_DTYPE_BYTES = 4


def _positive(name: str, value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group of the reference model.

    Example: ``GroupSpec("sliding_window", num_layers=2, tokens_per_block=4, window=6)`` is
    two sliding-window layers; position 10 attends to positions 5..10, and the allocator
    keeps blocks by ``kvtier.coverage.retained_blocks``.
    """

    kind: AttentionKind
    """``full``, ``sliding_window``, ``chunked_local`` or ``state`` (recurrent layers)."""
    num_layers: int = 1
    """Decoder layers in this group; they share one block table."""
    tokens_per_block: int = 4
    """Tokens in one engine block of this group."""
    blocks_per_chunk: int = 1
    """Consecutive blocks kvtier stores as one chunk (only the layout uses it)."""
    window: int | None = None
    """Sliding window ``W`` (position ``i`` attends to ``[i - W + 1, i]``)."""
    chunk: int | None = None
    """Attention chunk ``C`` of chunked local attention (``i`` attends to its own chunk)."""
    extra_retained: int = 0
    """Extra history ``E`` the allocator keeps beyond the window (sliding window only)."""

    def __post_init__(self) -> None:
        where = f"GroupSpec({self.kind!r})"
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(f"{where}: kind must be one of {list(ATTENTION_KINDS)}")
        _positive("num_layers", self.num_layers, where)
        # The remaining fields are validated by kvtier.layout.Group, the one place that
        # knows which kind takes which field.
        self.to_group(1, name="check")

    def to_group(self, num_bytes: int, name: str) -> Group:
        """The kvtier ``Group`` for this spec: ``num_bytes`` is KV bytes per token, or for a
        ``state`` group the bytes of one state (all its layers)."""
        state = self.kind == "state"
        return Group(
            kind=self.kind,
            tokens_per_block=self.tokens_per_block,
            blocks_per_chunk=self.blocks_per_chunk,
            window=self.window,
            extra_retained=self.extra_retained,
            chunk=self.chunk,
            bytes_per_token=None if state else num_bytes,
            bytes_per_state=num_bytes if state else None,
            num_layers=self.num_layers,
            name=name,
        )


@dataclass(frozen=True)
class EngineConfig:
    """Model dimensions, KV-cache geometry and scheduler limits of a reference engine.

    Defaults give a model that runs a 100-token request in milliseconds on one CPU core.
    """

    groups: tuple[GroupSpec, ...]
    """The KV-cache groups, in kvtier's group order."""
    layer_groups: tuple[int, ...] | None = None
    """Group index of each decoder layer; default: round robin over groups with layers left."""
    hidden_size: int = 64
    """Width of the residual stream."""
    num_heads: int = 4
    """Query heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide ``num_heads``."""
    head_dim: int = 16
    """Width of one attention head; even, for rotary embeddings."""
    intermediate_size: int = 128
    """Width of the SwiGLU MLP."""
    vocab_size: int = 256
    """Token ids are ``0 .. vocab_size - 1``."""
    rope_theta: float = 10000.0
    """Rotary embedding base."""
    rms_eps: float = 1e-6
    """RMSNorm epsilon."""
    seed: int = 0
    """Seed of the random weights (``torch.Generator``); part of the model identity."""
    num_blocks: int = 64
    """Blocks in each group's pool."""
    max_prefill_tokens: int = 32
    """Most prompt tokens one request computes in one step (chunked prefill)."""
    max_running: int = 8
    """Most requests that run at once; later ones wait to be admitted."""
    hit_granularity: int = 0
    """Passed to the layout; 0 means the lcm of the groups' ``tokens_per_chunk``."""
    speculative: SpeculativeConfig | None = None
    """Draft modules for speculative decoding (``kvtier.engine.speculative_config``); None: off."""
    linear_num_heads: int = 2
    """Heads of each recurrent (``state``) layer's delta rule."""
    linear_head_dim: int = 8
    """Key and value width of one recurrent head."""
    conv_kernel: int = 4
    """Taps of each recurrent layer's causal convolution (>= 2)."""

    def __post_init__(self) -> None:
        if not isinstance(self.groups, tuple):
            object.__setattr__(self, "groups", tuple(self.groups))
        if not self.groups or not all(isinstance(g, GroupSpec) for g in self.groups):
            raise ValueError("EngineConfig: groups must be a non-empty sequence of GroupSpec")
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "num_blocks", "max_prefill_tokens",
                     "max_running", "linear_num_heads", "linear_head_dim", "conv_kernel"):
            _positive(name, getattr(self, name), "EngineConfig")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"EngineConfig: num_kv_heads {self.num_kv_heads} must divide "
                f"num_heads {self.num_heads}"
            )
        if self.conv_kernel < 2:
            raise ValueError(f"EngineConfig: conv_kernel must be >= 2, got {self.conv_kernel}")
        if self.head_dim % 2:
            raise ValueError(f"EngineConfig: head_dim must be even for rotary, got {self.head_dim}")
        if self.layer_groups is None:
            object.__setattr__(self, "layer_groups", _round_robin(self.groups))
        else:
            object.__setattr__(self, "layer_groups", tuple(self.layer_groups))
            self._check_layer_groups()

    def _check_layer_groups(self) -> None:
        assert self.layer_groups is not None
        counts = [0] * len(self.groups)
        for layer, g in enumerate(self.layer_groups):
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < len(self.groups):
                raise ValueError(
                    f"EngineConfig: layer {layer} maps to group {g!r}; group indices are "
                    f"0..{len(self.groups) - 1}"
                )
            counts[g] += 1
        wanted = [g.num_layers for g in self.groups]
        if counts != wanted:
            raise ValueError(
                f"EngineConfig: layer_groups gives {counts} layers per group, but the "
                f"GroupSpecs say num_layers {wanted}"
            )

    @property
    def num_layers(self) -> int:
        """Decoder layers in the model."""
        return sum(g.num_layers for g in self.groups)

    @property
    def block_alignment(self) -> int:
        """The lcm of every group's ``tokens_per_block``: a hit must be a multiple of it."""
        return math.lcm(*(g.tokens_per_block for g in self.groups))

    @property
    def recurrent_shape(self) -> RecurrentShape:
        """The state geometry of every recurrent layer."""
        return RecurrentShape(self.linear_num_heads, self.linear_head_dim, self.conv_kernel)

    def is_recurrent(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` is a recurrent layer (in a ``state`` group)."""
        assert self.layer_groups is not None
        return self.groups[self.layer_groups[layer]].kind == "state"

    def group_bytes(self, group_index: int) -> int:
        """``bytes_per_token`` of an attention group; for a ``state`` group the bytes of one
        state: ``layers * state_numel * 4`` (``kvtier.engine.recurrent``)."""
        if self.groups[group_index].kind != "state":
            return self.bytes_per_token(group_index)
        return self.groups[group_index].num_layers * self.recurrent_shape.state_numel * 4

    def bytes_per_token(self, group_index: int) -> int:
        """KV bytes per token of one group: ``2 * layers * kv_heads * head_dim * 4``.

        Example: 2 layers, 2 KV heads, head dim 16: ``2 * 2 * 2 * 16 * 4 = 512``.
        """
        layers = self.groups[group_index].num_layers
        return 2 * layers * self.num_kv_heads * self.head_dim * KV_DTYPE_BYTES

    @property
    def model_id(self) -> str:
        """Model identity for kvtier namespaces: differs whenever weights or shapes differ."""
        digest = hashlib.blake2b(repr(self._identity()).encode(), digest_size=6).hexdigest()
        return f"kvtier-reference-{digest}"

    def _identity(self) -> tuple[object, ...]:
        return (self.groups, self.layer_groups, self.hidden_size, self.num_heads,
                self.num_kv_heads, self.head_dim, self.intermediate_size, self.vocab_size,
                self.rope_theta, self.rms_eps, self.seed,
                self.speculative and self.speculative.identity, *self._recurrent_identity())

    def _recurrent_identity(self) -> tuple[int, ...]:
        """Recurrent dimensions, only when a layer uses them (other models keep their ids)."""
        if not any(g.kind == "state" for g in self.groups):
            return ()
        return (self.linear_num_heads, self.linear_head_dim, self.conv_kernel)

    @property
    def num_draft_modules(self) -> int:
        """Draft modules (each one layer in its own group after the target's groups)."""
        return 0 if self.speculative is None else self.speculative.num_modules

    def layout(self) -> Layout:
        """The kvtier ``Layout`` of this model, group for group, with sizes filled in.

        With ``speculative`` set, the target's groups are followed by one group per draft
        module and the ``hidden`` state group (``kvtier.engine.speculative_config``).
        """
        groups = tuple(
            spec.to_group(self.group_bytes(i), name=f"g{i}-{spec.kind}")
            for i, spec in enumerate(self.groups)
        )
        layout = Layout(groups=groups, hit_granularity=self.hit_granularity,
                        model=self.model_id, kv_dtype="float32")
        if self.speculative is None:
            return layout
        draft_bytes = 2 * self.num_kv_heads * self.head_dim * KV_DTYPE_BYTES
        return speculative_layout(layout, self.speculative, draft_bytes, self.hidden_size)


def _round_robin(groups: tuple[GroupSpec, ...]) -> tuple[int, ...]:
    """Interleave layers: group 0, 1, ..., 0, 1, ...; skip groups whose layers are used up.

    Example: groups with 1 and 3 layers give ``(0, 1, 1, 1)``; 2 and 2 give ``(0, 1, 0, 1)``.
    """
    left = [g.num_layers for g in groups]
    order: list[int] = []
    while any(left):
        for i in range(len(groups)):
            if left[i]:
                order.append(i)
                left[i] -= 1
    return tuple(order)
