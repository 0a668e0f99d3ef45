"""A second OS process for the tier tests (run as a script, not collected).

    tier_child.py disk-stall <path> [<n>]    store chunk "whole", then write the first <n>
                                             bytes of chunk "torn"'s record (default: the
                                             header and half the payload), print "ready"
                                             and block until killed
    tier_child.py redis-put <url> <names..>  store the named chunks, print "done"
    tier_child.py redis-get <url> <names..>  print the names found, as JSON
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence

from tier_helpers import GEOMETRY, SLOT, items, key, payload

from kvtier.store.backend import BytesLike
from kvtier.tiers.disk.tier import DiskTier, write_all
from kvtier.tiers.redis.tier import RedisTier


def stall_after(size: int | None) -> Callable[[int, Sequence[BytesLike]], None]:
    """A writer that writes the first ``size`` bytes of the record (None: the header and
    half the payload), tells the parent, then blocks until killed."""

    def stall(fd: int, buffers: Sequence[BytesLike]) -> None:
        head, body = (memoryview(b).cast("B") for b in buffers)  # type: ignore[arg-type]
        whole = bytes(head) + bytes(body)
        write_all(fd, [whole[: head.nbytes + body.nbytes // 2 if size is None else size]])
        os.fsync(fd)
        print("ready", flush=True)
        sys.stdin.read()  # the parent kills us while we wait here

    return stall


def disk_stall(path: str, size: int | None) -> None:
    tier = DiskTier(path, 64 * SLOT, SLOT, geometry=GEOMETRY)
    tier.put(items(["whole"]))
    tier.close()
    stalling = DiskTier(path, 64 * SLOT, SLOT, geometry=GEOMETRY, writer=stall_after(size))
    stalling.put([(key("torn"), payload("torn"))])


def main(argv: list[str]) -> None:
    command, target, *names = argv
    if command == "disk-stall":
        disk_stall(target, int(names[0]) if names else None)
    elif command == "redis-put":
        RedisTier(target, geometry=GEOMETRY).put(items(names))
        print("done", flush=True)
    elif command == "redis-get":
        found = RedisTier(target, geometry=GEOMETRY).get([key(n) for n in names])
        print(json.dumps([n for n in names if key(n) in found]), flush=True)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
