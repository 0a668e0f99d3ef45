"""The offer window's fast paths (a batch split at once, a batch recorded as one slice,
fingerprints in one numpy pass) against a reference that keeps every offer in a deque and
counts, offer by offer; with a negative control showing the comparison can fail."""

from __future__ import annotations

import random
from collections import deque

import pytest

from kvtier.keys import ChunkKey
from kvtier.store.admission import OfferWindow, fingerprint, fingerprints
from kvtier.store.offers import VECTOR_FROM


def pool_key(i: int) -> ChunkKey:
    """A key with varied tag and digest words, so fingerprints differ in both halves."""
    rng = random.Random(i)
    return ChunkKey(rng.randbytes(40))


class Reference:
    """Admission by definition: a key is admitted when at least ``after - 1`` of the last
    ``window`` offers before it are of the same key."""

    def __init__(self, after: int, window: int) -> None:
        self.after, self.offers = after, deque[ChunkKey](maxlen=window)

    def split(self, ks: list[ChunkKey]) -> tuple[list[ChunkKey], list[ChunkKey]]:
        seen = deque(self.offers, maxlen=self.offers.maxlen)
        admitted, declined = [], []
        for k in ks:  # the batch's own keys are distinct: only earlier offers count
            (admitted if seen.count(k) >= self.after - 1 else declined).append(k)
            seen.append(k)
        return admitted, declined

    def record(self, ks: list[ChunkKey]) -> None:
        self.offers.extend(ks)


def replay_offers(window: OfferWindow, ref: Reference, seed: int) -> int:
    """Random batches through both; the batches after which they disagree (on the split,
    or on the offers remembered)."""
    rng, pool = random.Random(seed), [pool_key(i) for i in range(60)]
    disagreements = 0
    for _ in range(300):
        batch = rng.sample(pool, rng.choice([0, 1, 3, VECTOR_FROM - 1, VECTOR_FROM, 40]))
        wrong = window.split(batch) != ref.split(batch)
        if rng.random() < 0.8:  # a refused store records nothing
            window.record(batch)
            ref.record(batch)
        window.check_invariants()
        wrong |= len(window) != len(ref.offers)
        wrong |= window.num_distinct() != len(set(ref.offers))
        disagreements += wrong
    return disagreements


@pytest.mark.parametrize("after", [2, 3, 5])
@pytest.mark.parametrize("size", [1, 7, 16, 41, 97, 1000])
def test_window_equals_the_offer_by_offer_reference(after: int, size: int) -> None:
    for seed in range(3):
        assert replay_offers(OfferWindow(after, size), Reference(after, size), seed) == 0


def test_negative_control_a_window_one_offer_too_long_disagrees() -> None:
    wrong = sum(replay_offers(OfferWindow(2, size + 1), Reference(2, size), seed)
                for size in (7, 41) for seed in range(3))
    assert wrong > 0


def test_a_key_whose_offer_leaves_the_window_during_the_batch_is_declined() -> None:
    """Window 4, admit at the second offer, after offers a b c d: offering ``b a``, a's
    earlier offer leaves the window before a comes (b's pushes it out), so a is declined;
    offering ``a b``, both are admitted (b's offer is still there when b comes)."""
    a, b, c, d = (pool_key(i) for i in range(4))
    window = OfferWindow(2, 4)
    window.record([a, b, c, d])
    assert window.split([b, a]) == ([b], [a])
    assert window.split([a, b]) == ([a, b], [])
    ref = Reference(2, 4)
    ref.record([a, b, c, d])
    assert ref.split([b, a]) == ([b], [a])  # the definition agrees
    assert window.split([b, a]) != ([b, a], [])  # negative control: counts now, ignoring leaving


def test_fingerprints_in_one_pass_equal_each_key_alone() -> None:
    for n in (0, 1, VECTOR_FROM - 1, VECTOR_FROM, 200):
        ks = [pool_key(i) for i in range(n)]
        assert fingerprints(ks) == [fingerprint(k) for k in ks]
    tag = (0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little")  # the product wraps at 64 bits
    big = [ChunkKey(tag + bytes([i]) * 32) for i in range(VECTOR_FROM)]
    assert fingerprints(big) == [fingerprint(k) for k in big]
    assert fingerprints(big) != [fingerprint(k) for k in reversed(big)]  # control
