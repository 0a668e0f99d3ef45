"""The reference engine: paged KV, an allocator that frees by ``retained_blocks``, hooks.

Each ``step`` admits waiting requests (``lookup``, allocate the hit's retained blocks,
``on_allocated``), then advances every running request by one piece: up to
``max_prefill_tokens`` prompt tokens, or one generated token. After the piece it reports
the horizon (``on_computed``) and returns to the pool every block outside
``kvtier.coverage.retained_blocks(group, horizon)``, behind the ``before_free`` fence.
Recurrent layers keep their state at each block boundary in a block of their own
(``kvtier.engine.states``), so that same rule keeps one state block per request.

Example::

    engine = Engine(EngineConfig(groups=(GroupSpec("sliding_window", window=6),)))
    [done] = engine.generate([[1, 2, 3, 4, 5]], max_tokens=3)
    done.output_token_ids     # three greedy tokens
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from kvtier.coverage import restored_blocks, retained, retained_blocks, whole_prompt_hit
from kvtier.engine.attention import attend, attention_mask
from kvtier.engine.blocks import BlockTable, PagedKVCache
from kvtier.engine.config import EngineConfig
from kvtier.engine.hooks import NullOffloader, Offloader
from kvtier.engine.model import AttentionFn, TinyModel
from kvtier.engine.request import BlockTables, Completion, Request, RequestStatus
from kvtier.engine.speculative import Speculator
from kvtier.engine.states import PagedStates


class Engine:
    """Greedy decoding of many requests over paged, per-group KV caches."""

    def __init__(self, config: EngineConfig, offloader: Offloader | None = None) -> None:
        self.config = config
        self.layout = config.layout()
        self.model = TinyModel(config)
        self._cache = PagedKVCache(config)
        self._offloader: Offloader = offloader if offloader is not None else NullOffloader()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._requests: dict[str, Request] = {}
        self._run_states: PagedStates | None = None  # the recurrent states of the step's run
        self._spec = (None if config.speculative is None else
                      Speculator(config, self.model, self._cache, self.layout, self._hold))
        self._offloader.register_kv_caches(self.kv_caches)

    # ----------------------------------------------------------------------------------
    # Public API

    @property
    def kv_caches(self) -> list[list[torch.Tensor]]:
        """Per group, per layer of the group: ``[num_blocks, 2, tokens_per_block, KVH, D]``
        (a recurrent layer: ``[num_blocks, state_numel]``, one state per block)."""
        return self._cache.kv_caches

    def add_request(
        self, prompt_token_ids: Sequence[int], max_tokens: int, request_id: str | None = None
    ) -> str:
        """Queue a request; it is admitted by a later ``step``. Returns its id."""
        prompt = tuple(prompt_token_ids)
        self._check_new_request(prompt, max_tokens, request_id)
        rid = request_id if request_id is not None else f"req-{len(self._requests)}"
        request = Request(rid, prompt, max_tokens)
        self._requests[rid] = request
        self._waiting.append(request)
        return rid

    def step(self) -> list[Completion]:
        """Admit what fits, advance every running request by one piece; return finished."""
        self._admit()
        finished = []
        for request in list(self._running):
            self._advance(request)
            if len(request.output_token_ids) == request.max_tokens:
                finished.append(self._finish(request))
        return finished

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[Completion]:
        """Run ``prompts`` together to completion; results in the order given."""
        ids = [self.add_request(p, max_tokens) for p in prompts]
        done: dict[str, Completion] = {}
        while self.has_unfinished():
            done.update((c.request_id, c) for c in self.step())
        return [done[i] for i in ids]

    def get_request(self, request_id: str) -> Request:
        """The live request (read-only for callers); finished ones stay readable."""
        if request_id not in self._requests:
            raise KeyError(f"no request {request_id!r}; known: {sorted(self._requests)}")
        return self._requests[request_id]

    def block_tables(self, request_id: str) -> BlockTables:
        """The request's block tables now, group outermost; None where no block is held."""
        return self.get_request(request_id).tables_snapshot()

    def num_free_blocks(self, group_index: int) -> int:
        return self._cache.pools[group_index].num_free

    def reset_device_cache(self) -> None:
        """Clear every block (filled with NaN) and the pools, as if the device were reset.

        Only allowed while no request is waiting or running.
        """
        if self.has_unfinished():
            raise RuntimeError(
                "reset_device_cache: requests are still waiting or running; finish them first"
            )
        self._cache.reset()

    # ----------------------------------------------------------------------------------
    # Admission and loads

    def _check_new_request(
        self, prompt: tuple[int, ...], max_tokens: int, request_id: str | None
    ) -> None:
        if not prompt:
            raise ValueError("add_request: the prompt must have at least one token")
        bad = [t for t in prompt if not (isinstance(t, int) and 0 <= t < self.config.vocab_size)]
        if bad:
            raise ValueError(
                f"add_request: token ids must be ints in [0, {self.config.vocab_size}), "
                f"got {bad[:5]}"
            )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"add_request: max_tokens must be an integer >= 1, got {max_tokens!r}")
        if request_id is not None and request_id in self._requests:
            raise ValueError(f"add_request: request id {request_id!r} is already used")

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.config.max_running:
            request = self._waiting.popleft()
            request.block_tables = [BlockTable() for _ in self.layout.groups]
            hit = self._offloader.lookup(request)
            self._check_hit(request, hit)
            for g, group in enumerate(self.layout.groups):
                for index in restored_blocks(group, hit):
                    request.block_tables[g].assign(index, self._cache.pools[g].allocate())
            if self._spec is not None:
                self._spec.start(request)
            request.num_computed_tokens = request.num_restored_tokens = hit
            request.status = RequestStatus.LOADING if hit else RequestStatus.RUNNING
            self._running.append(request)
            self._offloader.on_allocated(request, hit, request.tables_snapshot())

    def _check_hit(self, request: Request, hit: object) -> None:
        """A hit is a multiple of every group's block size below the prompt's last token, or
        the whole prompt but that token where the layout allows it
        (``coverage.whole_prompt_hit``: the engine computes the last token again)."""
        align, last = self.config.block_alignment, request.num_prompt_tokens - 1
        whole = hit == last and whole_prompt_hit(self.layout, request.num_prompt_tokens)
        if (
            not isinstance(hit, int) or isinstance(hit, bool)
            or not 0 <= hit <= last or (hit % align and not whole)
        ):
            raise ValueError(
                f"offloader.lookup({request.request_id!r}) returned {hit!r}; a hit must be an "
                f"int multiple of {align} (every group's tokens_per_block) in [0, {last}] (the "
                f"last prompt token is computed), or {last} where the layout allows a "
                "whole-prompt hit"
            )

    def _finish_load(self, request: Request) -> None:
        if not self._offloader.wait_loaded(request):
            self._free(request, [t.held() for t in request.block_tables])
            request.num_computed_tokens = request.num_restored_tokens = 0
        elif self._spec is not None:
            self._spec.restored(request, request.num_restored_tokens)
        request.status = RequestStatus.RUNNING

    # ----------------------------------------------------------------------------------
    # Compute

    def _advance(self, request: Request) -> None:
        if request.status is RequestStatus.LOADING:
            self._finish_load(request)
        start = request.num_computed_tokens
        if self._spec is not None and start >= request.num_prompt_tokens:
            self._spec.decode_step(request, lambda tokens: self._target(request, start, tokens))
        else:
            hidden = self._target(request, start, self._next_piece(request))
            logits = self.model.logits(hidden)
            request.num_computed_tokens = start + len(hidden)
            if request.num_computed_tokens >= request.num_prompt_tokens:
                request.output_logits.append(logits[-1])
                request.output_token_ids.append(int(torch.argmax(logits[-1])))
            if self._spec is not None:
                self._spec.target_computed(request, start, hidden)
        if self._run_states is not None:
            self._run_states.commit(request.num_computed_tokens)
            self._run_states = None
        self._offloader.on_computed(
            request, request.num_computed_tokens, request.tables_snapshot()
        )
        self._free_unretained(request)

    def _target(self, request: Request, start: int, tokens: list[int]) -> torch.Tensor:
        """Run the target over ``tokens`` at ``start ..``; their final hidden states."""
        self._allocate(request, start, start + len(tokens))
        positions = torch.arange(start, start + len(tokens))
        self._run_states = PagedStates(self._cache, request, start)
        with torch.no_grad():
            return self.model.hidden(tokens, positions, self._paged_attention(request, start),
                                     self._run_states)

    def _hold(self, request: Request, group: int, start: int, stop: int) -> None:
        """Hold a block of one group for every logical block ``[start, stop)`` touches."""
        tpb = self.layout.groups[group].tokens_per_block
        table = request.block_tables[group]
        for index in range(start // tpb, -(-stop // tpb)):
            if table[index] is None:
                table.assign(index, self._cache.pools[group].allocate())

    def _next_piece(self, request: Request) -> list[int]:
        """Prompt tokens still to prefill (at most ``max_prefill_tokens``), else the last token.

        Example: a 10-token prompt with ``max_prefill_tokens = 4`` runs pieces of 4, 4, 2;
        then one token per step, the token the previous step generated.
        """
        start = request.num_computed_tokens
        if start < request.num_prompt_tokens:
            stop = min(request.num_prompt_tokens, start + self.config.max_prefill_tokens)
            return list(request.prompt_token_ids[start:stop])
        return [request.output_token_ids[-1]]

    def _allocate(self, request: Request, start: int, stop: int) -> None:
        """Hold a block for every logical block that positions ``[start, stop)`` touch."""
        for g in range(len(self.layout.groups)):
            self._hold(request, g, start, stop)

    def _paged_attention(self, request: Request, start: int) -> AttentionFn:
        """Attention that writes new KV through the block tables, then reads back the keys
        from ``retained(group, start).start`` to the last new position."""

        def paged(
            layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            positions: torch.Tensor,
        ) -> torch.Tensor:
            g = self._cache.group_of(layer)
            table = request.block_tables[g]
            self._cache.write(layer, table, start, k, v)
            lo, hi = retained(self.layout.groups[g], start).start, start + len(positions)
            keys, values = self._cache.gather(layer, table, lo, hi)
            mask = attention_mask(self.config.groups[g], positions, torch.arange(lo, hi))
            return attend(q, keys, values, mask)

        return paged

    # ----------------------------------------------------------------------------------
    # Freeing

    def _free_unretained(self, request: Request) -> None:
        """Free every held block outside ``retained_blocks(group, horizon)``."""
        n = request.num_computed_tokens
        drop = []
        for group, table in zip(self.layout.groups, request.block_tables, strict=True):
            keep = retained_blocks(group, n)
            drop.append([i for i in table.held() if i not in keep])
        self._free(request, drop)

    def _free(self, request: Request, logical: list[list[int]]) -> None:
        """Fence, then null these logical blocks, poison them and return them to the pool."""
        tables = request.block_tables
        ids = tuple(t.physical(idx) for t, idx in zip(tables, logical, strict=True))
        if not any(ids):
            return
        self._offloader.before_free(request, ids)
        for g, (table, indices) in enumerate(zip(tables, logical, strict=True)):
            physical = [table.release(i) for i in indices]
            self._cache.poison(g, physical)
            self._cache.pools[g].free(physical)

    def _finish(self, request: Request) -> Completion:
        if self._spec is not None:
            self._spec.finish(request)
        self._offloader.on_finished(request)
        self._free(request, [t.held() for t in request.block_tables])
        request.status = RequestStatus.FINISHED
        self._running.remove(request)
        return Completion(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=tuple(request.output_token_ids),
            logits=torch.stack(request.output_logits),
            num_restored_tokens=request.num_restored_tokens,
            num_drafted_tokens=request.num_drafted_tokens,
            num_accepted_tokens=request.num_accepted_tokens,
            num_reprefilled_tokens=request.num_reprefilled_tokens,
        )
