"""Where a file dialog opens: models in the models folder, images in Pictures, exports in
Documents, anything else at home; never the folder the app happens to run from (a
dialog given "" opens in the process's working directory, which for an installed app
is wherever it was started, e.g. the source tree's ``resources/``).

A folder typed in the field the dialog fills is preferred when it exists.
"""

from __future__ import annotations

import contextlib
from enum import StrEnum
from pathlib import Path

from k3desk.core.paths import AppPaths
from k3desk.core.private import private_dir
from k3desk.core.settings import Settings


class Kind(StrEnum):
    MODEL = "model"  # a GGUF shard, a projector, a model folder
    IMAGE = "image"  # an image to attach
    EXPORT = "export"  # where an exported conversation goes
    OTHER = "other"  # an engine binary, an SSH key, a hardware file


def _existing(path: Path) -> Path | None:
    """``path`` when it is a folder, else its parent when that is one."""
    for p in (path, path.parent):
        try:
            if p.is_dir():
                return p
        except OSError:
            continue
    return None


def _xdg_folder(home: Path, name: str) -> Path:
    """``~/Pictures``-style folders, as named in ``user-dirs.dirs`` where it says so
    (xdg-user-dirs: ``XDG_PICTURES_DIR="$HOME/Bilder"``)."""
    key = {"Pictures": "XDG_PICTURES_DIR", "Documents": "XDG_DOCUMENTS_DIR"}.get(name)
    conf = home / ".config" / "user-dirs.dirs"
    if key is not None:
        try:
            for line in conf.read_text(encoding="utf-8", errors="replace").splitlines():
                k, _, v = line.partition("=")
                if k.strip() == key:
                    value = v.strip().strip('"').replace("$HOME", str(home))
                    if value and Path(value).is_dir():
                        return Path(value)
        except OSError:
            pass
    return home / name


def start_folder(
    kind: Kind,
    settings: Settings,
    paths: AppPaths,
    *,
    current: str = "",
    home: Path | None = None,
) -> Path:
    """The folder a dialog for ``kind`` opens in (see the module docstring)."""
    home = home or Path.home()
    if current.strip():
        found = _existing(Path(current.strip()).expanduser())
        if found is not None:
            return found
    if kind is Kind.MODEL:
        candidates = [settings.effective_download_dir(paths.models_dir)]
        candidates += [Path(d).expanduser() for d in settings.model_dirs]
        candidates.append(paths.models_dir)
        if not any(c.is_dir() for c in candidates):
            # the app's own models folder (where downloads go) is made when first needed
            with contextlib.suppress(OSError):
                private_dir(paths.models_dir)
    elif kind is Kind.IMAGE:
        candidates = [_xdg_folder(home, "Pictures")]
    elif kind is Kind.EXPORT:
        candidates = [_xdg_folder(home, "Documents")]
    else:
        candidates = []
    for c in candidates:
        if c.is_dir():
            return c
    return home
