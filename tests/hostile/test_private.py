"""Private by default: what k3desk keeps about its user is 0600 in 0700 folders, whatever
the umask, and a looser file or folder from an older version is tightened."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from k3desk.core.chat.history import HistoryStore
from k3desk.core.cluster.endpoints import EndpointStore
from k3desk.core.cluster.nodes import Cluster, ClusterStore, Node
from k3desk.core.engines.supervisor import Event, LaunchSpec, RestartPolicy, State, Supervisor
from k3desk.core.paths import AppPaths, default_paths
from k3desk.core.settings import Settings, SettingsStore
from tests.hostile.conftest import StandIn, run_k3desk


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The loosest umask a user might have: nothing may rely on it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def assert_private(paths: list[Path], root: Path) -> None:
    for p in paths:
        assert mode(p) == 0o600, f"{p} is {oct(mode(p))}"
        for folder in p.parents:
            if folder == root.parent:
                break
            assert mode(folder) == 0o700, f"{folder} is {oct(mode(folder))}"


def test_chat_history_is_private(standin: StandIn, k3_home: Path) -> None:
    r = run_k3desk("chat", "--url", standin.url, "--save", "a private question")
    assert r.returncode == 0, r.stderr.decode()
    db = default_paths().history_db
    files = [p for p in db.parent.glob("history.sqlite3*")]
    assert db in files
    assert_private(files, k3_home)


def test_history_images_and_exports_are_private(tmp_path: Path) -> None:
    from k3desk.core.chat.images import prepare_image
    from tests.hostile.test_hostile_history import png

    with HistoryStore(tmp_path / "data" / "history.sqlite3") as h:
        conv = h.create_conversation("pics")
        h.add_message(conv.id, "user", "see", images=[prepare_image(png(), name="a.png")])
        (img,) = h.branch(conv.id)[0].images
        md = h.write_export(conv.id, tmp_path / "out" / "chat.md")
        js = h.write_export(conv.id, tmp_path / "out" / "chat.json", fmt="json")
    assert_private([img.path], tmp_path / "data")
    assert_private([md, js, *(tmp_path / "out" / "chat_files").iterdir()], tmp_path / "out")


def test_an_export_into_the_persons_own_folder_leaves_that_folder_as_it_was(
    tmp_path: Path,
) -> None:
    from k3desk.core.chat.images import prepare_image
    from tests.hostile.test_hostile_history import png

    documents = tmp_path / "Documents"
    documents.mkdir()
    os.chmod(documents, 0o755)  # the person's folder, readable by others on purpose
    with HistoryStore(tmp_path / "data" / "history.sqlite3") as h:
        conv = h.create_conversation("pics")
        h.add_message(conv.id, "user", "see", images=[prepare_image(png(), name="a.png")])
        md = h.write_export(conv.id, documents / "chat.md")
        js = h.write_export(conv.id, documents / "chat.json", fmt="json")
    assert mode(documents) == 0o755
    assert (mode(md), mode(js)) == (0o600, 0o600)
    assert mode(documents / "chat_files") == 0o700  # the folder k3desk made for the pictures


def test_a_loose_history_from_an_older_version_is_tightened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    db = data / "history.sqlite3"
    HistoryStore(db).close()
    os.chmod(data, 0o755)
    os.chmod(db, 0o644)
    HistoryStore(db).close()
    assert (mode(data), mode(db)) == (0o700, 0o600)


def test_engine_logs_and_key_files_are_private(
    fake_engine: Callable[..., Path], tmp_path: Path
) -> None:
    paths = default_paths()
    keys: list[tuple[Path, int]] = []

    def on_event(e: Event) -> None:
        if e.state is State.STARTING:  # the key file exists until the server is verified
            keys.extend((p, mode(p)) for p in (paths.state / "run").glob("*.key"))

    spec = LaunchSpec(fake_engine("serve"), ("-m", str(tmp_path / "m.gguf")), api_key_file=True)
    sup = Supervisor(spec, paths, policy=RestartPolicy(stop_grace=3.0), on_event=on_event)
    with sup:
        sup.start()
        sup.wait_ready(30)
    assert keys
    assert [m for _, m in keys] == [0o600]
    assert mode(paths.state / "run") == 0o700
    assert sup.log_file is not None
    assert_private([sup.log_file], paths.state)
    assert not list((paths.state / "run").glob("*.key"))  # gone once it was read


def test_settings_clusters_and_servers_are_private(k3_home: Path, standin: StandIn) -> None:
    paths = default_paths().ensure()
    for folder in (paths.config, paths.data, paths.cache, paths.state):
        assert mode(folder) == 0o700
    SettingsStore(paths.settings_file).save(Settings(system_prompt="I am a private person"))
    clusters = ClusterStore(paths)
    clusters.save([Cluster("sparks", (Node("10.0.0.1"),))])
    EndpointStore(paths).add("box", standin.url)
    written = sorted(paths.config.glob("*.json"))
    assert {p.name for p in written} >= {"settings.json", "clusters.json", "endpoints.json"}
    assert_private(written, k3_home)
    assert not [p for p in paths.config.iterdir() if p.name.endswith(".tmp")]


def test_app_paths_tighten_an_existing_loose_folder(tmp_path: Path) -> None:
    root = tmp_path / "k3"
    for sub in ("config", "data", "cache", "state"):
        (root / sub).mkdir(parents=True, mode=0o755)
        os.chmod(root / sub, 0o755)
    AppPaths(root / "config", root / "data", root / "cache", root / "state").ensure()
    assert [mode(root / s) for s in ("config", "data", "cache", "state")] == [0o700] * 4
