"""What the Hub has: Kimi-K3 GGUF repositories, and the shard sets in each, per commit.

:func:`search_repos` asks the Hub's model search (``/api/models``, what
``HfApi.list_models`` asks) with the filters it offers: the ``gguf`` library tag, the
text searched for, and optionally a base model (``base_model:<id>``); a repository whose
GGUF metadata names another architecture than ``kimi-k3`` is left out.  Its pages are
followed here, within bounds (:data:`SEARCH_PAGES` pages, empty ones included,
:data:`SEARCH_SECONDS`), as the tree listing's are: huggingface_hub follows a search's
``Link: rel="next"`` for as long as the server sends one.  An id the Hub could not have
(:func:`repo_id_problem`) is no repository to list: it is said, cut short, and skipped.

:func:`list_repo_sets` lists one repository's tree at one commit
(:func:`k3desk.core.hub.listing.list_remote`: bounded pages, the token kept on the
Hub) and groups its ``.gguf`` files into shard sets by the split-name
parser (:func:`k3desk.core.gguf.shards.parse_split_name`), projectors (``mmproj``)
apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from k3desk.core.errors import HubError
from k3desk.core.gguf.shards import parse_split_name
from k3desk.core.hub.errors import Where, hub_error
from k3desk.core.hub.listing import (
    ListingRefused,
    Pages,
    follow_pages,
    list_remote,
    resolve_endpoint,
)
from k3desk.core.hub.model import DownloadRequest, Listing, RemoteFile
from k3desk.core.hub.session import TokenRefused, guard_session, token_only_to
from k3desk.core.safepaths import shown

DEFAULT_QUERY = "Kimi-K3"
ARCH = "kimi-k3"
MAX_REPOS = 50  # repositories one search returns at most
SEARCH_PAGES = 10  # the Hub answers a search of 50 in one page
SEARCH_BYTES = 16 * 1024 * 1024
SEARCH_SECONDS = 120.0
# huggingface_hub's REPO_ID_REGEX and its 96-character bound (utils/_validators.py)
_REPO_ID = re.compile(r"[\w\-.]{1,96}/[\w\-.]{1,96}")


def repo_id_problem(repo: str) -> str:
    """Why ``repo`` is no Hub repository id ("" when it may be one)."""
    if len(repo) > 193:
        return f"it is {len(repo):,} characters long"
    if not _REPO_ID.fullmatch(repo) or ".." in repo or "--" in repo:
        return "it is not of the form owner/name"
    return ""


@dataclass(frozen=True)
class RepoHit:
    """One repository the search found."""

    repo: str
    revision: str  # the commit the search saw ("" when the Hub did not say)
    last_modified: datetime | None = None
    downloads: int = 0
    likes: int = 0
    gated: bool = False
    architecture: str = ""  # the Hub's reading of its GGUF metadata, when given


@dataclass(frozen=True)
class RemoteSet:
    """One model in a repository: the parts of a split set, or one unsplit file."""

    repo: str
    revision: str
    name: str  # the prefix ("Q8_0/Kimi-K3-Q8_0"), or the file name of an unsplit file
    count: int  # parts the names promise
    parts: tuple[RemoteFile, ...]  # in order; the parts present
    missing: tuple[int, ...] = ()  # 1-based numbers of parts the listing lacks

    @property
    def first_path(self) -> str:
        return self.parts[0].path if self.parts else ""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.parts)

    @property
    def complete(self) -> bool:
        return not self.missing and bool(self.parts)

    @property
    def include(self) -> str:
        """The ``--include`` pattern that selects exactly this set."""
        if self.count > 1 or parse_split_name(self.first_path) is not None:
            return f"{self.name}-*-of-{self.count:05d}.gguf"
        return self.first_path


@dataclass(frozen=True)
class RemoteRepo:
    """One repository at one commit: its shard sets and projectors."""

    listing: Listing
    sets: tuple[RemoteSet, ...]
    projectors: tuple[RemoteFile, ...]

    @property
    def repo(self) -> str:
        return self.listing.repo

    @property
    def revision(self) -> str:
        return self.listing.revision


def is_projector(path: str) -> bool:
    return "mmproj" in path.rsplit("/", 1)[-1].lower()


def group_sets(repo: str, revision: str, files: Iterable[RemoteFile]) -> RemoteRepo:
    """Split sets, unsplit models and projectors among ``files`` (a repo's listing)."""
    groups: dict[tuple[str, int], dict[int, RemoteFile]] = {}
    singles: list[RemoteFile] = []
    projectors: list[RemoteFile] = []
    listed = list(files)
    for f in listed:
        if not f.path.lower().endswith(".gguf"):
            continue
        if is_projector(f.path):
            projectors.append(f)
            continue
        name = parse_split_name(f.path)
        if name is None or name.count < 1 or not 1 <= name.number <= name.count:
            singles.append(f)
            continue
        groups.setdefault((name.prefix, name.count), {})[name.number] = f
    sets = [
        RemoteSet(
            repo,
            revision,
            prefix,
            count,
            tuple(parts[i] for i in sorted(parts)),
            tuple(i for i in range(1, count + 1) if i not in parts),
        )
        for (prefix, count), parts in groups.items()
    ]
    sets += [RemoteSet(repo, revision, f.path, 1, (f,)) for f in singles]
    sets.sort(key=lambda s: s.name.lower())
    listing = Listing(repo, revision, revision, tuple(listed), "")
    return RemoteRepo(listing, tuple(sets), tuple(sorted(projectors, key=lambda f: f.path)))


def list_repo_sets(
    repo: str, revision: str = "main", *, endpoint: str | None = None, token: str | None = None
) -> RemoteRepo:
    """``repo``'s shard sets at ``revision`` (resolved to its commit first)."""
    listing = list_remote(
        DownloadRequest(repo=repo, allow_patterns=("*",), revision=revision),
        endpoint=endpoint,
        token=token,
    )
    grouped = group_sets(listing.repo, listing.revision, listing.files)
    return RemoteRepo(listing, grouped.sets, grouped.projectors)


def search_repos(
    query: str = DEFAULT_QUERY,
    *,
    base_model: str | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    limit: int = MAX_REPOS,
    refused: list[str] | None = None,
) -> list[RepoHit]:
    """GGUF repositories the Hub's search finds for ``query`` (Kimi-K3 ones only); an id
    that is no repository id is skipped and said in ``refused`` (bounded)."""
    ep = resolve_endpoint(endpoint)
    filters = ["gguf"]
    if base_model:
        filters.append(f"base_model:{base_model}")
    limit = max(1, min(limit, MAX_REPOS))
    params: dict[str, Any] = {
        "filter": filters,
        "limit": limit,
        "expand": ["sha", "lastModified", "downloads", "likes", "gated", "gguf"],
    }
    if query:
        params["search"] = query
    guard_session()
    try:
        with token_only_to(ep):
            items = follow_pages(
                f"{ep}/api/models",
                params,
                token,
                Pages(SEARCH_PAGES, 10 * MAX_REPOS, SEARCH_BYTES, SEARCH_SECONDS),
                "the search",
                enough=limit,
            )
            return _hits(items[:limit], refused if refused is not None else [])
    except (TokenRefused, ListingRefused) as exc:
        raise HubError(
            f"k3desk stopped searching {ep}: {exc}.",
            "The server (or the mirror in HF_ENDPOINT) does not answer as the Hub does.",
        ) from None
    except (KeyError, TypeError, AttributeError, ValueError, json.JSONDecodeError) as exc:
        raise HubError(
            f"The Hub at {ep} answered the search with something that is not a Hub answer "
            f"({type(exc).__name__}: {shown(exc, 300)}).",
            "Check HF_ENDPOINT (a mirror or proxy may be broken), then try again.",
        ) from exc
    except Exception as exc:  # every failure becomes a HubError
        raise hub_error(exc, Where(repo="(search)", endpoint=ep, has_token=bool(token))) from exc


def _hits(items: list[dict[str, Any]], refused: list[str]) -> list[RepoHit]:
    """The Kimi-K3 repositories among a search's answers (as ``list_models`` reads them)."""
    from huggingface_hub.hf_api import ModelInfo

    hits: list[RepoHit] = []
    for item in items:
        item.setdefault("siblings", None)
        info = ModelInfo(**item)  # type: ignore[no-untyped-call]
        gguf = info.gguf if isinstance(info.gguf, dict) else {}
        arch = gguf.get("architecture")
        arch = arch if isinstance(arch, str) else ""
        if arch and arch != ARCH:
            continue  # the Hub read its GGUF metadata: another model
        problem = repo_id_problem(str(info.id))
        if problem:
            refused.append(f"{shown(info.id, 120)}: not a repository id ({problem}); skipped")
            continue
        hits.append(
            RepoHit(
                repo=str(info.id),
                revision=str(info.sha or ""),
                last_modified=info.last_modified,
                downloads=int(info.downloads or 0),
                likes=int(info.likes or 0),
                gated=bool(info.gated),
                architecture=shown(arch, 60),
            )
        )
    return hits
