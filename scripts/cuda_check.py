"""GPU check of the transfer engine: a byte-exact round trip, then bandwidth against copy_.

Run: ``python scripts/cuda_check.py`` on a machine with a CUDA device (exits 0 with a
message when there is none); ``--device cpu --mib 16`` runs the same steps on the CPU, a
dry run of the script itself. Steps, each printed:

1. round trip: random KV on the GPU (two groups: ``[num_blocks, 2, ...]`` in each dtype
   (fp8 too when torch has it) and fp16 ``[2, num_blocks, ...]``), stored into pinned slab
   slots, their blocks cleared, loaded back (one partial ``first_block`` copy included),
   compared byte for byte (untouched blocks must be unchanged); on consecutive slab rows
   (slot tensors) and on shuffled ones (named by row index of the registered slab), with
   shuffled block ids and with consecutive runs of ids (which move as one run per layer);
2. bandwidth: for 16 KiB, 256 KiB and 2 MiB chunks (shuffled block ids, and runs), store
   and load of 256 MiB against a ``copy_`` of the same bytes between the GPU and pinned
   host memory.

Prints a table, then one JSON line: {"benchmark": "transfer_cuda", "figures", "targets",
"met"}; ``met`` needs the round trips exact and 0.8 of copy_ at 256 KiB and larger.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, TransferEngine, allocate_slab

TARGET = 0.8
CHUNKS = {"16KiB": 16 << 10, "256KiB": 256 << 10, "2MiB": 2 << 20}
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_kv(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator,
              device: torch.device) -> torch.Tensor:
    size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
    return raw.to(device).view(dtype).reshape(shape)


def chunk_ids(num_chunks: int, num_blocks: int, per_chunk: int, runs: bool,
              gen: torch.Generator | None = None) -> list[tuple[int, ...]]:
    """``per_chunk`` block ids per chunk: a random permutation, or consecutive runs."""
    if runs:
        starts = torch.randperm(num_blocks // per_chunk, generator=gen)[:num_chunks]
        ids = starts[:, None] * per_chunk + torch.arange(per_chunk)
    else:
        ids = torch.randperm(num_blocks, generator=gen)[: num_chunks * per_chunk]
    return [tuple(row) for row in ids.view(num_chunks, per_chunk).tolist()]


def round_trip(dtype: torch.dtype, shuffle: bool, runs: bool, device: torch.device) -> bool:
    """Store 12 chunks per group into pinned slots, clear the KV, load, compare bytes."""
    gen = torch.Generator().manual_seed(0)
    layout = Layout((Group("full", 16, 4), Group("sliding_window", 8, 2, window=32)))
    kv = [
        GroupKV(tuple(random_kv((64, 2, 16, 4, 64), dtype, gen, device) for _ in range(3))),
        GroupKV(tuple(random_kv((2, 48, 8, 2, 64), torch.float16, gen, device) for _ in range(2)),
                block_axis=1),
    ]
    before = [[t.clone() for t in g.layers] for g in kv]
    slab = allocate_slab(48, TransferEngine(layout, kv).slot_bytes, device)
    # shuffled slots are named by row index of the registered slab, as the integrations do
    with TransferEngine(layout, kv, slab=slab) as engine:
        order = torch.randperm(48, generator=gen).tolist() if shuffle else list(range(48))
        slot = (lambda i: order[i]) if shuffle else (lambda i: slab[order[i]])
        full, swa = chunk_ids(12, 64, 4, runs, gen), chunk_ids(13, 48, 2, runs, gen)
        copies = [ChunkCopy(0, slot(i), full[i]) for i in range(12)]
        copies += [ChunkCopy(1, slot(12 + i), swa[i]) for i in range(12)]
        copies.append(ChunkCopy(1, slot(30), swa[12][1:], first_block=1))
        ok = engine.wait(engine.submit_store(copies)).ok
        for g in range(2):
            clear_blocks(kv[g], [b for c in copies if c.group == g for b in c.block_ids], device)
        ok = ok and engine.wait(engine.submit_load(copies)).ok
    sync(device)
    return ok and all(
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        for g, old in zip(kv, before, strict=True) for a, b in zip(g.layers, old, strict=True)
    )


def clear_blocks(group: GroupKV, ids: list[int], device: torch.device) -> None:
    index = torch.tensor(ids, device=device)
    for t in group.layers:
        lead = t.shape[:1] if group.block_axis == 1 else ()
        rows = t.reshape(*lead, t.shape[group.block_axis], -1).view(torch.uint8)
        rows.index_fill_(group.block_axis, index, 0)


def timed(fn: object, device: torch.device) -> float:
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def bandwidth(chunk: int, runs: bool, total: int, device: torch.device) -> dict[str, float]:
    layers, tokens, blocks = 8, 16, 4
    width = chunk // (layers * blocks * 2 * tokens * 2)
    num_chunks = total // chunk
    num_blocks = 2 * num_chunks * blocks
    kv = tuple(torch.empty((num_blocks, 2, tokens, 1, width), dtype=torch.bfloat16,
                           device=device).normal_() for _ in range(layers))
    slab = allocate_slab(num_chunks, chunk, device)
    engine = TransferEngine(Layout((Group("full", tokens, blocks),)), [GroupKV(kv)], slab=slab)
    ids = chunk_ids(num_chunks, num_blocks, blocks, runs)
    copies = [ChunkCopy(0, i, ids[i]) for i in range(num_chunks)]
    dev = torch.empty(total, dtype=torch.uint8, device=device).random_(0, 256)
    host = torch.zeros(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    with engine:
        base_store = timed(lambda: host.copy_(dev, non_blocking=True), device)
        base_load = timed(lambda: dev.copy_(host, non_blocking=True), device)
        store = timed(lambda: engine.wait(engine.submit_store(copies)), device)
        load = timed(lambda: engine.wait(engine.submit_load(copies)), device)
    return {"store_ratio": base_store / store, "load_ratio": base_load / load,
            "store_gbps": total / store / 1e9, "load_gbps": total / load / 1e9,
            "copy_gbps": total / base_store / 1e9}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script")
    parser.add_argument("--mib", type=int, default=256, help="bytes per bandwidth job")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("cuda_check: no CUDA device visible to torch; nothing to check.")
        return 0
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)"
    print(f"device: {name}  torch {torch.__version__}")
    figures: dict[str, float | bool] = {}
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    dtypes += [torch.float8_e4m3fn] if hasattr(torch, "float8_e4m3fn") else []
    for dtype in dtypes:
        for shuffle in (False, True):
            for runs in (False, True):
                kind = ("shuffled" if shuffle else "slab") + ("_runs" if runs else "")
                key = f"roundtrip_{str(dtype).removeprefix('torch.')}_{kind}"
                figures[key] = round_trip(dtype, shuffle, runs, device)
                print(f"{key:<40} {'exact' if figures[key] else 'MISMATCH'}")
    print(f"\n{'chunk':<8}{'block ids':>10}{'store GB/s':>12}{'load GB/s':>11}{'copy GB/s':>11}"
          f"{'store x':>9}{'load x':>8}")
    for size, chunk in CHUNKS.items():
        for runs in (False, True):
            f = bandwidth(chunk, runs, args.mib << 20, device)
            prefix = f"{size}_runs" if runs else size
            figures.update({f"{prefix}_{k}": v for k, v in f.items()})
            print(f"{size:<8}{'runs' if runs else 'shuffled':>10}{f['store_gbps']:>12.2f}"
                  f"{f['load_gbps']:>11.2f}{f['copy_gbps']:>11.2f}{f['store_ratio']:>9.2f}"
                  f"{f['load_ratio']:>8.2f}")
    targets = {f"{n}_{d}_ratio": TARGET for n in ("256KiB", "2MiB") for d in ("store", "load")}
    exact = all(v for k, v in figures.items() if k.startswith("roundtrip"))
    met = exact and all(figures[k] >= v for k, v in targets.items())
    print(json.dumps({"benchmark": "transfer_cuda", "device": device.type, "figures": figures,
                      "targets": targets, "met": met}))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
