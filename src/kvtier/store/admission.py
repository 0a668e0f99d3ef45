"""Admission: store a chunk only once it has been offered ``after`` times within a window.

Most chunks an engine offers are never asked for again; storing them evicts chunks that
would have hit, and costs a write each. Admission keeps them out: a ``ChunkStore`` built
with ``Admission(after=N)`` reserves a slot for an absent key only at its N-th offer among
the last ``window`` offers (an offer: a key ``prepare_store`` was asked to store and did not
hold). The other offers are *declined*: a clean "not stored" (``StoreHandle.declined``),
exactly as if the store had no room; a lookup later finds the chunk absent. ``after=1``
admits every offer and keeps no filter: the store behaves exactly as without admission.

Only new chunks from the engine are filtered: a chunk promoted from a lower tier was
admitted when it was first stored (``ChunkStore.prepare_store(..., promote=True)``).

Memory is fixed by ``window``, whatever the length of the traffic: ``OfferWindow`` keeps
the fingerprints of the last ``window`` offers in a ring (8 bytes each) and a count per
distinct fingerprint among them (a dict entry), about 100 to 150 bytes per remembered
offer in all; both grow as offers come, up to the window, and never beyond (nothing is
allocated up front). The window defaults to ``WINDOW_PER_SLOT`` offers per slot of the
store: on the Mooncake conversation trace, 4 to 8 times the capacity gives the best hit
rates (a shorter window forgets a chunk before its second offer; docs/replay.md,
"Admission").

A fingerprint is 8 bytes of the key's digest mixed with its group tag: stable across processes
(no ``hash()``, so no ``PYTHONHASHSEED``), and two keys share one with probability 2^-64.

Worked example: admit at the second offer, remembering the last 3 offers.

>>> from kvtier.keys import ChunkKey
>>> a, b, c, d = (ChunkKey(bytes([i]) * 40) for i in range(4))
>>> w = Admission(after=2, window=3).filter(num_slots=100)
>>> [len(x) for x in w.split([a, b])]          # first offers: both declined
[0, 2]
>>> w.record([a, b]); w.split([a, c])[0] == [a]    # a's second offer is admitted
True
>>> w.record([c, d])                               # the window holds b, c, d: a is forgotten
>>> w.split([a])[0], w.split([b])[0] == [b]
([], True)
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.keys import ChunkKey

MAX_ADMIT_AFTER = 64
"""The most offers admission may ask for (a chunk offered more often is plainly hot)."""
WINDOW_PER_SLOT = 4
"""Default window: offers remembered per slot of the store (module docstring)."""
_MIX = 0x9E3779B97F4A7C15  # odd: spreads the tag over the 64 bits before it meets the digest
_MASK = (1 << 64) - 1
_HALVES = struct.Struct("<QQ")  # a key's group tag and the first 8 bytes of its digest
MAX_WINDOW = 1 << 30
"""The largest window (about 150 GiB of fingerprints at worst: a bound on typos)."""


def _check_int(where: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{where}: must be an integer in {low}..{high}, got {value!r}")


@dataclass(frozen=True)
class Admission:
    """When a store admits a new chunk: at its ``after``-th offer within ``window`` offers.

    >>> Admission(after=0)
    Traceback (most recent call last):
    ...
    ValueError: admit_after: must be an integer in 1..64, got 0
    """

    after: int = 1
    """Offers a chunk needs, this one included, before it is stored; 1 stores every offer."""
    window: int | None = None
    """Offers remembered (the last ones); None: ``WINDOW_PER_SLOT`` per slot of the store."""

    def __post_init__(self) -> None:
        _check_int("admit_after", self.after, 1, MAX_ADMIT_AFTER)
        if self.window is not None:
            _check_int("admit_window", self.window, 1, MAX_WINDOW)

    def filter(self, num_slots: int) -> OfferWindow | None:
        """The filter for a store of ``num_slots`` slots; None when every offer is admitted."""
        if self.after == 1:
            return None
        window = self.window or min(MAX_WINDOW, WINDOW_PER_SLOT * num_slots)
        return OfferWindow(self.after, window)


def fingerprint(key: ChunkKey) -> int:
    """8 stable bytes of ``key`` (module docstring).

    >>> fingerprint(ChunkKey(bytes(8) + bytes([1]) + bytes(31)))   # tag 0, digest 1
    1
    """
    tag, digest = _HALVES.unpack_from(key)
    return (tag * _MIX ^ digest) & _MASK


def fingerprints(keys: Sequence[ChunkKey]) -> list[int]:
    """``fingerprint`` of each key, in one pass (a store offers a request's keys at once)."""
    return [(tag * _MIX ^ digest) & _MASK for tag, digest in map(_HALVES.unpack_from, keys)]


class OfferWindow:
    """Counts of each key's offers among the last ``window`` offers (module docstring).

    ``split`` asks, changing nothing, which keys an offer now would admit; ``record``
    counts the offers (the store records them once it has reserved the admitted keys'
    slots, so an offer the store refused for room is not counted twice when retried).
    """

    __slots__ = ("_counts", "_pos", "_ring", "after", "window")

    def __init__(self, after: int, window: int) -> None:
        _check_int("admit_after", after, 2, MAX_ADMIT_AFTER)
        _check_int("admit_window", window, 1, MAX_WINDOW)
        self.after, self.window = after, window
        self._ring = array("Q")  # fingerprints of the last offers, oldest at _pos once full
        self._pos = 0
        self._counts: dict[int, int] = {}  # fingerprint -> offers of it in the ring

    def split(
        self, keys: Sequence[ChunkKey], fps: Sequence[int] | None = None
    ) -> tuple[list[ChunkKey], list[ChunkKey]]:
        """``(admitted, declined)``, each in order, changing nothing: the (distinct) keys
        whose offer, were ``keys`` offered one after another now, would find at least
        ``after - 1`` offers of the same key among the last ``window`` offers before it.
        ``fps``: their ``fingerprints``, when the caller has them already."""
        counts, need, ring, window = self._counts, self.after - 1, self._ring, self.window
        pos = self._pos
        fps = fingerprints(keys) if fps is None else fps
        fast = self._split_fast(keys, fps)
        if fast is not None:
            return fast
        gone: dict[int, int] = {}  # offers that leave the window before the current key
        # before key i, the oldest max(0, min(len(ring), len(ring) + i - window)) offers have
        # left: that grows by at most one per key
        dropped, late, full = 0, len(ring) - window, len(ring)
        admitted: list[ChunkKey] = []
        declined: list[ChunkKey] = []
        for k, fp in zip(keys, fps, strict=True):
            if late > dropped and dropped < full:
                old = ring[(pos + dropped) % window]
                gone[old] = gone.get(old, 0) + 1
                dropped += 1
            late += 1
            seen = counts.get(fp, 0) - gone.get(fp, 0) if gone else counts.get(fp, 0)
            (admitted if seen >= need else declined).append(k)
        return admitted, declined

    def _split_fast(self, keys: Sequence[ChunkKey], fps: Sequence[int]
                    ) -> tuple[list[ChunkKey], list[ChunkKey]] | None:
        """``split`` when no offer that leaves the window before a key is of a key offered
        now (the usual case): each key's count is then its count now. None otherwise."""
        counts, need, ring, window = self._counts, self.after - 1, self._ring, self.window
        n, full = len(fps), len(ring)
        # before key i, the oldest min(full, max(0, full - window + i)) offers have left
        leaving = min(full, max(0, full - window + n - 1))
        if leaving > window - self._pos:  # wraps around the ring's end
            olds = set(ring[self._pos:]) | set(ring[: leaving - (window - self._pos)])
        else:
            olds = set(ring[self._pos : self._pos + leaving])
        if leaving and not olds.isdisjoint(fps):
            return None
        get = counts.get
        admitted = [k for k, fp in zip(keys, fps, strict=True) if get(fp, 0) >= need]
        if len(admitted) == n:
            return admitted, []
        declined = [k for k, fp in zip(keys, fps, strict=True) if get(fp, 0) < need]
        return admitted, declined

    def record(self, keys: Sequence[ChunkKey], fps: Sequence[int] | None = None) -> None:
        """Count one offer of each key, forgetting the oldest offers past the window
        (``fps``: as ``split``'s)."""
        counts, ring, window = self._counts, self._ring, self.window
        fps = fingerprints(keys) if fps is None else fps
        pos, n = self._pos, len(fps)
        if len(ring) == window and pos + n <= window:  # full, and no wrap: one slice
            olds = ring[pos : pos + n]
            ring[pos : pos + n] = array("Q", fps)
            self._pos = (pos + n) % window
            get = counts.get
            for fp in fps:
                counts[fp] = get(fp, 0) + 1
            for old in olds:
                left = counts[old] - 1
                if left:
                    counts[old] = left
                else:
                    del counts[old]
            return
        for fp in fps:
            counts[fp] = counts.get(fp, 0) + 1
            if len(ring) < window:
                ring.append(fp)
                continue
            old, ring[self._pos] = ring[self._pos], fp
            self._pos = (self._pos + 1) % window
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]

    def __len__(self) -> int:
        """Offers remembered: at most ``window``."""
        return len(self._ring)

    def num_distinct(self) -> int:
        """Distinct fingerprints among the remembered offers."""
        return len(self._counts)

    def check_invariants(self) -> None:
        if len(self._ring) > self.window or sum(self._counts.values()) != len(self._ring):
            raise AssertionError("OfferWindow: counts disagree with the remembered offers")
