"""Synthetic multi-round conversation traces, in Mooncake's format.

For users without traces of their own (``kvtier replay --synthetic users=200,turns=6``).
Users arrive at random (Poisson, ``arrival_rate_per_s``); each holds one conversation of
about ``turns`` rounds over one of ``system_prompts`` shared system prompts. A round's
prompt is the system prompt, every earlier user message and answer, and the new message;
the next round arrives after the answer is generated (``decode_tokens_per_s``) and the
user thinks (``think_time_s``, exponential). Lengths are drawn around their means.

Block ids follow the trace's rule (an id names a block and its whole prefix): blocks
inside a system prompt get that prompt's ids, so every conversation shares them; blocks of
a conversation's history keep their ids from round to round; the partial last block of a
prompt gets an id of its own, which the next round (whose block there holds more tokens)
does not repeat.

>>> reqs = generate(SynthConfig(users=3, turns=2, system_prompts=1, seed=1))
>>> len({r.hash_ids[0] for r in reqs})  # one shared system prompt
1
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from kvtier.replay.options import Options
from kvtier.replay.trace import BLOCK_TOKENS, MAX_TIMESTAMP_MS, TraceRequest, TraceSource

_RATES = ("arrival_rate_per_s", "decode_tokens_per_s")
MAX_BLOCKS = 2_000_000
"""The most hash ids a synthetic trace may hold (``expected_blocks``): about 10 s to
generate, 200 times the default trace."""


@dataclass(frozen=True)
class SynthConfig(Options):
    """Parameters of the synthetic workload (means where lengths are random)."""

    where: ClassVar[str] = "synthetic"

    users: int = 200
    """Conversations, one per user."""
    turns: int = 5
    """Mean rounds per conversation (uniform in 1 .. 2 * turns - 1)."""
    system_prompts: int = 4
    """Distinct shared system prompts."""
    system_tokens: int = 2048
    """Tokens of each system prompt."""
    user_tokens: int = 400
    """Mean tokens of a user message."""
    output_tokens: int = 300
    """Mean tokens of an answer."""
    think_time_s: float = 30.0
    """Mean time a user takes between an answer and the next message."""
    arrival_rate_per_s: float = 0.5
    """New users per second."""
    decode_tokens_per_s: float = 50.0
    """How fast answers are generated (spaces a user's rounds)."""
    seed: int = 0
    """Random seed: the same config gives the same trace."""

    @staticmethod
    def allowed(name: str, value: Any) -> tuple[bool, str]:
        """Rates are finite and positive, the think time finite and not negative, the seed an
        integer >= 0, every count an integer >= 1."""
        is_int = isinstance(value, int)
        number = is_int or (isinstance(value, float) and math.isfinite(value))
        if name in _RATES:
            return number and value > 0, "a finite number > 0"
        if name == "think_time_s":
            return number and value >= 0, "a finite number >= 0"
        if name == "seed":
            return is_int and value >= 0, "an integer >= 0"
        return is_int and value >= 1, "an integer >= 1"


class _Ids:
    """Dense block ids, one per distinct block identity, numbered in order of first use.
    A conversation's own blocks are remembered only while it is drawn
    (``new_conversation``): only the shared system prompts' are kept for the whole trace.

    A prompt's blocks, in order, are: its system prompt's whole blocks, then its own whole
    blocks (the history's, then the new message's), then its partial last block, if any.
    Every prompt holds its whole system prompt and more, and each round's prompt is longer
    than the last; so the ids are kept as lists by block index, and a prompt's ids are
    those lists' first entries (new ones drawn in block order) and its partial block's.
    """

    def __init__(self) -> None:
        self._system: dict[int, list[int]] = {}  # a system prompt's whole blocks' ids
        self._own: list[int] = []  # this conversation's whole blocks' ids, after the system's
        self._partial: dict[tuple[int, int], int] = {}  # (block, prompt tokens) -> id
        self._next = 0

    def new_conversation(self) -> None:
        self._own, self._partial = [], {}

    def prompt(self, system: int, system_tokens: int, prompt: int, block_tokens: int
               ) -> tuple[int, ...]:
        """The ids of a prompt of ``prompt`` tokens over system prompt ``system``."""
        whole = prompt // block_tokens
        shared = min(system_tokens // block_tokens, whole)
        out = self._draw(self._system.setdefault(system, []), shared)
        out += self._draw(self._own, whole - shared)
        if prompt % block_tokens:
            found = self._partial.get((whole, prompt))
            if found is None:
                found = self._partial[(whole, prompt)] = self._next
                self._next += 1
            out.append(found)
        return tuple(out)

    def _draw(self, ids: list[int], n: int) -> list[int]:
        """The first ``n`` of ``ids``, those missing drawn now, numbered next in order."""
        missing = n - len(ids)
        if missing > 0:
            ids.extend(range(self._next, self._next + missing))
            self._next += missing
        return ids[:n]


def expected_blocks(config: SynthConfig, block_tokens: int = BLOCK_TOKENS) -> int:
    """About how many hash ids the trace holds: users x turns x blocks of a mean prompt
    (the system prompt and ``turns`` rounds of message and answer); the cost of ``generate``.

    >>> expected_blocks(SynthConfig(users=200, turns=5))  # 200 x 5 x ceil(5548 / 512)
    11000
    """
    prompt = config.system_tokens + config.turns * (config.user_tokens + config.output_tokens)
    return config.users * config.turns * -(-prompt // block_tokens)


def generate(config: SynthConfig, block_tokens: int = BLOCK_TOKENS) -> list[TraceRequest]:
    """The synthetic trace, in arrival order, held in a list (``iter_generate``)."""
    return list(iter_generate(config, block_tokens))


def iter_generate(config: SynthConfig, block_tokens: int = BLOCK_TOKENS
                  ) -> Iterator[TraceRequest]:
    """The synthetic trace, in arrival order, one request at a time: it holds only the
    conversations under way. ValueError, before the first request, if the trace would hold
    more than ``MAX_BLOCKS`` hash ids; when a request is reached that would arrive later
    than ``MAX_TIMESTAMP_MS``.

    Users are drawn in order (the same draws as one list sorted by arrival), and a request
    is released once no later user can arrive before it: users arrive in order, and each
    user's rounds come after its arrival. Ties keep user, then round, order.
    """
    blocks = expected_blocks(config, block_tokens)
    if blocks > MAX_BLOCKS:
        raise ValueError(f"synthetic: users x turns x prompt blocks is about {blocks:.3g} "
                         f"hash ids; at most {MAX_BLOCKS:,}: lower users, turns or the token "
                         "counts")
    rng = random.Random(config.seed)
    ids = _Ids()
    pending: list[tuple[float, int, int, TraceRequest]] = []  # (arrival, user, round, req)
    start, user, latest = 0.0, 0, float("-inf")  # latest: the last drawn user's arrival
    while pending or user < config.users:
        while user < config.users and (not pending or latest < pending[0][0]):
            start += rng.expovariate(config.arrival_rate_per_s)
            rounds = _conversation(config, rng, ids, user, start, block_tokens)
            for n, r in enumerate(rounds):
                heapq.heappush(pending, (r.timestamp_ms, user, n, r))
            latest, user = rounds[0].timestamp_ms, user + 1
        req = heapq.heappop(pending)[3]
        if req.timestamp_ms > MAX_TIMESTAMP_MS:
            raise ValueError("synthetic: the last request would arrive after "
                             f"{MAX_TIMESTAMP_MS} ms; raise arrival_rate_per_s or "
                             "decode_tokens_per_s, or lower think_time_s")
        yield req


def synthetic_source(config: SynthConfig, block_tokens: int = BLOCK_TOKENS,
                     limit: int | None = None) -> TraceSource:
    """The synthetic trace (its first ``limit`` requests), generated again for each pass
    (a partial: it pickles, for worker processes)."""
    return functools.partial(_first, config, block_tokens, limit)


def _first(config: SynthConfig, block_tokens: int, limit: int | None) -> Iterator[TraceRequest]:
    return itertools.islice(iter_generate(config, block_tokens), limit)


def _length(rng: random.Random, mean: int) -> int:
    return max(1, round(rng.lognormvariate(0.0, 0.5) * mean / 1.133))  # E[lognormal] = 1.133


def _conversation(
    config: SynthConfig, rng: random.Random, ids: _Ids, user: int, start_s: float,
    block_tokens: int,
) -> list[TraceRequest]:
    ids.new_conversation()
    system = rng.randrange(config.system_prompts)
    history = config.system_tokens
    now = start_s
    out = []
    for _ in range(rng.randint(1, 2 * config.turns - 1)):
        prompt = history + _length(rng, config.user_tokens)
        output = _length(rng, config.output_tokens)
        block_ids = ids.prompt(system, config.system_tokens, prompt, block_tokens)
        out.append(TraceRequest(round(now * 1000.0, 3), prompt, output, block_ids))
        history = prompt + output
        think = rng.expovariate(1.0 / config.think_time_s) if config.think_time_s else 0.0
        now += output / config.decode_tokens_per_s + think
    return out


