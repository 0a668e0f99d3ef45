"""The disk tier's directory: what it may touch, and how, when others share the directory.

A cache directory is often shared with other software and sometimes writable by others, so
the disk tier owns only what it can prove it wrote:

* ``<path>/chunks`` and ``<path>/LOCK`` are opened without following symlinks (a symlink
  there is refused with a ValueError, never followed), and every file operation after that
  is relative to the open ``chunks`` directory, so swapping a path component for a symlink
  later redirects nothing. Chunk files are opened with ``O_NOFOLLOW`` and must be regular
  files; new ones are created with ``O_EXCL``.
* An entry of ``chunks/`` is the tier's own only if its name is one the tier writes
  (``<key hex>``, ``<key hex>.tmp-<pid>-<n>``, ``<key hex>.drop-<pid>-<n>``) *and* it is a
  regular file that starts with a kvtier record header (magic and header checksum intact)
  claiming that key, or, for a temporary or a drop only, is shorter than a header and is
  how one for that key begins as far as it goes (empty included: a write killed before its
  header was whole; ``torn_header_of``). Anything else (a user's file, a subdirectory, a
  symlink, a file of another name however like) is *foreign*: never read as a chunk, never
  renamed, never deleted, only counted.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     chunks = ChunkDir(Path(d))
...     _ = (Path(d) / "chunks" / "notes.txt").write_text("a user's file")
...     [(entry.name, entry.key) for entry in chunks.scan()]
...     chunks.close()
[('notes.txt', None)]
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from kvtier.keys import ChunkKey
from kvtier.store.backend import BytesLike
from kvtier.store.results import KEY_BYTES
from kvtier.tiers.records.format import HEADER_BYTES, claimed_key, torn_header_of

Writer = Callable[[int, Sequence[BytesLike]], None]
"""Writes buffers, in order, to an open file descriptor (a seam for fault tests)."""


def write_all(fd: int, buffers: Sequence[BytesLike]) -> None:
    """Write every buffer to ``fd`` in order, retrying short writes (the default
    ``Writer``)."""
    for buf in buffers:
        view = memoryview(buf).cast("B")  # type: ignore[arg-type]
        while view:
            view = view[os.write(fd, view):]

_NAME = re.compile(rf"^([0-9a-f]{{{2 * KEY_BYTES}}})(?:\.(tmp|drop)-\d+-\d+)?$")
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def record_path(root: Path, key: ChunkKey) -> Path:
    """Where a disk tier opened on ``root`` publishes ``key``'s record: ``<root>/chunks/<key
    hex>`` (its name appears only once the record is whole and durable). Another process
    may ``stat`` it to learn, without opening the tier, whether the tier holds the chunk."""
    return root / "chunks" / key.hex()


class NotOurs(OSError):
    """A chunk-named entry that is not a regular file the tier wrote: left alone."""


@dataclass(frozen=True)
class Entry:
    """One entry of ``chunks/`` as the tier sees it at open."""

    name: str
    key: ChunkKey | None
    """The key its name and header agree on; None for a foreign entry."""
    leftover: bool
    """A temporary or renamed-aside drop of the tier's own (delete it)."""
    size: int
    mtime_ns: int


