"""A request's block hit: the largest boundary, up to its stored scope, at which every
group's required chunks are cached (anywhere), in tokens, by prefix semantics.

The boundaries a request may hit, and the chunks each needs, depend only on how many tokens
it stores and which chunks it references (``RequestRefs.groups``, ``chunks``): a
``HitPlan`` computes them once for every request storing the same tokens, so a request's
hit is one pass over where its chunks are and one over its boundaries, largest first.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import pairwise

from kvtier import coverage
from kvtier.layout import Layout
from kvtier.replay.refs import RequestRefs

MAX_HIT_PLANS = 4096
"""Plans kept (a replay needs one per stored scope: a few hundred)."""

Check = tuple[int, int, int]
"""A group's required chunks at a boundary: (group, start, stop), not empty."""


class Bound:
    """What every plan needs of one boundary (``HitPlans.bound``): its checks, the groups
    they check and those whose required range does not start at chunk 0 (as bit masks),
    and each group's stop (0: nothing required)."""

    __slots__ = ("checked", "checks", "not_from_zero", "stops")

    def __init__(self, layout: Layout, b: int) -> None:
        need = [coverage.required(g, b) for g in layout.groups]
        self.checks: list[Check] = [(gi, r.start, r.stop) for gi, r in enumerate(need) if len(r)]
        self.checked = sum(1 << gi for gi, _, _ in self.checks)
        self.not_from_zero = sum(1 << gi for gi, start, _ in self.checks if start)
        self.stops: list[int] = [r.stop if len(r) else 0 for r in need]


class HitPlans:
    """``block_hit``'s plans, by the stored scope and each reference's group and chunk,
    and what each boundary needs (``Bound``), shared by every plan."""

    def __init__(self) -> None:
        self.plans: dict[tuple[int, tuple[int, ...], tuple[int, ...]], HitPlan] = {}
        self.bounds: dict[int, Bound] = {}
        self.last: dict[int, HitPlan] = {}
        """The plan last used per stored scope, found again when a request's references
        are the very tuples it was made for (``RefsPlanner`` shares them): no tuple of a
        chunk per reference hashed per request."""

    def bound(self, layout: Layout, b: int) -> Bound:
        known = self.bounds.get(b)
        if known is None:
            known = self.bounds[b] = Bound(layout, b)
        return known


def block_hit(
    layout: Layout, refs: RequestRefs, where: list[str], cache: HitPlans | None = None,
) -> int:
    """The request's block hit (module docstring), given ``where`` each of its chunks is
    (``""``: absent). ``cache`` keeps the ``HitPlan`` of each list of references across
    requests (the replay's share one per stored scope; a fleet's probe truncates some)."""
    cache = HitPlans() if cache is None else cache
    plan = cache.last.get(refs.store_tokens)
    if plan is None or plan.groups is not refs.groups or plan.chunks is not refs.chunks:
        key = (refs.store_tokens, refs.groups, refs.chunks)
        plan = cache.plans.get(key)
        if plan is None:
            plan = HitPlan(layout, refs, cache)
            if len(cache.plans) < MAX_HIT_PLANS:
                cache.plans[key] = plan
        if len(cache.last) >= MAX_HIT_PLANS:
            cache.last.clear()
        cache.last[refs.store_tokens] = plan
    return plan.hit(where)


