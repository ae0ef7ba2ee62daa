"""What a download is asked to do, what it finds on the Hub, and what it reports.

Everything here is plain data: requests and options going in, typed events and
a summary coming out.  Events are delivered to one ``on_event`` callback, one at
a time (never concurrently), from the job's worker threads; a GUI marshals them
to its own thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier

MiB = 1024**2
GiB = 1024**3

Transport = Literal["auto", "http", "hub"]
"""How file bytes travel.

``http``: our resumable HTTP Range transfer (continues a partial file across
restarts).  ``hub``: huggingface_hub's own ``hf_hub_download`` in a child
process, which uses hf_xet when the server offers Xet.  ``auto``: ``hub`` for
files the server offers over Xet when hf_xet is usable and nothing partial is on
disk for them, ``http`` otherwise.
"""


@dataclass(frozen=True)
class DownloadRequest:
    """Which files of which Hub repo to fetch.

    ``allow_patterns`` select files exactly as ``hf download --include`` does
    (fnmatch, case-sensitive, ``*`` also crosses ``/``).  The remaining fields
    are what the catalog promises about the selection, used to cross-check the
    listing; leave them empty for an ad-hoc request.
    """

    repo: str
    allow_patterns: tuple[str, ...]
    revision: str = "main"
    label: str = ""  # tier id, for messages
    shard_patterns: tuple[str, ...] = ()  # which patterns select the text shards
    expected_shards: int | None = None
    expected_shard_bytes: int | None = None
    required: tuple[str, ...] = ()  # patterns that must each match a file (mmproj, template)
    manifest: str = ""  # per-file size+sha256 manifest in the repo, if any
    # the first part of the set whose vision projector comes with it (or a pattern that
    # selects its parts): the job lists the repository's projectors and adds the one
    # for this set (hub/projectors.py); "" where the patterns name every file (a
    # catalog tier names its mmproj)
    projector_of: str = ""

    @classmethod
    def from_tier(cls, tier: Tier, revision: str | None = None) -> DownloadRequest:
        extras = tuple(tier.mmproj) + tuple(tier.extra_files)
        if tier.manifest and tier.manifest not in extras:
            extras += (tier.manifest,)
        return cls(
            repo=tier.repo,
            allow_patterns=tuple(tier.include) + extras,
            revision=revision or "main",
            label=tier.id,
            shard_patterns=tuple(tier.include),
            expected_shards=tier.shard_count if tier.known else None,
            expected_shard_bytes=tier.size_bytes if tier.known and tier.size_bytes > 0 else None,
            required=extras,
            manifest=tier.manifest,
            # a tier that reads images but whose card names no projector file: the
            # repository's projector for its set, as for a set found on the Hub
            projector_of=tier.first_shard if tier.vision != "none" and not tier.mmproj else "",
        )


@dataclass(frozen=True)
class DownloadOptions:
    endpoint: str | None = None  # None: HF_ENDPOINT, else https://huggingface.co
    token: str | None = None  # None: anonymous (the caller resolves it, see tokens.TokenStore)
    parallel: int = 8  # files transferred at once, one connection each (hf download: 8)
    transport: Transport = "auto"
    xet_high_performance: bool = False  # sets HF_XET_HIGH_PERFORMANCE=1 for hf_xet
    stall_seconds: float = 30.0  # no byte for this long: drop the connection and retry
    max_retries: int = 6  # consecutive failed attempts per file before giving up
    backoff_base: float = 1.0  # seconds; doubles per attempt, capped by backoff_max
    backoff_max: float = 30.0
    max_retry_after: float = 300.0  # longest 429 Retry-After we wait out
    checkpoint_bytes: int = 64 * MiB  # resume granularity: fsync + sidecar every this many bytes
    # once no other file waits for a connection (the end of a download), a file with
    # at least two windows left is fetched over this many connections at once, each a
    # Range of range_window_bytes, or a quarter of what is left where that is less (not
    # under 8 MiB); 1: one stream per file.  A pause or a crash re-fetches at most
    # ranges_per_file windows beyond the durable prefix
    ranges_per_file: int = 4
    range_window_bytes: int = 64 * MiB
    # write (and read back to hash) around the page cache where the file system allows
    # O_DIRECT (diskio): cheaper per byte, and a 300 GB download does not push out what
    # the desktop has cached; False keeps the page cache (a spinning disk, where the
    # read-back of ranges would seek away from the writes)
    direct_io: bool = True
    margin_bytes: int = 2 * GiB  # free space kept beyond what the download needs
    use_hf_cache: bool = True  # reuse blobs from an earlier `hf download` in HF_HOME/hub
    hf_cache_dir: Path | None = None  # None: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub
    progress_interval: float = 0.25  # seconds between progress events per file
    timeout: float = 20.0  # connect / metadata timeout, seconds
    # no byte from the Hub for this long while files wait for it: say "waiting for the Hub"
    wait_notice_seconds: float = 10.0


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # LFS files: the content hash the Hub publishes
    git_sha1: str  # git blob id (for non-LFS files it is the content check)
    xet_hash: str | None = None


@dataclass(frozen=True)
class Listing:
    repo: str
    revision: str  # the commit sha every file is pinned to
    requested_revision: str
    files: tuple[RemoteFile, ...]
    endpoint: str
    # (name, why) for listed files k3desk will not write: a name that would land outside
    # the target folder, or a size or hash that is no size or hash
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def repo_url(self) -> str:
        return f"{self.endpoint.rstrip('/')}/{self.repo}"


# ------------------------------------------------------------------ events

FileSource = Literal["state", "existing", "hf-cache", "download"]
Phase = Literal["download", "verify", "copy"]


@dataclass(frozen=True)
class ListingDone:
    repo: str
    revision: str
    files: int
    total_bytes: int
    kind: Literal["listing"] = "listing"


@dataclass(frozen=True)
class QueuedFile:
    """One file of the listing, and how the job means to get it.

    ``source``: ``state`` (verified by an earlier run), ``existing`` or
    ``hf-cache`` (a copy to check and reuse), ``download`` (to fetch, from
    ``resume_from`` when part of it is on disk already).
    """

    path: str
    size: int
    source: FileSource
    resume_from: int = 0


@dataclass(frozen=True)
class Queued:
    """Every file of the download, in listing order, before any of them starts."""

    files: tuple[QueuedFile, ...]
    kind: Literal["queued"] = "queued"


@dataclass(frozen=True)
class Preflight:
    target: str
    filesystem: str
    free_bytes: int
    needed_bytes: int  # bytes that still have to land on this disk
    margin_bytes: int
    to_fetch: int  # files that need network transfer
    fetch_bytes: int  # bytes still to transfer
    partial_bytes: int  # bytes already on disk in partial files (resumed)
    reuse: int  # files already present (verified or to verify) or in the HF cache
    # bytes of the set already here (files reused, partial data resumed): counted done
    have_bytes: int = 0
    kind: Literal["preflight"] = "preflight"


@dataclass(frozen=True)
class FileStarted:
    path: str
    size: int
    resume_from: int
    transport: str
    kind: Literal["file_started"] = "file_started"


@dataclass(frozen=True)
class FileProgress:
    path: str
    done: int
    size: int
    speed: float  # bytes/s over the last few seconds
    eta: float | None  # seconds
    overall_done: int
    overall_total: int
    overall_speed: float
    overall_eta: float | None
    phase: Phase = "download"
    kind: Literal["file_progress"] = "file_progress"


@dataclass(frozen=True)
class Stalled:
    path: str
    seconds: float  # how long no byte arrived
    at_byte: int
    kind: Literal["stalled"] = "stalled"


@dataclass(frozen=True)
class Retrying:
    path: str
    attempt: int
    max_attempts: int
    wait: float
    reason: str
    kind: Literal["retrying"] = "retrying"


@dataclass(frozen=True)
class Verified:
    path: str
    ok: bool
    source: FileSource
    expected: str
    actual: str
    kind: Literal["verified"] = "verified"


@dataclass(frozen=True)
class FileDone:
    path: str
    size: int
    fetched_bytes: int  # bytes that came over the network for this file in this run
    seconds: float
    source: FileSource
    kind: Literal["file_done"] = "file_done"


@dataclass(frozen=True)
class HubWaiting:
    """No byte has come from the Hub for ``seconds`` while files wait for it (the Hub or
    the link is down, or answers nothing): the job keeps retrying.  ``waiting`` False:
    bytes come again."""

    waiting: bool
    seconds: float
    reason: str
    kind: Literal["hub_waiting"] = "hub_waiting"


@dataclass(frozen=True)
class HubWarning:
    message: str
    path: str = ""
    kind: Literal["warning"] = "warning"


@dataclass(frozen=True)
class DownloadSummary:
    repo: str
    revision: str
    target: str
    files: int
    total_bytes: int
    fetched_bytes: int
    reused_files: int
    refetched: tuple[str, ...]  # files whose hash did not match and were fetched again
    seconds: float
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def average_speed(self) -> float:
        return self.fetched_bytes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Done:
    summary: DownloadSummary
    kind: Literal["done"] = "done"


DownloadEvent = (
    ListingDone
    | Queued
    | Preflight
    | FileStarted
    | FileProgress
    | Stalled
    | Retrying
    | HubWaiting
    | Verified
    | FileDone
    | HubWarning
    | Done
)
