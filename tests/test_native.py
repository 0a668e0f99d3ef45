"""``kvtier._native``, the compiled build's C loops, against the Python they replace.

Skipped in the pure build (the module is only built with ``KVTIER_COMPILE=1``); CI's second
run has it (tests/test_buildinfo.py fails there if it is missing).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import os
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvtier.keys
from kvtier.keys import KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.replay.refs import ReplayChain, replay_namespace, token_stream

_native = pytest.importorskip("kvtier._native", reason="built only by KVTIER_COMPILE=1")


def spine_by_hashlib(seed: bytes, data: bytes, step: int) -> list[bytes]:
    h, out = hashlib.sha256(seed), []
    for end in range(step, len(data) + 1, step):
        h.update(data[end - step : end])
        out.append(h.digest())
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=5000), step=st.integers(1, 700),
       cuts=st.lists(st.integers(0, 5000), max_size=6))
def test_spine_digests_equal_hashlib_however_the_stream_is_cut(
        data: bytes, step: int, cuts: list[int]) -> None:
    state, filled, got = _native.sha256_start(b"seed"), 0, []
    edges = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    for lo, hi in itertools.pairwise(edges):
        digests, filled = _native.sha256_spine(state, data[lo:hi], filled, step)
        got += digests
    assert got == spine_by_hashlib(b"seed", data, step)
    assert filled == len(data) % step


def test_a_feed_long_enough_to_hash_without_the_gil_agrees() -> None:
    """300 KB, past the size from which the C loop lets go of the GIL: same digests."""
    data = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8)
    digests, filled = _native.sha256_spine(_native.sha256_start(b""), data, 0, 1024)
    assert digests == spine_by_hashlib(b"", data.tobytes(), 1024)
    assert filled == 300_000 % 1024


@pytest.mark.parametrize("layout", [
    Layout((Group("full", 16),)),
    Layout((Group("full", 16, 4), Group("sliding_window", 32, 2, window=100))),
    Layout((Group("full", 16), Group("full", 16, lookahead=2))),
], ids=["full", "hybrid", "draft"])
def test_keys_are_the_same_with_and_without_the_c_loop(
        layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = np.random.default_rng(2).integers(0, 150_000, 5000, dtype=np.uint32)
    ns = Namespace("m", tenant_salt="t")

    def all_keys() -> list[list[object]]:
        chain = KeyChain(layout, ns, tokens[:3001])
        for i in range(3001, 5000, 7):  # a prompt, then decoding-sized appends
            chain.extend(tokens[i : i + 7].tolist())
        return [[chain.key(g, c) for c in range(5000 // grp.tokens_per_chunk)]
                for g, grp in enumerate(layout.groups)]

    native = all_keys()
    monkeypatch.setattr(kvtier.keys, "_native", None)
    assert all_keys() == native
    assert all(k is not None for keys in native for k in keys[:-1])


def test_bad_spine_arguments_are_clear_errors() -> None:
    state = _native.sha256_start(b"")
    with pytest.raises(ValueError, match="state must come from sha256_start"):
        _native.sha256_spine(bytearray(7), b"abc", 0, 4)
    forged = bytearray(b"\xff" * len(state))  # a buffered-byte count OpenSSL would trust
    with pytest.raises(ValueError, match="state must come from sha256_start"):
        _native.sha256_spine(forged, b"x" * 100, 0, 1000)
    with pytest.raises(ValueError, match="0 <= filled < step"):
        _native.sha256_spine(state, b"abc", 4, 4)
    with pytest.raises(ValueError, match="0 <= filled < step"):
        _native.sha256_spine(state, b"abc", 0, 0)
    assert _native.sha256_spine(state, b"", 0, 4) == ([], 0)


@settings(max_examples=80, deadline=None)
@given(block=st.integers(1, 9), chunk=st.integers(1, 12), seed=st.integers(0, 2**32),
       cut=st.integers(0, 60))
def test_replay_chain_digests_are_the_same_with_and_without_the_c_loop(
        block: int, chunk: int, seed: int, cut: int) -> None:
    """``sha256_blocks`` against ``ReplayChain._feed``'s Python loop, fed by ids and by
    tokens, units that do and do not divide a block."""
    layout = Layout((Group("full", chunk),))
    rng = random.Random(seed)
    ids = tuple(rng.choice([3, 2**32 + 3, 2**64 - 1]) for _ in range(7))
    n = 7 * block

    def keys() -> list[object]:
        chain = ReplayChain(layout, replay_namespace(layout), block)
        chain.extend_blocks(ids, min(cut, n))
        chain.extend(token_stream(ids, block)[min(cut, n) : n - 1])
        chain.extend_blocks(ids, n)
        return chain.keys(0, range(n // chunk))

    native = keys()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kvtier.keys, "_native", None)
        assert keys() == native


def test_bad_block_digest_arguments_are_clear_errors() -> None:
    prefix, heads = bytes(32), bytes(range(16))
    at_2 = hashlib.sha256(prefix + heads[:8] + (2).to_bytes(8, "little")).digest()
    at_4 = hashlib.sha256(at_2 + heads[8:16] + (2).to_bytes(8, "little")).digest()
    assert _native.sha256_blocks(prefix, heads, 0, 4, 0, 2, 2) == ([at_2, at_4], at_4)
    with pytest.raises(ValueError, match="32-byte prefix"):
        _native.sha256_blocks(bytes(31), heads, 0, 4, 0, 2, 2)
    for start, end, first, width, unit in ((0, 4, 0, 0, 2), (0, 4, 0, 2, 0), (2, 4, 0, 2, 2),
                                           (0, 0, 0, 2, 2), (0, 4, -1, 2, 2),
                                           (0, 2**62, 0, 2, 2), (0, 4, 0, 2, 2**62),
                                           (2**40, 2**40 + 4, 2**40, 2**30, 2)):
        with pytest.raises(ValueError, match="first \\* width <= start"):
            _native.sha256_blocks(prefix, heads, start, end, first, width, unit)
    with pytest.raises(ValueError, match="8 head bytes per block"):
        _native.sha256_blocks(prefix, heads, 0, 5, 0, 2, 2)  # 3 blocks, 2 heads


def addr(a: np.ndarray, offset: int = 0) -> int:
    return int(a.ctypes.data) + offset


@pytest.mark.parametrize("length", [0, 1, 15, 255, 256, 257, 1000, 4096, 65_537])
@pytest.mark.parametrize("dst_off", [0, 1, 8, 13])
@pytest.mark.parametrize("src_off", [0, 3, 16])
def test_copy_moves_exactly_its_ranges(length: int, dst_off: int, src_off: int) -> None:
    rng = np.random.default_rng(length + dst_off)
    src = rng.integers(0, 256, 2 * length + 64, dtype=np.uint8)
    dst = np.zeros_like(src)
    # two ranges: the second starts where the first ends in dst, from elsewhere in src
    d = np.array([addr(dst, dst_off), addr(dst, dst_off + length)], np.int64)
    s = np.array([addr(src, src_off + length), addr(src, src_off)], np.int64)
    _native.copy(d, s, np.array([length, length], np.int64))
    want = np.zeros_like(src)
    want[dst_off : dst_off + length] = src[src_off + length : src_off + 2 * length]
    want[dst_off + length : dst_off + 2 * length] = src[src_off : src_off + length]
    np.testing.assert_array_equal(dst, want)  # and not one byte outside them


def test_bad_copy_arguments_are_clear_errors() -> None:
    one = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="differ in length"):
        _native.copy(one, one, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="negative"):
        _native.copy(one, one, np.array([-1], np.int64))
    with pytest.raises(ValueError, match="8-byte integers"):
        _native.copy(np.zeros(1, np.int32), one, one)
    with pytest.raises(ValueError, match="8-byte integers"):
        _native.copy(np.zeros((1, 1), np.int64), one, one)
    with pytest.raises(ValueError, match="8-byte integers"):  # 8 bytes, but not addresses
        _native.copy(np.zeros(1), one, np.ones(1, np.int64))
    _native.copy(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))


@pytest.mark.parametrize("grain", [1, 3, 64, 1000])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_threads_sharing_a_cursor_copy_every_range_once(threads: int, grain: int) -> None:
    """200 ranges of random lengths, shared out ``grain`` at a time: the result is what one
    plain copy gives, and the cursor ends past the last range."""
    rng = np.random.default_rng(threads * 1000 + grain)
    lengths = rng.integers(0, 3000, 200).astype(np.int64)
    src = rng.integers(0, 256, int(lengths.sum()), dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    order = rng.permutation(200)  # each range lands somewhere else in dst
    dst_starts = np.concatenate(([0], np.cumsum(lengths[order])[:-1]))[np.argsort(order)]
    want, got = np.zeros_like(src), np.zeros_like(src)
    s = int(src.ctypes.data) + starts
    _native.copy(int(want.ctypes.data) + dst_starts, s, lengths)
    cursor = np.zeros(1, np.int64)
    d = int(got.ctypes.data) + dst_starts
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(_native.copy, d, s, lengths, cursor, grain) for _ in range(threads)]:
            f.result()
    np.testing.assert_array_equal(got, want)
    step = min(grain, 200)  # a grain past the end takes every range at once
    claims = -(-200 // step) + threads  # every range's claim, then each thread's last try
    assert int(cursor[0]) == claims * step


def test_bad_cursor_arguments_are_clear_errors() -> None:
    one = np.zeros(1, np.int64)
    bad = "cursor must be one aligned, writable, non-negative int64"
    with pytest.raises(ValueError, match=bad):
        _native.copy(one, one, one, np.zeros(2, np.int64), 1)
    with pytest.raises(ValueError, match=bad):
        _native.copy(one, one, one, np.array([-(2**40)], np.int64), 1)
    read_only = np.zeros(1, np.int64)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=bad):
        _native.copy(one, one, one, read_only, 1)
    with pytest.raises(ValueError, match=bad):  # 8 bytes, but not 8-byte aligned
        _native.copy(one, one, one, np.zeros(9, np.uint8)[1:].view(np.int64), 1)
    for not_int64 in (np.zeros(1), bytearray(8), np.zeros(8, np.uint8)):
        with pytest.raises(ValueError, match="cursor must be a 1-D buffer of 8-byte integers"):
            _native.copy(one, one, one, not_int64, 1)
    with pytest.raises(ValueError, match="grain must be at least 1, got 0"):
        _native.copy(one, one, one, np.zeros(1, np.int64), 0)


def test_a_huge_grain_takes_every_range_once_and_never_wraps_the_cursor() -> None:
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros_like(src)
    cursor = np.zeros(1, np.int64)
    d = np.array([addr(dst), addr(dst, 32)], np.int64)
    s = np.array([addr(src, 32), addr(src)], np.int64)
    for _ in range(3):  # later calls find the cursor spent and copy nothing
        _native.copy(d, s, np.array([32, 32], np.int64), cursor, 2**63 - 1)
    np.testing.assert_array_equal(dst, np.concatenate((src[32:], src[:32])))
    assert int(cursor[0]) == 4 * 2  # the grain is cut to the 2 ranges: 1 claim + 3 tries


def test_cpu_is_one_this_thread_may_run_on() -> None:
    cpu = _native.cpu()
    if hasattr(os, "sched_getaffinity"):
        assert cpu in os.sched_getaffinity(0)
    else:
        assert cpu >= -1


# ---- recv_values: Redis GET replies read into place ----------------------------------------

HEAD = 8


def _replies(values: list[bytes | str | None]) -> bytes:
    """The wire bytes of GET replies: a value, a missing key, or (a str) an error."""
    out = []
    for v in values:
        if v is None:
            out.append(b"$-1\r\n")
        elif isinstance(v, str):
            out.append(b"-" + v.encode() + b"\r\n")
        else:
            out.append(b"$%d\r\n%s\r\n" % (len(v), v))
    return b"".join(out)


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.binary(max_size=3000), st.just("ERR x")),
                       min_size=1, max_size=6),
       slot=st.integers(0, 2000), cuts=st.lists(st.integers(1, 4000), max_size=8))
def test_recv_values_takes_values_that_fit_and_stops_before_anything_else(
        values: list[bytes | str | None], slot: int, cuts: list[int]) -> None:
    """The stream sent in pieces cut anywhere: each value that fits ``HEAD + slot`` bytes
    lands in its view (head apart), a missing key is None, and the first error or value too
    long stops the reading with that reply's bytes handed back whole."""
    import socket
    import threading

    wire = _replies(values)
    a, b = socket.socketpair()
    pieces = [wire[i:j] for i, j in itertools.pairwise(
        sorted({0, len(wire), *(c for c in cuts if c < len(wire))}))]
    writer = threading.Thread(target=lambda: [a.sendall(p) for p in pieces])
    writer.start()
    views = [memoryview(bytearray(slot)) for _ in values]
    try:
        heads, bodies, rest = _native.recv_values(b.fileno(), 5.0, b"", views, HEAD,
                                                   [b""] * len(views))
    finally:
        writer.join()
    stop = next((i for i, v in enumerate(values) if isinstance(v, str)
                 or (isinstance(v, bytes) and len(v) > HEAD + slot)), len(values))
    assert len(heads) == len(bodies) == stop
    for i in range(stop):
        v = values[i]
        if v is None:
            assert (heads[i], bodies[i]) == (None, -1)
        else:
            assert isinstance(v, bytes)
            assert heads[i] == v[:HEAD] and bodies[i] == len(v) - len(heads[i])
            assert bytes(views[i][: bodies[i]]) == v[HEAD:]
    left = _replies(values[stop:])
    if stop < len(values):  # what was read of the replies not taken, from their start
        assert rest == left[: len(rest)] and len(rest) > 0
    else:
        assert rest == b""
    a.close()
    b.close()


