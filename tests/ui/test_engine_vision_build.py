"""The Engine page offers a build from the tier's fork when the tier has images and the
engine here cannot show them; the build is the real `--source` build (a local git
repository standing in for the fork, built with CMake), and afterwards the offer is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3desk.core.engines import source
from k3desk.core.engines.source import GitSource
from k3desk.ui.engine.page import EnginePanel
from tests.core.engines.test_engine_source import make_repo
from tests.fixtures.engine import write_fake


def test_a_tier_with_images_gets_its_fork_built_when_the_engine_cannot_show_them(  # type: ignore[no-untyped-def]
    ctx, qtbot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the "fork": a repository whose llama-server knows the kimik3 projector, as unsloth's does
    fork = write_fake(tmp_path / "fork", "serve", FAKE_PROJECTOR_TYPES="mlp,kimik3")
    make_repo(tmp_path / "repo", fork)
    local = GitSource(str(tmp_path / "repo"), "main", "unsloth", "a stand-in for unsloth's fork")
    monkeypatch.setitem(source.FORKS, "unsloth", local)

    panel = EnginePanel(ctx)
    qtbot.addWidget(panel)
    panel.show()
    panel.set_tier(ctx.services.catalog.get("6block-iq1s-xs"))
    panel.refresh_engines()
    qtbot.waitUntil(lambda: panel.vision is not None, timeout=60_000)
    # upstream b11434 (the engine here) loads K3 text but not 6block's projector
    assert panel.usable()
    assert panel.vision is not None
    assert not panel.vision.usable
    assert panel.build_vision.isVisible()
    assert panel.build_vision.text() == "Build for images (unsloth)"
    assert "does not know the 'kimik3' vision projector" in panel.engines_note.text()

    panel.build_vision.click()
    assert panel.build.text() == "Cancel build"
    assert not panel.build_vision.isVisible()
    qtbot.waitUntil(lambda: panel._build_task is None, timeout=120_000)
    log = panel.build_log.toPlainText()
    assert log.startswith(f"source: {local.label}")
    assert "Building C object" in log
    assert "Installed " in log
    # the new engine is found first and shows 6block's images: no offer any more
    qtbot.waitUntil(lambda: panel.vision is not None and panel.vision.usable, timeout=60_000)
    assert panel.rows[0].source.startswith("managed")
    assert not panel.build_vision.isVisible()
    assert ctx.reporter.last is None
