"""Read the GGUF headers of a shard set on the Hub, by HTTP ranges, and keep them as a twin.

Every part's header is read with ``Range`` requests through huggingface_hub's own HTTP
session (``get_session``), pinned to the commit the listing resolved: the first request
asks for :data:`FIRST_READ` bytes and each later one grows what is held (to twice as
much, by at most :data:`MAX_STEP`) only when the header parser
(:func:`k3desk.core.gguf.reader.read_header_from`, with the bounds ``validate`` reads
local files with) needs bytes it does not have yet.  What one part may make k3desk
receive is capped (:data:`MAX_PART_BYTES`, its retries included), and so is a whole set
(:data:`MAX_SET_BYTES`) and, when the caller gives one, a whole search
(:func:`header_budget`): every byte that arrives counts at every level, whatever becomes
of the read, so a refused set counts what it cost.  Requests per part
(:data:`MAX_PART_REQUESTS`) and the time a set takes (:data:`SET_SECONDS`) are bounded
too.  A header that claims more stops with a message, not with a download.

A server that ignores ``Range`` (answers 200 and the whole file) is read as one stream,
from byte 0, only as far as the header goes, and then dropped: the cap holds there too.
A redirect to another origin (the Hub's CDN) is followed without the token, as
huggingface_hub does (``get_hf_file_metadata`` reads it from the 302).

The bytes read become a *header twin* under the cache folder
(``<cache>/<host>/<owner>--<name>/<commit>/<repo path>``): each part's real header at
its real offset and the file extended to its real size with a hole for the data, so
:func:`k3desk.core.gguf.validate.inspect_shard_set`, the planner and llama.cpp's own
``llama-fit-params`` judge the very layout that would be downloaded.  A commit never
changes, so a twin made once is reused (a record per commit folder says which parts are
whole, with the size and hash the listing gave them).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from k3desk.core.errors import Cancelled, HubError, ValidationError
from k3desk.core.gguf.reader import read_header_from
from k3desk.core.hub.errors import Where, hub_error, is_transient
from k3desk.core.hub.listing import resolve_endpoint
from k3desk.core.hub.model import RemoteFile
from k3desk.core.hub.session import guard_session, origin, token_only_to
from k3desk.core.private import (
    RefusedPath,
    own_dir,
    private_dir,
    refuse_links_under,
    replacing,
    write_private,
)
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress
from k3desk.core.safepaths import name_problem, shown
from k3desk.core.units import fmt_bytes

KiB, MiB = 1024, 1024 * 1024
FIRST_READ = 64 * KiB  # a part without the vocabulary has a header of a few KiB
MAX_STEP = 8 * MiB  # one request never asks for more than this beyond what is held
# Part 1 of a Kimi-K3 set holds the tokenizer (163,840 tokens, 163,328 merges: about
# 4 MiB); the other parts only their tensor infos.  The caps leave room for far larger
# vocabularies and stop a header that claims gigabytes of strings.
MAX_PART_BYTES = 128 * MiB
MAX_SET_BYTES = 512 * MiB
MAX_PART_REQUESTS = 64  # a Kimi-K3 part 1 takes 7 (64 KiB doubling to its 4 MiB)
SET_SECONDS = 300.0  # reading one set's headers; the 94 parts of a K3 set take seconds
PARALLEL = 8  # parts read at once
ATTEMPTS = 3  # per part, on a network hiccup (a timeout, a dropped connection, a 5xx)
TIMEOUT = 20.0
RECORD = ".k3desk-headers.json"  # in the commit folder; '.k3desk' names are no repo's


_COMMIT = re.compile(r"[0-9a-f]{40}")


class HeaderTooLong(HubError):
    """A header needs more bytes than k3desk reads before a download."""


class BudgetSpent(HubError):
    """A caller's budget for headers (a search's, :func:`header_budget`) is spent."""


@dataclass(frozen=True)
class PartRead:
    """What reading one part's header took."""

    path: str  # repo path
    size: int  # the file's size (the listing's)
    header_bytes: int  # where its tensor data starts
    received: int  # bytes that came over the network for it (0 when cached)
    requests: int
    cached: bool
    ranges_ignored: bool = False  # the server sent the whole file from byte 0


