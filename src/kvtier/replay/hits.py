"""A request's block hit: the largest boundary, up to its stored scope, at which every
group's required chunks are cached (anywhere), in tokens, by prefix semantics.

The boundaries a request may hit, and the chunks each needs, depend only on how many tokens
it stores and which chunks it references (``RequestRefs.groups``, ``chunks``): a
``HitPlan`` computes them once for every request storing the same tokens, so a request's
hit is one pass over where its chunks are and one over its boundaries, largest first.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate, pairwise

from kvtier import coverage
from kvtier.layout import Layout
from kvtier.replay.refs import RequestRefs

MAX_HIT_PLANS = 4096
"""Plans kept (a replay needs one per stored scope: a few hundred)."""


class HitPlans:
    """``block_hit``'s plans, by the stored scope and each reference's group and chunk,
    and ``coverage.required`` of every group per boundary."""

    def __init__(self) -> None:
        self.plans: dict[tuple[int, tuple[int, ...], tuple[int, ...]], HitPlan] = {}
        self.needs: dict[int, tuple[range, ...]] = {}


def block_hit(
    layout: Layout, refs: RequestRefs, where: list[str], cache: HitPlans | None = None,
) -> int:
    """The request's block hit (module docstring), given ``where`` each of its chunks is
    (``""``: absent). ``cache`` keeps the ``HitPlan`` of each list of references across
    requests (the replay's share one per stored scope; a fleet's probe truncates some)."""
    cache = HitPlans() if cache is None else cache
    key = (refs.store_tokens, refs.groups, refs.chunks)
    plan = cache.plans.get(key)
    if plan is None:
        plan = HitPlan(layout, refs, cache.needs)
        if len(cache.plans) < MAX_HIT_PLANS:
            cache.plans[key] = plan
    return plan.hit(where)


class HitPlan:
    """What ``block_hit`` needs of every request that stores the same tokens: per group,
    where its chunks are in the request's list and their indices; per admissible boundary
    (largest first), each group's required chunks as ``(start, stop, length)``."""

    def __init__(self, layout: Layout, refs: RequestRefs,
                 needs: dict[int, tuple[range, ...]]) -> None:
        bounds = coverage.admissible_boundaries(layout, refs.store_tokens)[::-1]
        self.bounds: list[int] = list(bounds)
        per_bound: list[tuple[range, ...]] = []
        for b in self.bounds:
            need = needs.get(b)
            if need is None:
                need = needs[b] = tuple(coverage.required(g, b) for g in layout.groups)
            per_bound.append(need)
        self.sizes: list[int] = []
        """Per group: one past its largest chunk referenced (0: none)."""
        self.slots: list[list[tuple[int, int]]] = []
        """Per group: (position in the request's list, chunk index) of each of its chunks."""
        for gi in range(len(layout.groups)):
            mine = [(p, c) for p, (g, c) in enumerate(zip(refs.groups, refs.chunks,
                                                           strict=True)) if g == gi]
            self.slots.append(mine)
            self.sizes.append(max(c for _, c in mine) + 1 if mine else 0)
        self.checks: list[list[tuple[int, int, int, int]]] = []
        """Per boundary, largest first: (group, start, stop, length) of every group whose
        required range is not empty (an empty one always holds)."""
        for need in per_bound:
            self.checks.append([(gi, r.start, r.stop, len(r)) for gi, r in enumerate(need)
                                if len(r)])
        self.from_zero = [all(start == 0 for checks in self.checks
                              for g, start, _, _ in checks if g == gi)
                          for gi in range(len(layout.groups))]
        """Per group: every required range starts at chunk 0 (full attention): its chunks
        present from 0 on (the lead) decide, no count per index needed."""
        self.in_place = [mine == [(c, c) for c in range(len(mine))] for mine in self.slots]
        """Per group: its chunk ``c`` is the request's ``c``-th reference (one group)."""
        checked = sorted({g for checks in self.checks for g, _, _, _ in checks})
        self.lone = checked[0] if len(checked) == 1 else -1
        """The one group whose chunks decide the hit (one full-attention group), or -1."""
        self.by_lead: list[int] | None = None
        """For ``lone``: the hit for each count of its chunks present from 0 on (its lead),
        0 .. its size; None unless its checks all start at 0 and its chunks are in place."""
        if self.lone >= 0 and self.from_zero[self.lone] and self.in_place[self.lone]:
            self.by_lead = self._by_lead(self.sizes[self.lone])
        self.skips = self._skips(len(layout.groups)) if self.by_lead is None else []
        """Per group whose required ranges start at 0 and shrink as the boundary does (full
        attention), ``(group, -stop per boundary)``, ascending: the boundaries its lead
        cannot satisfy come first, and a bisection skips them all. Empty when some such
        group's ranges do not shrink (then every boundary is checked), or with ``by_lead``."""

    def _skips(self, num_groups: int) -> list[tuple[int, list[int]]]:
        skips = []
        for gi in range(num_groups):
            if not self.from_zero[gi]:
                continue
            stops = [max([stop for g, _, stop, _ in checks if g == gi], default=0)
                     for checks in self.checks]
            if any(a < b for a, b in pairwise(stops)):
                return []
            skips.append((gi, [-stop for stop in stops]))
        return skips

    def _by_lead(self, size: int) -> list[int]:
        """For each lead ``0 .. size``, the largest boundary whose checks (all ``lone``'s,
        from chunk 0) it satisfies: a boundary needing ``need`` chunks is the answer for
        every lead from ``need`` up to where a larger boundary already answered."""
        out, low = [0] * (size + 1), size + 1  # leads from ``low`` on are answered
        for b, checks in zip(self.bounds, self.checks, strict=True):  # largest first
            need = max([stop for _, _, stop, _ in checks], default=0)
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
        leads: list[int] = []  # per group: chunks present from chunk 0 on (from_zero)
        sums: list[list[int]] = []  # per group otherwise: chunks present below each index
        for gi, (mine, size) in enumerate(zip(self.slots, self.sizes, strict=True)):
            if self.from_zero[gi] and self.in_place[gi]:  # the first absent, found in C
                leads.append(where.index("", 0, size) if "" in where[:size] else size)
                sums.append([])
                continue
            flags = [0] * size
            for p, c in mine:
                if where[p]:
                    flags[c] = 1
            leads.append(flags.index(0) if 0 in flags else size)
            sums.append([0, *accumulate(flags)])
        first = 0  # the boundaries before it need more of a lead than some group has
        for gi, neg_stops in self.skips:
            first = max(first, bisect_left(neg_stops, -leads[gi]))
        for i in range(first, len(self.bounds)):
            for gi, start, stop, length in self.checks[i]:
                if start == 0:
                    if stop > leads[gi]:
                        break
                    continue
                s = sums[gi]
                if stop >= len(s) or s[stop] - s[start] != length:
                    break
            else:
                return self.bounds[i]
        return 0
