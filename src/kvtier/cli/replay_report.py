"""``kvtier replay``'s tables and JSON: what a finished replay prints (``cli.replay`` runs it)."""

from __future__ import annotations

import argparse
from typing import Any

from kvtier.cli.common import human_bytes, print_json, table
from kvtier.replay.stats import ReplayStats, normalized


def report(args: argparse.Namespace, meta: dict[str, Any], results: list[ReplayStats]) -> None:
    first = results[0].as_dict()
    if args.json:
        norm = normalized(results)
        out = {**meta, "requests": first["requests"], "block_hit_rate": first["block_hit_rate"],
               "token_hit_rate": first["token_hit_rate"], "policy": first["policy"],
               "policies": {r.policy: {**r.as_dict(), **_normalized_fields(norm, r.policy)}
                            for r in results}}
        print_json(out)
        return
    print(_head(meta, results[0]))
    print()
    print(_policy_table(results))
    print()
    print(_group_table(results[0]))
    if results[0].tiers:
        print()
        print(_tier_table(results))


def _normalized_fields(norm: dict[str, dict[str, float | None]], policy: str
                       ) -> dict[str, float | None]:
    """``normalized_block_hit_rate`` and ``normalized_token_hit_rate`` of ``policy``, when
    LRU and Belady both ran."""
    return {f"normalized_{rate}": v for rate, v in norm.get(policy, {}).items()}


def _head(meta: dict[str, Any], stats: ReplayStats) -> str:
    tiers = ", ".join(f"{t} {n} chunks ({human_bytes(n * meta['bytes_per_slot'])})"
                      if meta["bytes_per_slot"] else f"{t} {n} chunks"
                      for t, n in stats.slots.items())
    return (f"{meta['trace']}: {meta['requests']} requests, {meta['model']}, {tiers}, "
            f"{meta['mode']} replay, store {meta['store']}, boundaries {meta['boundaries']}, "
            f"admit after {meta['admit_after']} offer(s)")


def _policy_table(results: list[ReplayStats]) -> str:
    headers = ["policy", "block hit", "token hit", "normalized", "prefill saved", "loaded host",
               "loaded disk", "stored", "written per hit token", "TTFT cold", "TTFT", "saved",
               "time"]
    rows = []
    norm = normalized(results)
    for s in results:
        d = s.as_dict()
        stored = sum(g.stored * (g.bytes_per_chunk or 0) for g in s.groups)
        rows.append([
            s.policy, f"{d['block_hit_rate']:.4f}", f"{d['token_hit_rate']:.4f}",
            _ratio(norm.get(s.policy, {}).get("token_hit_rate")),
            f"{s.hit_tokens:,} tok", _tier(s, "host"), _tier(s, "disk"),
            f"{sum(g.stored for g in s.groups):,} ({human_bytes(stored)})", _written(s),
            f"{d['mean_ttft_cold_s']:.3f}s", f"{d['mean_ttft_s']:.3f}s",
            f"{d['mean_ttft_saved_s']:.3f}s", f"{s.wall_s:.1f}s",
        ])
    return table(headers, rows)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _written(s: ReplayStats) -> str:
    """Write amplification: bytes written to each tier per prompt token restored."""
    per = s.written_per_hit_token()
    return ", ".join(f"{t} {'-' if v is None else human_bytes(round(v))}"
                     for t, v in per.items()) or "-"


def _tier(s: ReplayStats, tier: str) -> str:
    n = s.chunks_loaded_by_tier.get(tier, 0)
    return f"{n:,} ({human_bytes(s.bytes_loaded_by_tier.get(tier, 0))})" if n else "-"


def _group_table(s: ReplayStats) -> str:
    headers = ["group", "kind", "offered", "dense", "offered/dense", "stored", "loaded"]
    rows = []
    for g in s.groups:
        per = g.bytes_per_chunk
        ratio = f"{g.offered / g.dense:.3f}" if g.dense else "-"
        rows.append([g.name, g.kind] + [
            f"{n:,}" + (f" ({human_bytes(n * per)})" if per else "")
            for n in (g.offered, g.dense)] + [ratio] + [
            f"{n:,}" + (f" ({human_bytes(n * per)})" if per else "") for n in (g.stored, g.loaded)])
    return f"chunks per group ({s.policy}; dense = every whole chunk, no pruning)\n" + table(
        headers, rows)


def _tier_table(results: list[ReplayStats]) -> str:
    """``--bytes``: per policy and tier, what the real store moved and how long it took."""
    headers = ["policy", "tier", "hits", "read", "written", "moved read/written", "time",
               "corrupt"]
    rows = []
    for s in results:
        for tier, t in s.tiers.items():
            rows.append([
                s.policy, tier, f"{t['hits']:,}",
                _chunks(t["chunks_read"], t["real_bytes_read"]),
                _chunks(t["chunks_written"], t["real_bytes_written"]),
                f"{human_bytes(t['bytes_read'])} / {human_bytes(t['bytes_written'])}",
                f"{t['seconds']:.2f}s", f"{t['corrupt']:,}",
            ])
    lines = [f"{s.policy}: {s.verified_chunks:,} loaded chunks verified byte for byte, "
             f"{s.corrupt_chunks:,} corrupt, {s.waits:,} waits for promotions"
             for s in results]
    return ("tiers (--bytes; read/written as the real layout's chunks, moved: the scaled "
            "slots' bytes)\n" + table(headers, rows) + "\n" + "\n".join(lines))


def _chunks(n: int, real: int | None) -> str:
    return f"{n:,}" + (f" ({human_bytes(real)})" if real is not None else "")
