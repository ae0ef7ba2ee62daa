"""List a request's files on the Hub, pinned to one commit, and cross-check them.

The revision (branch or tag) is resolved to its commit sha first and every
later call uses that sha, so a repo that changes mid-download cannot leave a
mix of old and new files on disk.

The file tree is listed here, not by ``HfApi.list_repo_tree``, so that following its
pages is bounded and the token stays on the Hub: a ``Link: rel="next"`` to another
origin is refused (:func:`k3desk.core.hub.session.token_only_to` refuses any request
that would carry the token elsewhere, too), and a listing longer than
:data:`MAX_PAGES` pages, :data:`MAX_ENTRIES` entries, :data:`MAX_LISTING_BYTES`
bytes or :data:`LISTING_SECONDS` seconds stops with a message.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import quote, urljoin

from k3desk.core.errors import Cancelled, HubError
from k3desk.core.hub.errors import Where, hub_error
from k3desk.core.hub.model import DownloadRequest, Listing, RemoteFile
from k3desk.core.hub.session import (
    TokenRefused,
    guard_session,
    origin,
    patient,
    token_only_to,
)
from k3desk.core.progress import CancelToken
from k3desk.core.safepaths import name_problem, shown
from k3desk.core.units import fmt_bytes

DEFAULT_ENDPOINT = "https://huggingface.co"
SIZE_TOLERANCE = 0.01  # catalog sizes are often rounded ("539.7 GiB"): accept 1 %
# The Hub pages a tree 1000 entries at a time; a K3 repository has a few hundred files.
MAX_PAGES = 50  # 50,000 entries at the Hub's 1000 a page
MAX_ENTRIES = 100_000
MAX_LISTING_BYTES = 128 * 1024 * 1024
LISTING_SECONDS = 300.0


class ListingRefused(Exception):
    """The listing went where k3desk does not follow, or on longer than it reads."""


def resolve_endpoint(endpoint: str | None = None) -> str:
    """``endpoint``, else ``HF_ENDPOINT`` read now (not at import), else huggingface.co."""
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def select(paths: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """Paths matched by ``patterns`` exactly as ``hf download --include`` matches them."""
    from huggingface_hub.utils._paths import filter_repo_objects

    return list(filter_repo_objects(list(paths), allow_patterns=list(patterns)))


def list_remote(
    request: DownloadRequest,
    *,
    endpoint: str | None = None,
    token: str | None = None,
    cancel: CancelToken | None = None,
) -> Listing:
    """Resolve the revision to a commit and list the requested files with sizes and hashes.

    ``cancel`` is looked at before every request after the first: a cancelled listing
    (a download the user stopped while the Hub was slow to list) asks the Hub nothing
    more.  Otherwise it would go on in its thread after the download returned, and a
    connection error there makes huggingface_hub close its shared session
    (``http_backoff`` calls ``close_session``) under whatever else is using it, which
    drops the connections being opened at that moment without closing them.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    ep = resolve_endpoint(endpoint)
    where = Where(repo=request.repo, endpoint=ep, revision=request.revision, has_token=bool(token))
    # token=False, not None: huggingface_hub would otherwise pick up a token on its own
    api = HfApi(endpoint=ep, token=token or False)
    guard_session()
    try:
        with token_only_to(ep):
            info = patient(
                lambda: api.model_info(request.repo, revision=request.revision),
                f"the model info of {shown(request.repo, 100)}",
                f"The Hub at {ep}",
                cancel,
            )
            if cancel is not None:
                cancel.raise_if_cancelled()
            sha = info.sha
            if not sha:
                raise RuntimeError("the Hub did not return a commit for this revision")
            where = Where(repo=request.repo, endpoint=ep, revision=sha, has_token=bool(token))
            entries = [
                RepoFile(**item)  # type: ignore[no-untyped-call]
                for item in _tree_items(ep, request.repo, sha, token, cancel)
                if item.get("type") == "file"
            ]
    except Cancelled:
        raise
    except (ListingRefused, TokenRefused) as exc:
        raise HubError(
            f"k3desk stopped listing {request.repo} at {ep}: {exc}.",
            "The server (or the mirror in HF_ENDPOINT) does not answer as the Hub does; "
            "nothing was downloaded. Check HF_ENDPOINT, then run it again.",
        ) from None
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        # huggingface_hub met an answer that is not what the Hub sends
        raise HubError(
            f"The Hub at {ep} answered the listing of {request.repo} with something that is "
            f"not a Hub listing ({type(exc).__name__}: {exc}).",
            "Check HF_ENDPOINT (a mirror or proxy may be broken), then run it again.",
        ) from exc
    except Exception as exc:  # every failure becomes a HubError
        raise hub_error(exc, where) from exc

    by_path = {e.path: e for e in entries}
    chosen = select(by_path, request.allow_patterns)
    files = []
    refused: list[tuple[str, str]] = []
    for path in chosen:
        f = _remote_file(by_path[path])
        problem = listed_file_problem(f)
        if problem:
            refused.append((path, problem))
        else:
            files.append(f)
    return Listing(
        repo=request.repo,
        revision=sha,
        requested_revision=request.revision,
        files=tuple(files),
        endpoint=ep,
        refused=tuple(refused),
    )


