"""The desktop app's own options open it without ``--gui`` (as ``k3desk --help`` and the
module docstring of k3desk.ui.main describe them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_app_process import App

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def test_page_and_no_wizard_open_the_app_on_that_page(tmp_path: Path) -> None:
    a = App(tmp_path / "home", "--page", "engine", "--no-wizard")
    try:
        ready = a.next()
        assert ready["event"] == "ready"
        assert ready["page"] == "engine"
        assert ready["first_run"] is True
        assert ready["wizard"] is False
        assert a.send("quit")["event"] == "ok"
        assert a.proc.wait(timeout=30) == 0
    finally:
        a.close()


def test_a_hardware_file_that_is_not_json_is_reported_in_the_app(tmp_path: Path) -> None:
    bad = tmp_path / "box.json"
    bad.write_text("{nope")
    a = App(tmp_path / "home", "--hardware", str(bad))
    try:
        ready = a.next()
        assert ready["event"] == "ready"
        assert ready["wizard"] is True  # first run
        last = None
        for _ in range(50):
            last = a.send("errors")["last"]
            if last:
                break
        assert last is not None
        message, hint, unexpected = last
        assert str(bad) in message
        assert "not valid JSON" in message
        assert "k3desk doctor --json" in hint
        assert unexpected is False
        assert a.send("quit")["event"] == "ok"
        assert a.proc.wait(timeout=30) == 0
    finally:
        a.close()
