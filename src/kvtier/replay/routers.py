"""Routers: which engine of a fleet serves each request (``kvtier replay --router``).

A router sees the fleet through ``FleetView``: how many engines, each engine's load (prefill
tokens, ``kvtier.replay.fleet``) and how much of a request's prefix an engine holds in any
of its tiers. Registered by name in ``ROUTERS``; ``parse_router("prefix:balance=0.5")``
reads a name and its options, and ``RouterSpec.build`` makes a fresh router per replay:

* ``round_robin``: engine ``i mod N`` for the ``i``-th request;
* ``least_loaded``: the engine with the least load (ties: the lowest index);
* ``prefix`` (KV-aware, as llm-d's and Dynamo's routers): the engine with the lowest cost
  ``(prompt - held) + balance * load``, where ``held`` is the prefix, in tokens, the engine
  holds in any tier (its host, its disk, the shared tier) and both terms are prefill
  tokens, so ``balance`` weighs a token of queued work against a token of prefill the cache
  saves: 0 routes by prefix alone, large values by load alone (ties: less load, then the
  lowest index);
* ``session``: sticky by conversation. A trace names no conversation, so one is derived
  from the block ids (``ConversationKeys``); a conversation's first request goes to the
  least loaded engine, and every later one to the same engine.

>>> parse_router("prefix:balance=0.25").options
PrefixOptions(balance=0.25)
>>> parse_router("nearest")
Traceback (most recent call last):
...
ValueError: --router: unknown router 'nearest'; known: least_loaded, prefix, round_robin, session
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from kvtier.replay.options import Options
from kvtier.replay.refs import RequestRefs
from kvtier.replay.trace import TraceRequest

DEFAULT_BALANCE = 1.0
"""The ``prefix`` router's default ``balance``: a token of load weighs a token of prefill."""


class FleetView(Protocol):
    """What a router may ask of the fleet."""

    @property
    def num_engines(self) -> int: ...

    def load(self, engine: int) -> float:
        """Engine ``engine``'s load, in prefill tokens."""

    def held(self, engine: int, refs: RequestRefs) -> int:
        """Tokens of the request's prefix engine ``engine`` holds, in any tier."""


class Router(ABC):
    """Picks an engine per request; one instance per replay (it may keep state)."""

    @abstractmethod
    def choose(self, req: TraceRequest, refs: RequestRefs, fleet: FleetView) -> int:
        """The engine index, in ``range(fleet.num_engines)``, that serves ``req``."""


def least_loaded(fleet: FleetView) -> int:
    """The engine with the least load, the lowest index on ties."""
    return min(range(fleet.num_engines), key=lambda e: (fleet.load(e), e))


class RoundRobin(Router):
    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: TraceRequest, refs: RequestRefs, fleet: FleetView) -> int:
        e, self._next = self._next % fleet.num_engines, self._next + 1
        return e


class LeastLoaded(Router):
    def choose(self, req: TraceRequest, refs: RequestRefs, fleet: FleetView) -> int:
        return least_loaded(fleet)


@dataclass(frozen=True)
class PrefixOptions(Options):
    """Options of the ``prefix`` router."""

    where: ClassVar[str] = "--router prefix"
    balance: float = DEFAULT_BALANCE
    """Weight of one token of load against one token of prefill saved (module docstring)."""

    @staticmethod
    def allowed(name: str, value: Any) -> tuple[bool, str]:
        return isinstance(value, (int, float)) and 0 <= value <= 1e12, "a number in [0, 1e12]"


class Prefix(Router):
    def __init__(self, options: PrefixOptions) -> None:
        self.balance = options.balance

    def choose(self, req: TraceRequest, refs: RequestRefs, fleet: FleetView) -> int:
        def cost(e: int) -> tuple[float, float, int]:
            load = fleet.load(e)
            return (req.input_length - fleet.held(e, refs) + self.balance * load, load, e)

        return min(range(fleet.num_engines), key=cost)


class ConversationKeys:
    """A conversation key per request, from its block ids alone, online.

    Requests with the same first block share a system prompt; the prefix common to every
    request seen so far with that first block is taken as the system prompt, and the key is
    the first whole block past it (a partial last block's id is never repeated by the next
    round, whose block there holds more tokens). So the rounds of one conversation, whose
    prompts repeat its history, get one key, and two conversations over one system prompt
    get two (a block id names the block and its whole prefix, so one id is the key). A
    request with no whole block past the system prompt gets its last whole block's id, and so
    does the first request over a system prompt, before a second shows where it ends:

    >>> keys = ConversationKeys(512)
    >>> r = lambda *ids: TraceRequest(0.0, 512 * len(ids), 1, ids)
    >>> [keys(r(0, 1, 2)), keys(r(0, 5, 6)), keys(r(0, 1, 2, 3)), keys(r(0, 5, 6, 7))]
    [2, 5, 1, 5]
    """

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._common: dict[int, tuple[int, ...]] = {}

    def __call__(self, req: TraceRequest) -> int:
        whole = req.hash_ids[: req.input_length // self.block_tokens] or req.hash_ids
        common = self._common.get(whole[0], whole)
        n = next((i for i, (a, b) in enumerate(zip(common, whole, strict=False))
                  if a != b),
                 min(len(common), len(whole)))
        self._common[whole[0]] = whole[:n]
        return whole[min(n, len(whole) - 1)]


class Session(Router):
    def __init__(self, block_tokens: int) -> None:
        self.keys = ConversationKeys(block_tokens)
        self._engine: dict[int, int] = {}

    def choose(self, req: TraceRequest, refs: RequestRefs, fleet: FleetView) -> int:
        key = self.keys(req)
        e = self._engine.get(key)
        if e is None:
            e = self._engine[key] = least_loaded(fleet)
        return e


@dataclass(frozen=True)
class RouterSpec:
    """A router's name and options: ``build`` makes a fresh one for each replay."""

    name: str
    options: Options | None = None

    def build(self, block_tokens: int) -> Router:
        return ROUTERS[self.name][1](self.options, block_tokens)

    def __str__(self) -> str:
        if self.options is None:
            return self.name
        return f"{self.name}:" + ",".join(f"{k}={v:g}" for k, v in vars(self.options).items())


Factory = Callable[[Any, int], Router]
ROUTERS: dict[str, tuple[type[Options] | None, Factory]] = {
    "round_robin": (None, lambda _o, _b: RoundRobin()),
    "least_loaded": (None, lambda _o, _b: LeastLoaded()),
    "prefix": (PrefixOptions, lambda o, _b: Prefix(o)),
    "session": (None, lambda _o, b: Session(b)),
}
"""Router name -> (its options class or None, a factory of (options, block tokens))."""


def parse_router(text: str) -> RouterSpec:
    """``NAME`` or ``NAME:key=value,...``; ValueError naming what is wrong."""
    name, _, rest = (s.strip() for s in text.partition(":"))
    if name not in ROUTERS:
        raise ValueError(f"--router: unknown router {name!r}; known: {', '.join(sorted(ROUTERS))}")
    cls = ROUTERS[name][0]
    if cls is None:
        if rest:
            raise ValueError(f"--router {name} takes no options, got {rest!r}")
        return RouterSpec(name)
    return RouterSpec(name, cls.parse(rest))