@dataclass(frozen=True)
class HeaderSet:
    """The header twin of one shard set (or of single files) at one commit."""

    repo: str
    revision: str  # the commit sha
    endpoint: str
    folder: Path  # the commit folder of the twin
    parts: tuple[PartRead, ...]
    seconds: float

    @property
    def local_paths(self) -> tuple[Path, ...]:
        return tuple(self.folder / p.path for p in self.parts)

    @property
    def received(self) -> int:
        return sum(p.received for p in self.parts)

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.parts)

    @property
    def cached(self) -> bool:
        return all(p.cached for p in self.parts)


def twin_folder(cache_dir: Path, endpoint: str, repo: str, revision: str) -> Path:
    """``<cache>/<host_port>/<owner>--<name>/<commit>``: one folder per commit."""
    parts = urlsplit(endpoint)
    host = f"{parts.hostname or 'hub'}_{parts.port or ''}".strip("_")
    return cache_dir / host / repo.replace("/", "--") / revision


class HeaderBudget:
    """What reading headers may still take: bytes, requests, time (shared by threads).

    A byte or a request taken here is taken from ``parent`` too (a part's from its
    set's, a set's from a search's), counted before anything is refused, so every level
    knows what was really received, however the read ends.
    """

    def __init__(
        self,
        name: str,
        limit: int,
        refuse: Callable[[int, str], HubError],
        parent: HeaderBudget | None = None,
        *,
        requests: int | None = None,
        seconds: float | None = None,
    ) -> None:
        self.name = name  # "the header of X", "the headers of this set", ...
        self.limit = limit
        self.refuse = refuse  # (limit, what) -> the error when the bytes are spent
        self.parent = parent
        self.max_requests = requests
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.used = 0
        self.requests = 0
        self.spent = False  # it has refused something: its bytes, requests or time
        self._lock = threading.Lock()

    def take(self, n: int, what: str) -> None:
        with self._lock:
            self.used += n
            over = self.used > self.limit
        if self.parent is not None:
            self.parent.take(n, what)
        if over:
            self.spent = True
            raise self.refuse(self.limit, what)
        self._in_time(what)

    def request(self, what: str) -> None:
        """One more request (for ``what``)."""
        with self._lock:
            self.requests += 1
            over = self.max_requests is not None and self.requests > self.max_requests
        if self.parent is not None:
            self.parent.request(what)
        if over:
            self.spent = True
            raise HeaderTooLong(
                f"Reading {self.name} took more than {self.max_requests} requests (at "
                f"{what}); k3desk stops there before a download.",
                "The server answers in pieces no Hub sends, or the file is not what it "
                "says. Pick another set.",
            )
        self._in_time(what)

    def _in_time(self, what: str) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.spent = True
            raise HeaderTooLong(
                f"Reading {self.name} took longer than {self.seconds:g} s (at {what}); "
                "k3desk stops there before a download.",
                "The server is very slow or sends the headers a few bytes at a time; try "
                "again later, or pick another set.",
            )


def _set_too_long(limit: int, what: str) -> HubError:
    return HeaderTooLong(
        f"Reading the headers of this set took more than {fmt_bytes(limit)} "
        f"(at {what}); k3desk stops there before a download.",
        "The files claim headers far larger than any Kimi-K3 GGUF has: they are "
        "damaged or not what they say. Pick another set.",
    )


def _part_too_long(limit: int, what: str) -> HubError:
    return HeaderTooLong(
        f"The server sent more than {fmt_bytes(limit - MAX_STEP)} of {what} without its "
        "header ending; k3desk reads no more of it before a download.",
        "The file is damaged or not a Kimi-K3 GGUF. Pick another set.",
    )


def header_budget(
    limit: int, seconds: float | None = None, what: str = "this search"
) -> HeaderBudget:
    """A budget several reads of headers share (a search's): when its bytes or time are
    spent, the read under way stops with :class:`BudgetSpent`; ``used`` is every byte
    received under it, from sets refused or failed too."""

    def spent(lim: int, at: str) -> HubError:
        return BudgetSpent(
            f"{what[0].upper()}{what[1:]} has read {fmt_bytes(lim)} of headers, all it may "
            f"(at {at}).",
            "Plan one set in full with `k3desk plan --remote REPO@REV --include PATTERN`.",
        )

    return HeaderBudget(f"the headers of {what}", limit, spent, seconds=seconds)


