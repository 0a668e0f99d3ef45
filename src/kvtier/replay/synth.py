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
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from kvtier.replay.conversations import BlockIds, conversations
from kvtier.replay.options import Options
from kvtier.replay.trace import BLOCK_TOKENS, TraceRequest, TraceSource

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
    conversations under way (``kvtier.replay.conversations``, which draws them). ValueError
    at once if the trace would hold more than ``MAX_BLOCKS`` hash ids; when a request is
    reached that would arrive later than ``trace.MAX_TIMESTAMP_MS``."""
    blocks = expected_blocks(config, block_tokens)
    if blocks > MAX_BLOCKS:
        raise ValueError(f"synthetic: users x turns x prompt blocks is about {blocks:.3g} "
                         f"hash ids; at most {MAX_BLOCKS:,}: lower users, turns or the token "
                         "counts")
    return conversations(config, block_tokens, BlockIds())


def synthetic_source(config: SynthConfig, block_tokens: int = BLOCK_TOKENS,
                     limit: int | None = None) -> TraceSource:
    """The synthetic trace (its first ``limit`` requests), generated again for each pass
    (a partial: it pickles, for worker processes)."""
    return functools.partial(_first, config, block_tokens, limit)


def _first(config: SynthConfig, block_tokens: int, limit: int | None) -> Iterator[TraceRequest]:
    return itertools.islice(iter_generate(config, block_tokens), limit)
