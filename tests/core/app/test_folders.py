"""Where file dialogs open: the models folder, Pictures, Documents, home; never the folder
the app was started from."""

from __future__ import annotations

from pathlib import Path

from k3desk.core.app.folders import Kind, start_folder
from k3desk.core.paths import default_paths
from k3desk.core.settings import Settings


def test_each_kind_of_file_opens_where_it_lives(tmp_path: Path, k3_home: Path) -> None:
    home = tmp_path / "user"
    (home / "Pictures").mkdir(parents=True)
    paths = default_paths().ensure()
    models = tmp_path / "models"
    models.mkdir()
    s = Settings(download_dir=str(models))
    assert start_folder(Kind.MODEL, s, paths, home=home) == models
    assert start_folder(Kind.MODEL, Settings(), paths, home=home) == paths.models_dir
    assert start_folder(Kind.IMAGE, s, paths, home=home) == home / "Pictures"
    assert start_folder(Kind.EXPORT, s, paths, home=home) == home  # no Documents: home
    assert start_folder(Kind.OTHER, s, paths, home=home) == home
    # the file in the field being filled wins: its folder
    shard = models / "sub" / "m-00001-of-00002.gguf"
    shard.parent.mkdir()
    shard.write_bytes(b"")
    assert start_folder(Kind.MODEL, s, paths, current=str(shard), home=home) == shard.parent
    assert start_folder(Kind.MODEL, s, paths, current="/no/such/x.gguf", home=home) == models


def test_the_pictures_folder_named_in_user_dirs(tmp_path: Path, k3_home: Path) -> None:
    home = tmp_path / "user"
    (home / "Bilder").mkdir(parents=True)
    (home / ".config").mkdir()
    (home / ".config" / "user-dirs.dirs").write_text('XDG_PICTURES_DIR="$HOME/Bilder"\n')
    assert start_folder(Kind.IMAGE, Settings(), default_paths(), home=home) == home / "Bilder"
