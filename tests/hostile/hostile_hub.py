"""The Hub stand-in (tests/hubserver.py) turned hostile: a server, or a mirror behind
``HF_ENDPOINT``, that lies in its listing and misbehaves on the wire.

Everything the honest stand-in does still works; on top of it, per file or per route:

* listings may name anything (``../../x.gguf``, an absolute path, ``a\\b``): the
  files are served at the URL huggingface_hub builds for the name (``hf_hub_url``,
  dot segments resolved as httpx resolves them), so a client that follows the
  listing gets content the server controls;
* ``body[file]``: content served instead of the listed one (a wrong hash, or a
  body longer or shorter than the listed size; HEAD still reports the listed size);
* ``drop_after[file]``: every GET ignores Range, answers 200 from byte 0 and cuts
  the connection after that many bytes;
* ``always[file]``: every request for the file answers this status (endless 429s);
* ``endless_api``: an ``/api/`` route (regex) answered with an endless body, gzip'ed
  (a few hundred KiB on the wire, ``endless_bytes`` once decoded);
* ``api_redirect``: every ``/api/`` answer is a 302 to the other origin (the "CDN"
  port), which records whether a token came along;
* ``get_redirect``: files whose HEAD answers normally but whose GET is a 302 to the
  other origin;
* ``tree_next``: the tree listing's ``Link: rel="next"`` is hostile: ``"other-origin"``
  points it at the other origin (which lists the repo's files too, and records
  whether a token came along), ``"endless"`` at ever new pages of ever new names,
  ``"circle"`` at its second page again and again;
* ``stall_api``: an ``/api/`` route (regex) whose requests are accepted and never
  answered (until the server closes); ``stall_get``: files whose GETs are (their HEAD
  answers);
* ``search_next``: ``"endless-empty"``: the model search answers empty pages, each with
  a ``Link: rel="next"`` to one more;
* ``search_extra``: entries the model search answers (one page) instead of the repos
  it holds: an id 5 MB long, say.
"""

from __future__ import annotations

import contextlib
import re
import socket
import zlib
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.hubserver import Hit, HubFile, HubServer, _Handler

_BOMBS: dict[int, bytes] = {}


def _bomb(size: int) -> bytes:
    """``[`` and ``size`` spaces, gzip'ed (made once, a MiB at a time: never held whole)."""
    if size not in _BOMBS:
        z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip framing
        spaces = b" " * (1 << 20)
        out = [z.compress(b"[")]
        for _ in range(size >> 20):
            out.append(z.compress(spaces))
        out.append(z.flush())
        _BOMBS[size] = b"".join(out)
    return _BOMBS[size]


class HostileHub(HubServer):
    def __init__(self, **kw: Any) -> None:
        self.body: dict[str, bytes] = {}
        self.drop_after: dict[str, int] = {}
        self.always: dict[str, tuple[int, dict[str, str]]] = {}
        self.endless_api: str | None = None
        self.endless_bytes = 300 * 1024 * 1024
        self.api_redirect = False
        self.get_redirect: set[str] = set()
        self.tree_next: str | None = None
        self.stall_api: str | None = None
        self.stall_get: set[str] = set()
        self.search_next: str | None = None
        self.search_extra: list[dict[str, Any]] = []
        super().__init__(**kw)

    def file_at(self, url_path: str) -> tuple[str, str] | None:
        """(repo, file) whose resolve URL, as a client builds and normalises it, is this."""
        import httpx
        from huggingface_hub import hf_hub_url

        for repo_id, repo in self.repos.items():
            for name in repo.files:
                for rev in (repo.sha, "main"):
                    url = hf_hub_url(repo_id, name, revision=rev, endpoint=self.endpoint)
                    if httpx.URL(url).path == url_path:
                        return repo_id, name
        return None


