"""Downloads from the Hugging Face Hub for the shells: the request and its options, the
job that runs it, the events it reports on the way, the token store, and the check of a
finished download against the Hub's hashes.

Both shells get their job from :func:`start_download`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.hub.job import DownloadJob
from k3desk.core.hub.model import (
    Done,
    DownloadEvent,
    DownloadOptions,
    DownloadRequest,
    DownloadSummary,
    FileDone,
    FileProgress,
    FileStarted,
    HubWaiting,
    HubWarning,
    ListingDone,
    Preflight,
    Queued,
    Retrying,
    Stalled,
    Verified,
)
from k3desk.core.hub.state import discard_partials
from k3desk.core.hub.tokens import TokenStore, mask
from k3desk.core.hub.verify import verify_target

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

__all__ = [
    "Done",
    "DownloadEvent",
    "DownloadJob",
    "DownloadOptions",
    "DownloadRequest",
    "DownloadSummary",
    "FileDone",
    "FileProgress",
    "FileStarted",
    "HubWaiting",
    "HubWarning",
    "ListingDone",
    "Preflight",
    "Queued",
    "Retrying",
    "Stalled",
    "TokenStore",
    "Verified",
    "discard_partials",
    "download_folder",
    "mask",
    "start_download",
    "verify_target",
]


def download_folder(request: DownloadRequest) -> str:
    """The folder a download lands in under the models folder: the tier's id, else the
    repo's name with ``--`` for ``/``."""
    if request.label and request.label != request.repo:
        return request.label
    return request.repo.replace("/", "--")


def start_download(
    services: Services,
    request: DownloadRequest,
    target: Path | None = None,
    *,
    tokens: TokenStore,
    options: DownloadOptions | None = None,
    on_event: Callable[[DownloadEvent], None] | None = None,
) -> DownloadJob:
    """The job that downloads ``request`` into ``target`` (None: the models folder's
    :func:`download_folder`), with the Hub token ``tokens`` finds (HF_TOKEN, the keyring,
    this session; none: anonymous) and the Hub ``options`` name, else HF_ENDPOINT's, else
    the public one.  The token is looked up now (a keyring may ask to be unlocked).

    Nothing runs yet: the shell runs ``job.run()`` where it waits (a background operation,
    the terminal's thread) and pauses or cancels the job from elsewhere; the same request
    and target resume what an earlier job left."""
    opts = options or DownloadOptions()
    opts = replace(
        opts,
        token=tokens.get(),
        endpoint=opts.endpoint or os.environ.get("HF_ENDPOINT") or None,
    )
    where = target if target is not None else services.paths.models_dir / download_folder(request)
    return DownloadJob(request, where.expanduser(), opts, on_event=on_event)
