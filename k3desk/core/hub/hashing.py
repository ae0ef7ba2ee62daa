"""Content hashes as the Hub publishes them: SHA-256 for LFS files, git blob SHA-1 otherwise.

:class:`StreamHasher` overlaps hashing with the transfer.  Bytes that arrive
are hashed as they are written; when a transfer resumes a partial file, a
helper thread hashes the prefix already on disk while the rest downloads, then
hands over to in-stream hashing once it has caught up.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

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
    """Hash a file that is being appended to, starting ``prefix`` bytes in.

    The writer calls :meth:`feed` after writing each chunk.  If ``prefix`` > 0
    a helper thread first reads bytes ``[0, prefix)`` (and whatever was appended
    meanwhile) back from disk; as soon as it has caught up, :meth:`feed` hashes
    the chunks it is given directly.  :meth:`hexdigest` waits for the helper.
    """

    def __init__(self, path: Path, kind: str, size: int, prefix: int = 0) -> None:
        self._kind = kind
        self._size = size
        self._h = _new(kind, size)
        self._path = path
        self._lock = threading.Condition()
        self._hashed = 0  # bytes of the file folded into the hash
        self._written = prefix  # bytes of the file on disk
        self._error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        if prefix > 0:
            self._thread = threading.Thread(
                target=self._catch_up, name=f"hash-prefix:{path.name}", daemon=True
            )
            self._thread.start()

    def _catch_up(self) -> None:
        try:
            with self._path.open("rb", buffering=0) as f:
                while True:
                    with self._lock:
                        if self._stop:
                            return
                        start, end = self._hashed, self._written
                        if start >= end:
                            self._thread = None  # writer hashes in-stream from here on
                            self._lock.notify_all()
                            return
                    f.seek(start)
                    block = f.read(min(BLOCK, end - start))
                    if not block:
                        raise OSError(f"{self._path} is shorter than expected")
                    with self._lock:
                        self._h.update(block)
                        self._hashed += len(block)
        except BaseException as exc:  # noqa: BLE001 - handed to the writer thread
            with self._lock:
                self._error = exc
                self._thread = None
                self._lock.notify_all()

    def feed(self, chunk: bytes | memoryview, offset: int) -> None:
        """``chunk`` was written at ``offset`` (== bytes written so far)."""
        n = len(chunk)
        with self._lock:
            if self._thread is None and self._hashed == offset and self._error is None:
                self._h.update(chunk)
                self._hashed += n
            self._written = offset + n

    def reset(self) -> None:
        """The file was truncated to zero: start over."""
        self.close()
        with self._lock:
            self._h = _new(self._kind, self._size)
            self._hashed = 0
            self._written = 0
            self._stop = False
            self._error = None

    def hexdigest(self) -> str:
        with self._lock:
            while self._thread is not None:
                self._lock.wait(0.5)
            if self._error is not None:
                raise self._error
            if self._hashed != self._written:
                # helper finished early or was never started: finish from disk
                start, end = self._hashed, self._written
            else:
                start = end = 0
        if end > start:
            with self._path.open("rb", buffering=0) as f:
                f.seek(start)
                while start < end:
                    block = f.read(min(BLOCK, end - start))
                    if not block:
                        raise OSError(f"{self._path} is shorter than expected")
                    self._h.update(block)
                    start += len(block)
            with self._lock:
                self._hashed = end
        return self._h.hexdigest()

    def close(self) -> None:
        """Stop the helper thread (on cancel or error)."""
        with self._lock:
            self._stop = True
            thread = self._thread
        if thread is not None:
            thread.join(timeout=10)
