"""Settings > Local API, as a person uses it: a port kept with the settings, a key made,
copied, pasted into a tool and revoked; and the app's engine at that port, accepting that
key, launch after launch."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from PySide6.QtWidgets import QApplication, QInputDialog, QMessageBox

from k3desk.core.app.engines import settings_launch_request
from k3desk.core.app.library import add_model
from k3desk.core.app.local_api import create_key, key_secret, lan_addresses, local_api
from k3desk.core.engines.ports import free_port
from k3desk.devtools.tinyk3 import write_tiny_k3
from k3desk.ui.engine.page import EnginePage
from k3desk.ui.local_api_card import FREE, LocalApiCard
from k3desk.ui.settings_page import SettingsPage


def first(card: LocalApiCard) -> str:
    """The first line of the card's list of keys ("" before the keys were read)."""
    return card.keys.item(0).text() if card.keys.count() else ""


def engine_page(ctx, qtbot, shard: Path) -> EnginePage:  # type: ignore[no-untyped-def]
    """The Engine page shown, its list of models read, ``shard`` chosen to launch."""
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.activated()
    qtbot.waitUntil(lambda: bool(page.panel.rows), timeout=120_000)
    page.panel.shard.setText(str(shard))
    return page


def test_a_key_made_in_settings_is_copied_listed_pasted_as_settings_and_revoked(  # type: ignore[no-untyped-def]
    ctx, qtbot, monkeypatch
) -> None:
    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    page.show()
    card = page.api
    qtbot.waitUntil(lambda: "No keys yet" in first(card), timeout=10_000)
    assert not card.copy_for.isEnabled()
    assert not card.revoke.isEnabled()

    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("vscode", True))
    QApplication.clipboard().clear()
    card.new_key.click()
    qtbot.waitUntil(lambda: first(card).startswith("vscode"), timeout=10_000)
    secret = key_secret(ctx.services, "vscode")
    assert QApplication.clipboard().text() == secret  # made and copied, as it says
    assert "Made key 'vscode' and copied it." in card.note.text()
    assert f"k3-…{secret[-4:]}" in first(card)

    # the same name again: said, nothing added
    card.new_key.click()
    qtbot.waitUntil(lambda: "already an API key named" in card.note.text(), timeout=10_000)
    assert card.keys.count() == 1

    card.keys.setCurrentRow(0)
    QApplication.clipboard().clear()
    card.copy_key.click()
    qtbot.waitUntil(lambda: QApplication.clipboard().text() == secret, timeout=10_000)

    # the OpenAI SDK's settings, at the port in the page (saved or not yet)
    card.port.setValue(9123)
    QApplication.clipboard().clear()
    card.copy_for.menu().actions()[1].trigger()
    qtbot.waitUntil(lambda: bool(QApplication.clipboard().text()), timeout=10_000)
    pasted = QApplication.clipboard().text()
    assert 'base_url="http://127.0.0.1:9123/v1"' in pasted
    assert f'api_key="{secret}"' in pasted

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    card.keys.setCurrentRow(0)
    card.revoke.click()
    qtbot.waitUntil(lambda: "No keys yet" in first(card), timeout=10_000)
    assert local_api(ctx.services, ctx.settings).keys == ()


def test_the_port_is_saved_with_the_settings_and_the_lowest_value_means_a_free_one(  # type: ignore[no-untyped-def]
    ctx, qtbot
) -> None:
    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    page.show()
    assert page.api.port.value() == 8033  # the documented default
    assert page.api.parallel.value() == 1
    page.api.port.setValue(9200)
    page.api.parallel.setValue(3)
    assert page.save.isEnabled()
    page.save.click()
    assert (ctx.settings.api_port, ctx.settings.api_parallel) == (9200, 3)
    assert ctx.store.load().api_port == 9200
    # the next launch's plan counts three requests at once
    request = settings_launch_request(ctx.settings, Path("m.gguf"), None)
    assert request.options().parallel == 3
    page.api.port.setValue(FREE)
    assert page.api.port.text() == "A free one at each launch"
    assert "changes at each launch" in page.api.address.text()
    page.save.click()
    assert ctx.store.load().api_port == 0


