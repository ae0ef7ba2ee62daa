"""Files an earlier ``hf download`` left in the Hugging Face cache (``$HF_HOME/hub``).

The cache stores each file once as ``blobs/<etag>``: the SHA-256 for LFS files,
the git blob id otherwise.  A blob of the right name and size is a candidate;
it is hashed before it is trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

from k3desk.core.hub.model import RemoteFile


def hf_cache_dir(override: Path | None = None) -> Path:
    """The hub cache folder, read from the environment now (not at import)."""
    if override is not None:
        return override
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "huggingface" / "hub"


def find_cached(cache: Path, repo: str, f: RemoteFile) -> Path | None:
    blobs = cache / f"models--{repo.replace('/', '--')}" / "blobs"
    name = f.sha256 or f.git_sha1
    if not name:
        return None
    blob = blobs / name
    try:
        if blob.is_file() and blob.stat().st_size == f.size:
            return blob
    except OSError:
        return None
    return None
