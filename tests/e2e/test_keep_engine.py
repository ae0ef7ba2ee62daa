"""Journey "close with the engine running, reopen, continue": the real app as its own
process (automation hook), the real llama-server from the venv, the tiny Kimi-K3.

Closed with "Keep it running", the process goes on without a window and the model stays
loaded; a second start (the launcher, `k3desk`) does not open a second app: the running
one opens its window again, with the same llama-server, the same supervisor and the
conversation left open, and the second start exits.  Closed with "Stop", the process and
its engine end.  The start after that offers the model launched last, one click away,
with its load time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from k3desk.core.app import background
from k3desk.core.app.instance import socket_name
from k3desk.core.paths import default_paths
from k3desk.core.settings import Settings, SettingsStore
from tests.e2e.test_app_process import REPO, App

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


def second_start(home: Path) -> dict[str, Any]:
    """`k3desk` with no command, as the launcher and a terminal run it: its one line."""
    env = {
        **os.environ,
        "K3DESK_HOME": str(home),
        "K3DESK_AUTOMATION": "1",
        "QT_QPA_PLATFORM": "offscreen",
        "PYTHONPATH": str(REPO),
    }
    ran = subprocess.run(
        [sys.executable, "-m", "k3desk"], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    return dict(json.loads(ran.stdout.strip().splitlines()[-1]))


def ask_to_show(home: Path) -> dict[str, Any]:
    """What a second start sends the running app, sent straight to its socket."""
    name = socket_name(default_paths({"K3DESK_HOME": str(home)}))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(name)
        sock.sendall(b'{"cmd": "show"}\n')
        answer = sock.makefile("rb").readline()
    return dict(json.loads(answer))


def engines_of(app: App) -> list[psutil.Process]:
    kids = psutil.Process(app.proc.pid).children(recursive=True)
    return [k for k in kids if k.status() != psutil.STATUS_ZOMBIE and "llama-server" in k.name()]


def launched(apps: list[App], home: Path, tiny_k3, send: str = "") -> tuple[App, int]:  # type: ignore[no-untyped-def]
    # set up before (the wizard done): a first run, with no settings file, remembers nothing
    paths = default_paths({"K3DESK_HOME": str(home)})
    SettingsStore(paths.settings_file).save(Settings(wizard_done=True))
    first = start(apps, home)
    first.send("launch", shard=str(tiny_k3.first_part), mmproj=str(tiny_k3.mmproj))
    state = until(first, lambda s: s["engine"] == "ready", "state", 180)
    pid = state["engine_pid"]
    assert pid
    if send:
        first.send("send", text=send, max_tokens=12)
        until(first, lambda c: len(c["messages"]) == 2 and not c["streaming"], "chat", 60)
    return first, pid


def test_close_with_the_engine_running_reopen_and_continue(
    apps: list[App], tmp_path: Path, tiny_k3, llama_server, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    monkeypatch.setenv("K3DESK_LLAMA_SERVER", str(llama_server))
    first, pid = launched(apps, home, tiny_k3, "Name a colour")

    # close, keeping the engine: the window goes, the process and the model stay
    first.send("close", engine="keep")
    time.sleep(1.5)
    assert first.proc.poll() is None
    assert psutil.pid_exists(pid)
    kept = background.kept(default_paths({"K3DESK_HOME": str(home)}))
    assert kept is not None
    assert (kept.pid, kept.keeper_pid) == (pid, first.proc.pid)
    assert first.send("state")["visible"] is False

    # start again: no second app; the one running opens its window again, with the same
    # llama-server and the conversation left open, and it continues
    t0 = time.monotonic()
    assert second_start(home) == {"event": "forwarded", "pid": first.proc.pid}
    assert time.monotonic() - t0 < 30
    state = first.send("state")
    assert state["visible"] is True
    assert state["engine"] == "ready"
    assert state["engine_pid"] == pid
    assert background.kept(default_paths({"K3DESK_HOME": str(home)})) is None
    chat = first.send("chat")
    assert [m["content"] for m in chat["messages"]][:1] == ["Name a colour"]
    assert "kept in the background" not in chat["model"]
    first.send("send", text="And another one", max_tokens=12)
    chat = until(first, lambda c: len(c["messages"]) == 4 and not c["streaming"], "chat", 60)
    assert chat["messages"][3]["role"] == "assistant"
    assert chat["messages"][3]["content"]

    # one supervisor: a llama-server killed is restarted by this app, and its window says
    # so; there is never a second llama-server
    os.kill(pid, signal.SIGKILL)
    state = until(
        first, lambda s: s["engine"] == "ready" and s["engine_pid"] not in (None, pid), "state", 180
    )
    assert [p.pid for p in engines_of(first)] == [state["engine_pid"]]
    restarted = state["engine_pid"]

    # close again, stopping it: the app and its llama-server end
    first.send("close", engine="stop")
    assert first.proc.wait(timeout=60) == 0
    assert not psutil.pid_exists(restarted) or (
        psutil.Process(restarted).status() == psutil.STATUS_ZOMBIE
    )
    assert background.kept(default_paths({"K3DESK_HOME": str(home)})) is None

    # the next start: nothing runs, the last model is one click away with its load time
    third = start(apps, home)
    chat = until(third, lambda c: bool(c["relaunch"]), "chat", 30)
    assert chat["relaunch"].startswith("Relaunch ")
    assert "loads in about" in chat["relaunch"]
    third.send("relaunch")
    state = until(third, lambda s: s["engine"] == "ready", "state", 180)
    assert state["engine_pid"] not in (None, pid, restarted)
    third.send("quit")
    assert third.proc.wait(timeout=60) == 0


def test_closing_with_the_engine_kept_twenty_times_raises_nothing(
    apps: list[App], tmp_path: Path, tiny_k3, llama_server, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Closed with "Keep it running" right after an answer (while the chat still asks
    the server what it is), twenty times over: no error reaches the person, and the same
    engine serves the window each time it opens again."""
    home = tmp_path / "home"
    monkeypatch.setenv("K3DESK_LLAMA_SERVER", str(llama_server))
    first, pid = launched(apps, home, tiny_k3)
    for i in range(20):
        first.send("send", text=f"Count to {i}", max_tokens=4)
        until(first, lambda c: not c["streaming"], "chat", 60)
        first.send("close", engine="keep")
        assert first.send("state")["visible"] is False
        assert ask_to_show(home) == {"ok": True, "pid": first.proc.pid}
        state = first.send("state")
        assert state["visible"] is True
        assert (state["engine"], state["engine_pid"]) == ("ready", pid)
        assert first.send("errors")["last"] is None, f"close {i + 1}"
    chat = first.send("chat")
    assert len(chat["messages"]) == 40
    assert first.proc.poll() is None
    assert [p.pid for p in engines_of(first)] == [pid]
    first.send("quit")
    assert first.proc.wait(timeout=60) == 0
