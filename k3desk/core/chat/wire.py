"""Reading an attached server's answers with a bound on everything.

A server reached by URL (``chat --url``, an endpoint, a cluster's bridge) is not
trusted: it may send one endless line, a flood of events, a gzip bomb, an error page
of hundreds of megabytes.  Every body the chat client reads goes through here:

* the body is read raw (``iter_raw``) and decoded here with ``zlib``'s
  ``max_length``, so a compressed body never expands by more than
  :data:`CHUNK` at a time and the limit counts the *decoded* bytes;
* :func:`read_capped` reads a whole body (``/props``, ``/v1/models``, an error)
  up to a limit: past it, :class:`TooLong` (or, with ``truncate``, what came);
* :func:`iter_lines` yields a stream's lines, none longer than ``max_line``, the
  whole stream no longer than ``max_bytes``.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from typing import Any

CHUNK = 256 * 1024  # the most one decompression step may produce

MAX_DESCRIPTION = 4 * 1024 * 1024  # /props, /v1/models, /healthz, /version
MAX_ERROR_BODY = 64 * 1024  # an error answer: only its first part is shown anyway
MAX_LINE = 1024 * 1024  # one line of a server-sent event stream
MAX_STREAM = 64 * 1024 * 1024  # a whole answer stream, decoded
MAX_EVENTS = 1_000_000  # events in one answer (a token is one event)
MAX_ANSWER_CHARS = 16 * 1024 * 1024  # text and reasoning of one answer
DESCRIPTION_SECONDS = 120.0  # a whole description (a server that trickles stops here)


class TooLong(Exception):
    """The server sent more than k3desk reads (the message says what and how much)."""


class UnknownEncoding(Exception):
    """The body is compressed in a way k3desk does not decode."""


def _decoder(encoding: str) -> Any:
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if enc == "deflate":
        return zlib.decompressobj()
    raise UnknownEncoding(f"the answer is compressed as {encoding!r}, which k3desk does not read")


def iter_decoded(resp: Any, limit: int, what: str, seconds: float | None = None) -> Iterator[bytes]:
    """The decoded body of an httpx streaming response, in pieces; :class:`TooLong` once
    more than ``limit`` bytes were decoded (or, with ``seconds``, once it took longer)."""
    dec = _decoder(resp.headers.get("content-encoding", ""))
    seen = 0
    deadline = None if seconds is None else time.monotonic() + seconds

    def count(piece: bytes) -> bytes:
        nonlocal seen
        seen += len(piece)
        if seen > limit:
            raise TooLong(f"{what} is longer than {limit:,} bytes")
        if deadline is not None and time.monotonic() > deadline:
            raise TooLong(f"{what} took longer than {seconds:.0f} s")
        return piece

    try:
        for raw in resp.iter_raw():
            if dec is None:
                yield count(raw)
                continue
            data = raw
            while data:
                out = dec.decompress(data, CHUNK)
                data = dec.unconsumed_tail
                if out:
                    yield count(out)
                if dec.eof:
                    break
        if dec is not None and not dec.eof:
            rest = dec.decompress(b"", CHUNK)
            if rest:
                yield count(rest)
    except zlib.error as exc:
        raise UnknownEncoding(f"the compressed answer is damaged ({exc})") from None


def read_capped(
    resp: Any,
    limit: int,
    what: str,
    *,
    truncate: bool = False,
    seconds: float | None = DESCRIPTION_SECONDS,
) -> bytes:
    """The decoded body, at most ``limit`` bytes read in at most ``seconds`` (``truncate``:
    what came until then; else :class:`TooLong`)."""
    parts: list[bytes] = []
    size = 0
    try:
        for piece in iter_decoded(resp, limit, what, seconds):
            parts.append(piece)
            size += len(piece)
    except TooLong:
        if not truncate:
            raise
    except UnknownEncoding:
        if not truncate:
            raise
    return b"".join(parts)[:limit]


def iter_lines(
    resp: Any, what: str, *, max_line: int = MAX_LINE, max_bytes: int = MAX_STREAM
) -> Iterator[str]:
    """The lines of a text stream (``\\n``, ``\\r\\n`` or ``\\r`` ends one, as in
    server-sent events), decoded as UTF-8; :class:`TooLong` for a line over ``max_line``
    bytes or a stream over ``max_bytes``."""
    buf = bytearray()
    for piece in iter_decoded(resp, max_bytes, what):
        buf += piece
        pos = 0
        while True:
            cut = _line_end(buf, pos)
            if cut is None:
                break
            end, nxt = cut
            yield buf[pos:end].decode("utf-8", "replace")
            pos = nxt
        del buf[:pos]
        if len(buf) > max_line:
            raise TooLong(f"a line of {what} is longer than {max_line:,} bytes")
    if buf:
        yield buf.decode("utf-8", "replace").rstrip("\r")


def _line_end(buf: bytearray, start: int) -> tuple[int, int] | None:
    """(end of the line starting at ``start``, start of the next) in ``buf``, or None."""
    n = buf.find(b"\n", start)
    r = buf.find(b"\r", start, n if n >= 0 else len(buf))
    if r >= 0:
        if r + 1 == len(buf):
            return None  # "\r" last: a "\n" may follow in the next piece
        return (r, r + 2) if buf[r + 1] == 0x0A else (r, r + 1)
    if n >= 0:
        return n, n + 1
    return None
