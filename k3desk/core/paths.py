"""Where k3desk keeps its files.  ``K3DESK_HOME`` overrides everything (tests use it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from k3desk.core.private import private_dir


@dataclass(frozen=True)
class AppPaths:
    config: Path
    data: Path
    cache: Path
    state: Path

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
        return self.state / "logs"

    @property
    def history_db(self) -> Path:
        return self.data / "history.sqlite3"

    def ensure(self) -> AppPaths:
        for p in (self.config, self.data, self.cache, self.state):
            private_dir(p)
        return self


def default_paths(env: dict[str, str] | None = None) -> AppPaths:
    e = os.environ if env is None else env
    home = e.get("K3DESK_HOME")
    if home:
        root = Path(home)
        return AppPaths(root / "config", root / "data", root / "cache", root / "state")
    user = Path(e.get("HOME", str(Path.home())))

    def xdg(var: str, fallback: str) -> Path:
        return Path(e.get(var) or user / fallback) / "k3desk"

    return AppPaths(
        xdg("XDG_CONFIG_HOME", ".config"),
        xdg("XDG_DATA_HOME", ".local/share"),
        xdg("XDG_CACHE_HOME", ".cache"),
        xdg("XDG_STATE_HOME", ".local/state"),
    )