class _RemotePrefix:
    """The first bytes of one remote file, fetched by ranges as the parser asks for them.

    It is what :func:`read_header_from` reads from (``seek``/``read``).  What it holds
    is a prefix of the file, ``self.buf`` = bytes [0, len(buf)), grown as the parser
    walks on, plus windows further on where the parser jumps over bytes it does not
    need (a long string it leaves undecoded): those bytes are never fetched.
    """

    def __init__(
        self,
        location: str,
        headers: dict[str, str],
        size: int,
        name: str,
        part: HeaderBudget,
        cancel: CancelToken | None,
    ) -> None:
        self.location = location
        self.headers = headers
        self.size = size
        self.name = name
        self.part = part  # the part's budget (its attempts together), under the set's
        self.cancel = cancel
        self.buf = bytearray()
        self.windows: list[tuple[int, bytes]] = []  # (offset, bytes) beyond the prefix
        self.pos = 0
        self.ranges_ignored = False
        self._stream: Any = None  # an open 200 answer (the server ignored Range)
        self._chunks: Iterator[bytes] | None = None
        self._skip = 0  # bytes of that stream before what the buffer ends at

    # --- what the parser calls
    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.pos + n)
        if self.pos > len(self.buf) + MAX_STEP and not self.ranges_ignored:
            data = self._window(self.pos, end)
        else:
            self._ensure(end)
            data = bytes(self.buf[self.pos : end])
        self.pos += len(data)
        return data

    def _window(self, start: int, end: int) -> bytes:
        """Bytes [start, end) far past the prefix, fetched on their own (a jump)."""
        for at, data in self.windows:
            if at <= start and end <= at + len(data):
                return data[start - at : end - at]
        self._check_position(end)
        want = min(self.size, max(end, start + FIRST_READ))
        held = self.buf
        self.buf = bytearray()
        try:
            self._fetch(start, want, base=start)
            data = bytes(self.buf)
        finally:
            self.buf = held
        if self.ranges_ignored:  # no ranges here: the stream from byte 0, to the cap
            self._ensure(end)
            return bytes(self.buf[start:end])
        self.windows.append((start, data))
        return data[: end - start]

    def _check_position(self, end: int) -> None:
        if end > MAX_PART_BYTES:
            raise HeaderTooLong(
                f"The header of {self.name} goes on past {fmt_bytes(MAX_PART_BYTES)} "
                f"(it asks for byte {end:,}); k3desk reads no more of it before a download.",
                "No Kimi-K3 GGUF has a header that long: the file is damaged or not a "
                "Kimi-K3 GGUF. Pick another set.",
            )

    def close(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.close()
            self._stream = self._chunks = None

    # --- fetching
    def _ensure(self, end: int) -> None:
        have = len(self.buf)
        if end <= have:
            return
        want = max(end, FIRST_READ, min(2 * have, have + MAX_STEP))
        want = min(want, self.size, max(end, MAX_PART_BYTES))
        self._check_position(end)
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()
        if self._chunks is not None:
            self._from_stream(want)
        else:
            self._fetch(have, want)

    def _fetch(self, start: int, end: int, base: int = 0) -> None:
        """Fetch bytes [start, end) onto ``self.buf``, which holds [base, start)."""
        import httpx2
        from huggingface_hub import get_session, hf_raise_for_status

        headers = dict(self.headers)
        headers["Range"] = f"bytes={start}-{end - 1}"
        timeout = httpx2.Timeout(TIMEOUT, read=TIMEOUT)
        self.part.request(self.name)
        r = get_session().send(
            get_session().build_request("GET", self.location, headers=headers, timeout=timeout),
            stream=True,
        )
        keep = False
        try:
            hf_raise_for_status(r)
            if r.status_code == 206:
                got_start, total = _content_range(r.headers.get("Content-Range"))
                if got_start != start:
                    raise HubError(
                        f"The server answered a request for bytes {start:,}- of {self.name} "
                        f"with {shown(r.headers.get('Content-Range'), 100)!r}.",
                        "The server (or a proxy) does not answer as the Hub does; check "
                        "HF_ENDPOINT and try again.",
                    )
                if total is not None and total != self.size:
                    raise _changed(self.name, total, self.size)
                self._take(r.iter_bytes(), end - base)
                return
            # 200: the server ignored Range and sends the file from byte 0
            self.ranges_ignored = True
            if base:
                return  # a jump (see _window): read on from the prefix instead
            length = r.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) != self.size:
                raise _changed(self.name, int(length), self.size)
            self.ranges_ignored = True
            self._stream, self._chunks, self._skip = r, r.iter_bytes(), start
            keep = True
            self._from_stream(end)
        finally:
            if not keep:
                r.close()

    def _take(self, chunks: Iterator[bytes], end: int) -> None:
        """Append a 206 body (bytes [len(buf), end)); a longer body is cut off there."""
        for chunk in chunks:
            self._count(len(chunk))
            room = end - len(self.buf)
            self.buf += chunk[:room]
            if len(self.buf) >= end:
                return
        if len(self.buf) < end:
            raise HubError(
                f"The server ended the answer for {self.name} at byte {len(self.buf):,} "
                f"of the {end:,} asked for.",
                "The connection broke or the server is not the Hub; try again.",
            )

    def _from_stream(self, end: int) -> None:
        """Read the 200 stream on (it started at byte 0) until ``end`` bytes are held."""
        assert self._chunks is not None
        for chunk in self._chunks:
            self._count(len(chunk))
            if self._skip:  # bytes held already (the stream restarted at byte 0)
                cut = min(self._skip, len(chunk))
                chunk, self._skip = chunk[cut:], self._skip - cut
            self.buf += chunk
            if len(self.buf) >= end:
                return
        raise HubError(
            f"The server ended {self.name} at byte {len(self.buf):,} of {self.size:,}.",
            "The connection broke or the server is not the Hub; try again.",
        )

    def _count(self, n: int) -> None:
        self.part.take(n, self.name)  # the part's, the set's (and a search's) count
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()


