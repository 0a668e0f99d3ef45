"""The small cases of the adversarial run (issue 29): each a clear ValueError that says what
is wrong and what to do, never a TypeError from deep inside, an input accepted silently, or
a misleading message; and the good case beside each, as the control."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtier.keys import ChunkKey, Namespace
from kvtier.layout import Group, Layout
from kvtier.planner import Planner
from kvtier.store import ChunkStore
from kvtier.tiers.disk.tier import DiskTier

KEY = ChunkKey(bytes(range(40)))


def disk(path: Path | str) -> DiskTier:
    return DiskTier(path, 1 << 20, 1024)


@pytest.mark.parametrize("bad", [bytearray(KEY), memoryview(KEY), KEY[:39], KEY.hex()])
def test_disk_put_refuses_a_key_that_is_not_40_bytes_as_get_does(tmp_path: Path, bad) -> None:
    tier = disk(tmp_path)
    for call in (lambda: tier.put([(bad, b"kv")]), lambda: tier.get([bad])):
        with pytest.raises(ValueError, match="a chunk key must be 40 bytes"):
            call()
    assert tier.put([(KEY, b"kv")]) == [KEY] and bytes(tier.get([KEY])[KEY]) == b"kv"
    tier.close()


@pytest.mark.parametrize(("path", "message"), [
    ("/", "is the file system's root; give the tier a directory of its own"),
    ("/dev/null", "is a character device, not a directory"),
])
def test_a_disk_path_that_is_no_directory_of_its_own_is_refused(path: str, message: str) -> None:
    before = sorted(os.listdir("/"))
    with pytest.raises(ValueError, match=message):
        disk(path)
    assert sorted(os.listdir("/")) == before  # no LOCK, no chunks/ at the root


def test_a_disk_path_that_is_a_file_or_a_link_to_the_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a user's file")
    (tmp_path / "root").symlink_to("/")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        disk(tmp_path / "file")
    with pytest.raises(ValueError, match="is the file system's root"):
        disk(tmp_path / "root")
    assert (tmp_path / "file").read_text() == "a user's file"


LAYOUT = Layout((Group("full", 16), Group("sliding_window", 16, window=32)))


def planner_with(tokens: int = 64) -> Planner:
    planner = Planner(LAYOUT, ChunkStore(64), Namespace("m"))
    planner.add_request("r", list(range(tokens)))
    return planner


def good_table(blocks: int = 4) -> list[list[int | None]]:
    return [list(range(blocks)), list(range(100, 100 + blocks))]


@pytest.mark.parametrize(("horizon", "table", "message"), [
    (64, [["0", 1, 2, 3], list(range(4))], r"group 0 holds '0' \(str\); a block id is an int"),
    (64, [[0.0, 1, 2, 3], list(range(4))], r"group 0 holds 0\.0 \(float\)"),
    (64, [[True, 1, 2, 3], list(range(4))], r"group 0 holds True \(bool\)"),
    (-1, good_table(), "horizon must be a token count >= 0, got -1"),
    (64, [list(range(4)), list(range(3))], "group 1's row has 3 blocks, 64 tokens fill 4"),
    (64, [list(range(4))], "needs one row per group \\(2\\), got 1"),
])
def test_planner_on_computed_refuses_what_cannot_be_right(horizon, table, message) -> None:
    planner = planner_with()
    with pytest.raises(ValueError, match=message):
        planner.on_computed("r", horizon, table)
    job = planner.on_computed("r", 64, good_table())  # the request is served as before
    assert job is not None and len(job.copies) > 0


def test_planner_on_computed_takes_freed_blocks_and_numpy_ids() -> None:
    np = pytest.importorskip("numpy")
    planner = planner_with()
    table = [list(np.arange(4)), [None, None, 102, 103]]  # the window freed two blocks
    job = planner.on_computed("r", 64, table)
    assert job is not None and {c.group for c in job.copies} == {0, 1}
