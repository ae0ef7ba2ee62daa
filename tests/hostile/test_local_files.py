"""Files and names around k3desk's own: a history database that is a named pipe, a
password in a URL, a Hub listing that names k3desk's own state, a listing whose every
file is refused, a folder of 10,000 GGUF names, caches under umask 000."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3desk.core.cluster.endpoints import EndpointStore
from k3desk.core.cluster.nodes import ClusterError
from k3desk.core.engines import probe
from k3desk.core.errors import HubError
from k3desk.core.paths import AppPaths, default_paths
from tests.hostile.conftest import StandIn, fifo, k3desk_env, no_traceback, run_k3desk
from tests.hostile.hostile_hub import HostileHub
from tests.hostile.test_hostile_hub import GOOD, REPO_ID, download, landed


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_the_engine_check_cache_is_private_under_umask_000(tmp_path: Path) -> None:
    """The cache folder as the platform names it (``~/.cache/k3desk``), made by the
    first engine check, not by :meth:`AppPaths.ensure`."""
    root = tmp_path / "home"
    paths = AppPaths(root / "config", root / "data", root / ".cache" / "k3desk", root / "state")
    probe._save_cache(paths, "key", {"schema": 0})
    cache = paths.cache / probe.CACHE_FILE
    assert (mode(paths.cache), mode(cache)) == (0o700, 0o600)
    assert not [p for p in paths.cache.iterdir() if p.name.endswith(".tmp")]
    assert probe._load_cache(paths) == {"key": {"schema": 0}}  # and it reads back


def test_a_history_file_that_is_a_pipe_does_not_hang_chat_save(standin: StandIn) -> None:
    db = default_paths().ensure().history_db
    fifo(db)
    t0 = time.monotonic()
    r = run_k3desk("chat", "--url", standin.url, "--save", "hello", timeout=10)
    assert time.monotonic() - t0 < 10
    no_traceback(r.stderr)
    assert r.returncode == 1
    assert f"Cannot create the chat history {db}: it is a named pipe" in r.stderr.decode()
    assert stat.S_ISFIFO(db.lstat().st_mode)  # left as it was


def test_a_password_in_a_url_is_never_stored(k3_home: Path) -> None:
    paths = default_paths().ensure()
    store = EndpointStore(paths)
    with pytest.raises(ClusterError) as err:
        store.add("box", "http://alice:s3cret@127.0.0.1:9/v1", check=False)
    assert "user name or password" in err.value.message
    assert "keyring" in err.value.hint
    r = run_k3desk(
        "cluster", "endpoint", "add", "box", "http://bob:hunter2@127.0.0.1:9", "--no-check"
    )
    no_traceback(r.stderr)
    assert r.returncode == 1
    for path in k3_home.rglob("*"):
        if path.is_file():
            assert b"hunter2" not in path.read_bytes(), path
            assert b"s3cret" not in path.read_bytes(), path


def test_an_unparsable_url_is_named(k3_home: Path) -> None:
    r = run_k3desk("cluster", "endpoint", "add", "box", "http://[::1", "--no-check")
    no_traceback(r.stderr)
    assert r.returncode == 1
    assert "'http://[::1' is not a URL k3desk can use" in r.stderr.decode()


def test_a_listed_k3desk_state_is_refused_not_verified(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    forged = json.dumps({"forged": True}).encode()
    hostile_hub.add_repo(REPO_ID, {**GOOD, ".k3desk/state.json": forged})
    target = tmp_path / "models"
    run = download(hostile_hub, target, patterns=("*.gguf", ".k3desk/*"))
    assert isinstance(run.error, HubError), run.error
    assert "'.k3desk/state.json'" in run.error.message
    assert hostile_hub.bytes_sent(".k3desk/state.json") == 0
    assert landed(target, GOOD)
    state = (target / ".k3desk" / "state.json").read_bytes()
    assert state != forged
    assert b"forged" not in state


def test_a_listing_whose_every_file_is_refused_names_them(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    hostile_hub.add_repo(REPO_ID, {"../../up.gguf": b"GGUF x", "/abs.gguf": b"GGUF y"})
    run = download(hostile_hub, tmp_path / "models")
    assert isinstance(run.error, HubError), run.error
    message = run.error.message
    assert "every file in" in message
    assert "was refused" in message
    assert "'../../up.gguf' (the name would not stay inside the target folder" in message
    assert "'/abs.gguf'" in message
    assert "no file" not in message


def test_a_folder_of_10000_gguf_names_answers_quickly_in_a_few_words(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(10_000):
        (folder / f"m{i:05d}-00001-of-00002.gguf").touch()
    t0 = time.monotonic()
    r = run_k3desk("models", "add", folder, timeout=10, env=k3desk_env())
    seconds = time.monotonic() - t0
    no_traceback(r.stderr)
    assert r.returncode == 1
    assert seconds < 10
    assert len(r.stderr) < 1000, len(r.stderr)
    assert "holds 10,000 GGUF sets" in r.stderr.decode()
