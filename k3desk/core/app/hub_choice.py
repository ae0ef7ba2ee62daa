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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.operations import Operation
from k3desk.core.app.search import SearchRequest, SearchResult, SetRow, search_hub
from k3desk.core.catalog.model import Tier
from k3desk.core.errors import K3Error
from k3desk.core.hub.model import DownloadRequest
from k3desk.core.hub.projectors import is_projector
from k3desk.core.hub.state import TargetState, meta_dir
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


@dataclass(frozen=True)
class SetDownload:
    """One set's download as every shell starts it: the request (its parts and its
    projector), the folder it lands in, and what is said first about its projector."""

    request: DownloadRequest
    target: Path
    note: str


def set_download(services: Services, row: SetRow, base: Path | None = None) -> SetDownload:
    """The download of ``row`` into ``base`` (None: the models folder): the same request
    and folder the wizard's download step uses, for a Hub result's Download button."""
    where = (base if base is not None else services.paths.models_dir) / folder_for(row)
    return SetDownload(download_request_for(row), where, projector_note(row.tier))


def projector_download(shard: Path) -> SetDownload | None:
    """The download of the vision projector of the set whose part ``shard`` is, into the
    set's folder: for a set k3desk downloaded without it (its folder's download state
    names the repository and the commit).  None where that is not known (files from
    elsewhere) or the folder already holds a projector."""
    shard = shard.expanduser().absolute()
    folder = next((d for d in shard.parents if meta_dir(d).is_dir()), None)
    if folder is None:
        return None
    if any(is_projector(p.name) for p in folder.rglob("*.gguf")):
        return None
    try:
        record = TargetState(folder).files.get(shard.relative_to(folder).as_posix())
    except K3Error:
        return None
    if record is None:
        return None
    request = DownloadRequest(
        repo=record.repo,
        allow_patterns=(),
        revision=record.revision,
        label=f"{folder.name} projector",
        projector_of=shard.relative_to(folder).as_posix(),
    )
    return SetDownload(request, folder, f"The projector of {shard.name} from {record.repo}.")


def projector_command(shard: Path) -> str:
    """The command that downloads the projector of ``shard``'s set (the CLI's words)."""
    return f"k3desk download --projector-for '{shard.expanduser().absolute()}'"


def projector_hint(shard: Path) -> str:
    """What to do where an image is refused because ``shard``'s set runs without its
    projector: the projector already beside it, else the command that downloads it."""
    shard = shard.expanduser().absolute()
    folder = next((d for d in shard.parents if meta_dir(d).is_dir()), shard.parent)
    here = sorted(p for p in folder.rglob("*.gguf") if is_projector(p.name))
    if here:
        return f"Pass its projector: --mmproj '{here[0]}'."
    if projector_download(shard) is not None:
        return (
            f"Its projector was not downloaded with it: {projector_command(shard)} fetches "
            "it into the set's folder; then pass it with --mmproj."
        )
    return "Pass the set's mmproj file with --mmproj, or leave the image out."


def download_request_for(row: SetRow) -> DownloadRequest:
    """Exactly ``row``'s parts, at the commit they were listed (and judged) at, and its
    vision projector: a catalog tier's own (its card names it, as a tier download
    brings it), else the one the repository has for the set
    (:mod:`k3desk.core.hub.projectors`, chosen when the job lists the repository)."""
    return set_request(
        row.repo,
        row.remote.include,
        row.revision or "main",
        row.tier,
        label=row.tier.id if row.tier is not None else f"{row.repo}:{row.remote.name}",
        first_part=row.remote.first_path,
        shards=(row.remote.count, row.remote.total_bytes or None),
    )


def set_request(
    repo: str,
    include: str,
    revision: str,
    tier: Tier | None,
    *,
    label: str,
    first_part: str,
    shards: tuple[int | None, int | None] = (None, None),
) -> DownloadRequest:
    """The request for the set ``include`` selects in ``repo`` (its first part
    ``first_part``), with its projector; ``shards``: the part count and bytes a listing
    showed, checked again when the job lists it."""
    mmproj = tuple(tier.mmproj) if tier is not None else ()
    text_only = tier is not None and tier.vision == "none"
    return DownloadRequest(
        repo=repo,
        allow_patterns=(include, *mmproj),
        revision=revision,
        label=label,
        shard_patterns=(include,),
        expected_shards=shards[0],
        expected_shard_bytes=shards[1],
        required=mmproj,
        projector_of="" if mmproj or text_only else first_part,
    )


def projector_note(tier: Tier | None) -> str:
    """What is said before a download about the set's projector and the engine that
    reads it ('' when there is nothing to say)."""
    if tier is None:
        return (
            "Its vision projector comes with it where the repository has one; whether an "
            "engine reads it is checked when the engine starts."
        )
    if tier.vision == "none":
        return f"{tier.name} reads no images: {tier.vision_note}"
    if tier.vision == "fork":
        fork = tier.vision_engine or "a llama.cpp fork"
        kind = f" ({tier.mmproj_type!r})" if tier.mmproj_type else ""
        return (
            f"Its projector{kind} comes with it, but the llama.cpp release cannot read it: "
            f"images need an engine built from the {fork} fork (Engine page). "
            f"{tier.vision_note}"
        ).strip()
    return "Its vision projector comes with it."


def folder_for(row: SetRow) -> str:
    """The download folder's name for ``row``: the catalog tier's id where it is one (the
    same folder a tier download uses), else the repository and the set's name."""
    if row.tier is not None:
        return row.tier.id
    name = row.remote.name.rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{row.repo.replace('/', '--')}--{name}")
