"""The automation hook's ``models``: the Models page's rows, as the table shows them, in the
app running as its own process (the same rows ``k3desk models list`` gives)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from k3desk.core.app.library import add_model, list_models
from k3desk.core.app.services import Services
from k3desk.core.app.subject import Subject
from tests.e2e.test_app_process import REPO, App

pytestmark = [pytest.mark.gui, pytest.mark.slow]
H100 = REPO / "resources" / "hardware" / "8xH100-2TB.json"


def test_the_models_command_returns_the_models_pages_rows(k3_home: Path, tiny_k3) -> None:  # type: ignore[no-untyped-def]
    services = Services()
    add_model(services, tiny_k3.first_part)
    (k3_home / "config").mkdir(parents=True, exist_ok=True)
    (k3_home / "config" / "settings.json").write_text(json.dumps({"wizard_done": True}))
    hw = services.load_hardware(H100)
    (expected,) = list_models(services, hw, Subject.hardware_file(H100, hw)).rows
    app = App(k3_home, "--gui", "--hardware", str(H100))
    try:
        assert app.next()["event"] == "ready"
        for _ in range(100):
            answer = app.send("models")
            if answer["event"] == "ok" and answer["rows"]:
                break
            time.sleep(0.2)
        assert answer["event"] == "ok", answer
        assert "8xH100-2TB.json" in answer["judged"]
        (row,) = answer["rows"]
        assert row["shard"] == str(tiny_k3.first_part)
        assert row["verdict"] == expected.label
        assert row["speed"] == expected.speed.text()
        assert row["vision"] == "yes"
        assert app.send("quit")["event"] == "ok"
        assert app.proc.wait(timeout=30) == 0
    finally:
        app.close()
