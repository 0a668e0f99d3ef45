"""GPU check of the transfer engine: a byte-exact round trip, then bandwidth against copy_.

Run: ``python scripts/cuda_check.py`` on a machine with a CUDA device (exits 0 with a
message when there is none). Steps, each printed:

1. round trip: random KV on the GPU (two groups: bf16 ``[num_blocks, 2, ...]`` and fp16
   ``[2, num_blocks, ...]``, plus fp8 when torch has it), stored into pinned slab slots,
   their blocks cleared, loaded back (one partial ``first_block`` copy included), compared
   byte for byte (untouched blocks must be unchanged); once on consecutive slab rows and
   once on shuffled ones;
2. bandwidth: for 16 KiB, 256 KiB and 2 MiB chunks, store and load of 256 MiB against a
   ``copy_`` of the same bytes between the GPU and pinned host memory.

Prints a table, then one JSON line: {"benchmark": "transfer_cuda", "figures", "targets",
"met"}; ``met`` needs the round trips exact and 0.8 of copy_ at 256 KiB and larger.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, TransferEngine, allocate_slab

TARGET = 0.8
CHUNKS = {"16KiB": 16 << 10, "256KiB": 256 << 10, "2MiB": 2 << 20}
TOTAL = 256 << 20


def random_kv(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
    return raw.cuda().view(dtype).reshape(shape)


def round_trip(dtype: torch.dtype, shuffle: bool) -> bool:
    """Store 12 chunks per group into pinned slots, clear the KV, load, compare bytes."""
    gen = torch.Generator().manual_seed(0)
    layout = Layout((Group("full", 16, 4), Group("sliding_window", 8, 2, window=32)))
    kv = [
        GroupKV(tuple(random_kv((64, 2, 16, 4, 64), dtype, gen) for _ in range(3))),
        GroupKV(tuple(random_kv((2, 48, 8, 2, 64), torch.float16, gen) for _ in range(2)),
                block_axis=1),
    ]
    before = [[t.clone() for t in g.layers] for g in kv]
    with TransferEngine(layout, kv) as engine:
        slab = allocate_slab(48, engine.slot_bytes, "cuda")
        order = torch.randperm(48, generator=gen).tolist() if shuffle else list(range(48))
        ids = [torch.randperm(n, generator=gen).tolist() for n in (64, 48)]
        copies = [ChunkCopy(0, slab[order[i]], ids[0][4 * i : 4 * i + 4]) for i in range(12)]
        copies += [ChunkCopy(1, slab[order[12 + i]], ids[1][2 * i : 2 * i + 2]) for i in range(12)]
        copies.append(ChunkCopy(1, slab[order[30]], ids[1][30:31], first_block=1))
        ok = engine.wait(engine.submit_store(copies)).ok
        for g in range(2):
            clear_blocks(kv[g], [b for c in copies if c.group == g for b in c.block_ids])
        ok = ok and engine.wait(engine.submit_load(copies)).ok
    torch.cuda.synchronize()
    return ok and all(
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        for g, old in zip(kv, before, strict=True) for a, b in zip(g.layers, old, strict=True)
    )


def clear_blocks(group: GroupKV, ids: list[int]) -> None:
    index = torch.tensor(ids, device="cuda")
    for t in group.layers:
        lead = t.shape[:1] if group.block_axis == 1 else ()
        rows = t.reshape(*lead, t.shape[group.block_axis], -1).view(torch.uint8)
        rows.index_fill_(group.block_axis, index, 0)


def timed(fn: object) -> float:
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def bandwidth(chunk: int) -> dict[str, float]:
    layers, tokens, blocks = 8, 16, 4
    width = chunk // (layers * blocks * 2 * tokens * 2)
    num_chunks = TOTAL // chunk
    num_blocks = 2 * num_chunks * blocks
    kv = tuple(torch.empty((num_blocks, 2, tokens, 1, width), dtype=torch.bfloat16,
                           device="cuda").normal_() for _ in range(layers))
    engine = TransferEngine(Layout((Group("full", tokens, blocks),)), [GroupKV(kv)])
    slab = allocate_slab(num_chunks, chunk, "cuda")
    ids = torch.randperm(num_blocks)[: num_chunks * blocks].view(num_chunks, blocks).tolist()
    copies = [ChunkCopy(0, slab[i], ids[i]) for i in range(num_chunks)]
    dev = torch.empty(TOTAL, dtype=torch.uint8, device="cuda").random_(0, 256)
    host = torch.zeros(TOTAL, dtype=torch.uint8, pin_memory=True)
    with engine:
        base_store = timed(lambda: host.copy_(dev, non_blocking=True))
        base_load = timed(lambda: dev.copy_(host, non_blocking=True))
        store = timed(lambda: engine.wait(engine.submit_store(copies)))
        load = timed(lambda: engine.wait(engine.submit_load(copies)))
    return {"store_ratio": base_store / store, "load_ratio": base_load / load,
            "store_gbps": TOTAL / store / 1e9, "load_gbps": TOTAL / load / 1e9,
            "copy_gbps": TOTAL / base_store / 1e9}


def main() -> int:
    if not torch.cuda.is_available():
        print("cuda_check: no CUDA device visible to torch; nothing to check.")
        return 0
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    figures: dict[str, float | bool] = {}
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    dtypes += [torch.float8_e4m3fn] if hasattr(torch, "float8_e4m3fn") else []
    for dtype in dtypes:
        for shuffle in (False, True):
            kind = "shuffled" if shuffle else "slab"
            name = f"roundtrip_{str(dtype).removeprefix('torch.')}_{kind}"
            figures[name] = round_trip(dtype, shuffle)
            print(f"{name:<40} {'exact' if figures[name] else 'MISMATCH'}")
    print(f"\n{'chunk':<8}{'store GB/s':>12}{'load GB/s':>11}{'copy GB/s':>11}"
          f"{'store x':>9}{'load x':>8}")
    for name, chunk in CHUNKS.items():
        f = bandwidth(chunk)
        figures.update({f"{name}_{k}": v for k, v in f.items()})
        print(f"{name:<8}{f['store_gbps']:>12.2f}{f['load_gbps']:>11.2f}{f['copy_gbps']:>11.2f}"
              f"{f['store_ratio']:>9.2f}{f['load_ratio']:>8.2f}")
    targets = {f"{n}_{d}_ratio": TARGET for n in ("256KiB", "2MiB") for d in ("store", "load")}
    exact = all(v for k, v in figures.items() if k.startswith("roundtrip"))
    met = exact and all(figures[k] >= v for k, v in targets.items())
    print(json.dumps({"benchmark": "transfer_cuda", "figures": figures, "targets": targets,
                      "met": met}))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