def _remote_file(e: Any) -> RemoteFile:
    """A tree entry (huggingface_hub's ``RepoFile``) as k3desk lists it."""
    lfs = e.lfs
    sha256 = lfs.sha256 if lfs is not None else None
    return RemoteFile(
        path=e.path,
        size=_size(lfs.size if lfs is not None else e.size),
        sha256=sha256.lower() if isinstance(sha256, str) else None,
        git_sha1=str(e.blob_id or "").lower(),
        xet_hash=getattr(e, "xet_hash", None),
    )


def _tree_items(
    ep: str, repo: str, sha: str, token: str | None, cancel: CancelToken | None = None
) -> list[dict[str, Any]]:
    """Every entry of ``repo``'s tree at ``sha``, page after page, within the bounds
    (``cancel`` looked at before each page)."""
    url = f"{ep}/api/models/{repo}/tree/{quote(sha, safe='')}"
    bounds = Pages(MAX_PAGES, MAX_ENTRIES, MAX_LISTING_BYTES, LISTING_SECONDS)
    return follow_pages(
        url, {"recursive": True, "expand": False}, token, bounds, f"the file list of {repo}",
        cancel,
    )  # fmt: skip


@dataclass(frozen=True)
class Pages:
    """How far k3desk follows a paged answer: pages, entries, bytes, seconds in all."""

    pages: int
    entries: int
    size: int
    seconds: float


def follow_pages(
    url: str,
    params: dict[str, Any] | None,
    token: str | None,
    bounds: Pages,
    what: str,
    cancel: CancelToken | None = None,
    enough: int | None = None,
) -> list[dict[str, Any]]:
    """The entries of a paged Hub answer (``Link: rel="next"``), page after page, until the
    last page, ``enough`` entries, or a bound (:class:`ListingRefused`, which says which).
    Every page counts, an empty one too; a page asked for twice, or on another origin,
    stops it; each request is bounded in time (:func:`session.patient`)."""
    import httpx2
    from huggingface_hub import hf_raise_for_status
    from huggingface_hub.utils._headers import build_hf_headers
    from huggingface_hub.utils._http import http_backoff

    # a connection dropped mid-answer is asked again; one never made (no network, a name
    # that does not resolve, nothing listening) is said at once: asking again for the
    # ~15 s of http_backoff's five tries would only keep the person waiting
    dropped = (httpx2.ReadError, httpx2.WriteError, httpx2.CloseError,
                httpx2.RemoteProtocolError)  # fmt: skip
    headers = build_hf_headers(token=token or False)
    home = origin(url)
    deadline = time.monotonic() + bounds.seconds
    items: list[dict[str, Any]] = []
    seen_pages: set[str] = set()
    pages = size = 0
    page_url: str | None = url
    while page_url is not None:
        if cancel is not None:
            cancel.raise_if_cancelled()
        ask = functools.partial(
            http_backoff, "GET", page_url, params=params, headers=headers,
            retry_on_exceptions=dropped,
        )  # fmt: skip
        r = patient(ask, f"page {pages + 1} of {what}", f"The Hub at {home}", cancel)
        hf_raise_for_status(r)
        pages += 1
        size += len(r.content)
        page = r.json()
        if not isinstance(page, list):
            raise TypeError(f"a page of the listing is {type(page).__name__}, not a list")
        items += [e for e in page if isinstance(e, dict)]
        nxt = r.links.get("next", {}).get("url")
        if nxt is None or (enough is not None and len(items) >= enough):
            break
        nxt = urljoin(str(r.url), nxt)
        if origin(nxt) != home:
            raise ListingRefused(
                f"its next page is on another server ({shown(origin(nxt), 100)}), which k3desk "
                "does not follow (the HF token goes to the Hub's own address only)"
            )
        if nxt in seen_pages:
            raise ListingRefused(f"its pages go round in a circle (page {pages + 1} is one "
                                 "already read)")  # fmt: skip
        seen_pages.add(nxt)
        if pages >= bounds.pages or len(items) > bounds.entries or size > bounds.size:
            raise ListingRefused(
                f"it goes on past {pages:,} pages, {len(items):,} entries and "
                f"{size:,} bytes (k3desk reads up to {bounds.pages} pages, "
                f"{bounds.entries:,} entries)"
            )
        if time.monotonic() > deadline:
            raise ListingRefused(f"it takes longer than {bounds.seconds:.0f} s")
        page_url, params = nxt, None
    return items


