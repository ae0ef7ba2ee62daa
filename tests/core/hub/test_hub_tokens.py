"""The Hugging Face token: keyring first-class, session-only without one, never on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3desk.core.errors import HubError
from k3desk.core.hub.tokens import SERVICE, TokenStore, mask
from tests.fixtures.hub import FakeKeyringModule, MemoryKeyring

SECRET = "hf_TokenForTestsOnly1234567890abcd"


class FailKeyring:
    """What keyring picks on a headless Linux box without a Secret Service."""

    priority = 0

    def get_password(self, service: str, user: str) -> str | None:
        raise RuntimeError("No recommended backend was available")

    def set_password(self, service: str, user: str, password: str) -> None:
        raise RuntimeError("No recommended backend was available")

    def delete_password(self, service: str, user: str) -> None:
        raise RuntimeError("No recommended backend was available")


def _scan_for(secret: str, *roots: Path) -> list[Path]:
    hits = []
    for root in roots:
        if not root.exists():
            continue
        for p in root.rglob("*"):
            if p.is_file() and secret.encode() in p.read_bytes():
                hits.append(p)
    return hits


def test_token_goes_to_the_keyring_under_service_k3desk(k3_home: Path) -> None:
    backend = MemoryKeyring()
    store = TokenStore(env={}, keyring_module=FakeKeyringModule(backend))
    saved = store.set(f"  {SECRET}\n")
    assert saved.where == "keyring"
    assert [k[0] for k in backend.store] == [SERVICE]
    assert store.get() == SECRET
    assert store.source() == "keyring"
    # a fresh store (next app start) still finds it
    assert TokenStore(env={}, keyring_module=FakeKeyringModule(backend)).get() == SECRET
    store.clear()
    assert store.get() is None
    assert store.source() is None
    assert backend.store == {}


def test_without_a_usable_keyring_the_token_lives_for_the_session_only(k3_home: Path) -> None:
    store = TokenStore(env={}, keyring_module=FakeKeyringModule(FailKeyring()))
    assert not store.keyring_usable()
    saved = store.set(SECRET)
    assert saved.where == "session"
    assert "this session only" in saved.message
    assert store.get() == SECRET
    assert store.source() == "session"
    # nothing was written anywhere: a new process would not know it
    assert TokenStore(env={}, keyring_module=FakeKeyringModule(FailKeyring())).get() is None
    assert _scan_for(SECRET, k3_home) == []


def test_hf_token_env_wins_and_hf_login_file_is_the_fallback(k3_home: Path) -> None:
    backend = MemoryKeyring()
    hf_home = k3_home / "hf"
    hf_home.mkdir(parents=True, exist_ok=True)
    (hf_home / "token").write_text("hf_fromLoginFile000000000\n")
    kr = FakeKeyringModule(backend)

    assert TokenStore(env={"HF_HOME": str(hf_home)}, keyring_module=kr).source() == (
        "huggingface_hub login"
    )
    store = TokenStore(env={"HF_HOME": str(hf_home)}, keyring_module=kr)
    assert store.get() == "hf_fromLoginFile000000000"
    store.set(SECRET)
    assert store.get() == SECRET  # k3desk's own token beats hf's login file
    env_store = TokenStore(env={"HF_HOME": str(hf_home), "HF_TOKEN": "hf_env"}, keyring_module=kr)
    assert env_store.get() == "hf_env"
    assert env_store.source() == "HF_TOKEN"


def test_bad_tokens_are_refused_with_a_reason() -> None:
    store = TokenStore(env={}, keyring_module=FakeKeyringModule(MemoryKeyring()))
    with pytest.raises(HubError, match="empty or contains spaces"):
        store.set("   ")
    with pytest.raises(HubError, match="empty or contains spaces"):
        store.set("hf_abc def")


def test_mask_never_shows_the_secret() -> None:
    shown = mask(SECRET)
    assert SECRET not in shown
    assert shown.startswith("hf_")
    assert shown.endswith(SECRET[-4:])
    assert mask(None) == "(none)"
    assert mask("short") == "…"
