"""Speculative decoding in the reference engine: propose, verify, accept, re-prefill.

One decode step at horizon ``c`` (target KV for ``[0, c)``, token ``c`` known):

1. *catch up* (after every target computation): module ``m`` computes, with true inputs,
   every position up to its frontier ``min(horizon, known_tokens - m)``;
2. *propose* ``k`` drafts: modules ``1..K`` at position ``c - 1`` give drafts ``1..K``
   (module ``m`` first runs its not-yet-final positions ``[c + 1 - m, c)`` on drafted
   tokens); module ``K`` then continues alone on its own output for drafts ``K+1..k``.
   Every draft KV entry written here is provisional;
3. *verify*: the target computes ``[token c, draft 1..k]`` at ``c..c+k`` and accepts the
   longest prefix of drafts equal to its own greedy tokens, plus its next token;
4. *rewind*: the horizon becomes ``c + a + 1``; target KV past it is dead, and the next
   catch-up re-prefills the draft positions that read a rejected draft (up to ``k - 1``).

With ``force_rejections`` every draft is replaced by a wrong token before verifying.

After a restore at ``b`` the draft modules' frontier is their restore point
(``coverage.restore_point``, e.g. 48 for ``b = 64`` with 16-token chunks) and the target
hidden states of ``[b - T, b)`` come from the restored ``hidden`` state block, so the
catch-up recomputes draft positions ``48..63`` exactly as the cold run computed them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvtier.coverage import restore_point
from kvtier.engine.attention import attend
from kvtier.engine.blocks import PagedKVCache
from kvtier.engine.config import EngineConfig
from kvtier.engine.draft import DraftModel
from kvtier.engine.model import AttentionFn, TinyModel
from kvtier.engine.request import Request
from kvtier.layout import Layout

#: allocate(request, group, start, stop): hold blocks for positions [start, stop) of a group.
Allocate = Callable[[Request, int, int, int], None]


@dataclass
class DraftState:
    """Per request: hidden states by level (0 = target) and each module's frontier."""

    hidden: list[torch.Tensor]
    frontier: list[int] = field(default_factory=list)
    """``frontier[m]``: first position module ``m`` has not computed with true inputs."""


