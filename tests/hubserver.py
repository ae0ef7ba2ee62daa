"""A stand-in for the Hugging Face Hub, on 127.0.0.1, for tests and benchmarks.

It speaks the part of the Hub protocol huggingface_hub 2.4 uses to list and
download files (no Xet: no ``X-Xet-Hash``/``xet-auth`` headers, no
``xetHash`` in tree entries, so clients take the plain HTTP path):

* ``GET /api/models?search=...&filter=gguf`` (the model search ``list_models`` asks,
  paged by ``Link: rel="next"``; ``filter`` tags and ``base_model:<id>`` honoured)
* ``GET /api/models/{repo}[/revision/{rev}]`` (model_info; ``?blobs=true`` adds sizes/LFS)
* ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=...`` paged with ``Link: rel="next"``
* ``POST /api/models/{repo}/paths-info/{rev}``
* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit``, ``X-Linked-Etag``,
  ``X-Linked-Size``, ``ETag``, ``Range``/206, and optionally a cross-origin 302 to a
  second port (the "CDN") that serves blobs without credentials
* errors keyed by ``X-Error-Code``: RepoNotFound, RevisionNotFound, EntryNotFound,
  GatedRepo; 401 for a bad token

Files on disk are sent with ``os.sendfile`` in large blocks, one thread per
connection, so the stand-in serves well over 1 GiB/s on loopback and is not
what a benchmark measures.  ``link_bps`` paces all connections together, like
a link of that rate (1 Gbit/s is 125e6 bytes/s).

Faults for tests: per-connection throttling, one-off stalls, 429 with
Retry-After, a corrupted byte served once.  Every request is logged with the
bytes of file content it sent, so tests can measure what was (re-)fetched.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import random
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_MIN = 1024  # files at least this big are stored as LFS (sha256 etag)
SEND_BLOCK = 64 * 1024
BIG_BLOCK = 1024 * 1024  # unthrottled sends: few wake-ups per GiB
LINK_BURST_S = 0.02  # see HubServer._link_wait


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def make_bytes(size: int, seed: int) -> bytes:
    """Deterministic pseudo-random content (incompressible, like quantized weights)."""
    return random.Random(seed).randbytes(size)


@dataclass
class HubFile:
    path: str
    data: bytes | None = None  # in memory ...
    source: Path | None = None  # ... or on disk (benchmarks)
    sha256: str = ""
    git_sha1: str = ""
    size: int = 0
    lfs: bool = True
    # False: a file on disk is not hashed whole (a sparse twin of hundreds of GB); its
    # "sha256" is then the hash of its size and first MiB, which a download cannot verify
    hash_content: bool = True

    def __post_init__(self) -> None:
        if self.data is None and not self.hash_content:
            assert self.source is not None
            self.size = self.source.stat().st_size
            with self.source.open("rb") as f:
                head = f.read(1 << 20)
            self.sha256 = hashlib.sha256(b"%d:" % self.size + head).hexdigest()
            self.git_sha1 = hashlib.sha1(self.sha256.encode(), usedforsecurity=False).hexdigest()
        elif self.data is not None:
            self.size = len(self.data)
            self.sha256 = hashlib.sha256(self.data).hexdigest()
            self.git_sha1 = git_blob_sha1(self.data)
        else:
            assert self.source is not None
            self.size = self.source.stat().st_size
            h = hashlib.sha256()
            with self.source.open("rb") as f:
                while block := f.read(8 << 20):
                    h.update(block)
            self.sha256 = h.hexdigest()
            self.git_sha1 = hashlib.sha1(self.sha256.encode(), usedforsecurity=False).hexdigest()
        self.lfs = self.lfs and self.size >= LFS_MIN

    def read(self, start: int, end: int) -> Iterator[bytes]:
        """Bytes [start, end) in blocks."""
        if self.data is not None:
            for pos in range(start, end, SEND_BLOCK):
                yield self.data[pos : min(end, pos + SEND_BLOCK)]
            return
        assert self.source is not None
        with self.source.open("rb") as f:
            f.seek(start)
            pos = start
            while pos < end:
                block = f.read(min(1 << 20, end - pos))
                if not block:
                    return
                pos += len(block)
                yield block


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    sha: str
    gated: bool = False
    private: bool = False
    allowed_tokens: set[str] = field(default_factory=set)  # gated: accepted; private: members
    tags: tuple[str, ...] = ("gguf",)
    gguf: dict[str, Any] | None = None  # what the Hub read of its GGUF metadata


@dataclass
class Hit:
    server: str  # "hub" or "cdn"
    method: str
    path: str  # URL path
    file: str  # repo file path for resolve/blob requests, else ""
    status: int
    range_start: int | None
    sent: int  # bytes of file content written
    authorized: bool
    token: str | None


class HubServer:
    """Start with ``with HubServer() as hub:``; point clients at ``hub.endpoint``."""

    handler: type[_Handler]  # the request handler (set below, where it is defined)

    def __init__(self, *, cdn: bool = False, page_size: int = 50) -> None:
        self.repos: dict[str, HubRepo] = {}
        # every commit a repo had: (repo, sha) -> repo as it was then (the Hub keeps them)
        self.history: dict[tuple[str, str], HubRepo] = {}
        self.valid_tokens: set[str] = set()
        self.page_size = page_size
        self.use_cdn = cdn
        self.throttle_bps = 0  # per connection; 0 = unlimited
        self.ranges = True  # False: Range headers are ignored (200 and the whole file)
        # all connections together, in bytes/s (a link: 125e6 is 1 Gbit/s); 0 = unlimited
        self.link_bps = 0
        self._link_lock = threading.Lock()
        self._link_at = 0.0  # when the link is free again (time.monotonic())
        self.api_delay = 0.0  # seconds every /api/ answer waits (an overloaded Hub)
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        self._stalls: dict[str, tuple[int, float]] = {}  # file -> (after bytes, seconds)
        self._corrupt: dict[str, int] = {}  # file -> offset flipped once
        self._fail: list[tuple[str, int, dict[str, str]]] = []  # (file pattern, status, headers)
        self._hub = self._make_server("hub")
        self._cdn = self._make_server("cdn")
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()

    # ------------------------------------------------------------------ setup
    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        *,
        gated: bool = False,
        private: bool = False,
        allowed_tokens: set[str] | None = None,
        lfs: bool = True,
        tags: tuple[str, ...] = ("gguf",),
        gguf: dict[str, Any] | None = None,
        hash_content: bool = True,
    ) -> HubRepo:
        """Add ``repo_id`` (or give it a new commit with these files; the old commit
        stays readable by its sha, as on the Hub)."""
        built = {
            p: HubFile(p, data=d, lfs=lfs)
            if isinstance(d, bytes)
            else HubFile(p, source=d, lfs=lfs, hash_content=hash_content)
            for p, d in files.items()
        }
        sha = hashlib.sha1(
            json.dumps(sorted((p, f.sha256) for p, f in built.items())).encode(),
            usedforsecurity=False,
        ).hexdigest()
        repo = HubRepo(repo_id, built, sha, gated, private, set(allowed_tokens or ()), tags, gguf)
        self.repos[repo_id] = repo
        self.history[(repo_id, sha)] = repo
        return repo

    def stall_once(self, file: str, after: int, seconds: float) -> None:
        """The next GET of ``file`` sends ``after`` bytes, then goes silent for ``seconds``."""
        self._stalls[file] = (after, seconds)

    def corrupt_once(self, file: str, offset: int) -> None:
        """The next GET of ``file`` that covers ``offset`` flips that byte."""
        self._corrupt[file] = offset

    def fail_next(self, file: str, status: int, headers: dict[str, str] | None = None) -> None:
        """The next request for ``file`` (HEAD or GET on resolve) answers ``status``."""
        self._fail.append((file, status, dict(headers or {})))

    # ------------------------------------------------------------------ lifecycle
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def __enter__(self) -> HubServer:
        for srv in (self._hub, self._cdn):
            t = threading.Thread(
                target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
            )
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        for srv in (self._hub, self._cdn):
            srv.shutdown()
            srv.drop_connections()
            srv.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def block_for_link(self) -> int:
        """Bytes per send: large when the link is fast (few wake-ups), about 2 ms of it else."""
        bps = self.link_bps
        if not bps:
            return BIG_BLOCK
        return max(SEND_BLOCK, min(BIG_BLOCK, int(bps * 0.002)))

    def _link_wait(self, n: int) -> None:
        """Pace ``n`` bytes onto the shared link: each send books the next slot of
        ``n / link_bps`` seconds and waits for its start, so that all connections
        together stay at ``link_bps`` (first come, first served, like a queue)."""
        bps = self.link_bps
        if not bps:
            return
        with self._link_lock:
            now = time.monotonic()
            # credit for at most LINK_BURST_S of idle link: a sender that wakes late
            # catches up within it (a real link's queue holds about that much), but
            # an idle link does not bank more
            begin = max(self._link_at, now - LINK_BURST_S)
            self._link_at = begin + n / bps
        if begin > now:
            time.sleep(begin - now)

    # ------------------------------------------------------------------ log queries
    def content_hits(self, file: str | None = None) -> list[Hit]:
        with self._lock:
            return [
                h
                for h in self.hits
                if h.file and h.method == "GET" and (file is None or h.file == file)
            ]

    def bytes_sent(self, file: str | None = None) -> int:
        return sum(h.sent for h in self.content_hits(file))

    def reset_log(self) -> None:
        with self._lock:
            self.hits.clear()

    def _log(self, hit: Hit) -> None:
        with self._lock:
            self.hits.append(hit)

    # ------------------------------------------------------------------ HTTP
    def _make_server(self, name: str) -> http.server.ThreadingHTTPServer:
        handler = type("Handler", (self.handler,), {"server_name_": name, "owner": self})
        srv = _QuietServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        return srv


class _QuietServer(http.server.ThreadingHTTPServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        with self._open_lock:
            self._open.add(sock)
        return sock, addr

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """End the kept-alive connections too: a closed stand-in answers nothing more
        (a client's pool would otherwise reach this one's handlers through a later
        stand-in that was given the same port)."""
        with self._open_lock:
            open_ = list(self._open)
        for sock in open_:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return  # clients drop connections on purpose (cancel, stall, kill -9)
        super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_name_ = "hub"
    owner: HubServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ------------------------------------------------------------ plumbing
    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[7:] if auth.lower().startswith("bearer ") else None

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        file: str = "",
    ) -> None:
        self.send_response(status)
        hdrs = {"Content-Length": str(len(body))}
        if body and "Content-Type" not in (headers or {}):
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.owner._log(
            Hit(
                self.server_name_,
                self.command,
                self.path,
                file,
                status,
                None,
                0,
                self._token() is not None,
                self._token(),
            )
        )

    def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(data).encode(), headers)

    def _error(self, status: int, code: str | None, message: str, file: str = "") -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers, file=file)

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            if self.server_name_ == "cdn":
                self._cdn()
            else:
                self._hub()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    # ------------------------------------------------------------ repo access
    def _repo(self, repo_id: str, file: str = "") -> HubRepo | None:
        """The repo if this request may read it; otherwise answer the error and return None."""
        token = self._token()
        if token is not None and token not in self.owner.valid_tokens:
            self._error(401, None, "Invalid credentials in Authorization header", file)
            return None
        repo = self.owner.repos.get(repo_id)
        if repo is None or (repo.private and token not in repo.allowed_tokens):
            self._error(401 if token is None else 404, "RepoNotFound", "Repository not found", file)
            return None
        if repo.gated and token not in repo.allowed_tokens:
            if token is None:
                self._error(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. "
                    "You must have access to it and be authenticated to access it.",
                    file,
                )
            else:
                self._error(
                    403,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted and you "
                    "are not in the authorized list.",
                    file,
                )
            return None
        return repo

    def _rev(self, repo: HubRepo, rev: str) -> HubRepo | None:
        """The repo as it is at ``rev`` (main, or any commit it had), else answer 404."""
        if unquote(rev) in ("main", repo.sha):
            return repo
        old = self.owner.history.get((repo.repo_id, unquote(rev)))
        if old is not None:
            return old
        self._error(404, "RevisionNotFound", f"Invalid rev id: {unquote(rev)}")
        return None

    # ------------------------------------------------------------ hub routes
    def _hub(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        query = parse_qs(url.query)
        if self.command == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        if path.startswith("/api/") and self.owner.api_delay:
            self.owner._closing.wait(self.owner.api_delay)
        if path == "/api/models" and self.command == "GET":
            self._search(query)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m and self.command == "GET":
            repo = self._repo(m.group(1))
            at = self._rev(repo, m.group(2) or "main") if repo else None
            if at:
                self._json(200, self._model_info(at, blobs="blobs" in query))
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        if m and self.command == "GET":
            repo = self._repo(m.group(1))
            at = self._rev(repo, m.group(2)) if repo else None
            if at:
                self._tree(at, m.group(2), unquote((m.group(3) or "").lstrip("/")), query)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/paths-info/([^/]+)", path)
        if m and self.command == "POST":
            repo = self._repo(m.group(1))
            at = self._rev(repo, m.group(2)) if repo else None
            if at:
                self._paths_info(at, body)
            return
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and self.command in ("GET", "HEAD"):
            self._resolve(m.group(1), m.group(2), unquote(m.group(3)))
            return
        self._error(404, None, "Not found")

    def _search(self, query: dict[str, list[str]]) -> None:
        """``list_models``: repos whose id holds ``search`` and that carry every ``filter``
        tag (``base_model:<id>`` among them), paged like the Hub."""
        text = (query.get("search") or [""])[0].lower()
        wanted = query.get("filter") or []
        token = self._token()
        found = []
        for repo in sorted(self.owner.repos.values(), key=lambda r: r.repo_id):
            if repo.private and token not in repo.allowed_tokens:
                continue
            if text and text not in repo.repo_id.lower():
                continue
            if not all(tag in repo.tags for tag in wanted):
                continue
            info: dict[str, Any] = {
                "_id": repo.sha[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.sha,
                "private": repo.private,
                "gated": "manual" if repo.gated else False,
                "downloads": 0,
                "likes": 0,
                "tags": list(repo.tags),
                "lastModified": "2026-11-30T12:00:00.000Z",
            }
            if repo.gguf is not None:
                info["gguf"] = repo.gguf
            found.append(info)
        limit = int((query.get("limit") or ["1000"])[0])
        start = int((query.get("cursor") or ["0"])[0])
        size = min(self.owner.page_size, limit)
        page = found[start : start + size]
        headers = {}
        if start + size < min(len(found), limit):
            params = "&".join(
                f"{k}={quote(v)}" for k, vs in query.items() if k != "cursor" for v in vs
            )
            nxt = f"{self.owner.endpoint}/api/models?{params}&cursor={start + size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._json(200, page, headers)

    def _entry(self, f: HubFile, blobs: bool = True) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        return entry

    def _model_info(self, repo: HubRepo, blobs: bool) -> dict[str, Any]:
        siblings = []
        for f in repo.files.values():
            s: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                s["size"] = f.size
                s["blobId"] = f.git_sha1
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(s)
        return {
            "_id": repo.sha[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": repo.sha,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["gguf"],
            "siblings": siblings,
        }

    def _tree(self, repo: HubRepo, rev: str, sub: str, query: dict[str, list[str]]) -> None:
        recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
        entries: list[dict[str, Any]] = []
        dirs: set[str] = set()
        prefix = sub.rstrip("/") + "/" if sub else ""
        for p in sorted(repo.files):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix) :]
            parts = rest.split("/")
            for i in range(1, len(parts)):
                d = prefix + "/".join(parts[:i])
                if d not in dirs and (recursive or i == 1):
                    dirs.add(d)
                    entries.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
            if recursive or len(parts) == 1:
                entries.append(self._entry(repo.files[p]))
        start = int((query.get("cursor") or ["0"])[0])
        page = entries[start : start + self.owner.page_size]
        headers = {}
        if start + self.owner.page_size < len(entries):
            nxt = (
                f"{self.owner.endpoint}/api/models/{repo.repo_id}/tree/{rev}"
                + (f"/{quote(sub)}" if sub else "")
                + f"?recursive={str(recursive).lower()}&expand=false"
                + f"&cursor={start + self.owner.page_size}"
            )
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._json(200, page, headers)

    def _paths_info(self, repo: HubRepo, body: bytes) -> None:
        ctype = self.headers.get("Content-Type") or ""
        if "json" in ctype:
            paths = json.loads(body or b"{}").get("paths", [])
        else:
            paths = parse_qs(body.decode()).get("paths", [])
        out = [self._entry(repo.files[p]) for p in paths if p in repo.files]
        self._json(200, out)

    def _file_headers(self, repo: HubRepo, f: HubFile) -> dict[str, str]:
        headers = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if f.lfs:
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
            headers["X-Linked-Size"] = str(f.size)
            headers["ETag"] = f'"{f.sha256}"'
        else:
            headers["ETag"] = f'"{f.git_sha1}"'
        return headers

    def _injected_failure(self, file: str) -> bool:
        with self.owner._lock:
            found = [i for i, fail in enumerate(self.owner._fail) if fail[0] == file]
            if not found:
                return False
            _, status, headers = self.owner._fail.pop(found[0])
        self._send(status, json.dumps({"error": f"injected {status}"}).encode(), headers, file=file)
        return True

    def _resolve(self, repo_id: str, rev: str, file: str) -> None:
        repo = self._repo(repo_id, file)
        if repo is None:
            return
        at = self._rev(repo, rev)
        if at is None:
            return
        repo = at
        f = repo.files.get(file)
        if f is None:
            self._error(404, "EntryNotFound", f'{file} does not exist on "{unquote(rev)}"', file)
            return
        if self._injected_failure(file):
            return
        headers = self._file_headers(repo, f)
        if self.owner.use_cdn and f.lfs:
            headers["Location"] = (
                f"{self.owner.cdn_endpoint}/blobs/{repo.repo_id}/{f.sha256}?X-Sig=stand-in"
            )
            self._send(302, b"", headers, file=file)
            return
        self._serve(f, headers)

    # ------------------------------------------------------------ content
    def _serve(self, f: HubFile, headers: dict[str, str]) -> None:
        start, end = 0, f.size
        status = 200
        rng = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "") if self.owner.ranges else None
        if m:
            start = int(m.group(1))
            if m.group(2):
                end = min(f.size, int(m.group(2)) + 1)
            if start >= f.size:
                self._send(416, b"", {"Content-Range": f"bytes */{f.size}"}, file=f.path)
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        headers["Content-Length"] = str(end - start)
        headers["Content-Type"] = "application/octet-stream"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        sent = 0
        token = self._token()
        hit = Hit(
            self.server_name_,
            self.command,
            self.path,
            f.path,
            status,
            start if m else None,
            0,
            token is not None,
            token,
        )
        self.owner._log(hit)
        if self.command == "HEAD":
            return
        owner = self.owner
        with owner._lock:
            stall = owner._stalls.pop(f.path, None)
            corrupt = owner._corrupt.get(f.path)
            if corrupt is not None and start <= corrupt < end:
                del owner._corrupt[f.path]
            else:
                corrupt = None
        if stall is None and corrupt is None and f.source is not None:
            self._sendfile(f.source, start, end, hit)
            return
        t0 = time.monotonic()
        pos = start
        try:
            for block in f.read(start, end):
                if corrupt is not None and pos <= corrupt < pos + len(block):
                    b = bytearray(block)
                    b[corrupt - pos] ^= 0xFF
                    block = bytes(b)
                if stall is not None and sent + len(block) > stall[0]:
                    cut = max(0, stall[0] - sent)
                    if cut:
                        self.wfile.write(block[:cut])
                        sent += cut
                        hit.sent = sent
                    self.wfile.flush()
                    owner._closing.wait(stall[1])
                    stall = None
                    block = block[cut:]
                owner._link_wait(len(block))
                self.wfile.write(block)
                sent += len(block)
                pos += len(block)
                hit.sent = sent
                bps = owner.throttle_bps
                if bps:
                    ahead = sent / bps - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        finally:
            hit.sent = sent

    def _sendfile(self, source: Path, start: int, end: int, hit: Hit) -> None:
        """Bytes [start, end) of a file on disk, by ``os.sendfile`` (no copy through Python)."""
        owner = self.owner
        out = self.connection.fileno()
        t0 = time.monotonic()
        pos = start
        with source.open("rb", buffering=0) as f:
            fd = f.fileno()
            while pos < end:
                bps = owner.throttle_bps
                n = min(end - pos, SEND_BLOCK if bps else owner.block_for_link())
                owner._link_wait(n)
                done = 0
                while done < n:
                    sent = os.sendfile(out, fd, pos + done, n - done)
                    if sent == 0:  # the file shrank under us
                        hit.sent = pos - start + done
                        self.close_connection = True
                        return
                    done += sent
                pos += n
                hit.sent = pos - start
                if bps:
                    ahead = (pos - start) / bps - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)

    # ------------------------------------------------------------ CDN
    def _cdn(self) -> None:
        m = re.fullmatch(r"/blobs/([^/]+/[^/]+)/([0-9a-f]{64})", urlsplit(self.path).path)
        if not m or self.command not in ("GET", "HEAD"):
            self._send(404, b"")
            return
        commits = [r for (rid, _), r in self.owner.history.items() if rid == m.group(1)]
        f = next((f for r in commits for f in r.files.values() if f.sha256 == m.group(2)), None)
        if f is None:
            self._send(404, b"")
            return
        self._serve(f, {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes"})


HubServer.handler = _Handler
