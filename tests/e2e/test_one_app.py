"""One k3desk per person: a second start (the launcher's Exec line, `k3desk` with no
command) brings the running app's window forward and exits, whatever page it names; a
start after the app was killed (kill -9, its lock and socket left behind) opens the app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3desk.core.app.instance import claim, socket_name
from k3desk.core.paths import default_paths
from tests.e2e.test_app_process import REPO, App

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def again(home: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {
        **os.environ,
        "K3DESK_HOME": str(home),
        "K3DESK_AUTOMATION": "1",
        "QT_QPA_PLATFORM": "offscreen",
        "PYTHONPATH": str(REPO),
    }
    t0 = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-m", "k3desk", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return ran, time.monotonic() - t0


def last_line(ran: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return dict(json.loads(ran.stdout.strip().splitlines()[-1]))


@pytest.fixture
def apps() -> Iterator[list[App]]:
    started: list[App] = []
    yield started
    for a in started:
        a.close()


def test_a_second_start_brings_the_running_window_forward(apps: list[App], tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = App(home, "--gui", "--no-wizard")
    apps.append(first)
    assert first.next(timeout=120)["event"] == "ready"
    ran, took = again(home)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert last_line(ran) == {"event": "forwarded", "pid": first.proc.pid}
    assert took < 30
    ran, _ = again(home, "--page", "engine")  # the page asked for is shown
    assert last_line(ran)["pid"] == first.proc.pid
    state = first.send("state")
    assert state["page"] == "engine"
    assert state["visible"] is True
    assert first.send("errors")["last"] is None

    # killed: its lock and its socket stay behind, and the next start opens the app
    first.proc.kill()
    first.proc.wait(timeout=30)
    assert Path(socket_name(default_paths({"K3DESK_HOME": str(home)}))).exists()
    second = App(home, "--gui", "--no-wizard")
    apps.append(second)
    assert second.next(timeout=120)["event"] == "ready"
    ran, _ = again(home)
    assert last_line(ran) == {"event": "forwarded", "pid": second.proc.pid}
    assert second.send("quit")["event"] == "ok"
    assert second.proc.wait(timeout=30) == 0


def test_a_start_while_the_app_quits_opens_the_app(apps: list[App], tmp_path: Path) -> None:
    """An app quitting holds its lock a moment longer but answers no one: a start then
    waits for the lock and opens the app itself (never a start that exits with no window
    left).  Here the test holds the lock, as a quitting app would, for a few seconds."""
    home = tmp_path / "home"
    paths = default_paths({"K3DESK_HOME": str(home)})
    lock = claim(paths)
    assert lock is not None
    second = App(home, "--gui", "--no-wizard")
    apps.append(second)
    time.sleep(4)
    assert second.proc.poll() is None  # waiting, not gone
    lock.release()
    assert second.next(timeout=60)["event"] == "ready"
    assert second.send("quit")["event"] == "ok"
    assert second.proc.wait(timeout=30) == 0
