"""Value types and small helpers both shells use as they are: the errors they catch, the
units they print, the progress and cancel tokens they pass, the settings they show, the
tier they name, and the path helpers that keep a file name printable.

A shell imports these from here, never from the core module that defines them.
"""

from __future__ import annotations

from k3desk.core.catalog.model import Tier
from k3desk.core.errors import (
    Cancelled,
    CatalogError,
    ChatError,
    EngineError,
    K3Error,
    ValidationError,
)
from k3desk.core.localfiles import DEFAULT_LIMIT
from k3desk.core.private import private_dir, private_file, write_shared
from k3desk.core.progress import CancelToken, Progress
from k3desk.core.resources import resources_dir
from k3desk.core.safepaths import has_undecodable, safe_file_name, scrub, visible, what_is
from k3desk.core.settings import EFFORTS, MAX_KEPT_STATE_GIB, THEMES, Settings, SettingsStore
from k3desk.core.units import GiB, fmt_bytes

__all__ = [
    "DEFAULT_LIMIT",
    "EFFORTS",
    "MAX_KEPT_STATE_GIB",
    "THEMES",
    "CancelToken",
    "Cancelled",
    "CatalogError",
    "ChatError",
    "EngineError",
    "GiB",
    "K3Error",
    "Progress",
    "Settings",
    "SettingsStore",
    "Tier",
    "ValidationError",
    "fmt_bytes",
    "has_undecodable",
    "private_dir",
    "private_file",
    "resources_dir",
    "safe_file_name",
    "scrub",
    "visible",
    "what_is",
    "write_shared",
]