class _HostileHandler(_Handler):
    owner: HostileHub

    def _hub(self) -> None:
        path = urlsplit(self.path).path
        hub = self.owner
        if path.startswith("/api/") and hub.api_redirect:
            self._send(302, b"", {"Location": hub.cdn_endpoint + self.path})
            return
        if path.startswith("/api/") and hub.endless_api and re.search(hub.endless_api, path):
            self._endless()
            return
        if path.startswith("/api/") and hub.stall_api and re.search(hub.stall_api, path):
            self._stall("")
            return
        if path == "/api/models" and (hub.search_next or hub.search_extra):
            self._hostile_search()
            return
        routed = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if routed is None or routed.group(1) not in hub.repos:
            found = hub.file_at(path)
            if found is not None and self.command in ("GET", "HEAD"):
                repo = hub.repos[found[0]]
                self._resolve(found[0], repo.sha, found[1])
                return
        super()._hub()

    def _cdn(self) -> None:
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", urlsplit(self.path).path)
        if m and self.owner.tree_next == "other-origin":
            # what a token-fishing origin answers: a page that lists the files, so that a
            # client that followed would download from here
            repo = self.owner.repos[m.group(1)]
            self._json(200, [self._entry(f) for f in repo.files.values()])
            return
        super()._cdn()

    def _stall(self, file: str) -> None:
        """Accept the request and never answer it (until the server closes)."""
        hub = self.owner
        hub._log(Hit(self.server_name_, self.command, self.path, file, 0, None, 0, False, None))
        hub._closing.wait()
        self.close_connection = True

    def _hostile_search(self) -> None:
        hub = self.owner
        if hub.search_extra:
            self._json(200, hub.search_extra)
            return
        cursor = int((parse_qs(urlsplit(self.path).query).get("cursor") or ["0"])[0])
        nxt = f"{hub.endpoint}/api/models?filter=gguf&cursor={cursor + 1}"
        self._json(200, [], {"Link": f'<{nxt}>; rel="next"'})

    def _tree(self, repo: Any, rev: str, sub: str, query: dict[str, list[str]]) -> None:
        hub = self.owner
        if hub.tree_next is None:
            super()._tree(repo, rev, sub, query)
            return
        cursor = int((query.get("cursor") or ["0"])[0])
        base = f"/api/models/{repo.repo_id}/tree/{rev}?recursive=true&cursor={cursor + 1}"
        if hub.tree_next == "other-origin":
            page = [self._entry(f) for f in repo.files.values()] if cursor == 0 else []
            nxt = hub.cdn_endpoint + base
        elif hub.tree_next == "circle":  # page 2 links to page 2
            page = [self._entry(f) for f in repo.files.values()] if cursor == 0 else []
            again = f"/api/models/{repo.repo_id}/tree/{rev}?recursive=true&cursor=1"
            nxt = hub.endpoint + again
        else:  # endless: every page names 50 files never named before
            page = [
                {"type": "file", "oid": "%040x" % (cursor * 50 + i), "size": 1,
                 "path": f"IQ1_S/endless-{cursor}-{i}.gguf"}
                for i in range(50)
            ]  # fmt: skip
            nxt = hub.endpoint + base
        self._json(200, page, {"Link": f'<{nxt}>; rel="next"'})

    def _resolve(self, repo_id: str, rev: str, file: str) -> None:
        hub = self.owner
        if file in hub.always:
            status, headers = hub.always[file]
            self._send(status, b'{"error": "go away"}', dict(headers), file=file)
            return
        if self.command == "GET" and file in hub.stall_get:
            self._stall(file)
            return
        if self.command == "GET" and file in hub.get_redirect:
            f = hub.repos[repo_id].files[file]
            self._send(
                302,
                b"",
                {"Location": f"{hub.cdn_endpoint}/blobs/{repo_id}/{f.sha256}"},
                file=file,
            )
            return
        super()._resolve(repo_id, rev, file)

    def _serve(self, f: HubFile, headers: dict[str, str]) -> None:
        hub = self.owner
        if f.path in hub.drop_after and self.command == "GET":
            self._drop(f, hub.drop_after[f.path], headers)
            return
        if f.path in hub.body:
            f = HubFile(f.path, data=hub.body[f.path], lfs=f.lfs)
        super()._serve(f, headers)

    def _drop(self, f: HubFile, after: int, headers: dict[str, str]) -> None:
        """200 from byte 0 whatever Range says, then the connection is cut."""
        headers = {**headers, "Content-Length": str(f.size)}
        headers["Content-Type"] = "application/octet-stream"
        self.send_response(200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        data = b"".join(f.read(0, min(after, f.size)))
        self.wfile.write(data)
        self.wfile.flush()
        self.owner._log(
            Hit(self.server_name_, "GET", self.path, f.path, 200, None, len(data), False, None)
        )
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _endless(self) -> None:
        """A body that never ends in JSON: gzip'ed spaces after an opening bracket."""
        block = _bomb(self.owner.endless_bytes)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(block)))
        self.end_headers()
        self.wfile.write(block)
        self.owner._log(Hit(self.server_name_, "GET", self.path, "", 200, None, 0, False, None))


HostileHub.handler = _HostileHandler
