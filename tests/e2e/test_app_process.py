"""End to end: ``python -m k3desk`` as its own process, driven through the automation hook
(K3DESK_AUTOMATION=1: JSON lines on stdout and stdin, see k3desk/ui/automation.py)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtGui import QImage

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gui, pytest.mark.slow]


class App:
    def __init__(self, home: Path, *args: str) -> None:
        env = {
            **os.environ,
            "K3DESK_HOME": str(home),
            "K3DESK_AUTOMATION": "1",
            "QT_QPA_PLATFORM": "offscreen",
            "PYTHONPATH": str(REPO),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "k3desk", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def next(self, timeout: float = 60) -> dict[str, Any]:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"no answer from the app; stderr:\n{err[-3000:]}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def send(self, cmd: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.next()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    a = App(
        tmp_path / "home", "--gui", "--hardware", str(REPO / "resources/hardware/8xH100-2TB.json")
    )
    yield a
    a.close()


def test_first_start_opens_the_wizard_and_the_app_quits_cleanly(app: App, tmp_path: Path) -> None:
    ready = app.next()
    assert ready["event"] == "ready"
    assert ready["first_run"] is True
    assert ready["page"] == "chat"
    # 1280x800, or less where the screen's free area is smaller (less a 48-px margin)
    free_w, free_h = ready["screen"]
    size = [min(1280, free_w - 48), min(800, free_h - 48)]
    assert ready["size"] == size
    assert ready["startup_s"] < 15
    state = app.send("state")
    assert state["wizard"] is True
    assert state["wizard_page"] == "machine"
    # the hardware file given on the command line is planned for; move to the tiers
    for _ in range(100):
        moved = app.send("wizard-next")
        if moved["wizard_page"] == "tiers":
            break
        import time

        time.sleep(0.2)
    assert moved["wizard_page"] == "tiers"
    shot = tmp_path / "window.png"
    assert app.send("grab", path=str(shot))["event"] == "ok"
    img = QImage(str(shot))
    assert [img.width(), img.height()] == size
    engine = app.send("page", name="engine")
    assert engine["page"] == "engine"
    assert "engine" in engine["pages_built"]
    assert app.send("errors")["last"] is None
    bad = app.send("page", name="nowhere")
    assert bad["event"] == "error"
    assert app.send("quit")["event"] == "ok"
    assert app.proc.wait(timeout=30) == 0
    err = app.proc.stderr.read() if app.proc.stderr else ""
    assert "Traceback" not in err
    # settings were not written behind the user's back (the wizard was not finished)
    assert not (tmp_path / "home" / "config" / "settings.json").exists()


def test_second_start_skips_the_wizard(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "settings.json").write_text(json.dumps({"wizard_done": True}))
    a = App(home)
    try:
        ready = a.next()
        assert ready["first_run"] is False
        assert ready["wizard"] is False
        assert a.send("quit")["event"] == "ok"
        assert a.proc.wait(timeout=30) == 0
    finally:
        a.close()


def test_a_broken_settings_file_is_reported_not_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "settings.json").write_text("{broken")
    a = App(home)
    try:
        ready = a.next()
        assert ready["first_run"] is False  # the file exists: not overwritten by a wizard
        last = None
        for _ in range(50):
            last = a.send("errors")["last"]
            if last:
                break
        assert last is not None
        assert "settings.json" in last[0]
        assert last[2] is False  # a K3Error with a hint, not an unexpected crash
        assert a.send("quit")["event"] == "ok"
        a.proc.wait(timeout=30)
        assert (home / "config" / "settings.json").read_text() == "{broken"
    finally:
        a.close()
