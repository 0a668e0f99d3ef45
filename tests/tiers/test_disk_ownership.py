"""The disk tier owns only what it wrote: symlinks at ``chunks`` or ``LOCK`` are refused,
never followed; foreign entries of ``chunks/`` (a user's files, subdirectories, symlinks,
files named like chunks) survive open, stores, evictions, reads, removal and close untouched;
a directory that turns read-only refuses stores and raises nothing."""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, SLOT, items, key, payload

from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.records.format import HEADER_BYTES


def open_disk(path: Path, chunks: int = 3) -> DiskTier:
    return DiskTier(path, chunks * (HEADER_BYTES + SLOT), SLOT, geometry=GEOMETRY)


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root`` (not following symlinks): its link target, listing or
    bytes."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir() or p.is_fifo():
                out[rel] = ("dir" if p.is_dir() else "fifo",)
            else:
                out[rel] = p.read_bytes()
    return out


def plant_foreign(chunks: Path, outside: Path) -> dict[str, object]:
    """A user's entries in ``chunks/``: plain files, one named like a chunk and one like a
    torn temporary, a subdirectory (one named like a chunk), symlinks (one to a valid
    record outside, named as its chunk), a FIFO. Returns their snapshot."""
    chunks.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    (chunks / "notes.txt").write_bytes(b"a user's notes")
    (chunks / key("fake").hex()).write_bytes(b"not a record, but named like one")
    (chunks / f"{key('torn').hex()}.tmp-1-2").write_bytes(b"no header")
    (chunks / "subdir").mkdir()
    (chunks / "subdir" / "inner.txt").write_bytes(b"inner")
    (chunks / key("dir").hex()).mkdir()
    (outside / "target.txt").write_bytes(b"outside the tier")
    (chunks / "link").symlink_to(outside / "target.txt")
    (chunks / key("linked").hex()).symlink_to(outside / "record")
    os.mkfifo(chunks / key("fifo").hex())
    return snapshot(chunks)


def a_record_of(tmp_path: Path, name: str) -> bytes:
    """The bytes of a genuine record of chunk ``name``, written by a tier elsewhere."""
    tier = open_disk(tmp_path / f"scratch-{name}")
    tier.put(items([name]))
    tier.close()
    return (tmp_path / f"scratch-{name}" / "chunks" / key(name).hex()).read_bytes()


def test_a_symlinked_chunks_directory_is_refused_and_its_target_untouched(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_bytes(b"keep me")
    (elsewhere / key("x").hex()).write_bytes(b"not a record")
    before = snapshot(elsewhere)
    (tmp_path / "disk").mkdir()
    (tmp_path / "disk" / "chunks").symlink_to(elsewhere)
    with pytest.raises(ValueError, match=r"chunks is not a plain directory.*symlink"):
        open_disk(tmp_path / "disk")
    assert snapshot(elsewhere) == before


@pytest.mark.parametrize("target_exists", [False, True])
def test_a_symlinked_lock_is_refused_and_nothing_is_created_elsewhere(tmp_path, target_exists):
    target = tmp_path / "elsewhere-lock"
    if target_exists:
        target.write_bytes(b"someone's file")
    (tmp_path / "disk").mkdir()
    (tmp_path / "disk" / "LOCK").symlink_to(target)
    with pytest.raises(ValueError, match="LOCK is a symlink, which is refused"):
        open_disk(tmp_path / "disk")
    assert target.exists() == target_exists
    assert not target_exists or target.read_bytes() == b"someone's file"


def test_chunks_that_is_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "disk").mkdir()
    (tmp_path / "disk" / "chunks").write_bytes(b"a file")
    with pytest.raises(ValueError, match="chunks is not a plain directory"):
        open_disk(tmp_path / "disk")


def test_foreign_entries_survive_every_operation_untouched(tmp_path):
    chunks, outside = tmp_path / "disk" / "chunks", tmp_path / "outside"
    before = plant_foreign(chunks, outside)
    (outside / "record").write_bytes(a_record_of(tmp_path, "linked"))
    outside_before = snapshot(outside)
    tier = open_disk(tmp_path / "disk", chunks=3)
    assert tier.stats.foreign == len([n for n in before if "/" not in n])
    assert not any(tier.might_hold(key(n)) for n in ("fake", "torn", "dir", "linked", "fifo"))
    assert tier.put(items("abcde")) == [key(n) for n in "abcde"]  # two evictions
    assert tier.stats.evicted == 2
    assert set(tier.get([key(n) for n in "cde"])) == {key(n) for n in "cde"}
    assert tier.get([key(n) for n in ("fake", "linked", "dir")]) == {}
    tier.remove([key("c")])
    tier.close()
    mine = {key(n).hex() for n in "de"}
    assert {n: v for n, v in snapshot(chunks).items() if n not in mine} == before
    assert snapshot(outside) == outside_before
    again = open_disk(tmp_path / "disk", chunks=3)  # and reopening serves only its own
    assert [again.might_hold(key(n)) for n in "de"] == [True, True]
    assert bytes(again.get([key("d")])[key("d")]) == payload("d")
    again.close()