@pytest.mark.engine
@pytest.mark.slow
def test_the_apps_engine_listens_at_the_port_and_takes_the_key_launch_after_launch(  # type: ignore[no-untyped-def]
    ctx, qtbot, monkeypatch, llama_server, tiny_k3_single
) -> None:
    """The address is held by the app's front across launches: while the window restarts
    its engine (as on a model switch or a re-plan), a tool is told to come back (503 with
    Retry-After, which the SDKs wait for), never refused a connection."""
    monkeypatch.delenv("K3DESK_API_PORT")  # the person's port, as in real use
    port = free_port()
    ctx.update_settings(engine_binary=str(llama_server), ctx=512, api_port=port)
    _, secret = create_key(ctx.services, "agent")
    page = engine_page(ctx, qtbot, tiny_k3_single.first_part)
    engine = ctx.engine
    address = f"http://127.0.0.1:{port}"
    pids: list[int] = []
    seen: list[object] = []
    polling = threading.Event()

    def poll() -> None:  # a tool asking all the while
        while polling.is_set():
            try:
                r = httpx.get(f"{address}/v1/models", timeout=10,
                              headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
                seen.append((r.status_code, r.headers.get("retry-after")))
            except httpx.TransportError as e:
                seen.append(type(e).__name__)
            time.sleep(0.02)

    tool = threading.Thread(target=poll, daemon=True)
    for button in (page.panel.launch_btn, page.panel.restart_btn):
        button.click()
        qtbot.waitUntil(lambda: engine.ready and engine.endpoint().pid not in pids, timeout=120_000)
        ep = engine.endpoint()
        pids.append(ep.pid)
        assert ep.url != address  # the engine itself is behind the front, on loopback
        assert engine.message == f"Listening on {address}"
        assert page.url.edit.text() == f"{address}/v1"
        for key, status in ((secret, 200), (ep.api_key, 200), ("k3-not-a-key", 401)):
            r = httpx.get(
                f"{address}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30
            )
            assert r.status_code == status
        # "Copy for…" now gives the person's key, which outlives this launch
        QApplication.clipboard().clear()
        page.copy_for.menu().actions()[1].trigger()
        qtbot.waitUntil(lambda: bool(QApplication.clipboard().text()), timeout=10_000)
        assert f'api_key="{secret}"' in QApplication.clipboard().text()
        if not tool.is_alive():
            polling.set()
            tool.start()
    polling.clear()
    tool.join(15)
    assert pids[0] != pids[1]
    assert (503, "5") in seen, seen  # asked during the restart: come back
    assert set(seen) <= {(200, None), (503, "5")}, seen
    engine.stop()
    qtbot.waitUntil(lambda: engine.state_name() == "stopped", timeout=60_000)
    with pytest.raises(httpx.ConnectError):  # stopped by the person: the address goes
        httpx.get(f"{address}/v1/models", timeout=5)


@pytest.mark.engine
def test_a_request_naming_another_of_my_models_is_told_the_window_runs_another(  # type: ignore[no-untyped-def]
    ctx, qtbot, monkeypatch, llama_server, tmp_path
) -> None:
    """llama-server alone would answer it with the model it has under the name asked for;
    a tool's request does not switch the model the person chose in the window either."""
    monkeypatch.delenv("K3DESK_API_PORT")
    port = free_port()
    ctx.update_settings(engine_binary=str(llama_server), ctx=512, api_port=port)
    _, secret = create_key(ctx.services, "agent")
    a = write_tiny_k3(tmp_path / "a", name="Tiny-A", seed=3)
    b = write_tiny_k3(tmp_path / "b", name="Tiny-B", seed=4)
    for model in (a, b):
        add_model(ctx.services, model.first_part)
    page = engine_page(ctx, qtbot, a.first_part)
    page.panel.launch_btn.click()
    engine = ctx.engine
    qtbot.waitUntil(lambda: engine.ready, timeout=120_000)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {secret}"}
    body = {"model": "Tiny-B", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    r = httpx.post(url, json=body, headers=auth, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "Model 'Tiny-B' is not served here: the k3desk window runs Tiny-A."
    )
    for name in ("Tiny-A", "gpt-4o"):
        body["model"] = name
        assert httpx.post(url, json=body, headers=auth, timeout=60).status_code == 200, name
    engine.stop()


@pytest.mark.engine
def test_a_launch_that_fails_or_gives_up_lets_the_address_go(  # type: ignore[no-untyped-def]
    ctx, qtbot, monkeypatch, llama_server, fake_engine, tmp_path
) -> None:
    """While an engine loads a tool is told to come back (503); once the launch failed, or
    the engine gave up after a crash, nothing will come: the tool is refused at once, as
    after a stop, instead of being told to come back forever."""
    from k3desk.core.engines.supervisor import LaunchSpec
    from k3desk.ui.engine.controller import LaunchRequest
    from tests.fixtures.engine import write_fake

    monkeypatch.delenv("K3DESK_API_PORT")
    port = free_port()
    ctx.update_settings(api_port=port)
    engine = ctx.engine
    failed: list[str] = []
    engine.failed.connect(lambda message, _hint: failed.append(message))
    address = f"http://127.0.0.1:{port}/v1/models"
    broken = tmp_path / "Broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))  # the real loader refuses it
    engine.launch(LaunchRequest(LaunchSpec(llama_server, ("-m", str(broken))), model_name="x"))
    qtbot.waitUntil(lambda: bool(failed), timeout=60_000)
    assert engine.state_name() == "crashed"
    qtbot.waitUntil(lambda: engine.api.url is None, timeout=10_000)
    with pytest.raises(httpx.ConnectError):
        httpx.get(address, timeout=5)
    # ready, then killed, and its restart dies too (the build no longer runs here)
    serve = fake_engine("serve")
    engine.launch(LaunchRequest(LaunchSpec(serve, ("-m", str(broken))), model_name="x"))
    qtbot.waitUntil(lambda: engine.ready, timeout=60_000)
    assert httpx.get(address, timeout=10).status_code in (200, 401)  # the front answers
    write_fake(serve.parent, "sigill")
    failed.clear()
    os.kill(engine.supervisor.pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: bool(failed), timeout=60_000)
    qtbot.waitUntil(lambda: engine.api.url is None, timeout=10_000)
    with pytest.raises(httpx.ConnectError):
        httpx.get(address, timeout=5)


def test_reaching_it_from_other_devices_is_a_choice_with_a_warning_and_one_origin(  # type: ignore[no-untyped-def]
    ctx, qtbot
) -> None:
    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    page.show()
    card = page.api
    assert not card.lan.isChecked()  # off unless the person turns it on
    assert not card.origin.isEnabled()
    assert "this machine only" in card.address.text()
    card.lan.setChecked(True)
    assert card.origin.isEnabled()
    warning = card.address.text()
    assert warning.startswith("Warning: other devices that hold one of your keys")
    for address in lan_addresses():
        assert f"http://{address}:8033/v1" in warning
    card.origin.setText("http://10.0.0.5:3000/app")  # a path: no origin
    page.save.click()
    message, _hint, unexpected = ctx.reporter.last
    assert "web origin 'http://10.0.0.5:3000/app' is not an origin" in message
    assert not unexpected
    assert not ctx.store.load().api_lan  # nothing saved
    card.origin.setText("http://10.0.0.5:3000")
    page.save.click()
    saved = ctx.store.load()
    assert (saved.api_lan, saved.api_cors_origin) == (True, "http://10.0.0.5:3000")


def test_the_disk_for_conversation_states_is_a_setting(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    """Settings > Conversation states: 16 GiB unless changed, "None kept" at 0, saved; the
    engine launched for the app is given the states folder only while it is on."""
    from k3desk.core.app.local_api import with_local_api
    from k3desk.core.engines.supervisor import LaunchSpec

    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    page.show()
    assert page.kept_states.value() == 16
    spec = LaunchSpec(Path("llama-server"), ())
    assert with_local_api(ctx.services, spec, ctx.settings).state_dir is not None
    page.kept_states.setValue(0)
    assert page.kept_states.text() == "None kept"
    page.save.click()
    assert ctx.store.load().kept_state_gib == 0
    assert with_local_api(ctx.services, spec, ctx.settings).state_dir is None
