"""A download's bytes to the disk and back without the page cache, where the file system allows.

A download writes each byte once and reads it back at most once (to hash what
arrived out of order, or the prefix of a resumed file); the page cache buys it
nothing, and filling it costs a page allocation and a copy per 4 KiB.  Measured
with ``bench/download.py`` on a 2-core VM (README, "Downloads: where the time
goes"): writing 1 GiB through the page cache of ext4 took 1.4-3 CPU seconds,
with ``O_DIRECT`` 0.15, and a 300 GB download through the cache would also push
out everything else the desktop had cached.

Direct I/O needs the memory address, the file offset and the length aligned to
the device's logical block (``ALIGN``, the page size, is a multiple of it).
:class:`Sink` and :class:`Source` use a second, ordinary descriptor of the same
file for what is not aligned (a file's last bytes, a resume from an odd offset);
Linux keeps the two coherent: a direct write or read first writes back and drops
the cached pages it overlaps (``generic_file_direct_write``,
``kiocb_write_and_wait``).  Where ``O_DIRECT`` is refused (EINVAL when opening or
on the first transfer: tmpfs before Linux 6.6, some FUSE and network file
systems), everything goes through the ordinary descriptor, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import threading
from pathlib import Path

from k3desk.core.private import open_regular

ALIGN = max(4096, mmap.PAGESIZE)
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)


# private (not shmem: the pages pin faster for direct I/O) and mapped in one call
# where the platform has the flags: the first touch of fresh memory faults once per
# 4 KiB, and measured on a 2-core VM a fresh 4 MiB buffer cost 3.1 ms as a shared
# mapping, 2.0 ms private, 1.5 ms private and populated, 0.1 ms reused (transparent
# huge pages: 9.6 ms, so not asked for)
_PRIVATE: int | None = (
    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")
    else None
)


def aligned_buffer(size: int) -> mmap.mmap:
    """``size`` bytes of anonymous memory: page-aligned, as direct I/O needs."""
    if _PRIVATE is None:
        return mmap.mmap(-1, max(size, ALIGN))
    return mmap.mmap(-1, max(size, ALIGN), flags=_PRIVATE)


class BufferPool:
    """Aligned buffers of one size for the whole of a download, reused by every file
    and window: fresh memory costs 15-30 times a reused buffer's (see ``_PRIVATE``),
    so a download touches its buffers once, not once per file.  It holds at most
    what was in use at once (the hash's queue and hold limits bound that), until
    the download ends."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return aligned_buffer(self.size)

    def give(self, buf: mmap.mmap) -> None:
        """``buf`` (from :meth:`take`) is no longer used by anyone."""
        with self._lock:
            self._free.append(buf)


def _address(view: memoryview) -> int | None:
    """Where ``view`` starts in memory, or None for a read-only or empty buffer."""
    if view.readonly or not view.nbytes:
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _aligned_part(view: memoryview, at: int) -> int:
    """How many leading bytes of ``view`` may go to ``at`` by direct I/O (0: none)."""
    size = view.nbytes - view.nbytes % ALIGN
    if at % ALIGN or not size:
        return 0
    address = _address(view)
    return size if address is not None and address % ALIGN == 0 else 0


def _open_direct(path: Path, flags: int) -> int | None:
    if not _O_DIRECT:
        return None
    try:
        return os.open(path, flags | _O_DIRECT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None  # this file system has no direct I/O
        raise


class Sink:
    """A partial file open for positional writes: aligned pieces go around the cache.

    ``fd`` is the ordinary descriptor (for ``ftruncate``, ``fsync`` and the pieces
    that are not aligned).  A full disk raises ``OSError(ENOSPC)`` as it would
    without direct I/O.
    """

    def __init__(self, path: Path, direct: bool = True) -> None:
        self.fd = open_regular(path, os.O_WRONLY)  # k3desk's own partial file, no link
        self._direct: int | None = None
        if direct:
            try:
                self._direct = _open_direct(path, os.O_WRONLY)
            except BaseException:
                os.close(self.fd)
                raise

    @property
    def direct(self) -> bool:
        """Aligned pieces still bypass the page cache."""
        return self._direct is not None

    def pwrite(self, data: memoryview, at: int) -> None:
        """All of ``data`` at offset ``at``: its aligned part directly, the rest
        (a file's last bytes) through the page cache."""
        while data:
            fd, size = self.fd, len(data)
            if self._direct is not None:
                aligned = _aligned_part(data, at)
                if aligned:
                    fd, size = self._direct, aligned
            try:
                n = os.pwrite(fd, data[:size], at)
            except OSError as exc:
                if fd == self.fd or exc.errno != errno.EINVAL:
                    raise
                self._stop_direct()  # refused after all: the ordinary way from here on
                continue
            data = data[n:]
            at += n

    def _stop_direct(self) -> None:
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None

    def close(self) -> None:
        self._stop_direct()
        os.close(self.fd)


class Source:
    """A file read back in order for its hash, around the page cache where allowed."""

    BLOCK = 4 * 1024 * 1024

    def __init__(self, path: Path, direct: bool = True) -> None:
        self.fd = open_regular(path, os.O_RDONLY)
        self._direct: int | None = None
        if direct:
            try:
                self._direct = _open_direct(path, os.O_RDONLY)
            except BaseException:
                os.close(self.fd)
                raise
        self._buf = aligned_buffer(self.BLOCK + ALIGN)
        self._view = memoryview(self._buf)

    def read(self, start: int, end: int) -> memoryview:
        """Bytes from ``start``, at most :attr:`BLOCK` and not past ``end``; empty
        at the end of the file.  Valid until the next call."""
        want = min(self.BLOCK, end - start)
        if self._direct is not None:
            base = start - start % ALIGN
            span = -(-(start + want - base) // ALIGN) * ALIGN
            try:
                n = os.preadv(self._direct, [self._view[:span]], base)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self._direct)
                self._direct = None
            else:
                skip = start - base
                return self._view[skip : skip + max(0, min(want, n - skip))]
        n = os.preadv(self.fd, [self._view[:want]], start)
        return self._view[:n]

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a caller still holds a block: GC frees it
            self._view.release()
            self._buf.close()
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None
        os.close(self.fd)
