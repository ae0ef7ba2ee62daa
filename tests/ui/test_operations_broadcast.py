"""Named operations in the app: success, failure and cancellation reach the caller on the
main thread, and what an operation changed is announced once, so a page shows the change
whichever page made it."""

from __future__ import annotations

import shutil
import threading

import pytest

from k3desk.core.app.operations import Change, OpChanges, Operation
from k3desk.core.errors import Cancelled, K3Error
from k3desk.core.progress import CancelToken


def test_success_then_one_announcement_failure_and_cancel_announce_nothing(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    heard: list[tuple[OpChanges, object]] = []
    ctx.ops.did_execute.connect(lambda c, i: heard.append((c, i)))
    main = threading.get_ident()
    order: list[str] = []
    changed = OpChanges.of(Change.MODELS)

    def work(_t: CancelToken) -> int:
        order.append("worker" if threading.get_ident() != main else "main")
        return 7

    ctx.ops.did_execute.connect(lambda _c, _i: order.append("announced"))
    ctx.ops.run(
        Operation("seven", work, changed),
        on_success=lambda r: order.append(f"success {r} on main {threading.get_ident() == main}"),
        on_finally=lambda: order.append("finally"),
        initiator="me",
    )
    qtbot.waitUntil(lambda: "finally" in order, timeout=5000)
    assert order == ["worker", "success 7 on main True", "announced", "finally"]
    assert heard == [(changed, "me")]

    failures: list[BaseException] = []

    def fail(_t: CancelToken) -> None:
        raise K3Error("the disk is full", "free some space")

    ctx.ops.run(Operation("fail", fail, changed), on_failure=failures.append)

    def slow(token: CancelToken) -> None:
        while not token.wait(0.01):
            pass
        raise Cancelled()

    cancelled: list[bool] = []
    task = ctx.ops.run(
        Operation("slow", slow, changed),
        on_success=lambda _r: pytest.fail("not cancelled"),
        on_cancelled=lambda: cancelled.append(True),
    )
    task.cancel()
    read = ctx.ops.run(Operation("read", lambda _t: 1), on_success=lambda _r: order.append("r"))
    qtbot.waitUntil(lambda: bool(failures and cancelled) and not read.running, timeout=5000)
    qtbot.wait(50)
    assert failures[0].message == "the disk is full"
    assert heard == [(changed, "me")]  # a failure, a cancellation and a read change nothing


def test_a_token_saved_in_the_wizard_shows_on_the_settings_page(  # type: ignore[no-untyped-def]
    ctx, qtbot, hardware_file
) -> None:
    from k3desk.core.hub.tokens import TokenStore
    from k3desk.ui.window import MainWindow
    from tests.fixtures.hub import FakeKeyringModule, MemoryKeyring

    ring = MemoryKeyring()
    ctx.__dict__["token_store"] = TokenStore(env={}, keyring_module=FakeKeyringModule(ring))
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    settings = w.settings_page()
    qtbot.waitUntil(lambda: settings.token_state.text() == "No token saved", timeout=5000)
    ctx.hardware.load_file(hardware_file("8xH100-2TB"))
    wiz = w.open_wizard()
    qtbot.waitUntil(lambda: ctx.hardware.recommendation is not None, timeout=30_000)
    wiz.next()
    wiz.tiers.table.select_tier("grearl-iq1s")
    wiz.next()
    assert wiz.current_key() == "where"
    secret = "hf_abcdefghijklmnopqrstuvwxyz9876"
    wiz.where.token_edit.setText(secret)
    wiz.where.token_save.click()
    qtbot.waitUntil(lambda: wiz.where.token_state.text() == "hf_…9876", timeout=5000)
    # the Settings page was built before and shows the token without being asked
    qtbot.waitUntil(lambda: settings.token_state.text() == "hf_…9876", timeout=5000)
    assert settings.token_remove.isEnabled()
    settings.token_remove.click()
    qtbot.waitUntil(lambda: settings.token_state.text() == "No token saved", timeout=5000)
    # ... and the wizard, still open, shows it gone too
    qtbot.waitUntil(lambda: wiz.where.token_state.text() == "No token saved", timeout=5000)
    assert ring.store == {}


def test_a_model_dropped_on_the_window_appears_in_my_models(  # type: ignore[no-untyped-def]
    ctx, qtbot, tiny_k3, tmp_path, hardware_file
) -> None:
    from k3desk.core.app import actions
    from k3desk.ui.window import MainWindow

    ctx.hardware.load_file(hardware_file("8xH100-2TB"))
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    mine = w.models_page().mine
    qtbot.waitUntil(lambda: mine.judgement is not None, timeout=60_000)
    folder = tmp_path / "tiny"
    shutil.copytree(tiny_k3.first_part.parent, folder)
    # an add made elsewhere than the page (the window's drop, the automation hook)
    ctx.ops.run(actions.add_models(ctx.services, [folder]))
    qtbot.waitUntil(lambda: len(mine.rows()) == 1, timeout=30_000)
    mine.select(mine.rows()[0].model.id)
    mine.remove_selected()
    qtbot.waitUntil(lambda: not mine.rows(), timeout=30_000)
    assert "Removed" in mine.status.text()


def test_a_conversation_change_that_ends_while_the_app_quits_says_nothing(  # type: ignore[no-untyped-def]
    ctx, qtbot
) -> None:
    """Quitting from outside the window (a logout's SIGTERM: no close event reaches the
    chat page) while a deletion or rename is still ending: the chat page, still open,
    would refresh its list on a task manager that has shut down.  Nothing is announced
    then, so the quit prints no traceback and the deletion itself still ends."""
    from k3desk.ui.chat.page import ChatPage

    page = ChatPage(ctx)
    qtbot.addWidget(page)
    page.show()
    heard: list[OpChanges] = []
    ctx.ops.did_execute.connect(lambda c, _i: heard.append(c))
    release = threading.Event()
    ended: list[str] = []

    def delete(_t: CancelToken) -> str:
        release.wait(10)  # a deletion does not stop half way when the app quits
        return "deleted"

    ctx.ops.run(
        Operation("chat-delete", delete, OpChanges.of(Change.CHATS)), on_success=ended.append
    )
    threading.Timer(0.2, release.set).start()
    ctx.tasks.shutdown(timeout=10)  # what the app's quit does, the window still open
    assert ended == ["deleted"]
    assert heard == []  # ... and a refresh would have raised in the page's slot