class ChunkDir:
    """``<path>/chunks``, opened safely, and ``<path>/LOCK`` held (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        _check_path(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise ValueError(f"disk tier: cannot create or open {path} ({e.strerror}); give "
                             "a directory this process can write") from None
        try:
            self._lock = _lock(path, top)
            self.fd = _open_chunks(path, top)
        except BaseException:
            if getattr(self, "_lock", None) is not None:
                os.close(self._lock)
            raise
        finally:
            os.close(top)

    def scan(self) -> Iterator[Entry]:
        """Every entry of ``chunks/``, classified (own record, own leftover, or foreign)."""
        with os.scandir(self.fd) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                match = _NAME.match(e.name)
                key = None
                if match and stat.S_ISREG(st.st_mode):
                    named = ChunkKey(bytes.fromhex(match.group(1)))
                    aside = match.group(2) is not None
                    key = named if self._ours(e.name, named, st.st_size, aside) else None
                leftover = key is not None and match is not None and match.group(2) is not None
                yield Entry(e.name, key, leftover, st.st_size, st.st_mtime_ns)

    def _ours(self, name: str, key: ChunkKey, size: int, aside: bool) -> bool:
        """Whether regular file ``name`` is the tier's (module docstring); ``aside``: a
        temporary or a drop, which a kill may have left torn before its header."""
        if size >= HEADER_BYTES:
            return self.claims(name, key)
        try:
            return aside and torn_header_of(self.read(name, HEADER_BYTES), key)
        except OSError:
            return False

    def claims(self, name: str, key: ChunkKey) -> bool:
        """Whether file ``name`` starts with a kvtier record header for ``key``."""
        try:
            return claimed_key(self.read(name, HEADER_BYTES)) == key
        except OSError:
            return False

    def read(self, name: str, limit: int) -> bytes:
        """Up to ``limit + 1`` bytes of regular file ``name`` (so that a file longer than
        ``limit`` shows as such); ``NotOurs`` for anything but a regular file."""
        fd = self._open_regular(name)
        try:
            chunks, left = [], limit + 1
            while left > 0 and (piece := os.read(fd, left)):
                chunks.append(piece)
                left -= len(piece)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read_into(self, name: str, buffers: Sequence[memoryview]) -> int:
        """Regular file ``name`` read into ``buffers`` in turn, as far as they reach (one
        ``preadv`` for a whole file); the bytes read. ``NotOurs`` as ``read``."""
        fd = self._open_regular(name)
        try:
            done, room = 0, sum(b.nbytes for b in buffers)
            while done < room and (n := os.preadv(fd, _past(buffers, done), done)):
                done += n
            return done
        finally:
            os.close(fd)

    def _open_regular(self, name: str) -> int:
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symlink: never followed
                raise NotOurs(f"{name} is a symlink") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotOurs(f"{name} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def create(self, name: str, buffers: Sequence[BytesLike], writer: Writer,
               fsync: bool) -> None:
        """Write a new file ``name`` (``O_EXCL``: never an existing one) from ``buffers``;
        on failure the file is removed again."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644, dir_fd=self.fd)
        try:
            try:
                writer(fd, buffers)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            self.unlink(name)
            raise

    def publish(self, tmp: str, name: str, *, keep: bool = False) -> None:
        """Rename ``tmp`` to ``name`` unless an entry already holds that name (a foreign
        one: the tier never replaces a file it did not write); ``NotOurs`` then, and
        ``tmp`` is deleted (or kept, with ``keep``)."""
        if self.exists(name):
            if not keep:
                self.unlink(tmp)
            raise NotOurs(f"{name} is taken by an entry the tier did not write")
        self.rename(tmp, name)

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> bool:
        """Delete ``name``; False if it could not be (already gone, or no permission)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            return False
        return True

    def sync(self) -> None:
        """fsync the directory (publishes renames durably)."""
        os.fsync(self.fd)

    def close(self) -> None:
        """Release the directory and its lock (idempotent)."""
        for attr in ("fd", "_lock"):
            fd = getattr(self, attr)
            if fd >= 0:
                with suppress(OSError):
                    os.close(fd)
                setattr(self, attr, -1)


_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFREG: "a file"}


def _check_path(path: Path) -> None:
    """``ValueError`` for a path the tier must not fill: the file system's root (its
    ``chunks/`` and ``LOCK`` would sit among the system's own), or anything but a
    directory (``/dev/null``)."""
    real = Path(os.path.realpath(path))
    if real == real.parent:
        raise ValueError(f"disk tier: {path} is the file system's root; give the tier a "
                         "directory of its own (e.g. /var/cache/kvtier)")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # not there yet: created (or refused with its reason) next
    if not stat.S_ISDIR(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a directory")
        raise ValueError(f"disk tier: {path} is {kind}, not a directory; give a directory "
                         "for the tier's files")


def _lock(path: Path, top: int) -> int:
    """Open ``LOCK`` without following a symlink and take an exclusive ``flock`` on it."""
    try:
        fd = os.open("LOCK", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=top)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(
                f"disk tier: {path / 'LOCK'} is a symlink, which is refused, never followed: "
                "remove it or choose another path") from None
        raise ValueError(  # a read-only file system, no permission, no space...
            f"disk tier: cannot create {path / 'LOCK'} ({e.strerror}); give a directory "
            "this process can write") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"disk tier: {path / 'LOCK'} is not a regular file; remove it")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(
            f"disk tier: {path} is in use by another process; give each process its own path"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_chunks(path: Path, top: int) -> int:
    """``chunks/`` under ``top``, created if missing; a symlink or a file there is refused."""
    try:
        os.mkdir("chunks", 0o755, dir_fd=top)
    except FileExistsError:
        pass  # a directory (opened below), or something refused below
    except OSError as e:
        raise ValueError(f"disk tier: cannot create {path / 'chunks'}: {e.strerror}") from None
    try:
        return os.open("chunks", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=top)
    except OSError as e:
        raise ValueError(
            f"disk tier: {path / 'chunks'} is not a plain directory ({e.strerror}); a symlink "
            "there is refused, never followed: remove it or choose another path"
        ) from None


def _past(buffers: Sequence[memoryview], skip: int) -> list[memoryview]:
    """``buffers`` less their first ``skip`` bytes in all (a read that stopped short)."""
    out = []
    for b in buffers:
        if skip >= b.nbytes:
            skip -= b.nbytes
            continue
        out.append(b[skip:])
        skip = 0
    return out
