"""Taking up an engine kept in the background: only one that passes the same checks a launch
makes (the recorded llama-server is the recorded keeper's child, holds the port, nothing else
listens there, it takes the key), against the real llama-server on the tiny Kimi-K3."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from k3desk.core.app import background
from k3desk.core.app.background import BackgroundEngine, LastModel, fmt_duration
from k3desk.core.engines.supervisor import LaunchSpec, Supervisor
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel

pytestmark = [pytest.mark.engine]


@pytest.fixture(scope="module")
def served(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Supervisor]:
    args = ("-m", str(tiny_k3_single.first_part), "-c", "512", "-ngl", "0")
    logs = default_paths({"K3DESK_HOME": str(tmp_path_factory.mktemp("served"))})
    sup = Supervisor(LaunchSpec(llama_server, args, ready_timeout=60), logs)
    sup.start()
    sup.wait_ready(timeout=60)
    yield sup
    sup.stop()


def record(sup: Supervisor, **changes: object) -> BackgroundEngine:
    ep = sup.endpoint
    assert ep is not None
    rec = BackgroundEngine(os.getpid(), ep.pid, ep.port, ep.api_key, "Tiny", time.time())
    return dataclasses.replace(rec, **changes)  # type: ignore[arg-type]


def test_the_kept_engine_is_taken_up_and_serves(served: Supervisor, k3_home: Path) -> None:
    paths = default_paths()
    background.keep(paths, record(served))
    assert oct(background.record_path(paths).stat().st_mode & 0o777) == "0o600"  # the key
    rec, why = background.take_up(paths)
    assert why == ""
    assert rec is not None
    ep = rec.endpoint()
    r = httpx.get(f"{ep.url}/v1/models", headers=ep.headers, timeout=10)
    assert r.status_code == 200


def test_a_record_with_the_wrong_key_is_not_trusted(served: Supervisor, k3_home: Path) -> None:
    paths = default_paths()
    background.keep(paths, record(served, api_key="not-the-key"))
    rec, why = background.take_up(paths)
    assert rec is None
    assert "did not accept the key" in why
    assert background.kept(paths) is not None  # both processes live: the record stays


def test_an_engine_that_is_not_the_keepers_child_is_not_trusted(
    served: Supervisor, k3_home: Path
) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        background.keep(default_paths(), record(served, keeper_pid=other.pid))
        rec, why = background.take_up(default_paths())
        assert rec is None
        assert f"is not the engine k3desk kept (its parent is {os.getpid()})" in why
    finally:
        other.kill()
        other.wait()


def test_a_port_someone_else_listens_on_is_not_trusted(served: Supervisor, k3_home: Path) -> None:
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    try:
        port = squatter.getsockname()[1]
        background.keep(default_paths(), record(served, port=port))
        rec, why = background.take_up(default_paths())
        assert rec is None
        assert f"another program listens on port {port}" in why
    finally:
        squatter.close()


def test_a_stale_record_is_dropped(k3_home: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    paths = default_paths()
    background.keep(paths, BackgroundEngine(os.getpid(), gone.pid, 1, "k", "Tiny", 0.0))
    rec, why = background.take_up(paths)
    assert rec is None
    assert "no longer running" in why
    assert background.kept(paths) is None
    background.record_path(paths).write_text("{not json")
    rec, why = background.take_up(paths)
    assert rec is None
    assert "keep-running record" in why
    assert "was damaged (it is not valid JSON" in why
    assert not background.record_path(paths).exists()  # set aside: not read again
    assert background.take_up(paths) == (None, "")


def test_the_last_models_load_time(tmp_path: Path) -> None:
    shard = tmp_path / "m-00001-of-00002.gguf"
    shard.write_bytes(b"GGUF")
    measured = LastModel(str(shard), name="M", model_bytes=10**12, ready_s=312.0)
    assert measured.load_text() == "loads in about 5 min (as last time)"
    guessed = LastModel(str(shard), name="M", model_bytes=350 * 10**9)
    assert guessed.load_text() == "loads in about 2 min (reading it from disk)"
    assert LastModel.from_json(json.loads(json.dumps(measured.to_json()))) == measured
    assert LastModel.from_json({"shard": 3}) is None
    assert LastModel(str(tmp_path / "gone.gguf")).available() is False
    assert [fmt_duration(s) for s in (0.2, 40, 119, 3900)] == ["1 s", "40 s", "2 min", "1 h 05 min"]
