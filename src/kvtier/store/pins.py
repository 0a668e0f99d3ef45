"""How many live loads hold each pinned chunk: the store manager's pin counts.

A pinned chunk cannot be evicted while the data plane reads its slot. The usual load is
completed before anything asks which chunks are pinned, so the pins of a lone load are not
counted at all: they are counted from the live load handles only when asked (``counts``).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvtier.keys import ChunkKey
from kvtier.store.results import LoadHandle


class PinCounts:
    """Live loads per pinned key, kept beside the manager's live load handles."""

    def __init__(self) -> None:
        # pinned key -> live loads holding it (> 0); None while the one live load's pins
        # are not counted yet
        self._pins: dict[ChunkKey, int] | None = {}

    def pin(self, keys: tuple[ChunkKey, ...], loads: Mapping[int, LoadHandle]) -> None:
        """ready -> pinned (or one pin more) for the load just added to ``loads``."""
        pins = self._pins
        if len(loads) == 1:
            self._pins = None
        elif pins is None:
            self.counts(loads)  # counts every live load, this one too
        else:
            for k in keys:
                pins[k] = pins.get(k, 0) + 1

    def counts(self, loads: Mapping[int, LoadHandle]) -> dict[ChunkKey, int]:
        """Live loads per pinned key, counted from the live load handles if not yet."""
        if self._pins is None:
            counts: dict[ChunkKey, int] = {}  # a plain loop: Counter's counting is interpreted
            if len(loads) == 1:  # the lone load: one pin each, unless it names a key twice
                (h,) = loads.values()
                counts = dict.fromkeys(h.keys, 1)
                if len(counts) == len(h.keys):
                    self._pins = counts
                    return counts
                counts = {}
            for h in loads.values():
                for k in h.keys:
                    counts[k] = counts.get(k, 0) + 1
            self._pins = counts
        return self._pins

    def unpin(self, keys: tuple[ChunkKey, ...], loads: Mapping[int, LoadHandle]) -> None:
        """One pin less per key of a load handle just retired from ``loads``."""
        if not loads:  # it was the only live load: every pin left was its own
            self._pins = {}
            return
        pins = self._pins
        assert pins is not None, "pins go uncounted only while one load is live"
        for k in keys:
            left = pins[k] - 1
            if left:
                pins[k] = left
            else:
                del pins[k]