def test_a_chunk_file_replaced_by_a_foreign_one_is_a_miss_and_kept(tmp_path):
    tier = open_disk(tmp_path)
    tier.put(items("ab"))
    chunk_a, chunk_b = (tmp_path / "chunks" / key(n).hex() for n in "ab")
    chunk_a.write_bytes(b"a user's file now")
    chunk_b.unlink()
    chunk_b.symlink_to(tmp_path / "somewhere")
    assert tier.get([key("a"), key("b")]) == {}
    assert tier.stats.foreign == 2 and tier.stats.corrupt == 0
    assert not tier.might_hold(key("a"))
    assert tier.put(items("a")) == []  # never written over the user's file
    assert chunk_a.read_bytes() == b"a user's file now" and chunk_b.is_symlink()
    assert not (tmp_path / "somewhere").exists()
    tier.check_invariants()


def test_an_evicted_chunk_whose_file_was_replaced_leaves_the_new_file_alone(tmp_path):
    tier = open_disk(tmp_path, chunks=2)
    tier.set_demote(lambda k, p: pytest.fail("a foreign file was handed down"))
    tier.put(items("ab"))
    chunk_a = tmp_path / "chunks" / key("a").hex()
    chunk_a.write_bytes(b"a user's file now")
    assert tier.put(items("c")) == [key("c")]  # evicts a, unread
    assert chunk_a.read_bytes() == b"a user's file now" and tier.stats.foreign == 1
    assert sorted(os.listdir(tmp_path / "chunks")) == sorted(key(n).hex() for n in "abc")


def test_own_leftovers_are_cleaned_torn_headers_too_and_look_alikes_kept(tmp_path):
    chunks = tmp_path / "chunks"
    chunks.mkdir()
    record = a_record_of(tmp_path, "t")
    (chunks / f"{key('t').hex()}.tmp-7-1").write_bytes(record[: HEADER_BYTES + 10])
    (chunks / f"{key('d').hex()}.drop-7-2").write_bytes(a_record_of(tmp_path, "d"))
    (chunks / f"{key('u').hex()}.tmp-7-3").write_bytes(b"")  # killed before its header
    (chunks / f"{key('v').hex()}.tmp-7-4").write_bytes(a_record_of(tmp_path, "v")[:36])
    kept = {f"{key('w').hex()}.tmp-7-5": a_record_of(tmp_path, "x")[:36],  # another key's
            f"{key('y').hex()}.tmp-7-6": b"KVTR?",  # not how a header goes on
            f"{key('z').hex()}": b""}  # a chunk's name is never torn: a record or foreign
    for name, data in kept.items():
        (chunks / name).write_bytes(data)
    open_disk(tmp_path).close()
    assert sorted(os.listdir(chunks)) == sorted(kept)


def read_only_scenario(path: Path) -> dict[str, object]:
    """Store a, b, c in a 3-chunk tier, make chunks/ read-only, store (with an eviction),
    read and remove; then reopen it writable. The outcome, for the parent to check."""
    tier = open_disk(path)
    tier.put(items("abc"))
    os.chmod(path / "chunks", 0o555)
    try:
        out = {"put": tier.put(items("de")), "put_async": tier.put_async(items("f")).result()}
        out["found"] = sorted(n for n in "abc" if key(n) in tier.get([key(n) for n in "abc"]))
        tier.remove([key("b")])
        out["refused"] = tier.stats.refused
        tier.close()
    finally:
        os.chmod(path / "chunks", 0o755)
    again = open_disk(path)
    out["files_after_reopen"] = len(os.listdir(path / "chunks"))
    out["served_after_reopen"] = [n for n in "abc" if again.get([key(n)])]
    again.close()
    return out


def in_unprivileged_child(scenario: Callable[[Path], object], path: Path) -> object:
    """``scenario(path)`` in a forked child that cannot ignore file modes (as nobody when
    the tests run as root); its result, or the child's traceback as a failure."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            message = json.dumps({"ok": scenario(path)})
            code = 0
        except BaseException:
            message = json.dumps({"error": traceback.format_exc()})
        finally:
            os.write(write, message.encode())
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        reply = json.loads(f.read())
    os.waitpid(pid, 0)
    assert "ok" in reply, reply["error"]
    return reply["ok"]


def test_a_read_only_directory_refuses_stores_and_raises_nothing():
    with tempfile.TemporaryDirectory() as base:
        os.chmod(base, 0o777)
        result = in_unprivileged_child(read_only_scenario, Path(base) / "disk")
    assert result == {
        "put": [], "put_async": [], "found": ["b", "c"], "refused": 3,
        "files_after_reopen": 3, "served_after_reopen": ["a", "b", "c"],
    }, result


def _open_unwritable(path: Path) -> str:
    try:
        open_disk(path).close()
    except ValueError as e:
        return str(e)
    return "opened"


def test_a_directory_the_process_cannot_write_says_so():
    """What a read-only file system meets too (the same branch, its own strerror): the
    message says the directory cannot be written, not that a symlink is refused."""
    with tempfile.TemporaryDirectory() as base:
        os.chmod(base, 0o777)
        locked = Path(base) / "locked"
        locked.mkdir(mode=0o555)
        said = in_unprivileged_child(
            lambda p: [_open_unwritable(p), _open_unwritable(p / "sub")], locked)
    assert said == [
        f"disk tier: cannot create {locked / 'LOCK'} (Permission denied); give a directory "
        "this process can write",
        f"disk tier: cannot create or open {locked / 'sub'} (Permission denied); give a "
        "directory this process can write",
    ], json.dumps(said)
