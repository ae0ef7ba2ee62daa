"""The person's API keys for their own tools: made, kept across runs, listed, revoked.

Two homes for the secret, both as a person meets them: a usable keyring (a backend held in
memory, shared between two ``ClientKeys`` as the OS keyring is shared between two runs of
k3desk) and none at all (the suite's null backend: a headless server), where the secret
lives in a private file.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from k3desk.core.engines.client_keys import MAX_KEYS, ApiKeyError, ClientKeys
from k3desk.core.secrets import SecretStore
from tests.fixtures.hub import FakeKeyringModule, MemoryKeyring


@pytest.fixture
def ring() -> MemoryKeyring:
    return MemoryKeyring()


def with_keyring(config: Path, ring: MemoryKeyring) -> ClientKeys:
    return ClientKeys(config, SecretStore(keyring_module=FakeKeyringModule(ring)))


def without_keyring(config: Path) -> ClientKeys:
    return ClientKeys(config, SecretStore())  # the suite's null backend: no keyring


def test_a_key_made_with_a_keyring_is_there_for_the_next_run_and_never_in_a_file(
    tmp_path: Path, ring: MemoryKeyring
) -> None:
    key, secret = with_keyring(tmp_path, ring).create("vscode")
    assert secret.startswith("k3-")
    assert len(secret) >= 32
    assert key.place == "keyring"
    assert key.tail == secret[-4:]
    later = with_keyring(tmp_path, ring)  # the next run: a new store, the same keyring
    (listed,) = later.listed()
    assert (listed.name, listed.shown) == ("vscode", f"k3-…{secret[-4:]}")
    assert later.secret(listed) == secret
    assert [s for _, s in later.active()] == [secret]
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert secret not in f.read_text()
    assert not (tmp_path / "api-keys.secret.json").exists()


def test_without_a_keyring_the_key_lives_in_a_private_file_and_still_survives(
    tmp_path: Path,
) -> None:
    key, secret = without_keyring(tmp_path).create("agent")
    assert key.place == "file"
    secret_file = tmp_path / "api-keys.secret.json"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "api-keys.json").stat().st_mode) == 0o600
    assert secret not in (tmp_path / "api-keys.json").read_text()
    later = without_keyring(tmp_path)
    assert [s for _, s in later.active()] == [secret]


def test_keys_are_distinct_and_a_revoked_one_is_gone_from_every_store(
    tmp_path: Path, ring: MemoryKeyring
) -> None:
    keys = with_keyring(tmp_path, ring)
    _, a = keys.create("a")
    _, b = keys.create("b")
    assert a != b
    gone = keys.revoke("A")  # names are matched without regard to case
    assert gone.name == "a"
    assert [k.name for k in keys.listed()] == ["b"]
    assert [s for _, s in keys.active()] == [b]
    assert a not in ring.store.values()
    with pytest.raises(ApiKeyError, match=r"no API key named 'a'.*keys: b"):
        keys.revoke("a")


def test_a_revoked_file_key_is_taken_out_of_the_file(tmp_path: Path) -> None:
    keys = without_keyring(tmp_path)
    _, a = keys.create("a")
    keys.create("b")
    keys.revoke("a")
    assert a not in (tmp_path / "api-keys.secret.json").read_text()


@pytest.mark.parametrize(
    "name",
    ["", "   ", "-x", "--api-key", "a" * 41, "tab\there", "new\nline", "semi;colon", "é"],
)
def test_a_name_that_cannot_name_a_key_is_refused_and_nothing_is_kept(
    tmp_path: Path, name: str
) -> None:
    keys = without_keyring(tmp_path)
    with pytest.raises(ApiKeyError, match="cannot name a key"):
        keys.create(name)
    assert keys.listed() == []
    assert not (tmp_path / "api-keys.secret.json").exists()


def test_a_taken_name_is_refused_whatever_its_case(tmp_path: Path) -> None:
    keys = without_keyring(tmp_path)
    keys.create("VSCode")
    with pytest.raises(ApiKeyError, match="already an API key named 'vscode'"):
        keys.create("vscode")
    assert len(keys.listed()) == 1


def test_at_most_max_keys(tmp_path: Path) -> None:
    keys = without_keyring(tmp_path)
    for n in range(MAX_KEYS):
        keys.create(f"k{n}")
    with pytest.raises(ApiKeyError, match=f"already {MAX_KEYS} API keys"):
        keys.create("one-more")


def test_a_damaged_list_is_set_aside_and_said_not_a_crash(tmp_path: Path) -> None:
    keys = without_keyring(tmp_path)
    keys.create("a")
    (tmp_path / "api-keys.json").write_text('{"schema": 1, "keys": [{"id": "zz"}]}')
    assert keys.listed() == []
    assert "list of API keys" in keys.warning
    assert "kept as api-keys.json.damaged" in keys.warning
    keys.create("b")  # a new list is started
    assert [k.name for k in keys.listed()] == ["b"]


def test_a_secret_changed_on_disk_is_not_given_to_the_engine(tmp_path: Path) -> None:
    """A hand-edited or foreign secret file: a secret that is not the one made (its tail
    differs) or not a key at all (a newline would add a line to the engine's key file)."""
    keys = without_keyring(tmp_path)
    key, _ = keys.create("a")
    path = tmp_path / "api-keys.secret.json"
    for forged in ("k3-" + "A" * 32, "k3-abcdefghijklmnop\nk3-xyzxyzxyzxyzxyz" + key.tail):
        path.write_text(json.dumps({key.id: forged}))
        assert keys.active() == ()
        with pytest.raises(ApiKeyError, match="no longer in"):
            keys.secret(key)


def test_a_locked_keyring_leaves_the_key_listed_but_not_active(tmp_path: Path) -> None:
    ring = MemoryKeyring()
    keys = with_keyring(tmp_path, ring)
    keys.create("a")
    ring.store.clear()  # the keyring lost it (locked, wiped)
    assert [k.name for k in keys.listed()] == ["a"]
    assert keys.active() == ()
    with pytest.raises(ApiKeyError, match=r"Unlock the keyring"):
        keys.secret(keys.find("a"))
