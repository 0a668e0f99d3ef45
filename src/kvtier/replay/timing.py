"""The time model behind the replay's time-to-first-token estimate.

A deliberately simple, documented model (docs/replay.md), every parameter settable with
``--timing key=value,...``:

* prefill computes ``prefill_tokens_per_s`` prompt tokens per second (linear: attention's
  quadratic term is folded into the rate, so set the rate for your typical prompt length);
* a hit's chunks are read at ``host_gb_per_s`` from host memory and ``disk_gb_per_s`` from
  disk, each read costing ``load_latency_ms`` once per request and tier it touches, and at
  ``shared_gb_per_s`` from a fleet's shared tier over the network, costing
  ``shared_latency_ms`` instead; loads happen before the remaining prefill (no layer-wise
  overlap: a conservative estimate);
* a request's first token then takes ``first_token_ms`` (one decode step), and every
  further token ``1000 / decode_tokens_per_s`` ms (used by ``--concurrent`` only, where
  the engine prefills up to ``prefill_slots`` requests at once).

Time to first token of a request without the cache is ``prefill(L) + first_token``; with a
hit of ``h`` tokens it is ``load(bytes) + prefill(L - h) + first_token``. The saving is the
difference.

>>> m = TimingModel(prefill_tokens_per_s=10_000, host_gb_per_s=20, load_latency_ms=0)
>>> round(m.prefill_s(20_000), 3), round(m.load_s({"host": 2 * 10**9}), 3)
(2.0, 0.1)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from kvtier.replay.options import Options
from kvtier.replay.ttft import TtftArithmetic

MAX_VALUE = 1e12
"""The largest value of any timing parameter."""
MIN_RATE = 1e-6
"""The smallest rate: with every value bounded so, every modelled time is a finite number."""
_RATES = ("prefill_tokens_per_s", "host_gb_per_s", "disk_gb_per_s", "shared_gb_per_s",
          "decode_tokens_per_s")


@dataclass(frozen=True)
class TimingModel(Options):
    """Parameters of the TTFT model (module docstring)."""

    where: ClassVar[str] = "timing"

    prefill_tokens_per_s: float = 10_000.0
    """Prompt tokens one engine prefills per second."""
    host_gb_per_s: float = 25.0
    """Host memory to accelerator bandwidth, GB/s (10**9 bytes)."""
    disk_gb_per_s: float = 5.0
    """Disk to accelerator bandwidth, GB/s."""
    load_latency_ms: float = 0.2
    """Fixed cost of a load from one tier, per request, milliseconds."""
    shared_gb_per_s: float = 12.5
    """A fleet's shared tier to accelerator bandwidth over the network, GB/s (100 Gbit/s)."""
    shared_latency_ms: float = 1.0
    """Fixed cost of a load from the shared tier, per request, milliseconds (a round trip)."""
    first_token_ms: float = 20.0
    """One decode step: the first token after prefill, milliseconds."""
    decode_tokens_per_s: float = 50.0
    """Tokens per second one request decodes after its first (``--concurrent``)."""
    prefill_slots: int = 1
    """Requests the engine prefills at once, each at the full rate (``--concurrent``)."""

    @staticmethod
    def allowed(name: str, value: Any) -> tuple[bool, str]:
        """``prefill_slots`` an integer in ``[1, MAX_VALUE]``, rates numbers in ``[MIN_RATE,
        MAX_VALUE]``, every other value a number in ``[0, MAX_VALUE]``."""
        if name == "prefill_slots":
            return isinstance(value, int) and 1 <= value <= MAX_VALUE, "an integer >= 1"
        low, want = (MIN_RATE, "> 0") if name in _RATES else (0, ">= 0")
        ok = isinstance(value, (int, float)) and low <= value <= MAX_VALUE
        return ok, f"{want}, a number in [{low:g}, {MAX_VALUE:g}]"

    def arithmetic(self) -> TtftArithmetic:
        """The model's arithmetic with these parameters (``kvtier.replay.ttft``): what a
        replay asks per request, and what the methods below ask."""
        load = self.load_latency_ms
        return TtftArithmetic(
            self.prefill_tokens_per_s, self.first_token_ms,
            {"host": (self.host_gb_per_s, load), "disk": (self.disk_gb_per_s, load),
             "shared": (self.shared_gb_per_s, self.shared_latency_ms)},
            (self.disk_gb_per_s, load))

    def prefill_s(self, tokens: int) -> float:
        return self.arithmetic().prefill_s(tokens)

    def load_s(self, bytes_by_tier: Mapping[str, int]) -> float:
        """Seconds to read a hit's chunks: bandwidth plus a fixed latency per tier used (a
        tier below the disk other than a fleet's ``shared`` one, Redis with ``--bytes``, is
        timed at disk bandwidth)."""
        return self.arithmetic().load_s(bytes_by_tier)

    def ttft_s(self, prompt: int, hit: int, bytes_by_tier: Mapping[str, int]) -> float:
        """Time to first token of a ``prompt``-token request with a ``hit``-token hit."""
        return self.arithmetic().ttft_s(prompt, hit, bytes_by_tier)

    def decode_s(self, output_tokens: int) -> float:
        """Seconds of decoding after the first token."""
        return max(0, output_tokens - 1) / self.decode_tokens_per_s
