"""Moving one file's bytes: our resumable HTTP transfer, or huggingface_hub in a child process.

Why two transports, and how each is cancelled:

* ``http`` (:func:`http_attempt`) exists because huggingface_hub 2.4 cannot
  resume across runs (issue #4196: its ``.incomplete`` files get a random name,
  are deleted on failure and orphaned after a kill).  It is deliberately thin:
  the URL, the metadata HEAD (redirects, X-Linked-Etag/Size), the auth headers,
  the HTTP session and the error mapping are huggingface_hub's own
  (``hf_hub_url``, ``get_hf_file_metadata``, ``build_hf_headers``,
  ``get_session``, ``hf_raise_for_status``); we only add a ``Range`` header,
  read the body off the connection's socket into large buffers (see
  :meth:`_Body.from_socket`), append to our ``.k3part`` file and checkpoint it.
  A large file comes as several Range windows at once (:func:`_in_ranges`).
  It runs in-process: a cancel or a stall shuts the connections' sockets down
  from the watching thread, which wakes the blocked reads at once (a child per
  file would cost a Python start-up per file and could not share the
  hash-as-you-go).

* ``hub`` (:func:`child_attempt`) runs ``hf_hub_download`` in a child process
  so hf_xet is used when the server offers Xet.  huggingface_hub has no cancel
  API and swallows exceptions raised from Xet progress callbacks, so the only
  prompt, reliable stop is to terminate the child; its scratch folder (with the
  ``.incomplete`` file) is then deleted.  The child also exits by itself when
  its stdin closes, so a parent killed with -9 leaves no orphan running.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from k3desk.core.errors import Cancelled, HubError
from k3desk.core.hub import _hfchild
from k3desk.core.hub.diskio import ALIGN, BufferPool, Sink
from k3desk.core.hub.hashing import StreamHasher
from k3desk.core.hub.model import DownloadOptions, RemoteFile
from k3desk.core.hub.reporting import FileTask
from k3desk.core.hub.session import BodyTooLong, guard_session
from k3desk.core.hub.state import Partial
from k3desk.core.private import own_dir
from k3desk.core.process import pump_thread, spawn
from k3desk.core.progress import CancelToken

WRITE_BYTES = 4 * 1024 * 1024  # per write, hash and checkpoint check: few calls per GiB


@dataclass
class Context:
    repo: str
    revision: str  # commit sha
    endpoint: str
    token: str | None
    options: DownloadOptions
    cancel: CancelToken
    # whether a file may take several connections now (DownloadJob: no other file is
    # waiting for one); asked at each attempt
    may_split: Callable[[], bool] = lambda: True
    # a connection for the calling thread's file, held while its bytes travel and let go
    # before the hash is finished and the file placed (DownloadJob: at most ``parallel``
    # at once, so the next file's bytes start as this one's last byte lands); taken by
    # each attempt after its metadata request
    slot: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
    # the download's write buffers, shared by every file and window (diskio.BufferPool)
    buffers: BufferPool = field(default_factory=lambda: BufferPool(WRITE_BYTES))


@dataclass
class Offsets:
    """Where a partial file stands; survives failed attempts within one run."""

    written: int = 0  # bytes in the .k3part file (fetching in ranges: the complete prefix)
    durable: int = 0  # bytes recorded in the sidecar after fsync
    no_ranges: bool = False  # the server answered a Range request with the whole file
    # windows fetched in ranges that lie past ``written`` (start -> end): kept for the
    # next attempt of this run, not across runs (the sidecar records the prefix only)
    windows: dict[int, int] = field(default_factory=dict)
    window: int = 0  # their size (0: not fetched in ranges yet)


class Checkpointer:
    """Makes a partial file durable in the background: fsync, then record the offset.

    The transfer asks for a checkpoint every ``checkpoint_bytes`` and carries
    on; a helper thread does the fsync (which waits for the disk) and rewrites
    the sidecar, so write-back never stalls the network stream.  A checkpoint
    asked for while one is running is folded into the next one.
    """

    def __init__(self, partial: Partial, fd: int, offsets: Offsets, holes: bool = False) -> None:
        self._partial = partial
        self._holes = holes  # the file is written in ranges (see Partial.checkpoint)
        self._fd = os.dup(fd)
        self._offsets = offsets
        self._lock = threading.Lock()
        self._want = offsets.durable
        self._thread: threading.Thread | None = None

    def request(self, offset: int) -> None:
        with self._lock:
            self._want = max(self._want, offset)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"checkpoint:{self._partial.file.path}", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                target = self._want
                if target <= self._offsets.durable:
                    self._thread = None
                    return
            try:
                os.fsync(self._fd)
                self._partial.checkpoint(target, holes=self._holes)
            except OSError:
                with self._lock:  # the disk is in trouble: the writer will find out
                    self._thread = None
                return
            self._offsets.durable = target

    def settle(self, final: int | None = None) -> None:
        """Wait for the helper; with ``final``, make that many bytes durable now."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        if final is not None and (final != self._offsets.durable or self._holes):
            os.fsync(self._fd)
            self._partial.checkpoint(final, holes=self._holes)
            self._offsets.durable = final

    def close(self) -> None:
        os.close(self._fd)


