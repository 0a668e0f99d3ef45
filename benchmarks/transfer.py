"""Store and load bandwidth of the transfer engine against one contiguous copy of the bytes.

Run: ``python benchmarks/transfer.py [--device cpu|cuda] [--mib 64]``.

Geometry: 4 bf16 layers ``[num_blocks, 2, 16, heads, dim]``, 4 blocks per chunk, so one
block of one layer is 1/16 of a chunk: 1 KiB at 16 KiB chunks, 16 KiB at 256 KiB, 128 KiB
at 2 MiB (for scale, a Llama-3.1-8B layer-block of 16 tokens is 64 KiB). The KV cache holds
twice the blocks a job moves. Each job moves ``--mib`` MiB of chunks between the KV tensors
and consecutive slab slots, with block ids either

* ``shuffled``: a random permutation (a fragmented block pool; no two blocks of a chunk
  adjacent): the figures the target applies to; or
* ``runs``: each chunk's blocks consecutive ids, chunks in random places (what a fresh
  allocator hands out), where each layer's blocks move as one run.

Baseline: one contiguous copy of the same byte count under the same memory conditions. The
store baseline copies ``--mib`` MiB from a source as large as the KV cache, at offsets that
alternate between its halves, into the slab the store job writes; the load baseline copies
the slab into a buffer as large as the KV cache, at alternating offsets. On the CPU it is
the faster of torch ``copy_`` (both cores) and numpy's memcpy; on CUDA ``copy_`` between the
device and pinned host memory. Before every timed run a 128 MiB write evicts the last-level
cache, so job and baseline both read cold memory. Jobs are timed from submit to ``wait``
returning (planning, queueing and the copies), baseline and jobs taking turns so that machine
noise hits them alike; each takes its best of ``REPEAT`` runs.

Prints a table, then one JSON line. Target: store and load each reach 0.8 of the baseline
for shuffled 256 KiB chunks and larger.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, TransferEngine, allocate_slab

CHUNK_SIZES = {"16KiB": 16 << 10, "256KiB": 256 << 10, "2MiB": 2 << 20}
TARGET = 0.8
LAYERS, TOKENS, BLOCKS = 4, 16, 4
REPEAT = 15
FLUSH_BYTES = 128 << 20


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_of(runs: dict[str, Callable[[], object]], device: torch.device) -> dict[str, float]:
    """Best time of each run, the runs taking turns so that noise hits them alike.

    Before each run, writing a buffer larger than the last-level cache evicts what the
    previous run left there, so no run reads bytes another one just brought into cache.
    """
    times: dict[str, list[float]] = {name: [] for name in runs}
    scratch = torch.empty(FLUSH_BYTES, dtype=torch.uint8)
    for i in range(REPEAT):
        for name, fn in runs.items():
            scratch.fill_(i)
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


class Rotating:
    """``nbytes`` at a time from (or into) a buffer twice as large, alternating halves.

    Example: ``Rotating(64 << 20, "cpu").next()`` is bytes 0..64 MiB of a 128 MiB buffer,
    the next call bytes 64..128 MiB, then 0..64 MiB again.
    """

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.buf = torch.randint(0, 256, (2 * nbytes,), dtype=torch.uint8, device=device)
        self.nbytes = nbytes
        self.half = 0

    def next(self) -> torch.Tensor:
        self.half ^= 1
        return self.buf[self.half * self.nbytes : (self.half + 1) * self.nbytes]


def block_ids(num_chunks: int, num_blocks: int, order: str) -> list[list[int]]:
    """``BLOCKS`` engine block ids per chunk, ``shuffled`` or as consecutive ``runs``.

    Example: 2 chunks of 16 blocks as runs might be ``[[8, 9, 10, 11], [0, 1, 2, 3]]``.
    """
    if order == "shuffled":
        ids = torch.randperm(num_blocks)[: num_chunks * BLOCKS].view(num_chunks, BLOCKS)
    else:
        starts = torch.randperm(num_blocks // BLOCKS)[:num_chunks] * BLOCKS
        ids = starts[:, None] + torch.arange(BLOCKS)
    return ids.tolist()


def setup(chunk: int, total: int, order: str, device: torch.device
          ) -> tuple[TransferEngine, list[ChunkCopy], torch.Tensor]:
    """An engine over 4 bf16 layers sized so that one chunk is ``chunk`` bytes; its copies
    of ``total`` bytes into consecutive slots, and the slab (flat) they write."""
    per_block = chunk // (LAYERS * BLOCKS)  # bytes of one block of one layer
    width = per_block // (2 * TOKENS * 2)  # heads * dim at bf16, K and V
    heads = max(1, width // 128)
    num_chunks = total // chunk
    num_blocks = 2 * num_chunks * BLOCKS
    layers = tuple(
        torch.randn((num_blocks, 2, TOKENS, heads, width // heads), device=device)
        .to(torch.bfloat16)
        for _ in range(LAYERS)
    )
    layout = Layout((Group("full", TOKENS, BLOCKS),))
    engine = TransferEngine(layout, [GroupKV(layers)])
    slab = allocate_slab(num_chunks, chunk, device).fill_(0)
    ids = block_ids(num_chunks, num_blocks, order)
    copies = [ChunkCopy(0, slab[i], tuple(ids[i])) for i in range(num_chunks)]
    return engine, copies, slab.view(-1)


def baselines(slab: torch.Tensor, device: torch.device) -> dict[str, Callable[[], object]]:
    """Contiguous copies of the slab's byte count: from a KV-sized source into the slab
    (store), and from the slab into a KV-sized destination (load), rotating halves."""
    pool = Rotating(slab.numel(), device)
    runs: dict[str, Callable[[], object]] = {
        "copy_store": lambda: slab.copy_(pool.next(), non_blocking=True),
        "copy_load": lambda: pool.next().copy_(slab, non_blocking=True),
    }
    if device.type == "cpu":  # numpy's memcpy, when faster than copy_, is the baseline
        runs["np_store"] = lambda: np.copyto(slab.numpy(), pool.next().numpy())
        runs["np_load"] = lambda: np.copyto(pool.next().numpy(), slab.numpy())
    return runs


def measure(chunk: int, order: str, total: int, device: torch.device) -> dict[str, float]:
    engine, copies, slab = setup(chunk, total, order, device)
    runs = baselines(slab, device)
    runs["store"] = lambda: engine.wait(engine.submit_store(copies))
    runs["load"] = lambda: engine.wait(engine.submit_load(copies))
    with engine:
        t = best_of(runs, device)
    base_store = min(t["copy_store"], t.get("np_store", math.inf))
    base_load = min(t["copy_load"], t.get("np_load", math.inf))
    store, load = t["store"], t["load"]
    return {
        "store_ratio": base_store / store, "load_ratio": base_load / load,
        "store_gbps": total / store / 1e9, "load_gbps": total / load / 1e9,
        "copy_gbps": total / base_store / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        print("on CUDA the baseline is copy_ between the device and pinned host memory")
    total = args.mib << 20
    figures: dict[str, float] = {}
    print(f"{args.mib} MiB per job on {device}; x = contiguous-copy time / job time "
          "(baseline: see the module docstring)\n")
    print(f"{'chunk':<8}{'block ids':>10}{'store GB/s':>12}{'load GB/s':>11}{'copy GB/s':>11}"
          f"{'store x':>9}{'load x':>8}")
    for size, chunk in CHUNK_SIZES.items():
        for order in ("shuffled", "runs"):
            f = measure(chunk, order, total, device)
            prefix = size if order == "shuffled" else f"{size}_runs"
            figures.update({f"{prefix}_{k}": v for k, v in f.items()})
            print(f"{size:<8}{order:>10}{f['store_gbps']:>12.2f}{f['load_gbps']:>11.2f}"
                  f"{f['copy_gbps']:>11.2f}{f['store_ratio']:>9.2f}{f['load_ratio']:>8.2f}")
    targets = {f"{n}_{d}_ratio": TARGET for n in ("256KiB", "2MiB") for d in ("store", "load")}
    met = all(figures[k] >= v for k, v in targets.items())
    print("\nTargets apply to shuffled ids; 16KiB is reported, not targeted: 1 KiB layer-blocks "
          "and per-copy overhead dominate there.")
    print(json.dumps({"benchmark": "transfer", "figures": figures, "targets": targets,
                      "met": met}))


if __name__ == "__main__":
    main()
