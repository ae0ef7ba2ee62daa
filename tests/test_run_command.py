"""scripts/run.sh sets up only when something the setup depends on changed: the second
start of an unchanged clone runs no pip; a changed pyproject.toml sets up again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def clone(tmp_path: Path) -> Path:
    """The run command's files in a folder of their own, with a stand-in setup (it
    records that it ran, then writes the stamp as scripts/setup.sh does) and app."""
    root = tmp_path / "k3desk"
    (root / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(REPO / name, root / name)
    for name in ("run.sh", "stamp.sh"):
        shutil.copy(REPO / "scripts" / name, root / "scripts" / name)
    real_tail = (REPO / "scripts" / "setup.sh").read_text().split("# what this setup was made")[1]
    (root / "scripts" / "setup.sh").write_text(
        '#!/usr/bin/env bash\nset -euo pipefail\ncd "$(dirname "$0")/.."\n'
        "want_test=0\necho ran >> setup-runs.txt\n# what this setup was made" + real_tail
    )
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    app = bin_dir / "k3desk"
    app.write_text('#!/bin/sh\necho "app $*"\n')
    app.chmod(0o755)
    return root


def run(root: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "K3DESK_SETUP"}
    out = subprocess.run(
        ["bash", "scripts/run.sh", "--page", "chat"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    return out.stdout


def setups(root: Path) -> int:
    f = root / "setup-runs.txt"
    return len(f.read_text().splitlines()) if f.exists() else 0


def test_an_unchanged_clone_opens_without_setting_up_again(tmp_path: Path) -> None:
    root = clone(tmp_path)
    assert run(root) == "app --page chat\n"
    assert setups(root) == 1  # the first start sets up
    assert run(root) == "app --page chat\n"
    assert setups(root) == 1  # nothing changed: no setup, no pip
    with (root / "pyproject.toml").open("a") as f:
        f.write("\n# a new dependency would be here\n")
    run(root)
    assert setups(root) == 2  # what the setup installs from changed
    run(root)
    assert setups(root) == 2
