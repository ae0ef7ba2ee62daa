"""Downloads from the Hugging Face Hub for the shells: the request and its options, the
job that runs it, the events it reports on the way, the token store, and the check of a
finished download against the Hub's hashes."""

from __future__ import annotations

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
    "HubWarning",
    "ListingDone",
    "Preflight",
    "Queued",
    "Retrying",
    "Stalled",
    "TokenStore",
    "Verified",
    "discard_partials",
    "mask",
    "verify_target",
]
