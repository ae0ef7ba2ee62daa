"""Another program on the engine's port: nothing it says is trusted, and it never gets the key.

The squatter answers every request with 200 (a /health that says "ok") and keeps
every Authorization header it is sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from k3desk.core.engines.ports import free_port
from k3desk.core.engines.supervisor import (
    Event,
    LaunchSpec,
    RestartPolicy,
    State,
    Supervisor,
)
from k3desk.core.errors import EngineError
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel
from tests.hostile.conftest import no_traceback, run_k3desk

FAST = RestartPolicy(backoff_initial=0.05, backoff_max=0.2, stop_grace=3.0)


class Squatter:
    def __init__(self, port: int) -> None:
        self.seen: list[tuple[str, str | None]] = []  # (path, Authorization)
        squatter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                squatter.seen.append((self.path, self.headers.get("Authorization")))
                body = b'{"status": "ok"}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def keys(self) -> list[str]:
        return [auth for _, auth in self.seen if auth]


@contextmanager
def squatting(port: int) -> Iterator[Squatter]:
    s = Squatter(port)
    try:
        yield s
    finally:
        s.close()


def start(
    started: list[Supervisor], exe: Path, tmp_path: Path, **spec: object
) -> tuple[Supervisor, list[Event]]:
    events: list[Event] = []
    launch = LaunchSpec(exe, ("-m", str(tmp_path / "model.gguf")), **spec)  # type: ignore[arg-type]
    sup = Supervisor(launch, default_paths(), policy=FAST, on_event=events.append)
    started.append(sup)
    sup.start()
    return sup, events


def wait_for_launch(sup: Supervisor) -> int:
    """The port of the first attempt, once its process runs (and has not bound yet)."""
    deadline = time.monotonic() + 10
    while sup.pid is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return sup.history[0].port


def test_serve_refuses_a_port_in_use_before_starting_anything(
    fake_engine: Callable[..., Path],
    tiny_k3_single: TinyModel,
    hardware_file: Callable[[str], Path],
) -> None:
    port = free_port()
    engine = fake_engine("serve")
    with squatting(port) as squatter:
        r = run_k3desk(
            "serve",
            tiny_k3_single.first_part,
            "--port",
            str(port),
            "--engine",
            engine,
            "--hardware",
            hardware_file("no-gpu-laptop-32GB"),
            timeout=60,
        )
    err, out = r.stderr.decode(), r.stdout.decode()
    assert r.returncode == 1, out + err
    no_traceback(r.stderr)
    assert f"error: Port {port} on 127.0.0.1 is already in use by python" in err
    assert "--port 0 for a free one" in err
    assert "API key" not in out
    assert "ready" not in out
    assert squatter.seen == []  # not even asked for /health
    assert "Plan:" not in out  # refused before the engine was even probed


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_serve_refuses_a_port_out_of_range(
    port: str, fake_engine: Callable[..., Path], tiny_k3_single: TinyModel
) -> None:
    r = run_k3desk(
        "serve", tiny_k3_single.first_part, "--port", port, "--engine", fake_engine("serve")
    )
    assert r.returncode == 1
    no_traceback(r.stderr)
    assert f"Port {port} is out of range: a TCP port is a number from 1 to 65535." in (
        r.stderr.decode()
    )
    assert "URL" not in r.stdout.decode()


def test_a_port_taken_after_launch_is_not_trusted_and_gets_no_key(
    fake_engine: Callable[..., Path], tmp_path: Path, supervised: list[Supervisor]
) -> None:
    """The squatter binds while the engine is still loading: its /health says 200."""
    exe = fake_engine("serve", FAKE_BIND_DELAY="1.5")
    port = free_port()
    sup, events = start(supervised, exe, tmp_path, port=port, api_key_file=True)
    wait_for_launch(sup)
    with squatting(port) as squatter, pytest.raises(EngineError) as err:
        sup.wait_ready(30)
    assert f"Another program listens on port {port} as well (python (pid " in err.value.message
    assert State.READY not in [e.state for e in events]
    assert sup.endpoint is None
    assert sup.api_key not in " ".join(squatter.keys())
    assert squatter.keys() == []
    assert f"port {port} was chosen explicitly" in sup.history[-1].action
    assert len(sup.history) == 1


def test_with_a_port_of_its_own_choosing_it_moves_away_from_the_squatter(
    fake_engine: Callable[..., Path], tmp_path: Path, supervised: list[Supervisor]
) -> None:
    exe = fake_engine("serve", FAKE_BIND_DELAY="1.0")
    sup, _ = start(supervised, exe, tmp_path)
    taken = wait_for_launch(sup)
    with squatting(taken) as squatter:
        ep = sup.wait_ready(30)
        assert ep.port != taken
        assert ep.pid == sup.pid
        assert squatter.keys() == []
    assert sup.history[0].crash is not None
    assert sup.history[0].crash.kind == "port_in_use"
    assert f"port {taken} was taken, using {ep.port}" in sup.history[0].action


def test_a_server_that_refuses_our_key_is_never_called_ready(
    fake_engine: Callable[..., Path], tmp_path: Path, supervised: list[Supervisor]
) -> None:
    sup, events = start(supervised, fake_engine("wrong_key"), tmp_path)
    with pytest.raises(EngineError) as err:
        sup.wait_ready(30)
    assert "refused the API key k3desk gave it (HTTP 401)" in err.value.message
    assert State.READY not in [e.state for e in events]
    assert len(sup.history) == 1  # restarting cannot make it take the key
    assert sup.history[0].action.startswith("gave up")
