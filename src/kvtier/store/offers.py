"""The offer window behind admission (``kvtier.store.admission``): the fingerprints of the
last ``window`` offers in a ring, and a count per distinct fingerprint among them.

A module of its own so that the serving build compiles it (setup.py's ``COMPILED``): a
store runs ``split`` and ``record`` over every key it is offered. ``Admission``, whose
fields come from users, stays interpreted, where a bad value raises its ``ValueError``
(compiled, mypyc would coerce ``True`` to 1 and raise ``TypeError`` for a string).

A fingerprint is 8 bytes of the key's digest mixed with its group tag: stable across
processes (no ``hash()``, so no ``PYTHONHASHSEED``), and two keys share one with
probability 2^-64.

Where the serving build has its C module, a window counts in C (``kvtier._native``'s
``OfferCounts``: the ring and a table of counts, no Python object per offer) and takes
fingerprints as 8 bytes each (``OfferWindow.fingerprints``); the code below is the pure
build's, and the definition both are tested against (``tests/store/test_offer_window.py``).
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from itertools import compress
from operator import not_
from typing import Final, cast

import numpy as np

from kvtier.keys import ChunkKey
from kvtier.store.results import KEY_BYTES

try:
    from kvtier import _native
except ImportError:  # the pure build
    _native = None  # type: ignore[assignment]

Fingerprints = Sequence[int] | bytes
"""A batch's fingerprints as a window takes them (``OfferWindow.fingerprints``): ints, or
8 bytes each to a window that counts in C."""

MAX_ADMIT_AFTER = 64
"""The most offers admission may ask for (a chunk offered more often is plainly hot)."""
MAX_WINDOW = 1 << 30
"""The largest window (about 150 GiB of fingerprints at worst: a bound on typos)."""
_MIX: Final = 0x9E3779B97F4A7C15  # odd: spreads the tag over the 64 bits before it meets the digest
_MASK: Final = (1 << 64) - 1
_HALVES: Final = struct.Struct("<QQ")  # a key's group tag and the first 8 bytes of its digest
_MIX64 = np.uint64(_MIX)
_WORDS: Final = KEY_BYTES // 8  # a key as 8-byte words: tag, then the digest's four
VECTOR_FROM = 16
"""Keys from which ``fingerprints`` computes them in one numpy pass (below, per key is
faster: numpy's fixed cost is about that of 16 keys)."""


def check_int(where: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an integer (not a bool) in ``low..high``; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{where}: must be an integer in {low}..{high}, got {value!r}")
    return value


def fingerprint(key: ChunkKey) -> int:
    """8 stable bytes of ``key`` (module docstring).

    >>> fingerprint(ChunkKey(bytes(8) + bytes([1]) + bytes(31)))   # tag 0, digest 1
    1
    """
    tag, digest = _HALVES.unpack_from(key)
    return cast(int, (tag * _MIX ^ digest) & _MASK)


def fingerprints(keys: Sequence[ChunkKey]) -> list[int]:
    """``fingerprint`` of each key, in one pass (a store offers a request's keys at once):
    for many ``KEY_BYTES``-byte keys, one numpy pass over their words (the same values:
    the product wraps at 64 bits as ``& _MASK`` does).

    >>> ks = [ChunkKey(bytes([i]) * 40) for i in range(20)]
    >>> fingerprints(ks) == [fingerprint(k) for k in ks]
    True
    """
    n = len(keys)
    if n >= VECTOR_FROM and all(len(k) == KEY_BYTES for k in keys):
        words = np.frombuffer(b"".join(keys), dtype="<u8").reshape(n, _WORDS)
        return cast("list[int]", ((words[:, 0] * _MIX64) ^ words[:, 1]).tolist())
    return [(tag * _MIX ^ digest) & _MASK for tag, digest in map(_HALVES.unpack_from, keys)]


class OfferWindow:
    """Counts of each key's offers among the last ``window`` offers (module docstring).

    ``split`` asks, changing nothing, which keys an offer now would admit; ``record``
    counts the offers (the store records them once it has reserved the admitted keys'
    slots, so an offer the store refused for room is not counted twice when retried).
    """

    def __init__(self, after: object, window: object) -> None:
        self.after = check_int("admit_after", after, 2, MAX_ADMIT_AFTER)
        self.window = check_int("admit_window", window, 1, MAX_WINDOW)
        # the C module's counts and fingerprints (module docstring), decided once (a test
        # may take the module away)
        self._c = _native.OfferCounts(self.window) if _native is not None else None
        self._c_fingerprints = _native.offer_fingerprints if _native is not None else None
        self._ring = array("Q")  # fingerprints of the last offers, oldest at _pos once full
        self._pos = 0
        self._counts: dict[int, int] = {}  # fingerprint -> offers of it in the ring (> 0)

    def fingerprints(self, keys: Sequence[ChunkKey]) -> Fingerprints:
        """``fingerprints(keys)``, as ``split`` and ``record`` take them here."""
        if self._c_fingerprints is not None:
            return self._c_fingerprints(keys if isinstance(keys, list) else list(keys))
        return fingerprints(keys)

    def split(
        self, keys: Sequence[ChunkKey], fps: Fingerprints | None = None
    ) -> tuple[list[ChunkKey], list[ChunkKey]]:
        """``(admitted, declined)``, each in order, changing nothing: the (distinct) keys
        whose offer, were ``keys`` offered one after another now, would find at least
        ``after - 1`` offers of the same key among the last ``window`` offers before it.
        ``fps``: their ``fingerprints`` (this window's), when the caller has them."""
        fps = self.fingerprints(keys) if fps is None else fps
        if self._c is not None:
            admit = self._c.split(cast(bytes, fps), self.after - 1)
            return list(compress(keys, admit)), list(compress(keys, map(not_, admit)))
        ints = cast("Sequence[int]", fps)
        fast = self._split_fast(keys, ints)
        return fast if fast is not None else self._split_each(keys, ints)

    def _split_each(self, keys: Sequence[ChunkKey], fps: Sequence[int]
                    ) -> tuple[list[ChunkKey], list[ChunkKey]]:
        """``split``, one offer after another: the offers that leave the window before
        each key no longer count for it."""
        counts, need, ring, window = self._counts, self.after - 1, self._ring, self.window
        pos = self._pos
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
        """``split`` from the counts now, each key's count less its offers that leave the
        window before it: found among the few offers that leave during this one. None
        when the ring wraps within them (``_split_each`` then)."""
        counts, need, ring, window, pos = (self._counts, self.after - 1, self._ring,
                                           self.window, self._pos)
        n, full = len(fps), len(ring)
        # before key i, the oldest min(full, max(0, full - window + i)) offers have left
        leaving = min(full, max(0, full - window + n - 1))
        if leaving > window - pos:  # wraps around the ring's end
            return None
        olds = ring[pos : pos + leaving]
        if leaving and not set(olds).isdisjoint(fps):  # a key offered now leaves before it
            return self._split_leaving(keys, fps, olds)
        if counts.keys().isdisjoint(fps):  # none offered before (a count is never 0)
            return [], list(keys)
        admitted: list[ChunkKey] = []
        declined: list[ChunkKey] = []
        for k, fp in zip(keys, fps, strict=True):  # one pass: a dict lookup per key
            (admitted if counts.get(fp, 0) >= need else declined).append(k)
        return admitted, declined

    def _split_leaving(self, keys: Sequence[ChunkKey], fps: Sequence[int], olds: array[int]
                       ) -> tuple[list[ChunkKey], list[ChunkKey]]:
        """``split`` when some keys offered now are among ``olds``, the offers that leave
        the window during this one, oldest first: such a key's count drops by its offers
        among those that left before it (``bisect`` over where its fingerprint is)."""
        now = set(fps)
        at: dict[int, list[int]] = {}  # fingerprint offered now -> its places in olds
        for j, old in enumerate(olds):
            if old in now:
                at.setdefault(old, []).append(j)
        get, need, lag = self._counts.get, self.after - 1, len(self._ring) - self.window
        admitted: list[ChunkKey] = []
        declined: list[ChunkKey] = []
        for i, (k, fp) in enumerate(zip(keys, fps, strict=True)):
            seen = get(fp, 0)
            places = at.get(fp)
            if places is not None:  # the offers of fp gone before key i
                seen -= bisect_left(places, max(0, lag + i))
            (admitted if seen >= need else declined).append(k)
        return admitted, declined

    def record(self, keys: Sequence[ChunkKey], fps: Fingerprints | None = None) -> None:
        """Count one offer of each key, forgetting the oldest offers past the window
        (``fps``: as ``split``'s)."""
        if self._c is not None:
            self._c.record(cast(bytes, self.fingerprints(keys) if fps is None else fps))
            return
        counts, ring, window = self._counts, self._ring, self.window
        fps = cast("Sequence[int]", fingerprints(keys) if fps is None else fps)
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
        return len(self._c) if self._c is not None else len(self._ring)

    def num_distinct(self) -> int:
        """Distinct fingerprints among the remembered offers."""
        return self._c.num_distinct() if self._c is not None else len(self._counts)

    def check_invariants(self) -> None:
        if self._c is not None:
            self._c.check()
            return
        if len(self._ring) > self.window or sum(self._counts.values()) != len(self._ring):
            raise AssertionError("OfferWindow: counts disagree with the remembered offers")
        if 0 in self._counts.values():
            raise AssertionError("OfferWindow: a fingerprint counted with no offer left")
