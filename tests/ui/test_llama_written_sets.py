"""The app runs a set written by llama.cpp's own tools, end to end: the Engine page
checks, plans and starts it with its projector, and the chat answers a message with
an image.  A set b11434 would refuse though its files are whole is started all the
same on an engine that loads it, with the warning in the plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage
from pytestqt.exceptions import TimeoutError as WaitTimeout

from k3desk.core.chat.model import ChatSettings
from k3desk.ui.chat.page import ChatPage
from k3desk.ui.engine.page import EnginePage
from tests.fixtures.engine import find_real_llama_server
from tests.oracle import gguf_edit as ge
from tests.oracle.llama import one_set

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def llama_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    server = find_real_llama_server()
    if server is None:
        pytest.fail("no llama-server: bash scripts/setup.sh --test", pytrace=False)
    return one_set(server.parent, tmp_path_factory.mktemp("llama-written"))


def launch(ctx, qtbot, engine_binary: Path, shard: Path, mmproj: Path):  # type: ignore[no-untyped-def]
    ctx.update_settings(engine_binary=str(engine_binary), ctx=1024)
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page.resize(1280, 900)
    page.show()
    page.activated()
    qtbot.waitUntil(lambda: bool(page.panel.rows), timeout=120_000)
    page.panel.shard.setText(str(shard))
    page.panel.mmproj.setText(str(mmproj))
    page.panel.launch_btn.click()
    engine = ctx.engine
    try:
        qtbot.waitUntil(lambda: engine.ready, timeout=120_000)
    except WaitTimeout:
        pytest.fail(f"not ready: {page.panel.state.text()}", pytrace=False)
    return page, engine


def test_a_llama_gguf_split_set_chats_about_an_image_in_the_app(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, llama_set, tmp_path
) -> None:
    parts, mmproj = llama_set
    assert len(parts) >= 2
    page, engine = launch(ctx, qtbot, llama_server, parts[0], mmproj)
    assert "⚠" not in page.plan_reason.text()
    assert f"--mmproj {mmproj}" in page.argv.edit.text()
    chat = ChatPage(ctx)
    chat.chat.update_settings(
        "", ChatSettings(thinking=False, max_tokens=4, seed=1, extra_body={"ignore_eos": True})
    )
    qtbot.addWidget(chat)
    chat.show()
    png = tmp_path / "red.png"
    img = QImage(40, 40, QImage.Format.Format_RGB32)
    img.fill(QColor("red"))
    img.save(str(png))
    chat.composer.files_added.emit([str(png)])
    qtbot.waitUntil(lambda: len(chat.composer.attachments) == 1, timeout=10_000)
    chat.composer.edit.setPlainText("What colour is this?")
    qtbot.keyClick(chat.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chat.chat.streaming or bool(chat.chat._task), timeout=5000)
    qtbot.waitUntil(lambda: not chat.chat.streaming and chat.chat._task is None, timeout=60_000)
    user, answer = chat.view.messages()
    assert len(user.images) == 1
    assert answer.content
    engine.stop()
    qtbot.waitUntil(lambda: engine.state_name() == "stopped", timeout=30_000)


def test_a_suspicious_set_starts_with_the_warning_in_the_plan(  # type: ignore[no-untyped-def]
    ctx, qtbot, fake_engine, llama_set, tmp_path
) -> None:
    parts, mmproj = llama_set
    first, last = ge.load(parts[0]), ge.load(parts[-1])
    count = first.kv("split.tensors.count")
    assert count is not None
    first = first.set(ge.KV.of(count.key, ge.INT32, int(count.scalar()) + 1))
    last = last.put(ge.Tensor("blk.0.foo.weight", (256,), 0, bytes(1024)))
    d = tmp_path / "set"
    d.mkdir()
    for p in parts[1:-1]:
        (d / p.name).symlink_to(p)
    ge.save(first, d / parts[0].name)
    ge.save(last, d / parts[-1].name)
    fork = fake_engine("serve")  # stands in for a llama.cpp fork that loads the set
    page, engine = launch(ctx, qtbot, fork, d / parts[0].name, mmproj)
    text = page.plan_reason.text()
    assert "⚠ Warning:" in text
    assert "holds tensor 'blk.0.foo.weight'" in text
    assert "Starting it anyway" in text
    engine.stop()
    qtbot.waitUntil(lambda: engine.state_name() == "stopped", timeout=30_000)
