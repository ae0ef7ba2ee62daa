"""The desktop launcher: .desktop entry, icons and AppStream metainfo in XDG_DATA_HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from PySide6.QtGui import QImage

REPO = Path(__file__).resolve().parents[2]


def run_k3desk(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def test_install_writes_entry_icons_and_metainfo_that_start_k3desk(tmp_path: Path) -> None:
    data = tmp_path / "xdg"
    env = {**os.environ, "XDG_DATA_HOME": str(data), "PYTHONPATH": str(REPO)}
    proc = run_k3desk("--install-desktop-entry", env=env)
    assert proc.returncode == 0, proc.stderr
    entry = (data / "applications" / "k3desk.desktop").read_text()
    fields = dict(
        line.split("=", 1)
        for line in entry.splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert fields["Type"] == "Application"
    assert fields["Icon"] == "k3desk"
    assert fields["Terminal"] == "false"
    assert "@" not in entry  # every placeholder filled
    exec_argv = fields["Exec"].split()
    assert exec_argv[-1] == "--gui"
    # the Exec line really starts k3desk (asked for its version instead of the GUI)
    version_argv = [a for a in exec_argv[:-1] if not a.startswith("PYTHONPATH=")]
    if version_argv[0] == "env":
        version_argv = version_argv[1:]
    out = subprocess.run(
        [*version_argv, "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert "k3desk" in out.stdout + out.stderr
    for size in (48, 64, 128, 256, 512):
        png = data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "k3desk.png"
        img = QImage(str(png))
        assert (img.width(), img.height()) == (size, size)
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "k3desk.svg").is_file()
    meta = ElementTree.parse(data / "metainfo" / "io.github.k3desk.k3desk.metainfo.xml")
    root = meta.getroot()
    assert root.get("type") == "desktop-application"
    assert root.findtext("launchable") == "k3desk.desktop"
    # the freedesktop and AppStream validators accept both files as installed
    for argv in (
        ["desktop-file-validate", str(data / "applications" / "k3desk.desktop")],
        [
            "appstreamcli",
            "validate",
            "--no-net",
            "--pedantic",
            str(data / "metainfo" / "io.github.k3desk.k3desk.metainfo.xml"),
        ],
    ):
        assert shutil.which(argv[0]), f"{argv[0]} is missing: scripts/setup.sh --test installs it"
        check = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        report = (check.stdout + check.stderr).strip()
        assert check.returncode == 0, report
        # hints count too (e.g. two main categories: the app would show twice in menus)
        assert argv[0] != "desktop-file-validate" or not report, report
    categories = [c for c in fields["Categories"].split(";") if c]
    main_categories = {"AudioVideo", "Audio", "Video", "Development", "Education", "Game",
                       "Graphics", "Network", "Office", "Science", "Settings", "System",
                       "Utility"}  # fmt: skip
    assert len(main_categories.intersection(categories)) == 1, categories
    assert [c.text for c in root.iter("category")] == categories
    # uninstall removes what install wrote
    proc = run_k3desk("desktop-entry", "uninstall", env=env)
    assert proc.returncode == 0
    assert not (data / "applications" / "k3desk.desktop").exists()


def test_an_unwritable_target_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = run_k3desk("desktop-entry", "install", "--prefix", str(blocker), env=env)
    assert proc.returncode == 1
    assert "Cannot write the desktop entry" in proc.stderr
    assert "Traceback" not in proc.stderr