_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1, or SHA-256 object ids


def _size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return -1
    try:
        return int(value)
    except ValueError:
        return -1


# Folders in the target that are not the repository's: k3desk's own state (what is
# verified, :mod:`k3desk.core.hub.state`) and huggingface_hub's local-dir metadata
# (``.cache/huggingface/``, ``_local_folder.py``).  A listed file there would be
# reported as verified and then overwrite, or be overwritten by, that state.
RESERVED_FOLDERS = ((".k3desk",), (".cache", "huggingface"))


def reserved_name(path: str) -> str:
    """Why ``path`` is not the repository's to write ("" when it is)."""
    parts = tuple(p.lower() for p in path.split("/"))
    for folder in RESERVED_FOLDERS:
        if parts[: len(folder)] == folder and len(parts) > len(folder):
            return f"it is inside {'/'.join(folder)}/, the folder of k3desk's own records"
    return ""


def refusals_text(refused: Sequence[tuple[str, str]], limit: int = 5) -> str:
    """'a.gguf (why); b.gguf (why) and 3 more', each name shown safely."""
    names = [f"{shown(name, 120)!r} ({why})" for name, why in refused[:limit]]
    more = len(refused) - limit
    return "; ".join(names) + (f" and {more} more" if more > 0 else "")


def listed_file_problem(f: RemoteFile) -> str:
    """Why k3desk will not download ``f`` as listed ("" when it will).

    The listing comes from the server: its names become paths under the target
    folder (see :mod:`k3desk.core.safepaths`), its hashes name blobs in the Hugging
    Face cache and decide what is trusted, its size what is fetched.
    """
    problem = name_problem(f.path)
    if problem:
        return f"the name would not stay inside the target folder ({problem})"
    reserved = reserved_name(f.path)
    if reserved:
        return f"{reserved}, which a download may not write"
    if f.size < 0:
        return "the listing gives it no valid size"
    if f.sha256 is not None and not _SHA256.fullmatch(f.sha256):
        return "the listing gives it a SHA-256 that is not one"
    if not _GIT_OID.fullmatch(f.git_sha1) and f.sha256 is None:
        return "the listing gives it no valid hash"
    return ""