def _content_range(value: str | None) -> tuple[int, int | None]:
    """(start, total) of 'bytes 0-99/200' (total None for '*'); (-1, None) when unreadable."""
    try:
        unit_range, total = (value or "").split("/", 1)
        start = int(unit_range.split()[1].split("-")[0])
        return start, (int(total) if total.strip().isdigit() else None)
    except (IndexError, ValueError):
        return -1, None


def _changed(name: str, server: int, listed: int) -> HubError:
    return HubError(
        f"{name} is {server:,} bytes on the server but the listing said {listed:,}.",
        "The repository changed while it was read; run it again to list it afresh.",
    )


# ------------------------------------------------------------------ one part


def _read_part(
    ep: str,
    repo: str,
    revision: str,
    f: RemoteFile,
    token: str | None,
    folder: Path,
    part: HeaderBudget,
    cancel: CancelToken | None,
) -> PartRead:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils._headers import build_hf_headers

    url = hf_hub_url(repo, f.path, revision=revision, endpoint=ep)
    meta = get_hf_file_metadata(url, token=token or False, timeout=TIMEOUT, endpoint=ep)
    if meta.commit_hash and meta.commit_hash != revision:
        raise HubError(
            f"The Hub answered for {shown(f.path, 160)} at commit {meta.commit_hash[:12]}, not at "
            f"{revision[:12]} as asked.",
            "The server does not pin files to a commit as the Hub does; check HF_ENDPOINT.",
        )
    if meta.size is not None and meta.size != f.size:
        raise _changed(shown(f.path, 160), meta.size, f.size)
    headers = build_hf_headers(token=token or False)
    if origin(meta.location) != origin(ep):
        # a CDN on another origin gets no credentials (it is sent a signed URL instead)
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    headers["Accept-Encoding"] = "identity"
    src = _RemotePrefix(meta.location, headers, f.size, shown(f.path, 160), part, cancel)
    try:
        try:
            header = read_header_from(src, f.path.rsplit("/", 1)[-1], f.size)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise ValidationError(
                f"{shown(repo, 120)} at {revision[:12]}, {shown(f.path, 160)}: {exc.message}",
                "The file on the Hub is damaged or not a GGUF k3desk can read; nothing was "
                "downloaded. Pick another set.",
            ) from None
    finally:
        src.close()
    data_start = header.data_start
    pieces = [(0, bytes(src.buf[: min(len(src.buf), data_start)]))]
    pieces += [(at, data[: max(0, data_start - at)]) for at, data in src.windows]
    _write_twin_part(folder / f.path, pieces, f.size)
    # what the part cost, its earlier attempts included
    return PartRead(f.path, f.size, data_start, part.used, part.requests, False, src.ranges_ignored)