class FileChanged(HubError):
    """The server's idea of a file differs from the pinned listing."""


class ShortRead(Exception):
    """The connection ended before the whole body arrived (retried)."""


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname or "", parts.port


def http_attempt(
    ctx: Context,
    f: RemoteFile,
    partial: Partial,
    task: FileTask,
    hasher: StreamHasher,
    offsets: Offsets,
) -> None:
    """Fetch ``f`` from ``offsets.written`` to its end into the partial file.

    Raises on any failure, leaving ``offsets`` (and the sidecar) describing
    what is safely on disk; the caller decides whether to retry.
    """
    guard_session()
    location, headers, timeout = _prepare(ctx, f)
    with ctx.slot():
        _attempt(ctx, f, partial, task, hasher, offsets, location, headers, timeout)


def _attempt(
    ctx: Context,
    f: RemoteFile,
    partial: Partial,
    task: FileTask,
    hasher: StreamHasher,
    offsets: Offsets,
    location: str,
    headers: dict[str, str],
    timeout: Any,
) -> None:
    """:func:`http_attempt` once it holds a connection: in ranges where no other
    file waits for one (asked only now), else one stream from ``offsets.written``."""
    from huggingface_hub import get_session, hf_raise_for_status

    opts = ctx.options
    if (
        opts.ranges_per_file > 1
        and not offsets.no_ranges
        and f.size - offsets.written >= 2 * min(opts.range_window_bytes, MIN_WINDOW)
        and ctx.may_split()
    ):
        try:
            _in_ranges(ctx, f, partial, task, hasher, offsets, location, headers, timeout)
            return
        except _NoRanges:
            offsets.no_ranges = True  # this server sends whole files: one stream from here
            offsets.windows.clear()
            task.rewind(offsets.written)
    if offsets.written > 0:
        headers["Range"] = f"bytes={offsets.written}-"

    with (
        _writing(partial, offsets, task, direct=opts.direct_io) as (sink, durable),
        get_session().stream("GET", location, headers=headers, timeout=timeout) as r,
    ):
        fd = sink.fd
        hf_raise_for_status(r)
        if offsets.written > 0 and r.status_code == 200:
            # the server ignored Range: start over from byte 0
            durable.settle()
            offsets.written = offsets.durable = 0
            os.ftruncate(fd, 0)
            partial.checkpoint(0)
            hasher.reset()
            task.rewind(0)
        elif r.status_code == 206:
            start = _content_range_start(r.headers.get("Content-Range"))
            if start != offsets.written:
                raise ShortRead(
                    f"asked for bytes from {offsets.written} but got "
                    f"{r.headers.get('Content-Range')}"
                )
        os.ftruncate(fd, offsets.written)
        stream = r.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        task.attach(sock=sock, closer=None if sock is not None else r.close)
        ctx.cancel.raise_if_cancelled()
        body = _Body(ctx, f, sink, task, hasher, offsets, durable)
        direct = _direct_socket(r, stream, sock, f.size - offsets.written)
        if direct is not None:
            body.from_socket(r, direct, ctx.options.stall_seconds + 5.0)
        else:
            body.from_chunks(r.iter_bytes())
        if offsets.written != f.size:
            raise ShortRead(f"the connection ended at byte {offsets.written:,} of {f.size:,}")


