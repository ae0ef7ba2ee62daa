"""Secrets go only to their owner, nothing untrusted becomes an option or a transport, and
only what was established is cached.

* a local engine's key goes only to the process k3desk started, over a connection that
  process accepted: after a restart on a new port, the old port (taken by another
  program) gets no key from ``serve``'s speed watcher, nor from a chat request (the
  window-less keeper's case is in tests/ui/test_hostile_keeper.py: it needs Qt);
* ``engine install --source`` refuses git options and remote helpers;
* a port taken during the engine's first K3 check is tried again, never cached.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from k3desk.core.chat.client import (
    ChatClient,
    ChatEndpoint,
    ChatMessage,
    ChatSettings,
    EngineUnavailableError,
)
from k3desk.core.engines import probe, supervisor
from k3desk.core.engines.ports import free_port
from k3desk.core.engines.supervisor import LaunchSpec, RestartPolicy, Supervisor
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel
from tests.conftest import REPO
from tests.hostile.conftest import bounded, files_under, k3desk_env, no_traceback, run_k3desk
from tests.hostile.test_port_squatter import squatting

FAST = RestartPolicy(backoff_initial=0.05, backoff_max=0.2, stop_grace=3.0)


def wait_free(port: int, seconds: float = 5.0) -> None:
    """Until ``port`` can be bound (the killed engine's socket is gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                return
            except OSError:
                time.sleep(0.01)
    pytest.fail(f"port {port} stayed taken")


# ------------------------------------------------------------------ the key's owner


def listening(pid: int) -> int:
    """The port a process listens on."""
    for conn in psutil.Process(pid).net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            return int(conn.laddr.port)
    pytest.fail(f"process {pid} listens nowhere")


def test_serve_after_a_restart_on_a_new_port_sends_the_old_port_no_key(
    fake_engine: Callable[..., Path],
    tiny_k3_single: TinyModel,
    hardware_file: Callable[[str], Path],
) -> None:
    """The engine is killed and another program takes its (loopback) port at once; the
    restart (which takes 4 s to bind, as a big model's load does) moves to a new port.
    The address tools use is the front's, which stays held throughout."""
    exe = fake_engine("serve", FAKE_BIND_DELAY="4")
    argv = ["serve", str(tiny_k3_single.first_part), "--engine", str(exe)]
    argv += ["--hardware", str(hardware_file("no-gpu-laptop-32GB"))]
    with subprocess.Popen(
        [sys.executable, "-m", "k3desk", *argv],
        cwd=REPO,
        env=k3desk_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        lines: list[str] = []

        def until(pattern: str) -> re.Match[str]:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                if not line:
                    break
                lines.append(line)
                m = re.match(pattern, line)
                if m:
                    return m
            pytest.fail("".join(lines))

        try:
            url = until(r"URL: (http://127\.0\.0\.1:\d+/v1)").group(1)
            key = until(r"API key: (\S+)").group(1)
            pid = int(until(r"Engine pid: (\d+)").group(1))
            port = listening(pid)
            time.sleep(2.5)  # the speed watcher has read the counters once
            os.kill(pid, signal.SIGKILL)
            wait_free(port)
            with squatting(port) as squatter:
                until(r"Ready again in [\d.]+ s \(attempt \d+\)")
                assert until(r"URL: (\S+)").group(1) == url  # the tools' address held
                new_port = listening(int(until(r"Engine pid: (\d+)").group(1)))
                time.sleep(3.0)  # a watcher polling every 2 s would have come by
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    assert new_port != port
    assert squatter.keys() == [], squatter.seen
    assert key not in json.dumps(squatter.seen)


def test_a_chat_request_to_a_restarted_engine_s_old_port_carries_no_key(
    fake_engine: Callable[..., Path], tmp_path: Path, supervised: list[Supervisor]
) -> None:
    spec = LaunchSpec(fake_engine("serve"), ("-m", str(tmp_path / "model.gguf")))
    sup = Supervisor(spec, default_paths(), policy=FAST)
    supervised.append(sup)
    sup.start()
    ep = sup.wait_ready(30)
    client = ChatClient(ChatEndpoint(ep.url, ep.api_key, "k3", "llama-server", owner_pid=ep.pid))
    os.kill(ep.pid, signal.SIGKILL)
    wait_free(ep.port)
    with squatting(ep.port) as squatter:
        run = bounded(lambda: client.chat([ChatMessage("user", "hi")], ChatSettings()), 10)
        client.close()
    assert isinstance(run.error, EngineUnavailableError), run.error
    assert f"Not sending the request to {ep.url}" in run.error.message
    assert squatter.keys() == []


# ------------------------------------------------------------------ git sources


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("--upload-pack=touch $K3_PWNED;:x", "the URL starts with '-'"),
        ("fd::3", "fd:: is a git remote helper, not a transport k3desk supports"),
        ("ext::sh -c touch% {marker}", "ext:: is a git remote helper"),
        ("ssh://-oProxyCommand=touch% {marker}/x", "so ssh would read it as an option"),
        ("https://example.invalid/x@--upload-pack=x", "is not a git ref"),
    ],
)
def test_an_install_source_never_becomes_a_git_option_or_transport(
    source: str, said: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    home = Path(os.environ["K3DESK_HOME"])
    before = files_under(home)
    t0 = time.monotonic()
    r = run_k3desk(
        "engine",
        "install",
        "--cpu",
        "--source",
        source.format(marker=marker),
        env=k3desk_env(K3_PWNED=str(marker)),
        timeout=60,
    )
    assert not marker.exists(), "git ran a command given as the source"
    assert time.monotonic() - t0 < 10
    no_traceback(r.stderr)
    assert r.returncode == 1, r.stdout.decode() + r.stderr.decode()
    assert said in r.stderr.decode(), r.stderr.decode()
    assert not [p for p in files_under(home) - before if "pwned" in p.name]


# ------------------------------------------------------------------ the K3 verdict


def test_a_port_taken_during_the_first_k3_check_is_retried_not_cached(
    fake_engine: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program holds the port the check's server was given; the check is tried
    again on another port, and only its completed verdict is remembered."""
    exe = fake_engine("serve")
    taken = free_port()
    ports = iter([taken])
    monkeypatch.setattr(supervisor, "free_port", lambda: next(ports, None) or free_port())
    paths = default_paths()
    with squatting(taken) as squatter:
        result = probe.probe_engine(exe, paths)
    assert result.loads_k3 is True, result.reason()
    assert result.usable
    assert squatter.keys() == []
    cached = probe.cached_probe(exe, paths)
    assert cached is not None
    assert cached.loads_k3 is True
