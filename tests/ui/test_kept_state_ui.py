"""The chat window says where an answer's prompt comes from after a restart: the
conversation's saved engine state, or read again with how many tokens and about how long
(the real llama-server, the tiny Kimi-K3; the numbers compared with the engine's own
timings of that answer)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from k3desk.core.chat.kept_state import states_dir
from k3desk.core.chat.model import ChatSettings, Timings
from k3desk.devtools.tinyk3 import TinyModel
from k3desk.ui.chat.page import ChatPage
from tests.processes import SlotsHeld
from tests.ui.test_chat import png_file, send, wait_idle

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SHORT = ChatSettings(thinking=False, max_tokens=4, seed=1, temperature=0.0)
RESUMED = r"Resumed from saved state \(([\d,]+) tokens, (?:under 0\.1|[\d.]+) s\)\.$"
REREAD = r"Re-reading ([\d,]+) tokens(?: \(about \d+ (?:s|min)\))?\. The kept state's file"


class Window:
    """The chat page over an engine on ``model`` that the test restarts, as the Engine
    page's Restart does."""

    def __init__(self, ctx: Any, qtbot: Any, llama_server: Path, model: TinyModel) -> None:
        self.ctx, self.qtbot, self.exe, self.model = ctx, qtbot, llama_server, model
        self.folder = states_dir(ctx.services.paths.cache)
        self.restart()
        self.page = ChatPage(ctx)
        qtbot.addWidget(self.page)
        self.page.show()
        self.page.chat.update_settings("", SHORT)

    def restart(self) -> None:
        from k3desk.core.engines.supervisor import LaunchSpec
        from k3desk.ui.engine.controller import LaunchRequest

        engine = self.ctx.engine
        if engine.running:
            engine.stop()
            self.qtbot.waitUntil(lambda: not engine.running, timeout=30_000)
        vision = ("--mmproj", str(self.model.mmproj)) if self.model.mmproj else ()
        args = ("-m", str(self.model.first_part), "-c", "4096", "--jinja", "-np", "1", *vision)
        spec = LaunchSpec(self.exe, args, ready_timeout=60, state_dir=self.folder)
        engine.launch(LaunchRequest(spec, model_name=self.model.name, vision=bool(vision)))
        self.qtbot.waitUntil(lambda: engine.ready, timeout=60_000)

    def ask(self, question: str) -> None:
        send(self.qtbot, self.page, question)
        wait_idle(self.qtbot, self.page)

    def answer_timings(self) -> Timings:
        assert self.page.chat.current is not None
        last = self.page.chat.current.messages[-1]
        assert last.role == "assistant"
        assert last.timings is not None
        return last.timings

    def after_restart(self, question: str, said: str) -> tuple[int, Timings]:
        """Restart the engine, ask; the number the chat said (matching ``said``) and the
        engine's timings of the answer."""
        self.restart()
        self.ask(question)
        text = self.page.composer.notice.text()
        m = re.match(said, text)
        assert m, text
        assert self.page.composer.notice.isVisible()
        # good news asks nothing of the person: not in the warning colour
        warned = self.page.composer.notice.objectName() == "warnText"
        assert warned == (said != RESUMED)
        return int(m.group(1).replace(",", "")), self.answer_timings()

    def damage_states(self) -> None:
        # the last answer's state is kept while the person reads it: once that has ended
        assert self.page.chat.settle_kept(30)
        for f in Path(self.folder).glob("k3c-*.bin"):
            f.write_bytes(b"not a state")  # damaged: refused and deleted, then read again


