"""The one place secrets are kept: the OS keyring, or this session's memory, never a file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from k3desk.core.secrets import SERVICE, SecretStore
from tests.fixtures.hub import FakeKeyringModule, MemoryKeyring

SECRET = "sk-SecretForTestsOnly-0123456789"


class LockedKeyring(MemoryKeyring):
    """A usable backend whose every call fails (a locked collection, a D-Bus error)."""

    def get_password(self, service: str, user: str) -> str | None:
        raise RuntimeError("the collection is locked")

    def set_password(self, service: str, user: str, password: str) -> None:
        raise RuntimeError("the collection is locked")

    def delete_password(self, service: str, user: str) -> None:
        raise RuntimeError("the collection is locked")


class NoBackend(MemoryKeyring):
    priority = 0  # what keyring picks on a headless box without a Secret Service


def test_a_secret_goes_to_the_keyring_and_a_new_run_finds_it() -> None:
    backend = MemoryKeyring()
    store = SecretStore(keyring_module=FakeKeyringModule(backend))
    assert store.keyring_usable()
    assert store.set("endpoint:lab", SECRET) == "keyring"
    assert backend.store == {(SERVICE, "endpoint:lab"): SECRET}
    again = SecretStore(keyring_module=FakeKeyringModule(backend))
    assert again.get("endpoint:lab") == SECRET
    assert again.get("endpoint:lab", keyring=False) is None  # only what this run was told
    assert again.get("endpoint:other") is None
    again.delete("endpoint:lab")
    assert backend.store == {}
    again.delete("endpoint:lab")  # twice is fine


def test_without_a_keyring_a_secret_lives_for_this_session_only(k3_home: Path) -> None:
    store = SecretStore(keyring_module=FakeKeyringModule(NoBackend()))
    assert not store.keyring_usable()
    assert store.set("huggingface-token", SECRET) == "session"
    assert store.get("huggingface-token") == SECRET
    assert (
        SecretStore(keyring_module=FakeKeyringModule(NoBackend())).get("huggingface-token") is None
    )
    written = [p for p in k3_home.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert written == []
    store.delete("huggingface-token")
    assert store.get("huggingface-token") is None


def test_a_locked_keyring_falls_back_to_the_session_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = SecretStore(keyring_module=FakeKeyringModule(LockedKeyring()))
    with caplog.at_level(logging.WARNING, logger="k3desk.core.secrets"):
        assert store.set("huggingface-token", SECRET, what="token") == "session"
    assert "could not save the token in the keyring (RuntimeError)" in caplog.text
    assert SECRET not in caplog.text
    assert store.get("huggingface-token") == SECRET
    store.delete("huggingface-token")  # the keyring's refusal is not an error here
    assert store.get("huggingface-token") is None


def test_saving_to_the_keyring_replaces_what_the_session_held() -> None:
    backend = NoBackend()
    store = SecretStore(keyring_module=FakeKeyringModule(backend))
    store.set("endpoint:lab", "old-key")
    backend.priority = 1  # the Secret Service came up (the user logged in to the desktop)
    assert store.set("endpoint:lab", SECRET) == "keyring"
    assert store.get("endpoint:lab") == SECRET