class Speculator:
    """Draft modules, their paged KV and the verify/accept loop of one engine."""

    def __init__(self, config: EngineConfig, model: TinyModel, cache: PagedKVCache,
                 layout: Layout, allocate: Allocate) -> None:
        assert config.speculative is not None
        self.spec = config.speculative
        self.model, self.cache, self.layout, self._allocate = model, cache, layout, allocate
        self.drafts = DraftModel(model)
        self.first_draft_group = len(config.groups)
        self.hidden_group = len(layout.groups) - 1
        self._states: dict[str, DraftState] = {}

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self, request: Request) -> None:
        rows = request.num_prompt_tokens + request.max_tokens + self.spec.num_speculative_tokens + 2
        size = self.model.config.hidden_size
        levels = [torch.zeros(rows, size) for _ in range(self.drafts.num_modules + 1)]
        self._states[request.request_id] = DraftState(levels, [0] * (self.drafts.num_modules + 1))

    def finish(self, request: Request) -> None:
        del self._states[request.request_id]

    def restored(self, request: Request, b: int) -> None:
        """After a restore at ``b``: seed target hidden states, rewind to restore points.

        Example: ``b = 64``, 16-token hidden blocks: block 3 holds positions 48..63; both
        MTP modules restart at 48.
        """
        st = self._states[request.request_id]
        tpb = self.layout.groups[self.hidden_group].tokens_per_block
        table = request.block_tables[self.hidden_group]
        st.hidden[0][b - tpb : b] = self.cache.read_state(self.hidden_group, table, (b - 1) // tpb)
        drafts = self.layout.groups[self.first_draft_group : self.hidden_group]
        start = min(restore_point(g, b) for g in drafts)
        assert start >= b - tpb, "the hidden state block must cover every draft tail"
        st.frontier = [b] + [start] * self.drafts.num_modules

    # ---- target hidden states and catch-up -----------------------------------------------

    def target_computed(self, request: Request, start: int, hidden: torch.Tensor) -> None:
        """Record target hidden states of ``start ..`` (final ones only), then catch up."""
        st = self._states[request.request_id]
        st.hidden[0][start : start + len(hidden)] = hidden
        self._allocate(request, self.hidden_group, start, start + len(hidden))
        self.cache.write_state(self.hidden_group, request.block_tables[self.hidden_group],
                               start, hidden)
        self.catch_up(request)

    def catch_up(self, request: Request) -> None:
        """Run every module over the positions it can now compute with true inputs."""
        st = self._states[request.request_id]
        n, tokens = request.num_computed_tokens, request.all_token_ids
        st.frontier[0] = n
        for m in range(1, self.drafts.num_modules + 1):
            lo, hi = st.frontier[m], min(n, len(tokens) - m)
            if hi > lo:
                out = self._run(request, m, lo, st.hidden[m - 1][lo:hi], tokens[lo + m : hi + m])
                st.hidden[m][lo:hi] = out
                st.frontier[m] = hi

    def _run(self, request: Request, m: int, lo: int, hidden_in: torch.Tensor,
             token_ids: tuple[int, ...] | list[int]) -> torch.Tensor:
        group = self.first_draft_group + m - 1
        hi = lo + len(token_ids)
        self._allocate(request, group, lo, hi)
        attention = self._attention(request, group, lo)
        with torch.no_grad():
            return self.drafts.forward(m, hidden_in, token_ids, torch.arange(lo, hi), attention)

    def _attention(self, request: Request, group: int, start: int) -> AttentionFn:
        """Causal attention over the module's own KV ``[0, last new position]``."""
        table = request.block_tables[group]

        def draft(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  positions: torch.Tensor) -> torch.Tensor:
            self.cache.write(layer, table, start, k, v)
            hi = start + len(positions)
            keys, values = self.cache.gather(layer, table, 0, hi)
            mask = positions[:, None] >= torch.arange(hi)[None, :]
            return attend(q, keys, values, mask)

        return draft

    # ---- propose -------------------------------------------------------------------------

    def propose(self, request: Request, k: int) -> tuple[list[int], int]:
        """``k`` drafts for positions ``c + 1 ..``, and how many provisional draft positions
        the last module wrote (what a full rejection makes it re-prefill: ``k - 1``)."""
        st = self._states[request.request_id]
        c, tokens = request.num_computed_tokens, list(request.all_token_ids)
        provisional: dict[int, tuple[int, torch.Tensor]] = {}
        last = st.hidden[0][c - 1]
        for m in range(1, min(k, self.drafts.num_modules) + 1):
            lo = st.frontier[m]
            if lo < c:
                out = self._run(request, m, lo, self._inputs(st, provisional, m, lo, c),
                                tokens[lo + m : c + m])
                provisional[m] = (lo, out)
                last = out[-1]
            else:
                last = st.hidden[m][c - 1]
            tokens.append(self.drafts.predict(last[None])[0])
        modules = min(k, self.drafts.num_modules)
        written = c - st.frontier[modules]
        for j in range(modules + 1, k + 1):  # the last module continues on its own output
            p = c - 1 + j - modules
            last = self._run(request, modules, p, last[None], [tokens[p + modules]])[0]
            tokens.append(self.drafts.predict(last[None])[0])
            written += 1
        return tokens[c + 1 :], written

    def _inputs(self, st: DraftState, provisional: dict[int, tuple[int, torch.Tensor]],
                m: int, lo: int, hi: int) -> torch.Tensor:
        """``h[m - 1]`` over ``[lo, hi)``: final rows below its frontier, provisional above."""
        if m == 1:
            return st.hidden[0][lo:hi]
        final_hi = st.frontier[m - 1]
        rows = [st.hidden[m - 1][lo:final_hi]]
        if m - 1 in provisional:
            plo, out = provisional[m - 1]
            rows.append(out[max(0, final_hi - plo) :])
        return torch.cat(rows)[: hi - lo]

    # ---- verify --------------------------------------------------------------------------

    def decode_step(self, request: Request, verify: Callable[[list[int]], torch.Tensor]) -> None:
        """One speculative step; ``verify(tokens)`` runs the target from the horizon and
        returns the final hidden states of those tokens."""
        k = min(self.spec.num_speculative_tokens,
                request.max_tokens - len(request.output_token_ids) - 1)
        drafts, written = self.propose(request, k) if k else ([], 0)
        if self.spec.force_rejections:
            drafts = [(d + 1) % self.model.config.vocab_size for d in drafts]
        c = request.num_computed_tokens
        hidden = verify([request.all_token_ids[-1], *drafts])
        logits = self.model.logits(hidden)
        greedy = [int(t) for t in torch.argmax(logits, dim=-1)]
        accepted = next((j for j, d in enumerate(drafts) if d != greedy[j]), len(drafts))
        request.output_token_ids.extend(greedy[: accepted + 1])
        request.output_logits.extend(logits[: accepted + 1])
        request.num_drafted_tokens += len(drafts)
        request.num_accepted_tokens += accepted
        if accepted < len(drafts):
            request.num_reprefilled_tokens += written
        request.num_computed_tokens = c + accepted + 1
        self.target_computed(request, c, hidden[: accepted + 1])
