"""Speculative decoding settings of the reference engine, and the layout they add.

Draft modules each get their own KV-cache group (one attention layer, full attention) with a
lookahead: MTP module ``m`` reads the embedding of token ``i + m`` at position ``i``
(lookahead ``m``); EAGLE's single draft layer reads token ``i + 1`` (lookahead 1). The
groups follow ``kvtier.presets.with_mtp`` / ``with_eagle``: sliding-window groups retain
``E = k - 1`` extra tokens under MTP with ``k`` speculative tokens.

The draft tail is *recomputed*: after a restore at ``b`` the engine recomputes each draft
module's KV from ``coverage.restore_point`` (the last draft chunk keyed by tokens before
``b``) up to ``b``, from the target's hidden states of those positions. Those hidden
states are a ``state`` group (``hidden``): block ``j`` holds the target's final hidden
states of positions ``[j*T, (j+1)*T)``, so the state stored with the chunk ending at ``b``
is the hidden states of ``[b - T, b)``. ``T`` is the draft chunk size times
``ceil(d_max / chunk)``, enough for every draft group's tail.

Example (the first seed report): 16-token chunks, MTP with 2 modules and 4 speculative
tokens, a 65-token prompt. A stored tail needs module 2's chunk 3, keyed through token 65,
so the hit would be 48. With the recomputed tail the hit is 64: target groups restore to
64, draft groups to 48, and the engine recomputes draft positions 48..63 from the stored
hidden states of 48..63 and the prompt's own tokens 49..64 (plus the first generated token
for module 2 at position 63, once the target has produced it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

from kvtier.layout import Group, Layout
from kvtier.presets import with_eagle, with_mtp

SpecMethod = Literal["mtp", "eagle"]
SPEC_METHODS: tuple[str, ...] = get_args(SpecMethod)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Draft modules and how many tokens they propose per step.

    Example: ``SpeculativeConfig("mtp", num_speculative_tokens=4, num_modules=2)``: modules
    1 and 2 propose two tokens, then module 2 continues on its own output for two more.
    """

    method: SpecMethod
    """``mtp`` (``num_modules`` chained modules) or ``eagle`` (one draft layer)."""
    num_speculative_tokens: int = 1
    """Draft tokens ``k`` verified per step."""
    num_modules: int = 1
    """MTP modules ``K`` (module ``m`` has lookahead ``m``); EAGLE has exactly one."""
    force_rejections: bool = False
    """Replace every draft by a wrong token before verifying (tests of the rejection path);
    not part of the model's identity: it changes no weight and no KV."""

    def __post_init__(self) -> None:
        where = "SpeculativeConfig"
        if self.method not in SPEC_METHODS:
            raise ValueError(f"{where}: method must be one of {list(SPEC_METHODS)}, "
                             f"got {self.method!r}")
        for name in ("num_speculative_tokens", "num_modules"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {name} must be an integer >= 1, got {value!r}")
        if self.method == "eagle" and self.num_modules != 1:
            raise ValueError(f"{where}: EAGLE has one draft layer; num_modules must be 1")

    @property
    def identity(self) -> SpeculativeConfig:
        """What the model identity hashes: everything but ``force_rejections``."""
        return replace(self, force_rejections=False)


def speculative_layout(
    base: Layout, spec: SpeculativeConfig, draft_bytes_per_token: int, hidden_size: int
) -> Layout:
    """``base`` plus the draft groups (recomputed tails) and the ``hidden`` state group.

    Example: a full + sliding layout with 16-token chunks and MTP ``k = 4, K = 2`` gives
    groups full, sliding (``E = 3``), mtp1 (lookahead 1), mtp2 (lookahead 2), hidden
    (16-token blocks of 16 * hidden_size fp32 values).
    """
    if spec.method == "mtp":
        layout = with_mtp(base, spec.num_speculative_tokens, spec.num_modules)
    else:
        layout = with_eagle(base)
    n = len(base.groups)
    drafts = tuple(
        replace(g, bytes_per_token=draft_bytes_per_token, num_layers=1, draft_tail="recomputed")
        for g in layout.groups[n:]
    )
    chunk = drafts[0].tokens_per_chunk
    tail = chunk * -(-max(g.lookahead for g in drafts) // chunk)
    hidden = Group("state", tokens_per_block=tail, bytes_per_state=tail * hidden_size * 4,
                   name="hidden")
    return layout.with_groups((*layout.groups[:n], *drafts, hidden))