def _prepare(ctx: Context, f: RemoteFile) -> tuple[str, dict[str, str], Any]:
    """(URL to GET, request headers, timeouts) for ``f``, after the metadata HEAD."""
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils._headers import build_hf_headers

    url = hf_hub_url(ctx.repo, f.path, revision=ctx.revision, endpoint=ctx.endpoint)
    meta = get_hf_file_metadata(
        url, token=ctx.token or False, timeout=ctx.options.timeout, endpoint=ctx.endpoint
    )
    if meta.size is not None and meta.size != f.size:
        raise FileChanged(
            f"{f.path} in {ctx.repo} is {meta.size:,} bytes on the server but the listing at "
            f"{ctx.revision[:12]} said {f.size:,}.",
            "The repository changed under the download; run it again to list it afresh.",
        )
    headers = build_hf_headers(token=ctx.token or False)
    if _origin(meta.location) != _origin(ctx.endpoint):
        # a CDN on another origin gets no credentials (it is sent a signed URL instead)
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    headers["Accept-Encoding"] = "identity"
    timeout = httpx2.Timeout(ctx.options.timeout, read=ctx.options.stall_seconds + 5.0)
    return meta.location, headers, timeout


@contextlib.contextmanager
def _writing(
    partial: Partial, offsets: Offsets, task: FileTask, holes: bool = False, direct: bool = True
) -> Iterator[tuple[Sink, Checkpointer]]:
    """The partial file open for writing, with its checkpointer, for one attempt.

    On a failure, a pause or a cancel everything that arrived is kept: what
    ``offsets.written`` says is made durable, and a retry or a later run resumes from
    there (fetching in ranges: the prefix; the sidecar says holes lie past it).  When
    complete there is no fsync (see TargetState.is_trusted): a running checkpoint is
    only let finish before the caller removes the sidecar.
    """
    sink = Sink(partial.data, direct=direct)
    durable = Checkpointer(partial, sink.fd, offsets, holes=holes)
    try:
        yield sink, durable
    except BaseException:
        with contextlib.suppress(OSError):
            durable.settle(final=offsets.written)
        raise
    else:
        durable.settle()
    finally:
        task.detach()
        durable.close()
        sink.close()


MIN_WINDOW = 8 * 1024 * 1024  # the smallest window worth a request of its own


