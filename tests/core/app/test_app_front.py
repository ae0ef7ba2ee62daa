"""The local API's address as the app's window holds it (core/app/local_api.AppFront): one
front for the app's process that each launch puts its engine behind, here the real
llama-server b11434 on two tiny Kimi-K3 models, switched from one to the other as the
window's Engine page does (the old engine stopped, the new one launched); a tool polls the
address all the while with the httpx a script would use."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from k3desk.core.app.library import add_model
from k3desk.core.app.local_api import PORT_ENV, AppFront, create_key, set_api_port
from k3desk.core.app.services import Services
from k3desk.core.engines.ports import free_port
from k3desk.core.engines.supervisor import Endpoint, LaunchSpec, Supervisor
from k3desk.core.errors import EngineError
from k3desk.devtools.tinyk3 import TinyModel, write_tiny_k3
from tests.fixtures.engine import BehindFront

pytestmark = [pytest.mark.engine]


@contextmanager
def polling(url: str, key: str) -> Iterator[list[object]]:
    """What a tool asking ``url`` every 20 ms is answered: (status, Retry-After) or the
    transport error's name."""
    seen: list[object] = []
    going = threading.Event()
    going.set()

    def poll() -> None:
        while going.is_set():
            try:
                r = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
                seen.append((r.status_code, r.headers.get("retry-after")))
            except httpx.TransportError as e:
                seen.append(type(e).__name__)
            time.sleep(0.02)

    tool = threading.Thread(target=poll, daemon=True)
    tool.start()
    try:
        yield seen
    finally:
        going.clear()
        tool.join(15)


def test_a_model_switch_in_the_window_keeps_the_address_answering(
    llama_server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PORT_ENV)  # the person's saved port, as in real use
    services = Services()
    port = free_port()
    set_api_port(services, port)
    _, secret = create_key(services, "agent")
    a = write_tiny_k3(tmp_path / "a", name="Tiny-A", seed=3)
    b = write_tiny_k3(tmp_path / "b", name="Tiny-B", seed=4)
    for model in (a, b):
        add_model(services, model.first_part)
    front = AppFront(services)
    behind = BehindFront(services, front, llama_server)

    def launch(model: TinyModel) -> Supervisor:
        return behind.launch(model.first_part, ctx=512)

    address = f"http://127.0.0.1:{port}"
    chat = f"{address}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {secret}"}

    def ask(name: str) -> httpx.Response:
        body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        return httpx.post(chat, json=body, headers=auth, timeout=60)

    try:
        first = launch(a)
        assert front.url == address
        assert first.endpoint is not None
        assert first.endpoint.port != port  # the engine itself is behind the front
        assert ask("Tiny-A").status_code == 200
        refused = ask("Tiny-B")
        assert refused.status_code == 400
        assert refused.json()["error"]["message"].startswith(
            "Model 'Tiny-B' is not served here: the k3desk window runs Tiny-A."
        )
        with polling(f"{address}/v1/models", secret) as seen:
            time.sleep(0.2)
            first.stop()  # the window's switch: the old engine stopped, the new one launched
            launch(b)
            time.sleep(0.2)
        assert (503, "5") in seen, seen  # asked during the switch: come back
        assert set(seen) <= {(200, None), (503, "5")}, seen  # never refused
        assert ask("Tiny-B").status_code == 200
        said = ask("Tiny-A").json()["error"]["message"]  # the names follow the launch
        assert said.startswith("Model 'Tiny-A' is not served here: the k3desk window runs Tiny-B.")
    finally:
        behind.close()
    with pytest.raises(httpx.ConnectError):  # stopped: the address goes with it
        httpx.get(f"{address}/v1/models", timeout=5)


def test_a_launch_that_fails_lets_the_address_go_unless_a_later_launch_holds_it(
    llama_server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two engines a tool is told to come back (503); once a launch has failed
    (the real llama-server cannot load its model) nothing will come, so the address is
    let go and the tool is refused at once, instead of waiting forever.  A later launch
    that already holds the address keeps it."""
    monkeypatch.delenv(PORT_ENV)
    services = Services()
    port = free_port()
    set_api_port(services, port)
    _, secret = create_key(services, "agent")
    broken = tmp_path / "Broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))  # its loader refuses it: no tensors, no arch
    front = AppFront(services)
    address = f"http://127.0.0.1:{port}/v1/models"
    auth = {"Authorization": f"Bearer {secret}"}
    sup: list[Supervisor] = []

    def first() -> Endpoint | None:
        return sup[0].endpoint if sup else None

    spec = LaunchSpec(llama_server, ("-m", str(broken), "-c", "512"))
    sup.append(Supervisor(front.place(spec, services.settings(), first), services.paths))
    try:
        sup[0].start()
        with pytest.raises(EngineError):
            sup[0].wait_ready(90)
        r = httpx.get(address, headers=auth, timeout=10)
        assert (r.status_code, r.headers.get("retry-after")) == (503, "5")  # not yet told
        assert not front.let_go(lambda: None)  # another launch's word does not count
        assert httpx.get(address, headers=auth, timeout=10).status_code == 503
        assert front.let_go(first)
        with pytest.raises(httpx.ConnectError):
            httpx.get(address, headers=auth, timeout=5)
        # a later launch placed before the failed one's word: the address stays
        front.place(spec, services.settings(), lambda: None)
        assert not front.let_go(first)
        assert httpx.get(address, headers=auth, timeout=10).status_code == 503
    finally:
        for s in sup:
            s.stop()
        front.stop()
