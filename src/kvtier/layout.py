"""The KV-cache geometry of a model: groups of layers and how kvtier chunks them.

A *group* is a set of layers that share one block table and one attention kind. A *layout*
is the ordered tuple of a model's groups plus the hit granularity: the token multiple at
which a cache hit may end. Everything here is plain, frozen data; validation happens at
construction so that every other module can trust a layout it is given.

Words (DESIGN section 1): a *block* is the engine's allocation unit of ``tokens_per_block``
tokens; a *chunk* is kvtier's storage unit of ``blocks_per_chunk`` consecutive blocks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

GroupKind = Literal["full", "sliding_window", "chunked_local", "state"]
GROUP_KINDS: tuple[str, ...] = get_args(GroupKind)

DraftTail = Literal["stored", "recomputed"]
DRAFT_TAILS: tuple[str, ...] = get_args(DraftTail)

#: Bumped whenever the meaning of stored bytes or keys changes; hashed into every key.
LAYOUT_VERSION = 3


def _check_int(name: str, value: object, low: int, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {name} must be an integer >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{where}: {name} must be >= {low}, got {value}")


@dataclass(frozen=True)
class Group:
    """One KV-cache group.

    Example: ``Group("sliding_window", tokens_per_block=16, blocks_per_chunk=4, window=128)``
    stores 64-token chunks; chunk 3 covers tokens 192..255.
    """

    kind: GroupKind
    """Attention kind: ``full``, ``sliding_window``, ``chunked_local`` or ``state``."""
    tokens_per_block: int
    """Tokens in one engine block of this group."""
    blocks_per_chunk: int = 1
    """Consecutive blocks kvtier stores as one chunk."""
    window: int | None = None
    """Sliding window ``W`` in tokens (position ``i`` attends to ``[i - W + 1, i]``)."""
    extra_retained: int = 0
    """Extra history ``E`` the engine keeps beyond the window (MTP: ``k - 1``)."""
    chunk: int | None = None
    """Attention chunk ``C`` of chunked local attention, in tokens."""
    lookahead: int = 0
    """Draft lookahead ``d``: KV at position ``i`` depends on token ``i + d``."""
    draft_tail: DraftTail = "stored"
    """For a draft group (``lookahead > 0``): ``stored``, a hit at ``b`` restores the draft
    KV up to ``b`` (so it needs tokens up to ``b + d``); ``recomputed``, a hit restores only
    the whole chunks keyed by tokens before ``b`` and the engine recomputes the rest from
    target hidden states it stores with the boundary (``coverage.restore_point``)."""
    bytes_per_token: int | None = None
    """KV bytes per token for attention groups (all layers of the group together)."""
    bytes_per_state: int | None = None
    """Bytes of one recurrent state (all layers of the group), for ``state`` groups."""
    num_layers: int = 1
    """Layers in the group; ``bytes_per_token`` covers all of them."""
    name: str = ""
    """Optional human name, for tables."""

    def __post_init__(self) -> None:
        where = f"group {self.name or self.kind!r}"
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"{where}: kind must be one of {list(GROUP_KINDS)}, got {self.kind!r}")
        _check_int("tokens_per_block", self.tokens_per_block, 1, where)
        _check_int("blocks_per_chunk", self.blocks_per_chunk, 1, where)
        _check_int("extra_retained", self.extra_retained, 0, where)
        _check_int("lookahead", self.lookahead, 0, where)
        _check_int("num_layers", self.num_layers, 1, where)
        self._check_kind_fields(where)
        if self.bytes_per_token is not None:
            _check_int("bytes_per_token", self.bytes_per_token, 1, where)
        if self.bytes_per_state is not None:
            _check_int("bytes_per_state", self.bytes_per_state, 1, where)
        if self.kind == "state" and self.bytes_per_token is not None:
            raise ValueError(f"{where}: a state group takes bytes_per_state, not bytes_per_token")
        if self.kind != "state" and self.bytes_per_state is not None:
            raise ValueError(f"{where}: bytes_per_state is only for kind 'state'")

    def _check_kind_fields(self, where: str) -> None:
        if self.kind == "sliding_window":
            _check_int("window", self.window, 1, where)
        elif self.window is not None:
            raise ValueError(f"{where}: window is only for kind 'sliding_window'")
        if self.kind != "sliding_window" and self.extra_retained:
            raise ValueError(f"{where}: extra_retained is only for kind 'sliding_window'")
        if self.kind == "chunked_local":
            _check_int("chunk", self.chunk, 1, where)
        elif self.chunk is not None:
            raise ValueError(f"{where}: chunk is only for kind 'chunked_local'")
        if self.kind == "state" and self.lookahead:
            raise ValueError(f"{where}: a state group cannot have a lookahead")
        if self.draft_tail not in DRAFT_TAILS:
            raise ValueError(f"{where}: draft_tail must be one of {list(DRAFT_TAILS)}, "
                             f"got {self.draft_tail!r}")
        if self.draft_tail == "recomputed" and not self.lookahead:
            raise ValueError(f"{where}: draft_tail 'recomputed' is only for draft groups "
                             "(lookahead > 0)")

    @functools.cached_property
    def tokens_per_chunk(self) -> int:
        """Tokens in one stored chunk: ``tokens_per_block * blocks_per_chunk`` (kept once
        read: the planner reads it per request, and a property is a Python call each)."""
        return self.tokens_per_block * self.blocks_per_chunk

    @property
    def bytes_per_chunk(self) -> int | None:
        """Bytes of one stored chunk, or None when the layout gives no sizes.

        A state chunk holds one state: the state after the chunk's last token.
        """
        if self.kind == "state":
            return self.bytes_per_state
        if self.bytes_per_token is None:
            return None
        return self.bytes_per_token * self.tokens_per_chunk

    @property
    def bytes_per_block(self) -> int | None:
        """Bytes of one engine block (for a state group, one state per block)."""
        if self.kind == "state":
            return self.bytes_per_state
        if self.bytes_per_token is None:
            return None
        return self.bytes_per_token * self.tokens_per_block

    @property
    def label(self) -> str:
        return self.name or self.kind


@dataclass(frozen=True)
class Layout:
    """An ordered tuple of groups and the hit granularity.

    ``hit_granularity`` defaults to the least common multiple of every group's
    ``tokens_per_chunk``; a given value must be a multiple of each of them, so that every
    boundary ends on a chunk boundary of every group.
    """

    groups: tuple[Group, ...]
    """The model's KV-cache groups, in the engine's order."""
    hit_granularity: int = 0
    """Token multiple at which hits may end; 0 means the default (lcm of chunk sizes)."""
    model: str = "custom"
    """Model identity, for namespaces and tables."""
    kv_dtype: str = "bfloat16"
    """KV-cache dtype, hashed into keys."""

    _lcm: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if not isinstance(self.groups, tuple):
            object.__setattr__(self, "groups", tuple(self.groups))
        if not self.groups:
            raise ValueError("layout: groups must list at least one group")
        for g in self.groups:
            if not isinstance(g, Group):
                raise ValueError(f"layout: groups must be Group objects, got {type(g).__name__}")
        lcm = math.lcm(*(g.tokens_per_chunk for g in self.groups))
        object.__setattr__(self, "_lcm", lcm)
        if self.hit_granularity == 0:
            object.__setattr__(self, "hit_granularity", lcm)
        _check_int("hit_granularity", self.hit_granularity, 1, "layout")
        if self.hit_granularity % lcm:
            sizes = [g.tokens_per_chunk for g in self.groups]
            raise ValueError(
                f"layout: hit_granularity {self.hit_granularity} must be a multiple of every "
                f"group's tokens_per_chunk {sizes} (their lcm is {lcm})"
            )

    def __hash__(self) -> int:
        """The fields' hash, computed once: every ``functools.lru_cache`` keyed by a layout
        (``kvtier.coverage``) hashes it per call, and hashing the groups costs microseconds.
        Kept out of pickles (``__getstate__``): ``str`` hashes differ between processes."""
        known: int | None = self.__dict__.get("_hash")
        if known is None:
            known = hash((self.groups, self.hit_granularity, self.model, self.kv_dtype))
            object.__setattr__(self, "_hash", known)
        return known

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @functools.cached_property
    def max_lookahead(self) -> int:
        """The largest lookahead ``d`` of any group (0 without draft layers)."""
        return max(g.lookahead for g in self.groups)

    @functools.cached_property
    def max_stored_lookahead(self) -> int:
        """The largest lookahead of a group whose draft tail is stored: how far past a
        boundary a hit's keys reach (0 when every draft tail is recomputed)."""
        return max((g.lookahead for g in self.groups if g.draft_tail == "stored"), default=0)

    @functools.cached_property
    def state_chunk_tokens(self) -> tuple[int, ...]:
        """``tokens_per_chunk`` of each state group (recurrent layers): where a whole-prompt
        hit must end (``retention.whole_prompt_hit``)."""
        return tuple(g.tokens_per_chunk for g in self.groups if g.kind == "state")

    @property
    def max_bytes_per_chunk(self) -> int | None:
        """The largest chunk of any group: the slot size of a tier, or None without sizes."""
        sizes = [g.bytes_per_chunk for g in self.groups]
        if any(s is None for s in sizes):
            return None
        return max(s for s in sizes if s is not None)

    @functools.cached_property
    def fingerprint(self) -> tuple[str, ...]:
        """Every field that changes the bytes a chunk holds, or where they go: the model,
        the KV dtype, and each group's name, kind, sizes, layers and attention shape, with
        the number of groups. Keys hash it (``Namespace.group_tag``) and records carry it
        (``geometry_of``), so two layouts that differ anywhere here never share a key, and
        those that share a key accept each other's records. ``extra_retained`` and
        ``hit_granularity`` are left out: they change what the engine keeps and where hits
        may end, not a chunk's bytes.

        >>> a = Layout((Group("sliding_window", 16, window=64, num_layers=32),))
        >>> b = Layout((Group("sliding_window", 16, window=64, num_layers=32, extra_retained=3),))
        >>> c = Layout((Group("sliding_window", 16, window=64, num_layers=40),))
        >>> a.fingerprint == b.fingerprint, a.fingerprint == c.fingerprint
        (True, False)
        """
        fields = [self.model, self.kv_dtype, str(len(self.groups))]
        for g in self.groups:
            fields += [g.name, g.kind, str(g.tokens_per_block), str(g.blocks_per_chunk),
                       str(g.window), str(g.chunk), str(g.lookahead), g.draft_tail,
                       str(g.bytes_per_token), str(g.bytes_per_state), str(g.num_layers)]
        return tuple(fields)

    def with_groups(self, groups: tuple[Group, ...]) -> Layout:
        """A copy with other groups; the granularity is recomputed unless it was explicit."""
        explicit = self.hit_granularity != self._lcm
        return replace(self, groups=groups, hit_granularity=self.hit_granularity if explicit else 0)
