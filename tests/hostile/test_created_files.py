"""What k3desk creates is private or deliberately shared, whatever the umask, and a link
planted where k3desk writes is never followed.

* a download (the Hub stand-in): the model files and their folders are as readable as
  the folder the person chose, never writable by others; ``.k3desk/`` and its records
  are 0700 / 0600;
* ``plan --remote``'s header cache: 0700 / 0600;
* a symbolic link planted in ``.k3desk/`` (at a record, a temporary name, a folder) is
  refused, naming it, and what it points to is untouched; one planted at a temporary
  name of the header cache (``.part``, ``.tmp``) is never written through, since
  temporary files are new files of fresh names, made exclusively;
* a ``.k3desk/`` that is another user's is refused.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from k3desk.app import Services
from k3desk.core.app.remote_plan import RemotePlanRequest, plan_remote_set
from k3desk.core.errors import HubError
from k3desk.core.hub.headers import RECORD
from k3desk.devtools.tinyk3 import TinyModel
from tests.core.hub.test_hub_remote_headers import TINY, _tiny_files
from tests.hostile.hostile_hub import HostileHub
from tests.hostile.test_hostile_hub import GOOD, REPO_ID, download, landed
from tests.hostile.test_private import mode, open_umask  # noqa: F401 - umask 000 here too
from tests.hubserver import HubServer

PART = "IQ1_S/K3-IQ1_S-00001-of-00002.gguf"
SECRET = b"the downloading user's own private file\n"


def modes_under(root: Path) -> dict[str, int]:
    """Every entry under ``root`` (``root`` itself as ``.``) with its permission bits."""
    out = {".": mode(root)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = mode(p)
    return out


def victim(tmp_path: Path) -> Path:
    """A private file of the person running k3desk, the target of every planted link."""
    v = tmp_path / "home" / "secret.txt"
    v.parent.mkdir(mode=0o700)
    v.write_bytes(SECRET)
    os.chmod(v, 0o600)
    return v


def untouched(v: Path) -> bool:
    return v.read_bytes() == SECRET and mode(v) == 0o600


# ------------------------------------------------------------------ modes


@pytest.mark.parametrize(
    ("shared", "files", "folders"),
    [(0o755, 0o644, 0o755), (0o1777, 0o644, 0o755), (0o750, 0o640, 0o750), (0o700, 0o600, 0o700)],
)
@pytest.mark.parametrize("transport", ["http", "hub"])
def test_a_download_makes_models_as_readable_as_their_folder_and_records_private(
    hostile_hub: HostileHub,
    tmp_path: Path,
    transport: str,
    shared: int,
    files: int,
    folders: int,
) -> None:
    """The folder the person chose (a shared models folder: 0755, or 1777 as /tmp is,
    or a group's 0750, or a private 0700) decides who may read the models; nobody else
    may ever write them or the records.  The modes are k3desk's, not the umask's: the
    same under umask 000 and 077."""
    hostile_hub.add_repo(REPO_ID, GOOD)
    parent = tmp_path / "models"
    parent.mkdir()
    os.chmod(parent, shared)
    target = parent / "new" / "K3"  # made by the download, with the folder above it

    # 000 lets everything through, 077 nothing: a shared folder's models are readable anyway
    os.umask(0o077 if transport == "hub" and shared & 0o077 else 0)
    run = download(hostile_hub, target, transport=transport)

    assert run.error is None, run.error
    assert landed(target, GOOD)
    got = modes_under(parent)
    models = {k: v for k, v in got.items() if not k.startswith("new/K3/.k3desk")}
    records = {k: v for k, v in got.items() if k.startswith("new/K3/.k3desk")}
    assert models == {
        ".": shared,
        "new": folders,
        "new/K3": folders,
        "new/K3/IQ1_S": folders,
        **{f"new/K3/{p}": files for p in GOOD},
    }
    assert records.pop("new/K3/.k3desk") == 0o700
    assert records.pop("new/K3/.k3desk/state.json") == 0o600
    assert all(v in (0o700, 0o600) for v in records.values()), records


def test_the_header_cache_of_a_remote_plan_is_private(
    hub_server: HubServer, tiny_k3: TinyModel, hardware_file: Any
) -> None:
    hub_server.add_repo(TINY, _tiny_files(tiny_k3))
    services = Services()
    hw = hardware_file("no-gpu-laptop-32GB")
    remote = plan_remote_set(
        services, RemotePlanRequest(TINY, hardware_file=hw, endpoint=hub_server.endpoint)
    )
    cache = services.paths.cache
    got = modes_under(cache)
    assert remote.headers.folder.is_relative_to(cache)
    assert len(got) > 6  # the folders and every part's twin
    loose = {k: oct(v) for k, v in got.items() if v not in (0o700, 0o600)}
    assert loose == {}
    for p in remote.headers.local_paths:
        assert mode(p) == 0o600


# ------------------------------------------------------------------ planted links


@pytest.mark.parametrize(
    "record",
    [
        ".k3desk",
        ".k3desk/state.json",
        ".k3desk/state.json.tmp",
        ".k3desk/.write-probe",
        ".k3desk/partial",
        ".k3desk/partial/IQ1_S",
        f".k3desk/partial/{PART}.k3part",
        f".k3desk/partial/{PART}.k3part.json",
        f".k3desk/partial/{PART}.k3part.json.tmp",
        f".k3desk/partial/{PART}.from-cache",
        ".k3desk/staging",
    ],
)
def test_a_link_planted_in_the_state_folder_is_refused_by_name_and_not_followed(
    hostile_hub: HostileHub, tmp_path: Path, record: str
) -> None:
    """Another user of a shared models folder plants links where k3desk keeps its
    records; before, a 0600 file of the person downloading was overwritten with the
    download or with k3desk's state."""
    hostile_hub.add_repo(REPO_ID, GOOD)
    v = victim(tmp_path)
    target = tmp_path / "shared"
    link = target / record
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(v if "." in link.name.strip(".") else v.parent)

    run = download(hostile_hub, target)

    assert isinstance(run.error, HubError), run.error
    assert f"{link} is a symbolic link" in run.error.message
    assert "Remove it" in run.error.hint
    assert untouched(v)
    assert sorted(p.name for p in v.parent.iterdir()) == ["secret.txt"]
    assert link.is_symlink()  # left for the person to look at
    assert not (target / "IQ1_S").exists()


def test_a_temporary_file_is_never_written_through_a_link_at_its_own_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even at the very name a temporary file is given (a fresh random one, here made
    known), a planted link is not followed: the file is created exclusively."""
    from k3desk.core import private

    monkeypatch.setattr(private.secrets, "token_hex", lambda n: "known")
    v = victim(tmp_path)
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / ".state.json.known.tmp").symlink_to(v)

    with pytest.raises(FileExistsError):
        private.write_private(folder / "state.json", '{"state": 1}')

    assert untouched(v)
    assert not (folder / "state.json").exists()


@pytest.fixture
def planned_once(
    hub_server: HubServer, tiny_k3: TinyModel, hardware_file: Any
) -> tuple[Services, RemotePlanRequest, Path]:
    """A remote plan made once: (its services, its request, its header twin's folder)."""
    hub_server.add_repo(TINY, _tiny_files(tiny_k3))
    services = Services()
    request = RemotePlanRequest(
        TINY, hardware_file=hardware_file("no-gpu-laptop-32GB"), endpoint=hub_server.endpoint
    )
    return services, request, plan_remote_set(services, request).headers.folder


@pytest.mark.parametrize(
    "planted", ["a part's .part", "the record's .tmp", "the record", "a folder"]
)
def test_a_link_planted_in_the_header_cache_is_refused_by_name_and_not_followed(
    planned_once: tuple[Services, RemotePlanRequest, Path], tmp_path: Path, planted: str
) -> None:
    """Before, links at ``<part>.part`` and ``.k3desk-headers.json.tmp`` had their targets
    overwritten."""
    services, request, folder = planned_once
    v = victim(tmp_path)
    twin = sorted(folder.rglob("*.gguf"))[0]
    twin.unlink()  # read again, so written again
    link = {
        "a part's .part": twin.with_name(twin.name + ".part"),
        "the record's .tmp": folder / (RECORD + ".tmp"),
        "the record": folder / RECORD,
        "a folder": folder.parent,
    }[planted]
    if planted == "the record":
        link.unlink()
    if planted == "a folder":
        shutil.rmtree(link)
    link.symlink_to(v if link.name.endswith(("part", "tmp", "json")) else v.parent)

    with pytest.raises(HubError) as err:
        plan_remote_set(services, request)

    assert f"{link} is a symbolic link" in err.value.message
    assert untouched(v)
    assert sorted(p.name for p in v.parent.iterdir()) == ["secret.txt"]


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder another user's needs root")
def test_a_state_folder_of_another_user_is_refused(hostile_hub: HostileHub, tmp_path: Path) -> None:
    hostile_hub.add_repo(REPO_ID, GOOD)
    target = tmp_path / "shared"
    (target / ".k3desk").mkdir(parents=True)
    os.chown(target / ".k3desk", 65534, 65534)

    run = download(hostile_hub, target)

    assert isinstance(run.error, HubError), run.error
    assert f"{target / '.k3desk'} belongs to another user" in run.error.message
    assert not list(target.glob("IQ1_S/*"))


def test_an_engine_built_under_umask_000_is_the_users_alone() -> None:
    """pip and the compiler write with the umask; what k3desk installs is checked after."""
    from k3desk.core.engines.install import choose_build
    from k3desk.core.paths import default_paths
    from tests.core.engines.test_engine_install import _install, machine

    paths = default_paths()
    engine = _install(paths, choose_build(machine(), None, machine="x86_64"), "ok")

    got = modes_under(engine.folder)
    assert len(got) > 5
    shared = {
        k: oct(v) for k, v in got.items() if v & 0o077 and not (engine.folder / k).is_symlink()
    }
    assert shared == {}
    assert got[str(engine.server.relative_to(engine.folder))] & 0o700 == 0o700  # still runs


def test_the_desktop_entry_is_for_the_desktop_to_read_and_nobody_else_to_change(
    tmp_path: Path,
) -> None:
    """Its ``Exec`` line is run when the menu entry is clicked: under umask 000 another
    user could have made it run anything."""
    from k3desk.cli.desktop_entry import install
    from k3desk.core.app.values import resources_dir

    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    install(resources_dir(), home / ".local" / "share")

    got = modes_under(home)
    assert got[".local/share/applications/k3desk.desktop"] == 0o644
    assert {v for k, v in got.items() if (home / k).is_file()} == {0o644}
    assert {v for k, v in got.items() if (home / k).is_dir()} == {0o755}


def test_a_model_linked_from_the_hugging_face_cache_is_writable_by_nobody_else_there_either(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    """A file reused from the HF cache is a hard link to its blob: one inode, one mode.
    Its others' write bits go (huggingface_hub made it 0666 under umask 000); its read
    bits stay, for the cache's other readers."""
    from huggingface_hub import hf_hub_download

    hostile_hub.add_repo(REPO_ID, GOOD)
    cache = tmp_path / "hf-cache"
    for p in GOOD:
        hf_hub_download(REPO_ID, p, cache_dir=cache, endpoint=hostile_hub.endpoint, token=False)
    blobs = sorted((cache / f"models--{REPO_ID.replace('/', '--')}" / "blobs").iterdir())
    private = tmp_path / "mine"
    private.mkdir(mode=0o700)
    hostile_hub.reset_log()

    run = download(hostile_hub, private / "K3", use_hf_cache=True, hf_cache_dir=cache)

    assert run.error is None, run.error
    assert landed(private / "K3", GOOD)
    assert [hostile_hub.bytes_sent(p) for p in GOOD] == [0] * len(GOOD)  # reused, not fetched
    assert [(p.stat().st_nlink, mode(p)) for p in blobs] == [(2, 0o644)] * len(GOOD)


def test_models_an_older_version_left_writable_by_others_lose_that_when_kept(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    """Kept in place, not fetched again: one the state knows as verified, one found in
    the folder and hashed; both were 0666 (an older version under umask 000)."""
    hostile_hub.add_repo(REPO_ID, GOOD)
    target = tmp_path / "models"
    assert download(hostile_hub, target).error is None
    known, found = GOOD
    (target / found).unlink()
    (target / found).write_bytes(GOOD[found])  # not the file the state verified
    for p in GOOD:
        os.chmod(target / p, 0o666)
    hostile_hub.reset_log()

    run = download(hostile_hub, target)

    assert run.error is None, run.error
    assert [hostile_hub.bytes_sent(p) for p in GOOD] == [0, 0]
    assert [mode(target / p) for p in (known, found)] == [0o644, 0o644]


def test_a_model_folder_that_is_a_link_is_refused_before_a_byte_is_fetched(
    hostile_hub: HostileHub, tmp_path: Path
) -> None:
    """A link that stays inside the folder is no escape, but the finished files would be
    renamed into a folder k3desk did not check: refused by name, and nothing fetched."""
    hostile_hub.add_repo(REPO_ID, GOOD)
    target = tmp_path / "shared"
    (target / "elsewhere").mkdir(parents=True)
    (target / "IQ1_S").symlink_to(target / "elsewhere")

    run = download(hostile_hub, target)

    assert isinstance(run.error, HubError), run.error
    assert f"{target / 'IQ1_S'} is a symbolic link" in run.error.message
    assert hostile_hub.bytes_sent() == 0
    assert list((target / "elsewhere").iterdir()) == []
