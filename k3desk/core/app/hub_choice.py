"""Use-case "a set the Hub has, chosen to download": the search as an operation, and the
download request for one set, pinned to the commit its headers were read at.

The first-run wizard lists what :func:`~k3desk.core.app.search.search_hub` finds beside
the catalog's tiers; a set chosen there is downloaded exactly: its parts selected by the
``--include`` pattern its file names give (:attr:`RemoteSet.include`), at the commit the
search listed (a newer commit pushed meanwhile is not what was judged), checked against
the part count and bytes the listing showed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from k3desk.core.app.operations import Operation
from k3desk.core.app.search import SearchRequest, SearchResult, SetRow, search_hub
from k3desk.core.hub.model import DownloadRequest
from k3desk.core.progress import CancelToken, ProgressCallback, no_progress

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


def hub_search_op(
    services: Services, request: SearchRequest, progress: ProgressCallback = no_progress
) -> Operation[SearchResult]:
    """The Hub search as a cancellable operation (it reads, it changes nothing shown)."""

    def work(token: CancelToken) -> SearchResult:
        return search_hub(services, request, progress=progress, cancel=token)

    return Operation("hub search", work)


def download_request_for(row: SetRow) -> DownloadRequest:
    """Exactly ``row``'s parts, at the commit they were listed (and judged) at."""
    include = row.remote.include
    return DownloadRequest(
        repo=row.repo,
        allow_patterns=(include,),
        revision=row.revision or "main",
        label=row.tier.id if row.tier is not None else f"{row.repo}:{row.remote.name}",
        shard_patterns=(include,),
        expected_shards=row.remote.count,
        expected_shard_bytes=row.remote.total_bytes or None,
    )


def folder_for(row: SetRow) -> str:
    """The download folder's name for ``row``: the catalog tier's id where it is one (the
    same folder a tier download uses), else the repository and the set's name."""
    if row.tier is not None:
        return row.tier.id
    name = row.remote.name.rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{row.repo.replace('/', '--')}--{name}")
