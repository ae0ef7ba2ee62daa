"""Where k3desk keeps its files.  ``K3DESK_HOME`` overrides everything (tests use it).

The folders are the platform's own, from platformdirs: on Linux the XDG ones
(``$XDG_CONFIG_HOME/k3desk``, ``$XDG_DATA_HOME/k3desk``, ``$XDG_CACHE_HOME/k3desk``,
``$XDG_STATE_HOME/k3desk`` with logs in its ``log/``), on macOS ``~/Library/Application
Support/k3desk``, ``~/Library/Caches/k3desk`` and ``~/Library/Logs/k3desk``, on Windows
``%LOCALAPPDATA%\\k3desk``.  Earlier versions used the XDG layout by hand on every
system (logs in ``state/logs``); :func:`migrate_legacy` moves what is there to the
new places once, without overwriting anything.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from platformdirs.api import PlatformDirsABC

from k3desk.core.private import private_dir, write_private

APP_NAME = "k3desk"
MIGRATED_MARKER = "moved-from-old-folders"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppPaths:
    config: Path
    data: Path
    cache: Path
    state: Path
    log: Path | None = None  # None: ``state/logs`` (K3DESK_HOME and the old layout)

    @property
    def settings_file(self) -> Path:
        return self.config / "settings.json"

    @property
    def engines_dir(self) -> Path:
        return self.data / "engines"

    @property
    def models_dir(self) -> Path:
        return self.data / "models"

    @property
    def logs_dir(self) -> Path:
        return self.log if self.log is not None else self.state / "logs"

    @property
    def history_db(self) -> Path:
        return self.data / "history.sqlite3"

    def ensure(self) -> AppPaths:
        for p in (self.config, self.data, self.cache, self.state, self.logs_dir):
            private_dir(p)
        return self


def default_paths(
    env: dict[str, str] | None = None, dirs: PlatformDirsABC | None = None
) -> AppPaths:
    """``K3DESK_HOME``'s folders when it is set, else the platform's (``dirs``)."""
    e = os.environ if env is None else env
    home = e.get("K3DESK_HOME")
    if home:
        root = Path(home)
        return AppPaths(root / "config", root / "data", root / "cache", root / "state")
    d = dirs or platformdirs.PlatformDirs(APP_NAME, appauthor=False)
    return AppPaths(
        Path(d.user_config_dir),
        Path(d.user_data_dir),
        Path(d.user_cache_dir),
        Path(d.user_state_dir),
        Path(d.user_log_dir),
    )


def legacy_paths(env: dict[str, str] | None = None) -> AppPaths:
    """Where versions before platformdirs kept their files: XDG by hand, on every system."""
    e = os.environ if env is None else env
    user = Path(e.get("HOME", str(Path.home())))

    def xdg(var: str, fallback: str) -> Path:
        return Path(e.get(var) or user / fallback) / APP_NAME

    return AppPaths(
        xdg("XDG_CONFIG_HOME", ".config"),
        xdg("XDG_DATA_HOME", ".local/share"),
        xdg("XDG_CACHE_HOME", ".cache"),
        xdg("XDG_STATE_HOME", ".local/state"),
    )


@dataclass(frozen=True)
class Move:
    """One entry of an old folder: moved to ``new``, or ``kept`` where it was (``why``)."""

    old: Path
    new: Path
    kept: bool = False
    why: str = ""


def migrate_legacy(paths: AppPaths, legacy: AppPaths) -> list[Move]:
    """Move the old folders' contents into ``paths`` (the same on Linux, but for the logs).

    Done once: a marker in the state folder says so.  Entry by entry: an entry whose
    name already exists at the new place is kept where it was (nothing is overwritten
    or merged), as is one that cannot be moved.  Old folders left empty are removed.
    Paths in ``settings.json`` that pointed into a moved folder (a download folder, a
    built engine) are rewritten to the new place.
    """
    marker = paths.state / MIGRATED_MARKER
    if marker.exists():
        return []
    moves: list[Move] = []
    # logs first: on the old layout they sat inside the state folder
    pairs = [
        (legacy.logs_dir, paths.logs_dir),
        (legacy.config, paths.config),
        (legacy.data, paths.data),
        (legacy.cache, paths.cache),
        (legacy.state, paths.state),
    ]
    for old, new in pairs:
        if old == new or not old.is_dir():
            continue
        for entry in sorted(old.iterdir()):
            target = new / entry.name
            if entry == new or _inside(new, entry):
                continue  # e.g. the new log folder inside the old state folder
            if target.exists() or target.is_symlink():
                moves.append(Move(entry, target, kept=True, why="already exists at the new place"))
                continue
            try:
                private_dir(new)
                shutil.move(str(entry), str(target))
            except OSError as exc:
                moves.append(Move(entry, target, kept=True, why=exc.strerror or str(exc)))
                continue
            moves.append(Move(entry, target))
        with contextlib.suppress(OSError):
            old.rmdir()  # only when empty
    # if the marker cannot be written it is tried again next time; nothing moves twice
    with contextlib.suppress(OSError):
        private_dir(paths.state)
        write_private(marker, "old folders moved; see k3desk/core/paths.py\n")
    moved = [m for m in moves if not m.kept]
    if moved:
        _rewrite_settings(paths.settings_file, moved)
    for m in moves:
        if m.kept:
            log.warning("kept %s where it was (%s), not moved to %s", m.old, m.why, m.new)
        else:
            log.info("moved %s to %s", m.old, m.new)
    return moves


def _inside(path: Path, folder: Path) -> bool:
    return path != folder and path.is_relative_to(folder)


def _rewrite_settings(settings_file: Path, moved: list[Move]) -> None:
    """Point absolute paths in the settings that named a moved entry at its new place."""
    try:
        data = json.loads(settings_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no settings, or a broken file the settings store reports itself

    def fix(value: object) -> object:
        if isinstance(value, str):
            for m in moved:
                old = str(m.old)
                if value == old or value.startswith(old + os.sep):
                    return str(m.new) + value[len(old) :]
            return value
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    fixed = fix(data)
    if fixed != data:
        write_private(settings_file, json.dumps(fixed, indent=2))
