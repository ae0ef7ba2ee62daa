"""The app's folders come from the platform (platformdirs); older versions' folders move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from platformdirs.macos import MacOS
from platformdirs.unix import Unix

from k3desk.core.paths import MIGRATED_MARKER, default_paths, legacy_paths, migrate_legacy


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("K3DESK_HOME")
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    return home


def _old_install(user: Path) -> Path:
    """What an older k3desk left: settings naming its own download folder, history, logs."""
    old = legacy_paths()
    (old.models_dir / "tiny").mkdir(parents=True)
    (old.models_dir / "tiny" / "K3-00001-of-00002.gguf").write_bytes(b"GGUF")
    old.config.mkdir(parents=True)
    old.settings_file.write_text(
        json.dumps(
            {
                "download_dir": str(old.models_dir / "tiny"),
                "model_dirs": [str(old.models_dir), "/srv/models"],
                "theme": "dark",
            }
        )
    )
    old.history_db.write_bytes(b"SQLite format 3\0")
    old.logs_dir.mkdir(parents=True)
    (old.logs_dir / "k3desk.log").write_text("an old log line\n")
    return old.data


def test_linux_folders_follow_xdg_and_logs_get_their_own(
    user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(user / "xdg-data"))
    p = default_paths(dirs=Unix("k3desk", appauthor=False))
    assert p.config == user / ".config" / "k3desk"
    assert p.data == user / "xdg-data" / "k3desk"
    assert p.cache == user / ".cache" / "k3desk"
    assert p.logs_dir == user / ".local" / "state" / "k3desk" / "log"


def test_k3desk_home_still_overrides_everything(user: Path) -> None:
    p = default_paths({"K3DESK_HOME": str(user / "h")})
    assert (p.config, p.logs_dir) == (user / "h" / "config", user / "h" / "state" / "logs")


def test_on_linux_only_the_logs_move_and_nothing_is_lost(user: Path) -> None:
    _old_install(user)
    new = default_paths(dirs=Unix("k3desk", appauthor=False))
    moves = migrate_legacy(new, legacy_paths())
    assert [(m.old.name, m.kept) for m in moves] == [("k3desk.log", False)]
    assert (new.logs_dir / "k3desk.log").read_text() == "an old log line\n"
    assert not (new.state / "logs").exists()
    assert json.loads(new.settings_file.read_text())["theme"] == "dark"
    assert (new.models_dir / "tiny" / "K3-00001-of-00002.gguf").read_bytes() == b"GGUF"


def test_on_macos_everything_moves_to_library_and_settings_follow(user: Path) -> None:
    old_data = _old_install(user)
    new = default_paths(dirs=MacOS("k3desk", appauthor=False))
    support = user / "Library" / "Application Support" / "k3desk"
    assert (new.config, new.data, new.logs_dir) == (support, support, user / "Library/Logs/k3desk")
    moves = migrate_legacy(new, legacy_paths())
    assert moves
    assert not [m for m in moves if m.kept]
    assert (new.models_dir / "tiny" / "K3-00001-of-00002.gguf").read_bytes() == b"GGUF"
    assert new.history_db.read_bytes().startswith(b"SQLite")
    assert (new.logs_dir / "k3desk.log").is_file()
    settings = json.loads(new.settings_file.read_text())
    assert settings["download_dir"] == str(new.models_dir / "tiny")
    assert settings["model_dirs"] == [str(new.models_dir), "/srv/models"]
    assert not old_data.exists()  # emptied folders are removed
    assert (new.state / MIGRATED_MARKER).is_file()
    assert migrate_legacy(new, legacy_paths()) == []  # once


def test_an_entry_already_at_the_new_place_is_kept_not_overwritten(user: Path) -> None:
    _old_install(user)
    new = default_paths(dirs=MacOS("k3desk", appauthor=False))
    new.config.mkdir(parents=True)
    new.settings_file.write_text('{"theme": "light"}')
    moves = migrate_legacy(new, legacy_paths())
    kept = [m for m in moves if m.kept]
    assert [m.old for m in kept] == [legacy_paths().settings_file]
    assert json.loads(new.settings_file.read_text()) == {"theme": "light"}
    assert legacy_paths().settings_file.is_file()  # still there, for the user to look at
