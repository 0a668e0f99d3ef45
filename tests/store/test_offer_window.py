"""The offer window's fast paths (a batch split at once, a batch recorded as one slice,
fingerprints in one numpy pass) and its C counts (the serving build's
``kvtier._native.OfferCounts``) against a reference that keeps every offer in a deque and
counts, offer by offer; with a negative control showing the comparison can fail."""

from __future__ import annotations

import random
import struct
from collections import deque
from collections.abc import Iterator

import pytest

from kvtier.keys import ChunkKey
from kvtier.store import offers
from kvtier.store.admission import OfferWindow, fingerprint, fingerprints
from kvtier.store.offers import VECTOR_FROM

NATIVE = offers._native


@pytest.fixture(params=["python", "native"], autouse=True)
def counts_in(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
              ) -> Iterator[str]:
    """Every test here runs on the pure build's counts and, where the C module is built,
    on its C counts (a window decides which when it is made)."""
    if request.param == "python":
        monkeypatch.setattr(offers, "_native", None)
    elif NATIVE is None:
        pytest.skip("no kvtier._native in this build (KVTIER_COMPILE=1 builds it)")
    yield request.param


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


def test_the_c_counts_equal_the_pure_ones_through_growth_and_wrap(
        counts_in: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many distinct keys (the C table grows, and entries empty out of long probe runs)
    and windows from 1 to 3,000, batch after batch: the same answers as the pure build's
    counts, and the same offers remembered."""
    if counts_in != "native":
        pytest.skip("compares both counts: run once, as the native case")
    pool = [pool_key(i) for i in range(4000)]
    for seed, (after, size) in enumerate([(2, 1), (2, 3), (3, 257), (2, 1024), (4, 3000)]):
        rng = random.Random(seed)
        monkeypatch.setattr(offers, "_native", NATIVE)
        c_window = OfferWindow(after, size)
        monkeypatch.setattr(offers, "_native", None)
        py_window = OfferWindow(after, size)
        assert c_window._c is not None and py_window._c is None
        for _ in range(400):
            some = pool[: rng.choice([50, 600, 4000])]
            batch = rng.sample(some, min(len(some), rng.choice([1, 7, 40, 200])))
            assert c_window.split(batch) == py_window.split(batch)
            c_window.record(batch)
            py_window.record(batch)
        c_window.check_invariants()
        assert (len(c_window), c_window.num_distinct()) == (len(py_window),
                                                            py_window.num_distinct())


def test_c_fingerprints_are_the_pure_builds_and_bad_input_is_refused(counts_in: str) -> None:
    if counts_in != "native":
        pytest.skip("the C module's own functions: run once, as the native case")
    assert NATIVE is not None
    ks = [pool_key(i) for i in range(100)]
    packed = NATIVE.offer_fingerprints(ks)
    assert list(struct.unpack(f"<{len(ks)}Q", packed)) == fingerprints(ks)
    assert NATIVE.offer_fingerprints(ks[1:]) != packed[:-8]  # control: order matters
    with pytest.raises(ValueError, match="at least 16"):
        NATIVE.offer_fingerprints([bytes(15)])
    with pytest.raises(TypeError, match="a list of keys"):
        NATIVE.offer_fingerprints(tuple(ks))
    with pytest.raises(ValueError, match="at least 1"):
        NATIVE.OfferCounts(0)
    with pytest.raises(ValueError, match="multiple of 8"):
        NATIVE.OfferCounts(4).record(bytes(12))
