"""The download child in a frozen (PyInstaller) build, where sys.executable is the app itself."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from k3desk.core.hub import _hfchild
from k3desk.core.hub.job import DownloadJob
from k3desk.core.hub.model import DownloadOptions, DownloadRequest
from tests.fixtures.hub import TEMPLATE, TIER_REPO, TierRepo, shard_name

REPO = Path(__file__).resolve().parents[3]


def test_a_python_install_starts_the_child_as_a_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sys, "frozen", raising=False)
    assert _hfchild.command() == [sys.executable, "-m", "k3desk.core.hub._hfchild"]


def test_a_frozen_app_starts_itself_with_the_hidden_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", "/opt/k3desk/k3desk")
    assert _hfchild.command() == ["/opt/k3desk/k3desk", "--hub-child"]


def test_the_app_entry_point_runs_the_child_and_downloads_with_it(
    tier_repo: TierRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in for the bundle: an executable that is `k3desk` and not a Python."""
    app = tmp_path / "bundle" / "k3desk"
    app.parent.mkdir()
    app.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m k3desk "$@"\n')
    app.chmod(app.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(app))

    req = DownloadRequest(TIER_REPO, (shard_name(1), TEMPLATE))
    opts = DownloadOptions(endpoint=tier_repo.hub.endpoint, margin_bytes=0, transport="hub")
    summary = DownloadJob(req, tmp_path / "models", opts).run()
    assert summary.fetched_bytes == sum(len(tier_repo.files[p]) for p in req.allow_patterns)
    for p in req.allow_patterns:
        assert (tmp_path / "models" / p).read_bytes() == tier_repo.files[p]