class HitPlan:
    """What ``block_hit`` needs of every request that stores the same tokens: per group,
    where its chunks are in the request's list, by chunk index; per admissible boundary
    (largest first), each group's required chunks (``Check``)."""

    def __init__(self, layout: Layout, refs: RequestRefs, cache: HitPlans) -> None:
        num_groups, n = len(layout.groups), len(refs.groups)
        self.groups, self.chunks = refs.groups, refs.chunks  # what it was made for
        self.bounds: list[int] = list(coverage.admissible_boundaries(layout,
                                                                     refs.store_tokens)[::-1])
        infos = [cache.bound(layout, b) for b in self.bounds]
        self.checks: list[list[Check]] = [info.checks for info in infos]
        """Per boundary, largest first: every group's required chunks that are not empty
        (an empty range always holds)."""
        checked = not_from_zero = 0
        for info in infos:
            checked |= info.checked
            not_from_zero |= info.not_from_zero
        self.from_zero = [not not_from_zero >> gi & 1 for gi in range(num_groups)]
        """Per group: every required range starts at chunk 0 (full attention): its chunks
        present from 0 on (the lead) decide."""
        self.positions: list[list[int]] = [[] for _ in range(num_groups)]
        """Per group, by chunk index: that chunk's position in the request's list, or ``n``
        (one past it) for a chunk the request does not reference (never present)."""
        self.pad = False
        """Some group skips a chunk below its largest: ``hit`` reads ``where`` padded."""
        for p, (gi, c) in enumerate(zip(refs.groups, refs.chunks, strict=True)):
            at = self.positions[gi]
            if c >= len(at):
                at.extend([n] * (c + 1 - len(at)))
            at[c] = p
        self.sizes = [len(at) for at in self.positions]
        """Per group: one past its largest chunk referenced (0: none)."""
        self.in_place = [at == list(range(len(at))) for at in self.positions]
        """Per group: its chunk ``c`` is the request's ``c``-th reference (one group)."""
        self.pad = any(n in at for at in self.positions)
        self.lone = checked.bit_length() - 1 if checked and not checked & (checked - 1) else -1
        """The one group whose chunks decide the hit (one full-attention group), or -1."""
        self.by_lead: list[int] | None = None
        """For ``lone``: the hit for each count of its chunks present from 0 on (its lead),
        0 .. its size; None unless its checks all start at 0 and its chunks are in place."""
        if self.lone >= 0 and self.from_zero[self.lone] and self.in_place[self.lone]:
            self.by_lead = self._by_lead([info.stops[self.lone] for info in infos])
        self.skips = self._skips(infos, num_groups) if self.by_lead is None else []
        """Per group whose required ranges start at 0 and shrink as the boundary does (full
        attention), ``(group, -stop per boundary)``, ascending: the boundaries its lead
        cannot satisfy come first, and a bisection skips them all. Empty when some such
        group's ranges do not shrink (then every boundary is checked), or with ``by_lead``."""

    def _skips(self, infos: list[Bound], num_groups: int) -> list[tuple[int, list[int]]]:
        skips = []
        for gi in range(num_groups):
            if not self.from_zero[gi]:
                continue
            stops = [info.stops[gi] for info in infos]
            if any(a < b for a, b in pairwise(stops)):
                return []
            skips.append((gi, [-stop for stop in stops]))
        return skips

    def _by_lead(self, needs: list[int]) -> list[int]:
        """For each lead ``0 .. size``, the largest boundary whose checks (all ``lone``'s,
        from chunk 0, ``needs`` chunks per boundary) it satisfies: a boundary needing
        ``need`` chunks is the answer for every lead from ``need`` up to where a larger
        boundary already answered."""
        size = self.sizes[self.lone]
        out, low = [0] * (size + 1), size + 1  # leads from ``low`` on are answered
        for b, need in zip(self.bounds, needs, strict=True):  # largest first
            if need < low:
                out[need:low] = [b] * (low - need)
                low = need
            if not low:
                break
        return out

    def hit(self, where: list[str]) -> int:
        """The block hit, given ``where`` each chunk is (``""``: absent)."""
        if not self.bounds:
            return 0
        if self.by_lead is not None:  # one group decides: its lead, found in C, says it all
            size = self.sizes[self.lone]
            return self.by_lead[where.index("", 0, size) if "" in where[:size] else size]
        padded = [*where, ""] if self.pad else where
        leads: list[int] = []  # per group: its chunks present from chunk 0 on
        present: list[list[str]] = []  # per group, by chunk index: where it is
        for gi, at in enumerate(self.positions):
            mine = padded[: len(at)] if self.in_place[gi] else [padded[p] for p in at]
            present.append(mine)
            leads.append(mine.index("") if "" in mine else len(mine))
        first = 0  # the boundaries before it need more of a lead than some group has
        for gi, neg_stops in self.skips:
            first = max(first, bisect_left(neg_stops, -leads[gi]))
        for i in range(first, len(self.bounds)):
            for gi, start, stop in self.checks[i]:
                if stop > leads[gi] and (start == 0 or stop > self.sizes[gi]
                                         or "" in present[gi][start:stop]):
                    break
            else:
                return self.bounds[i]
        return 0