def test_the_chat_says_resumed_or_re_reading_after_a_restart(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3_single
) -> None:
    window = Window(ctx, qtbot, llama_server, tiny_k3_single)
    for question in ("Tell me a long story about a cat and a dog.", "And then?"):
        window.ask(question)
    assert not window.page.composer.notice.isVisible()  # the engine held it: nothing to say

    n, timings = window.after_restart("What happened next?", RESUMED)
    assert n == timings.cache_n > 0
    window.ask("Who won?")  # the engine holds it now: what was said goes
    assert not window.page.composer.notice.isVisible()

    window.damage_states()
    n, timings = window.after_restart("And how did it end?", REREAD)
    assert n == timings.prompt_n
    assert timings.cache_n == 0

    # deleted, the conversation takes its kept states (they hold its words) with it
    assert window.page.chat.settle_kept(30)
    assert list(window.folder.glob("k3c-*.bin"))
    cid = window.page.current_id()
    assert cid is not None
    window.page.delete(cid, confirm=False)
    qtbot.waitUntil(lambda: not list(window.folder.glob("k3c-*.bin")), timeout=15_000)
    assert ctx.reporter.last is None


def test_a_conversation_with_a_picture_comes_back_in_the_window(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3, tmp_path
) -> None:
    """A picture attached in the window is kept with its conversation: after a restart
    the engine reads only the new question; read again, the tokens said are the engine's,
    the picture's included."""
    window = Window(ctx, qtbot, llama_server, tiny_k3)
    window.page.composer.files_added.emit([str(png_file(tmp_path / "red.png"))])
    qtbot.waitUntil(lambda: len(window.page.composer.attachments) == 1, timeout=10_000)
    window.ask("What is in this picture?")
    assert len(window.page.view.messages()[0].images) == 1

    n, timings = window.after_restart("And then?", RESUMED)
    assert n == timings.cache_n > 0

    window.damage_states()
    n, timings = window.after_restart("Why?", REREAD)
    assert n == timings.prompt_n
    assert timings.cache_n == 0
    assert ctx.reporter.last is None


def test_send_is_free_while_the_answer_is_kept_and_a_restart_waits_for_it(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3_single
) -> None:
    """The last answer's engine state is kept while the person reads it: the chat is
    free for the next question as soon as the answer is written, not once the engine has
    read and saved it (minutes where it streams its experts from disk); a restart waits
    for it, so the conversation comes back from it.  Here the engine writes the state
    two seconds late."""
    window = Window(ctx, qtbot, llama_server, tiny_k3_single)
    chat = window.page.chat
    endpoint = ctx.engine.chat_endpoint()
    assert endpoint is not None
    held = SlotsHeld(endpoint)
    held.pause = 2.0
    with chat._client_lock:
        chat._client = held
    send(qtbot, window.page, "Tell me a long story about a cat and a dog.")
    wait_idle(qtbot, window.page)
    free_at = time.monotonic()
    composer = window.page.composer
    composer.edit.setPlainText("And then?")
    assert composer.send_btn.isVisible()
    assert composer.send_btn.isEnabled()
    qtbot.waitUntil(lambda: held.held_at > 0, timeout=10_000)
    assert free_at < held.held_at + 1.0  # free while the engine was still saving it

    n, timings = window.after_restart("And then?", RESUMED)
    assert n == timings.cache_n > 0  # kept before the engine stopped
    assert ctx.reporter.last is None


def test_a_state_its_disk_cannot_take_is_said_in_the_window(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3_single, tmpfs
) -> None:
    """The disk that holds kept states is full: the answer comes as ever, and the chat
    says that its state was not kept and how much room is left, instead of only reading
    the conversation again after the next restart."""
    disk = tmpfs(1, at=states_dir(ctx.services.paths.cache))
    with open(disk / "filler", "wb") as f:
        f.write(bytes(shutil.disk_usage(disk).free - 8192))  # less than a state needs
    window = Window(ctx, qtbot, llama_server, tiny_k3_single)
    window.ask("Tell me a long story about a cat and a dog.")
    assert window.answer_timings().predicted_n > 0
    notice = window.page.composer.notice
    qtbot.waitUntil(lambda: notice.text().startswith("Not kept"), timeout=30_000)
    assert notice.text().endswith("; 8.0 KiB free on the disk that holds kept states.")
    assert notice.isVisible()
    assert not list(disk.glob("k3c-*.bin"))  # nothing left to hold the space
    assert ctx.reporter.last is None
