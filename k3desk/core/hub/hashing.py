"""Content hashes as the Hub publishes them: SHA-256 for LFS files, git blob SHA-1 otherwise.

:class:`StreamHasher` overlaps hashing with the transfer: a helper thread
hashes each chunk once it is written (on the other core), and reads back from
the file only what it was not handed, such as the prefix of a resumed partial
file.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from k3desk.core.hub.diskio import Source
from k3desk.core.progress import CancelToken

BLOCK = 4 * 1024 * 1024


def _new(kind: str, size: int) -> hashlib._Hash:
    if kind == "sha256":
        return hashlib.sha256()
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {size}\0".encode())
    return h


def hash_file(
    path: Path,
    kind: str = "sha256",
    *,
    cancel: CancelToken | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """``sha256`` (LFS oid) or ``git-sha1`` (git blob id) of a whole file."""
    size = path.stat().st_size
    h = _new(kind, size)
    with path.open("rb", buffering=0) as f:
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return h.hexdigest()


class StreamHasher:
    """Hash a file that is being appended to, in one pass, on a thread of its own.

    The writer calls :meth:`feed` after writing each chunk; the chunk is queued
    for a helper thread that folds it into the hash (hashlib releases the GIL
    for buffers this size, so hashing runs on another core while the next bytes
    arrive and are written).  Bytes the helper was not handed are read back
    from the file instead (around the page cache, :class:`~k3desk.core.hub.diskio.Source`):
    the ``prefix`` a resumed transfer already has on
    disk, and chunks the writer offered while more than :attr:`QUEUE_BYTES`
    were waiting (the network is never held up by the hash).  A chunk handed
    over with ``release`` is not touched by the writer until ``release()`` is
    called.  :meth:`hexdigest` waits for the helper.
    """

    QUEUE_BYTES = 16 * 1024 * 1024

    def __init__(
        self, path: Path, kind: str, size: int, prefix: int = 0, direct: bool = True
    ) -> None:
        self._kind = kind
        self._hold_limit = self.HOLD_BYTES
        self._direct = direct  # read back around the page cache (diskio.Source)
        self._size = size
        self._path = path
        self._lock = threading.Condition()
        self._start(prefix)

    def _start(self, prefix: int) -> None:
        self._h = _new(self._kind, self._size)
        self._hashed = 0  # bytes of the file folded into the hash
        self._written = prefix  # bytes of the file on disk
        self._queue: deque[tuple[bytes | memoryview, int, Callable[[], None] | None]] = deque()
        self._queued = 0  # bytes in the queue
        # chunks offered out of order (ranges), by offset, until the hash reaches them
        self._held: dict[int, tuple[bytes | memoryview, Callable[[], None]]] = {}
        self._held_bytes = 0
        self._error: BaseException | None = None
        self._stop = False
        self._finishing = False
        self._thread: threading.Thread | None = threading.Thread(
            target=self._work, name=f"hash:{self._path.name}", daemon=True
        )
        self._thread.start()

    def _work(self) -> None:
        lock = self._lock
        reader = None
        item = None
        try:
            while True:
                with lock:
                    while not (
                        self._stop
                        or self._queue
                        or self._hashed < self._written
                        or self._covering(self._hashed) is not None
                    ):
                        if self._finishing:
                            return
                        lock.wait()
                    if self._stop:
                        return
                    hashed, written = self._hashed, self._written
                    if self._queue:
                        item = self._queue.popleft()
                        self._queued -= len(item[0])
                        end = item[1]
                    else:
                        item = self._take_held(hashed)
                        # up to what is on disk, or to the next chunk held in memory
                        end = hashed if item is not None else self._next_held(hashed, written)
                # bytes not handed over (a resumed prefix, dropped chunks): from the file
                if hashed < end:
                    if reader is None:
                        reader = Source(self._path, direct=self._direct)
                    hashed = self._read_back(reader, hashed, end)
                if item is not None:
                    data, offset, release = item
                    item = None
                    if offset + len(data) > hashed:
                        skip = hashed - offset
                        self._h.update(data[skip:] if skip else data)
                        hashed = offset + len(data)
                    if release is not None:
                        release()
                with lock:
                    self._hashed = hashed
                    lock.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the writer thread
            with lock:
                self._error = exc
        finally:
            if reader is not None:
                reader.close()
            with lock:
                pending = list(self._queue)
                if item is not None:
                    pending.append(item)
                pending.extend((c, o, r) for o, (c, r) in self._held.items())
                self._queue.clear()
                self._queued = 0
                self._held.clear()
                self._held_bytes = 0
                self._thread = None
                lock.notify_all()
            for _, _, release in pending:
                if release is not None:
                    release()

    def _covering(self, at: int) -> int | None:
        """The offset of a held chunk that holds byte ``at`` (lock held)."""
        for offset, (chunk, _) in self._held.items():
            if offset <= at < offset + len(chunk):
                return offset
        return None

    def _take_held(
        self, at: int
    ) -> tuple[bytes | memoryview, int, Callable[[], None] | None] | None:
        """The held chunk holding byte ``at``, out of the store (lock held)."""
        offset = self._covering(at)
        if offset is None:
            return None
        chunk, release = self._held.pop(offset)
        self._held_bytes -= len(chunk)
        return chunk, offset, release

    def _next_held(self, at: int, written: int) -> int:
        """Where reading back from ``at`` stops: the file's in-order end, or the next
        chunk held in memory before it (lock held)."""
        return min([written, *(o for o in self._held if o > at)])

    def _read_back(self, reader: Source, start: int, end: int) -> int:
        while start < end:
            if self._stop:
                raise _Stopped()
            block = reader.read(start, end)
            if not block:
                raise OSError(f"{self._path} is shorter than expected")
            self._h.update(block)
            start += len(block)
            with self._lock:
                self._hashed = start
        return start

    def feed(
        self,
        chunk: bytes | memoryview,
        offset: int,
        release: Callable[[], None] | None = None,
    ) -> None:
        """``chunk`` was written at ``offset`` (== bytes written so far)."""
        n = len(chunk)
        with self._lock:
            self._written = offset + n
            if self._thread is not None and self._queued + n <= self.QUEUE_BYTES:
                self._queue.append((chunk, offset, release))
                self._queued += n
                self._lock.notify_all()
                return
            self._lock.notify_all()  # too much waiting: the helper reads it back instead
        if release is not None:
            release()

    HOLD_BYTES = 64 * 1024 * 1024  # unless hold_up_to says otherwise

    def hold_up_to(self, limit: int) -> None:
        """Hold at most ``limit`` bytes of out-of-order chunks (the span of the
        windows in flight: then none has to be read back)."""
        with self._lock:
            self._hold_limit = limit

    def offer(self, chunk: memoryview, offset: int, release: Callable[[], None]) -> None:
        """``chunk`` was written at ``offset``, in any order (ranges): the helper
        hashes it from memory when the hash reaches it, if at most
        :attr:`HOLD_BYTES` (or :meth:`hold_up_to`) are held; otherwise it is
        released at once and read back from the file then.  ``release()`` is
        called when it is no longer used."""
        n = len(chunk)
        with self._lock:
            old = self._held.pop(offset, None)  # a window fetched again
            if old is not None:
                self._held_bytes -= len(old[0])
            keep = (
                self._thread is not None
                and offset + n > self._hashed
                and self._held_bytes + n <= self._hold_limit
            )
            if keep:
                self._held[offset] = (chunk, release)
                self._held_bytes += n
                self._lock.notify_all()
        if old is not None:
            old[1]()
        if not keep:
            release()

    def on_disk(self, end: int) -> None:
        """Bytes up to ``end`` are in the file without having been handed over
        (written out of order, in ranges): the helper hashes them from the file."""
        with self._lock:
            if end > self._written:
                self._written = end
                self._lock.notify_all()

    def reset(self) -> None:
        """The file was truncated to zero: start over."""
        self.close()
        self._start(0)

    def hexdigest(self) -> str:
        with self._lock:
            self._finishing = True
            thread = self._thread
            self._lock.notify_all()
            while self._thread is not None:
                self._lock.wait(0.5)
        if thread is not None:
            # the helper has let go of the state, and hands back what it still held
            # on its way out: wait for that too, so no helper outlives the hash
            thread.join()
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._hashed != self._written:
                raise OSError(f"{self._path}: hashed {self._hashed} of {self._written} bytes")
        return self._h.hexdigest()

    def close(self) -> None:
        """Stop the helper thread (on cancel or error)."""
        with self._lock:
            self._stop = True
            thread = self._thread
            self._lock.notify_all()
        if thread is not None:
            thread.join(timeout=10)


class _Stopped(Exception):
    """The helper was told to stop while reading back."""