def test_recv_values_times_out_and_sees_a_closed_connection() -> None:
    import socket

    a, b = socket.socketpair()
    a.sendall(b"$10\r\nabc")  # a value cut short, then silence
    with pytest.raises(TimeoutError):
        _native.recv_values(b.fileno(), 0.05, b"", [memoryview(bytearray(16))], HEAD, [b""])
    a.sendall(b"$10\r\nabc")
    a.close()  # then the connection ends
    with pytest.raises(ConnectionError):
        _native.recv_values(b.fileno(), 5.0, b"", [memoryview(bytearray(16))], HEAD, [b""])
    b.close()


def test_recv_values_writes_each_send_once_its_reply_starts() -> None:
    """``sends[i]`` goes out after reply ``i``'s line and before its value is read: a peer
    that withholds each value until it has read that reply's send gets every one, in order,
    and nothing for the reply the reader stops at (the Python reader's to send)."""
    import socket
    import threading

    values: list[bytes | str | None] = [b"v" * 3000, None, b"w" * 40, "ERR stop"]
    sends = [b"GET 2\r\n", b"", b"GET 3\r\nGET 4\r\n", b"never"]
    a, b = socket.socketpair()
    a.settimeout(5.0)
    heard: list[bytes] = []

    def peer() -> None:
        for v, send in zip(values, sends[:3], strict=False):
            reply = _replies([v])
            line = reply.index(b"\r\n") + 2
            a.sendall(reply[:line])
            got = b""
            while len(got) < len(send):
                got += a.recv(len(send) - len(got))
            heard.append(got)
            a.sendall(reply[line:])
        a.sendall(_replies(values[3:]))

    writer = threading.Thread(target=peer)
    writer.start()
    views = [memoryview(bytearray(4096)) for _ in values]
    try:
        heads, bodies, rest = _native.recv_values(b.fileno(), 5.0, b"", views, HEAD, sends)
    finally:
        writer.join()
    assert heard == sends[:3]
    assert len(heads) == 3 and bodies[1] == -1 and rest == b"-ERR stop\r\n"
    assert bytes(views[0][: bodies[0]]) == b"v" * (3000 - HEAD)
    a.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing was sent for the reply not taken
        a.recv(16)
    with pytest.raises(ValueError, match="one send per view"):
        _native.recv_values(b.fileno(), 5.0, b"", views, HEAD, [])
    a.close()
    b.close()


def test_recv_values_hands_back_a_too_long_value_from_its_line_read_in_pieces() -> None:
    """A value too long for its view, its length line arriving in two pieces after the
    reader's buffer held a reply before it: the reply is handed back from its first byte."""
    import socket
    import threading

    first, long = _replies([b"x" * 10]), _replies([b"y" * 3000])
    a, b = socket.socketpair()
    a.settimeout(5.0)

    def peer() -> None:
        a.sendall(first + long[:3])
        assert a.recv(2) == b"go"  # sent once the first reply started: the reader waits on
        a.sendall(long[3:])

    writer = threading.Thread(target=peer)
    writer.start()
    views = [memoryview(bytearray(100)) for _ in range(2)]
    try:
        heads, bodies, rest = _native.recv_values(b.fileno(), 5.0, b"", views, HEAD,
                                                  [b"go", b""])
    finally:
        writer.join()
    assert len(heads) == 1 and bodies == [10 - HEAD]
    assert long.startswith(rest) and rest.startswith(b"$3000\r\n")
    a.close()
    b.close()
