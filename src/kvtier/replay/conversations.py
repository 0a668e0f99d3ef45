"""Drawing a synthetic trace's conversations (``kvtier.replay.synth``): users, their rounds
and each prompt's block ids, in arrival order.

A module of its own so that the serving build compiles it (setup.py's ``COMPILED``): a
trace is drawn twice per run (the pass that counts it, then the replay's), a request at
a time. ``SynthConfig``, whose fields come from users, stays in ``synth``, interpreted.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from typing import Protocol

from kvtier.replay.trace import MAX_TIMESTAMP_MS, TraceRequest


class Config(Protocol):
    """What drawing reads of a ``synth.SynthConfig`` (whose docstrings say what each is)."""

    @property
    def users(self) -> int: ...
    @property
    def turns(self) -> int: ...
    @property
    def system_prompts(self) -> int: ...
    @property
    def system_tokens(self) -> int: ...
    @property
    def user_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def think_time_s(self) -> float: ...
    @property
    def arrival_rate_per_s(self) -> float: ...
    @property
    def decode_tokens_per_s(self) -> float: ...
    @property
    def seed(self) -> int: ...


class PromptIds(Protocol):
    """How a prompt's block ids are given (``BlockIds``; tests give them by definition)."""

    def new_conversation(self) -> None: ...

    def prompt(self, system: int, system_tokens: int, prompt: int, block_tokens: int
               ) -> tuple[int, ...]: ...


class BlockIds:
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


def conversations(config: Config, block_tokens: int, ids: PromptIds
                  ) -> Iterator[TraceRequest]:
    """The trace of ``config``, in arrival order, one request at a time (``synth``'s
    ``iter_generate``, which checks its size first): only the conversations under way are
    held. ValueError when a request is reached that would arrive after
    ``MAX_TIMESTAMP_MS``.

    Users are drawn in order (the same draws as one list sorted by arrival), and a request
    is released once no later user can arrive before it: users arrive in order, and each
    user's rounds come after its arrival. Ties keep user, then round, order.
    """
    rng = random.Random(config.seed)
    users, rate = config.users, config.arrival_rate_per_s
    pending: list[tuple[float, int, int, TraceRequest]] = []  # (arrival, user, round, req)
    start, user, latest = 0.0, 0, float("-inf")  # latest: the last drawn user's arrival
    while pending or user < users:
        while user < users and (not pending or latest < pending[0][0]):
            start += _exponential(rng, rate)
            rounds = _conversation(config, rng, ids, start, block_tokens)
            for n, r in enumerate(rounds):
                heapq.heappush(pending, (r.timestamp_ms, user, n, r))
            latest, user = rounds[0].timestamp_ms, user + 1
        req = heapq.heappop(pending)[3]
        if req.timestamp_ms > MAX_TIMESTAMP_MS:
            raise ValueError("synthetic: the last request would arrive after "
                             f"{MAX_TIMESTAMP_MS} ms; raise arrival_rate_per_s or "
                             "decode_tokens_per_s, or lower think_time_s")
        yield req


NV_MAGICCONST = 4 * math.exp(-0.5) / math.sqrt(2.0)
"""The ratio-of-uniforms bound of Kinderman and Monahan's normal deviates."""


def _length(rng: random.Random, mean: int) -> int:
    return max(1, round(_lognormal(rng, 0.5) * mean / 1.133))  # E[lognormal] = 1.133


def _lognormal(rng: random.Random, sigma: float) -> float:
    """``rng.lognormvariate(0.0, sigma)``, the same draws and the same value: a normal
    deviate by Kinderman and Monahan's ratio of uniforms (ACM TOMS 3, 1977), as
    ``random.Random.normalvariate`` makes it, exponentiated. Written out so that the
    serving build compiles it; ``tests/replay/test_synth_ids.py`` compares the two."""
    uniform = rng.random
    while True:
        u1 = uniform()
        u2 = 1.0 - uniform()
        z = NV_MAGICCONST * (u1 - 0.5) / u2
        if z * z / 4.0 <= -math.log(u2):
            return math.exp(0.0 + z * sigma)


def _exponential(rng: random.Random, rate: float) -> float:
    """``rng.expovariate(rate)``, the same draw and the same value (compiled, as above)."""
    return -math.log(1.0 - rng.random()) / rate


def _conversation(config: Config, rng: random.Random, ids: PromptIds, start_s: float,
                  block_tokens: int) -> list[TraceRequest]:
    """One user's rounds, from its arrival at ``start_s``."""
    ids.new_conversation()
    system = rng.randrange(config.system_prompts)
    system_tokens, history, now = config.system_tokens, config.system_tokens, start_s
    think_s, speed = config.think_time_s, config.decode_tokens_per_s
    out = []
    for _ in range(rng.randint(1, 2 * config.turns - 1)):
        prompt = history + _length(rng, config.user_tokens)
        output = _length(rng, config.output_tokens)
        block_ids = ids.prompt(system, system_tokens, prompt, block_tokens)
        out.append(TraceRequest(round(now * 1000.0, 3), prompt, output, block_ids))
        history = prompt + output
        think = _exponential(rng, 1.0 / think_s) if think_s else 0.0
        now += output / speed + think
    return out
