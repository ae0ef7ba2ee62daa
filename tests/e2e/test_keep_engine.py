"""Journey "close with the engine running, reopen, continue": the real app as its own
process (automation hook), the real llama-server from the venv, the tiny Kimi-K3.

Closed with "Keep it running", the process goes on without a window and the model stays
loaded; the next start takes it up (same llama-server process, checked as ours) and
continues the conversation left open; closed with "Stop", both end.  The start after
that offers the model launched last, one click away, with its load time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from k3desk.core.app import background
from k3desk.core.paths import default_paths
from k3desk.core.settings import Settings, SettingsStore
from tests.e2e.test_app_process import App

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.engine]


def until(app: App, what: Callable[[dict[str, Any]], bool], cmd: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        answer = app.send(cmd)
        if what(answer):
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting; last {cmd!r} answer: {answer}")
        time.sleep(0.3)


@pytest.fixture
def apps() -> Iterator[list[App]]:
    started: list[App] = []
    yield started
    for a in started:
        a.close()


def start(apps: list[App], home: Path) -> App:
    app = App(home, "--gui", "--no-wizard")
    apps.append(app)
    ready = app.next(timeout=120)
    assert ready["event"] == "ready", ready
    return app


def test_close_with_the_engine_running_reopen_and_continue(
    apps: list[App], tmp_path: Path, tiny_k3, llama_server, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    monkeypatch.setenv("K3DESK_LLAMA_SERVER", str(llama_server))
    # set up before (the wizard done): a first run, with no settings file, remembers nothing
    paths = default_paths({"K3DESK_HOME": str(home)})
    SettingsStore(paths.settings_file).save(Settings(wizard_done=True))
    first = start(apps, home)
    first.send("launch", shard=str(tiny_k3.first_part), mmproj=str(tiny_k3.mmproj))
    state = until(first, lambda s: s["engine"] == "ready", "state", 180)
    pid = state["engine_pid"]
    assert pid
    first.send("send", text="Name a colour", max_tokens=12)
    until(first, lambda c: len(c["messages"]) == 2 and not c["streaming"], "chat", 60)

    # close, keeping the engine: the window goes, the process and the model stay
    first.send("close", engine="keep")
    time.sleep(1.5)
    assert first.proc.poll() is None
    assert psutil.pid_exists(pid)
    kept = background.kept(default_paths({"K3DESK_HOME": str(home)}))
    assert kept is not None
    assert (kept.pid, kept.keeper_pid) == (pid, first.proc.pid)

    # reopen: the kept engine is taken up (the same process: nothing reloaded), the
    # conversation left open is shown again, and it continues
    second = start(apps, home)
    state = until(second, lambda s: s["engine"] == "ready", "state", 60)
    assert state["background"] is True
    assert state["engine_pid"] == pid
    chat = until(second, lambda c: len(c["messages"]) == 2, "chat", 30)
    assert chat["messages"][0]["content"] == "Name a colour"
    assert "kept in the background" in chat["model"]
    second.send("send", text="And another one", max_tokens=12)
    chat = until(second, lambda c: len(c["messages"]) == 4 and not c["streaming"], "chat", 60)
    assert chat["messages"][3]["role"] == "assistant"
    assert chat["messages"][3]["content"]

    # close again, stopping it: the keeper and its llama-server end
    second.send("close", engine="stop")
    assert second.proc.wait(timeout=60) == 0
    first.proc.wait(timeout=60)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert background.kept(default_paths({"K3DESK_HOME": str(home)})) is None

    # the next start: nothing runs, the last model is one click away with its load time
    third = start(apps, home)
    chat = until(third, lambda c: bool(c["relaunch"]), "chat", 30)
    assert chat["relaunch"].startswith("Relaunch ")
    assert "loads in about" in chat["relaunch"]
    third.send("relaunch")
    state = until(third, lambda s: s["engine"] == "ready", "state", 180)
    assert state["engine_pid"] not in (None, pid)
    third.send("quit")
    assert third.proc.wait(timeout=60) == 0
