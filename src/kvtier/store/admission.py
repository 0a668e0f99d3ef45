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
offer in all (in the serving build's C counts, 8 bytes of ring and 24 to 48 of table);
both grow as offers come, up to the window, and never beyond (nothing is allocated up
front). The window defaults to ``WINDOW_PER_SLOT`` offers per slot of the
store: on the Mooncake conversation trace, 4 to 8 times the capacity gives the best hit
rates (a shorter window forgets a chunk before its second offer; docs/replay.md,
"Admission").

A fingerprint is 8 bytes of the key's digest mixed with its group tag: stable across processes
(no ``hash()``, so no ``PYTHONHASHSEED``), and two keys share one with probability 2^-64.
The window and the fingerprints live in ``kvtier.store.offers`` (compiled in the serving
build, which counts in C: ``kvtier._native.OfferCounts``); this module, interpreted,
checks what users give (``Admission``).

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

from dataclasses import dataclass

from kvtier.store.offers import (
    MAX_ADMIT_AFTER,
    MAX_WINDOW,
    OfferWindow,
    check_int,
    fingerprint,
    fingerprints,
)

__all__ = ["MAX_ADMIT_AFTER", "MAX_WINDOW", "WINDOW_PER_SLOT", "Admission", "OfferWindow",
           "fingerprint", "fingerprints"]

WINDOW_PER_SLOT = 4
"""Default window: offers remembered per slot of the store (module docstring)."""


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
        check_int("admit_after", self.after, 1, MAX_ADMIT_AFTER)
        if self.window is not None:
            check_int("admit_window", self.window, 1, MAX_WINDOW)

    def filter(self, num_slots: int) -> OfferWindow | None:
        """The filter for a store of ``num_slots`` slots; None when every offer is admitted."""
        if self.after == 1:
            return None
        window = self.window or min(MAX_WINDOW, WINDOW_PER_SLOT * num_slots)
        return OfferWindow(self.after, window)
