"""Names from outside become paths only inside the folder they belong to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from k3desk.core.safepaths import UnsafeName, confined


def test_a_link_to_a_folder_whose_name_starts_the_same_still_leads_out(tmp_path: Path) -> None:
    """``models-old`` is not inside ``models``, although its path starts with it: a link
    planted in the download folder that points there is refused like any other."""
    root = tmp_path / "models"
    sibling = tmp_path / "models-old"
    root.mkdir()
    sibling.mkdir()
    (root / "IQ1_S").symlink_to(sibling)

    with pytest.raises(UnsafeName, match="a symbolic link on its way leads out of the folder"):
        confined(root, "IQ1_S/part-00001-of-00002.gguf")
    # a link that stays inside is followed, and the folder itself is inside
    (root / "inner").mkdir()
    (root / "alias").symlink_to(root / "inner")
    assert confined(root, "alias/x.gguf") == root / "alias" / "x.gguf"
    assert confined(root, "x.gguf") == root / "x.gguf"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "it is empty"),
        ("a/../../x.gguf", "climbs out of its folder"),
        ("/etc/x.gguf", "it is an absolute path"),
        ("a\\x.gguf", "backslash"),
        ("C:x.gguf", "it names a drive"),
        ("a//x.gguf", "empty path segment"),
        ("./x.gguf", "'.' path segment"),
        ("x\x1b[2J.gguf", "control characters"),
        ("x\udcff.gguf", "not UTF-8"),
    ],
)
def test_names_that_are_not_plain_relative_paths_are_refused(
    tmp_path: Path, name: str, why: str
) -> None:
    with pytest.raises(UnsafeName, match=re.escape(why)):
        confined(tmp_path, name)
