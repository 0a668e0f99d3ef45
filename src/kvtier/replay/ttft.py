"""The arithmetic of the replay's time-to-first-token model, whose parameters are
``kvtier.replay.timing.TimingModel``'s (``TimingModel.arithmetic()`` builds one of these).

Apart from the parameters so that the serving build compiles it: the replay asks it twice
per request, and a call into an interpreted method costs more than the arithmetic
(``tests/replay/test_replay.py`` checks both give the same numbers).
"""

from __future__ import annotations

from collections.abc import Mapping


class TtftArithmetic:
    """``prefill_s``, ``load_s`` and ``ttft_s`` of ``TimingModel`` (docs there).

    ``tiers``: per tier, its bandwidth (GB/s) and the fixed latency of a load from it (ms);
    ``other``: the same for any other tier.
    """

    def __init__(self, prefill_tokens_per_s: float, first_token_ms: float,
                 tiers: dict[str, tuple[float, float]], other: tuple[float, float]) -> None:
        self.prefill_tokens_per_s, self.first_token_ms = prefill_tokens_per_s, first_token_ms
        self.tiers, self.other = tiers, other

    def prefill_s(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s

    def load_s(self, bytes_by_tier: Mapping[str, int]) -> float:
        total = 0.0
        for tier, nbytes in bytes_by_tier.items():
            if nbytes:
                gb_per_s, latency_ms = self.tiers.get(tier, self.other)
                total += nbytes / (gb_per_s * 1e9) + latency_ms / 1000
        return total

    def ttft_s(self, prompt: int, hit: int, bytes_by_tier: Mapping[str, int]) -> float:
        return self.load_s(bytes_by_tier) + self.prefill_s(prompt - hit) + (
            self.first_token_ms / 1000)