def _write_twin_part(path: Path, pieces: Sequence[tuple[int, bytes]], size: int) -> None:
    """The header's bytes at their offsets, holes elsewhere, ``size`` bytes in all
    (a fresh file made exclusively beside it, 0600, then renamed: a link at any name
    there is never written through)."""
    private_dir(path.parent)  # inside the commit folder read_remote_headers checked
    with replacing(path) as out:
        for at, data in pieces:
            out.seek(at)
            out.write(data)
        out.truncate(size)


# ------------------------------------------------------------------ the record


def _load_record(folder: Path) -> dict[str, dict[str, Any]]:
    try:
        raw = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def cached_files(
    cache_dir: Path, endpoint: str | None, repo: str, revision: str
) -> list[RemoteFile]:
    """The files whose headers the cache holds for ``repo`` at commit ``revision`` (as
    their listing gave them): what a plan can still use with the Hub out of reach."""
    if not _COMMIT.fullmatch(revision):
        return []
    folder = twin_folder(cache_dir, resolve_endpoint(endpoint), repo, revision)
    out = []
    for path, entry in sorted(_load_record(folder).items()):
        if not isinstance(entry, dict) or name_problem(path):
            continue
        size, sha = entry.get("size"), entry.get("sha256")
        if isinstance(size, int) and (sha is None or isinstance(sha, str)):
            out.append(RemoteFile(path, size, sha, ""))
    return out


def _cached(folder: Path, record: dict[str, dict[str, Any]], f: RemoteFile) -> PartRead | None:
    entry = record.get(f.path)
    if not isinstance(entry, dict):
        return None
    if entry.get("size") != f.size or entry.get("sha256") != f.sha256:
        return None
    try:
        if (folder / f.path).stat().st_size != f.size:
            return None
    except OSError:
        return None
    header = entry.get("header_bytes")
    return PartRead(f.path, f.size, header if isinstance(header, int) else 0, 0, 0, True)


def _save_record(folder: Path, parts: Sequence[PartRead], files: dict[str, RemoteFile]) -> None:
    record = _load_record(folder)
    for p in parts:
        record[p.path] = {
            "size": p.size,
            "sha256": files[p.path].sha256,
            "header_bytes": p.header_bytes,
        }
    write_private(folder / RECORD, json.dumps(record, indent=1, sort_keys=True))


# ------------------------------------------------------------------ a set


def _check_revision(repo: str, revision: str) -> None:
    if not _COMMIT.fullmatch(revision):
        # it names a folder of the cache: only a commit id the listing resolved will do
        raise HubError(
            f"The Hub gave {repo} the commit id {revision[:60]!r}, which is not one.",
            "The server (or the mirror in HF_ENDPOINT) does not answer as the Hub does.",
        )


def _check_names(repo: str, files: Sequence[RemoteFile]) -> None:
    for f in files:
        problem = name_problem(f.path)
        if problem:
            raise HubError(
                f"{repo} lists a file whose name k3desk will not use: {problem}.",
                "Pick another set.",
            )


def _split_cached(
    folder: Path, record: dict[str, dict[str, Any]], files: Sequence[RemoteFile]
) -> tuple[dict[str, PartRead], list[RemoteFile]]:
    """The parts already in the twin folder (read), and those still to read (todo)."""
    done: dict[str, PartRead] = {}
    todo: list[RemoteFile] = []
    for f in files:
        hit = _cached(folder, record, f)
        if hit is not None:
            done[f.path] = hit
        else:
            todo.append(f)
    return done, todo


