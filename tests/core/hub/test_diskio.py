"""A download's bytes around the page cache (k3desk.core.hub.diskio).

The oracles are the operating system's: what a plain ``read`` of the file gives
back, and what util-linux's ``fincore`` says is left in the page cache.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from k3desk.core.hub import diskio
from k3desk.core.hub.diskio import ALIGN, Sink, Source, aligned_buffer
from k3desk.core.hub.hashing import StreamHasher
from k3desk.core.hub.job import DownloadJob
from k3desk.core.hub.model import DownloadRequest
from tests.core.hub.test_hub_download import assert_landed, options
from tests.hubserver import HubServer, make_bytes


def _fs_type(folder: Path) -> str:
    return subprocess.run(
        ["stat", "-f", "-c", "%T", str(folder)], capture_output=True, text=True, check=True
    ).stdout.strip()


def _direct_possible(folder: Path) -> bool:
    """Whether the file system takes O_DIRECT (asked of the OS, not of diskio)."""
    probe = folder / "probe"
    probe.touch()
    try:
        os.close(os.open(probe, os.O_WRONLY | getattr(os, "O_DIRECT", 0)))
    except OSError:
        return False
    finally:
        probe.unlink()
    return hasattr(os, "O_DIRECT")


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    """A folder on a file system with its own page cache behind direct I/O (not tmpfs,
    whose files are the page cache)."""
    if _fs_type(tmp_path) == "tmpfs" or not _direct_possible(tmp_path):
        pytest.skip("the test folder's file system has no direct I/O")
    return tmp_path


def _pieces(data: bytes) -> list[tuple[int, memoryview]]:
    """The file cut as a transfer cuts it: an unaligned head, aligned buffers from
    page-aligned memory, a read-only piece, a piece at an odd address, the tail."""
    cuts = [0, 1000, ALIGN, ALIGN * 3, ALIGN * 4, ALIGN * 4 + 5000, ALIGN * 8, len(data)]
    out = []
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        if i == 3:
            view = memoryview(data[a:b])  # bytes: read-only
        elif i == 4:
            raw = bytearray(b - a + 1)
            raw[1:] = data[a:b]
            view = memoryview(raw)[1:]  # one byte past an allocation's start
        else:
            buf = aligned_buffer(b - a)
            buf[: b - a] = data[a:b]
            view = memoryview(buf)[: b - a]
        out.append((a, view))
    return out


def _write(path: Path, data: bytes, direct: bool = True) -> bool:
    path.write_bytes(b"")
    sink = Sink(path, direct=direct)
    try:
        for at, view in reversed(_pieces(data)):  # out of order, as windows land
            sink.pwrite(view, at)
        return sink.direct
    finally:
        sink.close()


def test_every_piece_lands_where_it_belongs_aligned_or_not(disk: Path) -> None:
    data = make_bytes(ALIGN * 9 + 123, 3)
    path = disk / "f.k3part"
    assert _write(path, data)  # direct I/O stayed on for the aligned pieces
    assert path.read_bytes() == data


@pytest.mark.parametrize("refused", ["open", "write"])
def test_a_file_system_that_refuses_direct_io_gets_ordinary_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: str
) -> None:
    real_open, real_pwrite = os.open, os.pwrite
    direct_fds: set[int] = set()

    def fake_open(path: Any, flags: int, *args: Any) -> int:
        if flags & diskio._O_DIRECT:
            if refused == "open":
                raise OSError(errno.EINVAL, "Invalid argument")
            fd = real_open(path, flags, *args)
            direct_fds.add(fd)
            return fd
        return real_open(path, flags, *args)

    def fake_pwrite(fd: int, data: Any, at: int) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, at)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "pwrite", fake_pwrite)
    data = make_bytes(ALIGN * 9 + 123, 4)
    path = tmp_path / "f.k3part"
    assert not _write(path, data)  # it gave up on direct I/O ...
    assert path.read_bytes() == data  # ... and lost nothing


def test_a_full_disk_is_an_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: Any, at: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "f.k3part"
    path.write_bytes(b"")
    sink = Sink(path)
    monkeypatch.setattr(os, "pwrite", full)
    buf = aligned_buffer(ALIGN)
    with pytest.raises(OSError, match="No space") as exc:
        sink.pwrite(memoryview(buf), 0)
    assert exc.value.errno == errno.ENOSPC
    sink.close()


@pytest.mark.parametrize("direct", [True, False])
def test_reading_back_gives_exactly_the_bytes_asked_for(tmp_path: Path, direct: bool) -> None:
    data = make_bytes(Source.BLOCK + ALIGN * 3 + 77, 5)
    path = tmp_path / "f.k3part"
    path.write_bytes(data)
    src = Source(path, direct=direct)
    try:
        for start, end in [
            (0, len(data)),
            (1, 2),
            (ALIGN - 1, ALIGN + 1),
            (777, Source.BLOCK + 5000),  # longer than one block: the block comes back
            (len(data) - 10, len(data) + ALIGN),  # past the end of the file
            (len(data), len(data) + 1),
        ]:
            got = bytes(src.read(start, end))
            want = data[start : min(end, start + Source.BLOCK)]
            assert got == want, (start, end)
    finally:
        src.close()


def _resident(path: Path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(shutil.which("fincore") is None, reason="util-linux fincore is missing")
@pytest.mark.parametrize("ranges", [1, 4])
@pytest.mark.parametrize("direct", [True, False])
def test_a_download_leaves_the_page_cache_to_the_rest_of_the_desktop(
    disk: Path, ranges: int, direct: bool
) -> None:
    """Streamed or in ranges (hashed by reading back), a download's bytes do not stay
    in memory; with ``direct_io=False`` they do, which shows ``fincore`` can tell."""
    files = {"big.gguf": make_bytes(6_000_001, 11)}
    with HubServer() as hub:
        hub.add_repo("o/big", dict(files.items()))
        opts = options(hub, ranges_per_file=ranges, range_window_bytes=1 << 20, direct_io=direct)
        DownloadJob(DownloadRequest("o/big", ("big.gguf",)), disk / "out", opts).run()
    resident = _resident(disk / "out" / "big.gguf")  # before reading it here
    assert_landed(disk / "out", files)
    if direct:
        assert resident <= 8 * ALIGN, resident  # the unaligned tail, a header read
    else:
        assert resident >= len(files["big.gguf"]) // 2, resident


@pytest.mark.parametrize("budget", [0, 1 << 20])
def test_chunks_written_out_of_order_hash_right_from_memory_or_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """Ranges land out of order: within the budget the hash takes them from memory
    and reads nothing back; with none, it reads each back.  Either way the digest is
    the file's, and every buffer lent to the hash comes back once."""
    data = make_bytes(9 * 65536 + 17, 6)
    path = tmp_path / "f.k3part"
    path.write_bytes(data)
    read_back: list[int] = []
    real_read = Source.read

    def counting(self: Source, start: int, end: int) -> memoryview:
        got = real_read(self, start, end)
        read_back.append(len(got))
        return got

    monkeypatch.setattr(Source, "read", counting)
    hasher = StreamHasher(path, "sha256", len(data))
    hasher.hold_up_to(budget)
    returned: list[int] = []
    cuts = [*range(0, len(data), 65536), len(data)]
    pieces = list(itertools.pairwise(cuts))
    for a, b in reversed(pieces):  # the last window first
        hasher.offer(memoryview(data)[a:b], a, functools.partial(returned.append, a))
    hasher.offer(memoryview(data)[0:65536], 0, functools.partial(returned.append, -1))  # again
    hasher.on_disk(len(data))
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()
    assert sorted(returned) == sorted([a for a, _ in pieces] + [-1])
    if budget:
        assert read_back == []
    else:
        assert sum(read_back) == len(data)
