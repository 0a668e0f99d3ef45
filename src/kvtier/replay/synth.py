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

import random
from collections.abc import Hashable
from dataclasses import dataclass, fields

from kvtier.replay.options import parse_options
from kvtier.replay.trace import BLOCK_TOKENS, TraceRequest

_RATES = ("arrival_rate_per_s", "decode_tokens_per_s")


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of the synthetic workload (means where lengths are random)."""

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

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            is_int = isinstance(value, int) and not isinstance(value, bool)
            if f.name in _RATES:
                ok, want = isinstance(value, (int, float)) and value > 0, "a number > 0"
            elif f.name == "think_time_s":
                ok, want = isinstance(value, (int, float)) and value >= 0, "a number >= 0"
            elif f.name == "seed":
                ok, want = is_int and value >= 0, "an integer >= 0"
            else:
                ok, want = is_int and value >= 1, "an integer >= 1"
            if isinstance(value, bool) or not ok:
                raise ValueError(f"synthetic: {f.name} must be {want}, got {value!r}")

    @classmethod
    def parse(cls, text: str) -> SynthConfig:
        """``"users=100,turns=8"``; unknown keys are rejected with the known ones."""
        return parse_options(cls, text, "synthetic")


class _Ids:
    """Dense block ids, one per distinct block identity."""

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}

    def __call__(self, identity: Hashable) -> int:
        return self._ids.setdefault(identity, len(self._ids))


def generate(config: SynthConfig, block_tokens: int = BLOCK_TOKENS) -> list[TraceRequest]:
    """The synthetic trace, in arrival order."""
    rng = random.Random(config.seed)
    ids = _Ids()
    out: list[TraceRequest] = []
    start = 0.0
    for user in range(config.users):
        start += rng.expovariate(config.arrival_rate_per_s)
        out += _conversation(config, rng, ids, user, start, block_tokens)
    out.sort(key=lambda r: r.timestamp_ms)
    return out


def _length(rng: random.Random, mean: int) -> int:
    return max(1, round(rng.lognormvariate(0.0, 0.5) * mean / 1.133))  # E[lognormal] = 1.133


def _conversation(
    config: SynthConfig, rng: random.Random, ids: _Ids, user: int, start_s: float,
    block_tokens: int,
) -> list[TraceRequest]:
    system = rng.randrange(config.system_prompts)
    history = config.system_tokens
    now = start_s
    out = []
    for _ in range(rng.randint(1, 2 * config.turns - 1)):
        prompt = history + _length(rng, config.user_tokens)
        output = _length(rng, config.output_tokens)
        block_ids = _block_ids(ids, system, user, config.system_tokens, prompt, block_tokens)
        out.append(TraceRequest(round(now * 1000.0, 3), prompt, output, block_ids))
        history = prompt + output
        think = rng.expovariate(1.0 / config.think_time_s) if config.think_time_s else 0.0
        now += output / config.decode_tokens_per_s + think
    return out


def _block_ids(
    ids: _Ids, system: int, user: int, system_tokens: int, prompt: int, block_tokens: int
) -> tuple[int, ...]:
    out = []
    for j in range(-(-prompt // block_tokens)):
        end = (j + 1) * block_tokens
        if end > prompt:
            out.append(ids(("partial", user, j, prompt)))
        elif end <= system_tokens:
            out.append(ids(("system", system, j)))
        else:
            out.append(ids(("user", user, j)))
    return tuple(out)