def crosscheck(request: DownloadRequest, listing: Listing) -> list[str]:
    """What in the listing disagrees with what the catalog promised (one line each)."""
    warnings: list[str] = []
    name = request.label or request.repo
    paths = [f.path for f in listing.files]
    if not listing.files:
        warnings.append(
            f"No file in {request.repo} at {listing.revision[:12]} matches "
            f"{', '.join(request.allow_patterns)}."
        )
        return warnings
    if request.shard_patterns:
        shards = set(select(paths, request.shard_patterns))
        count = len(shards)
        size = sum(f.size for f in listing.files if f.path in shards)
        if request.expected_shards is not None and count != request.expected_shards:
            warnings.append(
                f"{name}: the catalog lists {request.expected_shards} shards but "
                f"{request.repo} at {listing.revision[:12]} has {count} matching "
                f"{', '.join(request.shard_patterns)}."
            )
        expected = request.expected_shard_bytes
        if expected and abs(size - expected) > SIZE_TOLERANCE * expected:
            warnings.append(
                f"{name}: the shards total {fmt_bytes(size)} ({size:,} bytes) but the catalog "
                f"says {fmt_bytes(expected)} ({expected:,} bytes)."
            )
    for pattern in request.required:
        if not select(paths, [pattern]):
            warnings.append(
                f"{name}: '{pattern}' is named by the catalog but is not in {request.repo} at "
                f"{listing.revision[:12]}."
            )
    return warnings


# ------------------------------------------------------------------ manifests


def parse_manifest(raw: Any) -> dict[str, tuple[int | None, str | None]]:
    """Per-file (size, sha256) from a publisher's manifest.json, whatever its exact shape.

    Accepted: a list of entries, or a dict holding one (``files``, ``parts``,
    ``shards``...), or a dict keyed by file name; an entry names the file with
    ``path``/``name``/``file``/``filename`` and gives ``size``/``bytes`` and
    ``sha256``.
    """
    out: dict[str, tuple[int | None, str | None]] = {}

    def entry(name: str | None, d: dict[str, Any]) -> None:
        n = name
        for key in ("path", "name", "file", "filename", "rfilename"):
            if isinstance(d.get(key), str):
                n = d[key]
                break
        sha = d.get("sha256") or d.get("sha") or d.get("oid")
        size = d.get("size", d.get("bytes", d.get("size_bytes")))
        if not n or not (isinstance(sha, str) or isinstance(size, int)):
            return
        out[n] = (
            int(size) if isinstance(size, int) else None,
            sha.lower().removeprefix("sha256:") if isinstance(sha, str) else None,
        )

    def walk(node: Any, key: str | None, depth: int) -> None:
        if depth > 4:
            return
        if isinstance(node, list):
            for item in node:
                if isinstance(item, dict):
                    entry(None, item)
        elif isinstance(node, dict):
            if any(k in node for k in ("sha256", "size", "bytes")) and key is not None:
                entry(key, node)
                return
            for k, v in node.items():
                walk(v, k, depth + 1)

    walk(raw, None, 0)
    return out


def manifest_check(manifest_bytes: bytes, listing: Listing, manifest_name: str) -> list[str]:
    """Compare the listing with the repo's own manifest; one warning per disagreement."""
    try:
        entries = parse_manifest(json.loads(manifest_bytes.decode("utf-8")))
    except (ValueError, UnicodeDecodeError) as exc:
        return [f"{manifest_name} is not valid JSON ({exc}); it could not be cross-checked."]
    if not entries:
        return [f"{manifest_name} lists no files with sizes or hashes; nothing to cross-check."]
    warnings = []
    listed = {f.path: f for f in listing.files}

    def find(name: str) -> RemoteFile | None:
        if name in listed:
            return listed[name]
        hits = [f for p, f in listed.items() if p.endswith("/" + name) or fnmatchcase(p, name)]
        return hits[0] if len(hits) == 1 else None

    for name, (size, sha) in sorted(entries.items()):
        f = find(name)
        if f is None:
            if name != manifest_name and not name.endswith(".json"):
                warnings.append(f"{manifest_name} lists {name}, which this download does not have.")
            continue
        if size is not None and size != f.size:
            warnings.append(
                f"{name}: {manifest_name} says {size:,} bytes, the Hub says {f.size:,} bytes."
            )
        if sha and f.sha256 and sha != f.sha256:
            warnings.append(
                f"{name}: {manifest_name} gives sha256 {sha[:16]}…, the Hub {f.sha256[:16]}…."
            )
    return warnings