def _read_retried(
    where: Where,
    f: RemoteFile,
    token: str | None,
    folder: Path,
    budget: HeaderBudget,
    cancel: CancelToken,
) -> PartRead:
    """One part's header, read again from byte 0 after a transient failure (ATTEMPTS in all,
    all within the part's bounds); every other network failure becomes a HubError naming
    the part."""
    ep, repo, revision = where.endpoint, where.repo, where.revision
    part = HeaderBudget(
        f"the header of {shown(f.path, 160)}",
        MAX_PART_BYTES + MAX_STEP,
        _part_too_long,
        budget,
        requests=MAX_PART_REQUESTS,
    )
    for attempt in range(1, ATTEMPTS + 1):
        cancel.raise_if_cancelled()
        try:
            with token_only_to(ep):
                return _read_part(ep, repo, revision, f, token, folder, part, cancel)
        except (HubError, ValidationError, Cancelled):
            raise
        except Exception as exc:  # every network failure becomes a HubError
            if attempt < ATTEMPTS and is_transient(exc):
                cancel.wait(0.5 * attempt)  # a hiccup: the part again, from byte 0
                continue
            raise hub_error(exc, replace(where, path=f.path)) from exc
    raise AssertionError("unreachable: the last attempt returns or raises")


def _read_all(
    todo: Sequence[RemoteFile],
    one: Callable[[RemoteFile], PartRead],
    local_cancel: CancelToken,
    parallel: int,
) -> None:
    """``one`` for every part, ``parallel`` at a time; the first failure stops the others
    and is raised."""
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(todo)))) as pool:
        futures = [pool.submit(one, f) for f in todo]
        wait(futures, return_when=FIRST_EXCEPTION)
        errors = [e for e in (fut.exception() for fut in futures if fut.done()) if e]
        if errors:
            local_cancel.cancel()  # the others stop at their next chunk
            for fut in futures:
                fut.cancel()
            wait(futures)
            # the first real failure, not a part stopped because of it
            raise next((e for e in errors if not isinstance(e, Cancelled)), errors[0])


def read_remote_headers(
    repo: str,
    revision: str,
    files: Sequence[RemoteFile],
    cache_dir: Path,
    *,
    endpoint: str | None = None,
    token: str | None = None,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    parallel: int = PARALLEL,
    budget: HeaderBudget | None = None,
) -> HeaderSet:
    """The header twin of ``files`` (one shard set, listed at commit ``revision``).

    Parts already in the twin folder of that commit are not read again.  What is
    received counts in ``budget`` too (a search's, :func:`header_budget`), whatever
    the outcome.  Raises :class:`HubError` (unreachable, changed, refused, too long,
    ``budget`` spent) or :class:`ValidationError` (a header that is no GGUF header).
    """
    _check_revision(repo, revision)
    ep = resolve_endpoint(endpoint)
    _check_names(repo, files)
    folder = twin_folder(cache_dir, ep, repo, revision)
    try:  # the cache's folders: 0700 whatever the umask, none a link or another user's,
        # and no link planted in the commit folder (k3desk never makes one there)
        refuse_links_under(own_dir(folder, below=private_dir(cache_dir)))
    except RefusedPath as exc:
        raise HubError(exc.message, exc.hint) from None
    record = _load_record(folder)
    by_path = {f.path: f for f in files}
    t0 = time.monotonic()
    done, todo = _split_cached(folder, record, files)
    whole = HeaderBudget(
        "the headers of this set", MAX_SET_BYTES, _set_too_long, budget, seconds=SET_SECONDS
    )
    lock = threading.Lock()
    total = len(files)
    progress(Progress("Reading headers on the Hub", len(done), total))
    where = Where(repo=repo, endpoint=ep, revision=revision, has_token=bool(token))
    local_cancel = CancelToken()
    if cancel is not None:
        cancel.on_cancel(local_cancel.cancel)

    def one(f: RemoteFile) -> PartRead:
        got = _read_retried(where, f, token, folder, whole, local_cancel)
        with lock:
            done[f.path] = got
            progress(Progress("Reading headers on the Hub", len(done), total, f.path))
        return got

    guard_session()
    if todo:
        _read_all(todo, one, local_cancel, parallel)
        _save_record(folder, [done[f.path] for f in todo], by_path)
    return HeaderSet(
        repo=repo,
        revision=revision,
        endpoint=ep,
        folder=folder,
        parts=tuple(done[f.path] for f in files),
        seconds=time.monotonic() - t0,
    )