def _window(opts: DownloadOptions, left: int) -> int:
    """The window for a file with ``left`` bytes to fetch: ``range_window_bytes``, or
    less where fewer than ``ranges_per_file`` of those are left, so that every
    connection gets a share of it (a 64 MiB file at the end of a download comes over
    four connections, not one); never under ``MIN_WINDOW``, and a multiple of
    ``ALIGN`` so that the windows' writes stay aligned (diskio.Sink)."""
    share = -(-left // opts.ranges_per_file)
    share = -(-share // ALIGN) * ALIGN
    return max(min(opts.range_window_bytes, share), min(opts.range_window_bytes, MIN_WINDOW))


def _grid(start: int, size: int, window: int, tail: int, count: int) -> Iterator[tuple[int, int]]:
    """The windows [a, b) from ``start`` to ``size``: ``window`` bytes each, ``tail``
    bytes once no more than ``count`` windows are left.  Each window's end follows
    from its start alone, so the grid from any window's start on is the same one: an
    attempt after a failure fetches the windows not complete on the first one's grid.

    Why smaller windows at the end: the connections of a file share the link alike,
    so its windows travel in lockstep; the lowest one in flight ends together with
    the others, and the hash, which takes bytes in order, has the others' bytes still
    to do after the file's last byte, ``count - 1`` windows of them (192 MiB for
    64 MiB windows, 0.12 s of SHA-256 on this project's machines, once per file in
    ranges).  Windows a ``count``-th the size at the end leave a ``count``-th of that."""
    a = start
    while a < size:
        b = min(size, a + (window if size - a > count * window else tail))
        yield a, b
        a = b


class _NoRanges(Exception):
    """The server answered a Range request with the whole file."""


def _in_ranges(
    ctx: Context,
    f: RemoteFile,
    partial: Partial,
    task: FileTask,
    hasher: StreamHasher,
    offsets: Offsets,
    location: str,
    headers: dict[str, str],
    timeout: Any,
) -> None:
    """Fetch the rest of ``f`` as windows (:func:`_window`), several at once.

    ``ranges_per_file`` connections each take the next window not yet taken
    (a Range request) and write it in place; the complete prefix grows as the
    lowest windows finish: it is hashed in order (the windows in flight held in
    memory until the hash reaches them: StreamHasher.offer) and checkpointed.
    A failure of one connection stops the others; the caller's retry fetches
    only the windows not complete.  A later run (after
    a pause or a crash) resumes from the checkpointed prefix: it re-fetches at
    most the windows that were past it.
    """
    ranges = _Ranges(ctx, f, task, hasher, offsets, location, headers, timeout)
    with _writing(partial, offsets, task, holes=True, direct=ctx.options.direct_io) as (
        sink,
        durable,
    ):
        # windows in flight when an attempt failed come again
        task.rewind(offsets.written + sum(b - a for a, b in ranges.finished.items()))
        # before any byte lands past the prefix: a kill -9 from here on resumes from
        # the last fsync'ed checkpoint, not from the file's size.  Not fsync'ed: the
        # kernel keeps it through a kill, and after a reboot only the checkpoint counts,
        # holes or not (Partial.resumable_bytes); an fsync here waited 30-60 ms for the
        # journal while other files were written, at the start of every file in ranges
        partial.checkpoint(offsets.durable, holes=True, sync=False)
        task.attach(closer=ranges.stop_all)
        ctx.cancel.raise_if_cancelled()
        ranges.run(sink, durable)


class _Ranges:
    """The windows of one attempt and the connections fetching them."""

    def __init__(
        self,
        ctx: Context,
        f: RemoteFile,
        task: FileTask,
        hasher: StreamHasher,
        offsets: Offsets,
        location: str,
        headers: dict[str, str],
        timeout: Any,
    ) -> None:
        self.f, self.task, self.hasher, self.offsets = f, task, hasher, offsets
        self.location, self.headers, self.timeout = location, headers, timeout
        self.opts = ctx.options
        self.cancel = ctx.cancel
        if not offsets.window:  # fixed for the file's run: windows done stay on one grid
            offsets.window = _window(self.opts, f.size - offsets.written)
        self.window = offsets.window
        self.step = self.opts.checkpoint_bytes
        self.last = f.size - self.step // 2
        self.lock = threading.Lock()
        self.live: set[Any] = set()  # sockets (or response closers) of the windows in flight
        self.errors: list[BaseException] = []
        self.finished = offsets.windows  # complete windows above the prefix, kept across attempts
        # windows still to fetch: the grid from the prefix, less what is complete; the
        # last windows' worth in the window a file with one window left gets (a quarter)
        tail = _window(self.opts, self.window)
        grid = _grid(offsets.written, f.size, self.window, tail, self.opts.ranges_per_file)
        self.todo = deque(w for w in grid if w[0] not in self.finished)
        self.asked = offsets.durable
        self.reached: dict[int, int] = {}  # window start -> bytes of it written so far
        self.pool = ctx.buffers
        # the windows in flight span ranges_per_file of them: the hash can take all
        # that arrives out of order from memory, and reads nothing back
        hasher.hold_up_to(self.window * self.opts.ranges_per_file)

    def run(self, sink: Sink, durable: Checkpointer) -> None:
        """Fetch every window on ``ranges_per_file`` threads; raise the first failure."""
        count = min(self.opts.ranges_per_file, len(self.todo))
        threads = [
            threading.Thread(
                target=self.worker, args=(sink, durable), name=f"range:{self.f.path}", daemon=True
            )
            for _ in range(count)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.cancel.cancelled:
            raise Cancelled()
        if self.errors:
            first = next((e for e in self.errors if isinstance(e, _NoRanges)), self.errors[0])
            raise first
        if self.offsets.written != self.f.size:
            raise ShortRead(f"the ranges ended at byte {self.offsets.written:,} of {self.f.size:,}")

    def stop_all(self) -> None:
        with self.lock:
            handles = list(self.live)
        for h in handles:
            if isinstance(h, socket.socket):
                with contextlib.suppress(OSError):
                    h.shutdown(socket.SHUT_RDWR)
            else:
                h()

    def stopped(self) -> bool:
        if self.cancel.cancelled:
            raise Cancelled()
        return bool(self.errors)

    def fetch(self, sink: Sink, a: int, b: int) -> None:
        from huggingface_hub import get_session, hf_raise_for_status

        h = dict(self.headers)
        h["Range"] = f"bytes={a}-{b - 1}"
        with get_session().stream("GET", self.location, headers=h, timeout=self.timeout) as r:
            hf_raise_for_status(r)
            if r.status_code != 206:
                raise _NoRanges()
            if _content_range_start(r.headers.get("Content-Range")) != a:
                raise ShortRead(
                    f"asked for bytes from {a} but got {r.headers.get('Content-Range')}"
                )
            stream = r.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            handle = sock if isinstance(sock, socket.socket) else r.close
            with self.lock:
                self.live.add(handle)
            try:
                direct = _direct_socket(r, stream, sock, b - a)
                pos = _read_range(
                    r,
                    direct,
                    sink,
                    (a, b),
                    self.task,
                    self.stopped,
                    self.opts.stall_seconds + 5.0,
                    functools.partial(self.wrote, a),
                    self.pool,
                    self.hasher.offer,
                )
            finally:
                with self.lock:
                    self.live.discard(handle)
            if pos != b:
                raise ShortRead(f"the connection ended at byte {pos:,} of {self.f.size:,}")

    def worker(self, sink: Sink, durable: Checkpointer) -> None:
        while True:
            with self.lock:
                if self.errors or not self.todo:
                    return
                a, b = self.todo.popleft()
            try:
                if self.stopped():
                    return
                self.fetch(sink, a, b)
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
                with self.lock:
                    self.errors.append(exc)
                self.stop_all()
                return
            self.window_done(a, b, durable)

    def wrote(self, a: int, pos: int) -> None:
        """The window from ``a`` is written up to ``pos``.  The window that starts at
        the prefix extends what is on disk in order, so the hash takes it as it comes
        (from memory, or read back where a buffer was not held), not only once the
        window is complete."""
        with self.lock:
            self.reached[a] = pos
            head = self.offsets.written == a
        if head:
            self.hasher.on_disk(pos)

    def window_done(self, a: int, b: int, durable: Checkpointer) -> None:
        """[a, b) is on disk: grow the prefix over complete windows, hash it, and ask for
        a checkpoint every ``checkpoint_bytes`` (none in the file's last half-step)."""
        offsets = self.offsets
        with self.lock:
            self.finished[a] = b
            self.reached.pop(a, None)
            while offsets.written in self.finished:
                offsets.written = self.finished.pop(offsets.written)
            prefix = offsets.written
            ask = prefix - self.asked >= self.step and prefix < self.last
            if ask:
                self.asked = prefix
            in_order = self.reached.get(prefix, prefix)  # the next window, as far as it got
        self.hasher.on_disk(in_order)
        if ask:
            durable.request(prefix)


def _read_range(
    r: Any,
    sock: socket.socket | None,
    sink: Sink,
    window: tuple[int, int],
    task: FileTask,
    stopped: Callable[[], bool],
    timeout: float,
    wrote: Callable[[int], None],
    pool: BufferPool,
    offer: Callable[[memoryview, int, Callable[[], None]], None] | None = None,
) -> int:
    """Bytes [a, b) of a 206 body written in place; returns where it ended.
    ``wrote(pos)`` is told after each write, and each buffer written is offered to
    the hash with ``offer(view, at, release)`` (StreamHasher.offer): a buffer of
    ``pool`` is filled again only once released.

    A window that fails is fetched again whole, so a buffer is written only
    when full (or when the body ends), not after each ``recv_into``.
    """
    a, b = window
    pos = a
    if sock is None:
        for chunk in r.iter_bytes():
            if stopped():
                raise ShortRead("another range of the file failed")
            if pos + len(chunk) > b:
                raise BodyTooLong(f"it sent more than the {b - a:,} bytes asked for")
            sink.pwrite(memoryview(chunk), pos)
            pos += len(chunk)
            task.add(len(chunk))
            wrote(pos)
        return pos
    # as in _Body.from_socket: one chunk through the client, then the socket itself;
    # the first chunk heads the first buffer, so that every write stays aligned
    chunks = r.iter_raw()
    carry = next(chunks, b"")
    if len(carry) > b - pos:
        raise BodyTooLong(f"it sent more than the {b - a:,} bytes asked for")
    sock.settimeout(timeout)
    size = WRITE_BYTES
    while pos < b:
        buf = pool.take()
        view = memoryview(buf)
        want = max(_fill(pos, size, b - pos), len(carry))
        got = len(carry)
        if got:
            view[:got] = carry
            task.add(got)
            carry = b""
        while got < want:
            if stopped():
                raise ShortRead("another range of the file failed")
            try:
                n = sock.recv_into(view[got:want])
            except OSError as exc:  # reset, timeout, TLS alert: not the disk's
                raise ShortRead(f"the connection failed at byte {pos + got:,}: {exc}") from exc
            if n == 0:
                break
            got += n
            task.add(n)
        if got:
            sink.pwrite(view[:got], pos)
            if offer is not None:
                offer(view[:got], pos, functools.partial(pool.give, buf))
            pos += got
            wrote(pos)
        if got < want:
            break
    del chunks
    return pos


# longest a streamed byte waits in memory before it is written (a slow link fills a
# buffer slowly): what a kill -9 can lose beyond the bytes in flight
HOLD_SECONDS = 0.1


def _fill(pos: int, cap: int, left: int) -> int:
    """How much the buffer for file offset ``pos`` takes: at most ``cap`` and ``left``,
    and, when more follows, ending on an ``ALIGN`` boundary, so that after a resume
    from an odd offset only the first write is not aligned (diskio.Sink)."""
    want = min(cap, left)
    if want < left:
        end = pos + want
        end -= end % ALIGN
        if end > pos:
            want = end - pos
    return want


class _Body:
    """Writes a response body to the partial file, hashes it, checkpoints it."""

    def __init__(
        self,
        ctx: Context,
        f: RemoteFile,
        sink: Sink,
        task: FileTask,
        hasher: StreamHasher,
        offsets: Offsets,
        durable: Checkpointer,
    ) -> None:
        self.f, self.sink, self.task, self.hasher = f, sink, task, hasher
        self.offsets, self.durable, self.cancel = offsets, durable, ctx.cancel
        self.step = ctx.options.checkpoint_bytes
        self.pool = ctx.buffers
        self.asked = offsets.durable
        # no checkpoint in a file's last half-step: it is about to be complete anyway
        self.last = f.size - self.step // 2

    def _wrote(self, data: bytes | memoryview, release: Callable[[], None] | None) -> None:
        """``data`` goes to the file at ``offsets.written``, then to the hash."""
        n = len(data)
        at = self.offsets.written
        if at + n > self.f.size:
            raise BodyTooLong(
                f"it sent more than the {self.f.size:,} bytes listed for {self.f.path}"
            )
        self.sink.pwrite(memoryview(data), at)
        self.offsets.written = at + n
        self.hasher.feed(data, at, release)
        self._checkpoint()

    def _checkpoint(self) -> None:
        at = self.offsets.written
        if at - self.asked >= self.step and at < self.last:
            self.asked = at
            self.durable.request(at)

    def from_chunks(self, chunks: Iterator[bytes]) -> None:
        """Chunks as the HTTP client hands them over (<= 64 KiB each)."""
        cancel, task = self.cancel, self.task
        for chunk in chunks:
            if cancel.cancelled:
                raise Cancelled()
            self._wrote(chunk, None)
            task.add(len(chunk))

    def from_socket(self, r: Any, sock: socket.socket, timeout: float) -> None:
        """The rest of a plain-length body, straight from the connection's socket.

        One chunk goes through the HTTP client first: it holds the bytes that
        arrived with the headers, and after it the parser's buffer is empty
        (h11 ``_readers.ContentLengthReader.__call__`` hands over all it has).
        From there on ``recv_into`` fills large reusable buffers (the first
        chunk at the head of the first): no objects, parser passes or copies
        per 64 KiB.  A full buffer is written in one call, aligned, around the
        page cache where the file system allows (diskio.Sink), then goes to
        the hash.  No byte waits in memory longer than ``HOLD_SECONDS``: a
        buffer that fills slowly is written as it fills (aligned), and one cut
        short by a failure, a stall or a pause as far as it got, so what
        arrived is in the file (a kill -9 loses at most what was in flight).  The connection is
        closed afterwards: the client never saw the body end, so it does not
        reuse it (httpcore ``HTTP11Connection._response_closed``).
        """
        cancel, task, offsets = self.cancel, self.task, self.offsets
        # kept referenced until the end: a dropped generator closes the response
        chunks = r.iter_raw()
        carry: bytes = next(chunks, b"")
        remaining = self.f.size - offsets.written
        if len(carry) >= remaining:
            # the rest came with the headers (more is refused by _wrote)
            if carry:
                self._wrote(carry, None)
                task.add(len(carry))
            for chunk in chunks:  # only the end of the message: the connection is reused
                self._wrote(chunk, None)
            return
        sock.settimeout(timeout)
        pool = self.pool
        clock = time.monotonic
        while remaining > 0:
            buf = pool.take()
            view = memoryview(buf)
            want = max(_fill(offsets.written, len(buf), remaining), len(carry))
            got = len(carry)
            kept = 0  # bytes of this buffer already written
            if got:
                view[:got] = carry
                task.add(got)
                carry = b""
            since = clock()  # when the oldest byte not yet written arrived
            try:
                while got < want:
                    if cancel.cancelled:
                        raise Cancelled()
                    try:
                        n = sock.recv_into(view[got:want])
                    except OSError as exc:  # reset, timeout, TLS alert: not the disk's
                        raise ShortRead(
                            f"the connection failed at byte {offsets.written + got - kept:,}: {exc}"
                        ) from exc
                    if n == 0:
                        break
                    if got == kept:
                        since = clock()
                    got += n
                    task.add(n)
                    if got < want and clock() - since >= HOLD_SECONDS:
                        # a slow link: write what came (up to an aligned end) now
                        upto = got - got % ALIGN
                        if upto > kept:
                            self._wrote(view[kept:upto], None)
                            kept = upto
                            since = clock()
            finally:
                if got > kept:  # the buffer is reused only once the hash is done with it
                    release = functools.partial(pool.give, buf) if got == want else None
                    self._wrote(view[kept:got], release)
            remaining -= got
            if got < want:
                break  # the connection ended: the caller reports the short read
        del chunks


def _direct_socket(r: Any, stream: Any, sock: Any, expected: int) -> socket.socket | None:
    """The socket to read the body from directly, or None to leave it to the client.

    Only for a plain HTTP/1.1 body of exactly ``expected`` bytes (Content-Length,
    no transfer or content coding) on a socket that carries the body itself: a
    plain socket or a TLS one (``ssl.SSLSocket.recv_into`` decrypts), not
    TLS tunnelled inside TLS through a proxy (httpcore's ``TLSinTLSStream``
    decrypts in Python with an ``ssl.SSLObject``).
    """
    if not isinstance(sock, socket.socket) or r.http_version != "HTTP/1.1":
        return None
    if isinstance(stream.get_extra_info("ssl_object"), ssl.SSLObject):
        return None
    headers = r.headers
    if (
        headers.get("Transfer-Encoding")
        or headers.get("Content-Encoding", "identity") != "identity"
    ):
        return None
    try:
        length = int(headers.get("Content-Length", ""))
    except ValueError:
        return None
    return sock if length == expected else None


def _content_range_start(value: str | None) -> int:
    # "bytes 100-199/200"
    try:
        return int((value or "").split()[1].split("-")[0])
    except (IndexError, ValueError):
        return -1


# ---------------------------------------------------------------- child transport


def xet_usable() -> bool:
    """hf_xet is importable and not disabled."""
    from huggingface_hub import constants
    from huggingface_hub.utils._runtime import is_xet_available

    flag = os.environ.get("HF_HUB_DISABLE_XET", "").strip().lower()
    disabled = flag in {"1", "true", "yes", "on"}
    return bool(is_xet_available()) and not disabled and not constants.HF_HUB_DISABLE_XET


class ChildFailure(Exception):
    """The child reported an error: its exception class name, HTTP status, message."""

    def __init__(
        self,
        error: str,
        status: int | None,
        message: str,
        retry_after: float | None = None,
        error_code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.child_error = error
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.error_code = error_code


def child_attempt(ctx: Context, f: RemoteFile, staging: Path, task: FileTask) -> Path:
    """Download ``f`` with ``hf_hub_download`` in a child process into ``staging``.

    Returns the downloaded file (inside ``staging``).  On cancel, stall or
    failure the child is terminated and ``staging`` deleted.
    """
    spec = {
        "repo": ctx.repo,
        "path": f.path,
        "revision": ctx.revision,
        "endpoint": ctx.endpoint,
        "local_dir": str(staging),
        "use_token": bool(ctx.token),
    }
    shutil.rmtree(staging, ignore_errors=True)
    own_dir(staging, below=staging.parents[2])  # <target>/.k3desk/staging/NAME: 0700, no link
    # waited for on this thread: it dies with it, and with k3desk (k3desk.core.process)
    child = spawn(
        _hfchild.command(),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(ctx),
        text=True,
        bufsize=1,
    )
    proc = child.popen
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    stderr_tail: list[str] = []

    def err_line(line: str) -> None:
        stderr_tail.append(line + "\n")
        del stderr_tail[:-20]

    errs = pump_thread(proc.stderr, err_line, name=f"hf-child-err:{f.path}")

    def stop() -> None:
        if proc.poll() is None:
            child.signal_group(signal.SIGTERM)

    try:
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        task.attach(closer=stop)
        ctx.cancel.raise_if_cancelled()
        result = _child_result(proc.stdout, task)
        if ctx.cancel.cancelled:
            raise Cancelled()
        if "done" in result:
            proc.wait(timeout=30)
            return Path(result["done"])
        raise _child_failure(f, task, result, stderr_tail, proc.poll())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        task.detach()
        stop()
        with contextlib.suppress(OSError):
            proc.stdin.close()
        child.stop(5.0)
        errs.join(timeout=5)
        child.close_pipes()


def _child_env(ctx: Context) -> dict[str, str]:
    """The child's environment: the token through it (never on a command line)."""
    env = dict(os.environ)
    env.pop("HF_TOKEN", None)
    if ctx.token:
        env["HF_TOKEN"] = ctx.token  # through the environment: never on a command line
    if ctx.options.xet_high_performance:
        env["HF_XET_HIGH_PERFORMANCE"] = "1"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _child_result(lines: Iterable[str], task: FileTask) -> dict[str, Any]:
    """The child's progress counted into ``task`` up to its last word: {"done": path},
    {"error": ...}, or {} when it ended without one."""
    for line in lines:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "n" in msg:
            task.add(int(msg["n"]))
        elif "done" in msg or "error" in msg:
            return dict(msg)
    return {}


def _child_failure(
    f: RemoteFile,
    task: FileTask,
    result: dict[str, Any],
    stderr_tail: list[str],
    returncode: int | None,
) -> Exception:
    """What to raise for a child that did not bring the file."""
    if "error" in result:
        return ChildFailure(
            error=str(result["error"]),
            status=result.get("status"),
            message=str(result.get("message") or result["error"]),
            retry_after=result.get("retry_after"),
            error_code=result.get("error_code"),
        )
    if task.abort_reason:
        return ShortRead(f"transfer of {f.path} {task.abort_reason}")
    tail = "".join(stderr_tail).strip().splitlines()
    return ChildFailure(
        error="ChildExited",
        status=None,
        message=(tail[-1] if tail else f"the download process exited with {returncode}"),
    )
