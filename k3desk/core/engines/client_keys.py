"""The keys a person gives their own tools for the local API: named, kept, revoked.

Every launch of the engine accepts the app's own key (fresh per launch, used by k3desk's
own traffic) and every client key kept here, so a tool set up once keeps working across
restarts, re-plans and model switches.  llama-server reads its keys once, when it starts
(``--api-key-file``: one key per line, ``common/arg.cpp`` in b11434), so a key created or
revoked while an engine runs takes effect when it next starts; :meth:`ClientKeys.create`
and :meth:`ClientKeys.revoke` callers say so.

What is kept where:

* ``<config>/api-keys.json`` (0600): each key's name, id, when it was made, its last four
  characters and where its secret is; never the secret itself.
* The secret: the system keyring (service ``k3desk``, user ``api-key:<id>``).  A machine
  with no usable keyring (a headless server without a Secret Service) keeps it in
  ``<config>/api-keys.secret.json``, 0600 in a 0700 folder, and says so when the key is
  made: the engine's own key file is no better protected, and a key that vanished with
  each restart would break every tool pointed at the endpoint.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from k3desk.core.errors import K3Error
from k3desk.core.localfiles import check_dict, check_float, check_text, load_checked
from k3desk.core.private import write_private
from k3desk.core.secrets import SecretStore

KeyPlace = Literal["keyring", "file"]
PREFIX = "k3-"  # every client key starts so: recognisable, never read as an option
MAX_KEYS = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,39}")
_ID = re.compile(r"[0-9a-f]{12}")
SCHEMA = 1


class ApiKeyError(K3Error):
    """A client key could not be made, found or revoked."""


@dataclass(frozen=True)
class ClientKey:
    """One key as listed (the secret is fetched on demand: :meth:`ClientKeys.secret`)."""

    id: str
    name: str
    created: float  # seconds since the epoch
    tail: str  # the secret's last four characters, to tell keys apart
    place: KeyPlace

    @property
    def shown(self) -> str:
        """The key as a list shows it: ``k3-…AbCd``."""
        return f"{PREFIX}…{self.tail}"


def new_secret() -> str:
    """``k3-`` and 192 random bits (URL-safe: no comma, space or newline, which would split
    it in the engine's key list or key file)."""
    return PREFIX + secrets.token_urlsafe(24)


def check_name(name: str) -> str:
    """``name`` stripped, or :class:`ApiKeyError` saying what a name may be."""
    name = name.strip() if isinstance(name, str) else ""
    if not _NAME.fullmatch(name):
        raise ApiKeyError(
            f"{name[:60]!r} cannot name a key.",
            "A key's name is 1-40 letters, digits, spaces or . _ @ + -, starting with a "
            "letter or digit (for example: vscode, my-agent).",
        )
    return name


class ClientKeys:
    """The person's client keys under ``config`` (see the module docstring)."""

    def __init__(self, config: Path, store: SecretStore | None = None) -> None:
        self.config = config
        self.index_file = config / "api-keys.json"
        self.secret_file = config / "api-keys.secret.json"
        self._store = store or SecretStore()
        self.warning = ""  # a damaged record set aside on the last read, in words

    # ------------------------------------------------------------------ reading
    def listed(self) -> list[ClientKey]:
        """Every key, oldest first."""
        keys, why = load_checked(self.index_file, _parse_index, what="list of API keys")
        self.warning = why
        return keys or []

    def find(self, name: str) -> ClientKey:
        keys = self.listed()
        for key in keys:
            if key.name.casefold() == name.strip().casefold():
                return key
        known = ", ".join(k.name for k in keys) or "none yet"
        raise ApiKeyError(
            f"There is no API key named {name.strip()[:60]!r} (keys: {known}).",
            "List them with `k3desk api keys`, or make one with `k3desk api create NAME`.",
        )

    def secret(self, key: ClientKey) -> str:
        """The key itself; :class:`ApiKeyError` when its store no longer holds it."""
        value = self._secret_or_none(key)
        if value is None:
            where = "the keyring" if key.place == "keyring" else str(self.secret_file)
            raise ApiKeyError(
                f"The API key {key.name!r} is no longer in {where} (locked, or removed).",
                "Unlock the keyring, or revoke the key and create another.",
            )
        return value

    def active(self) -> tuple[tuple[ClientKey, str], ...]:
        """Every key whose secret can be read now, with it: what the engine accepts."""
        out = []
        for key in self.listed():
            value = self._secret_or_none(key)
            if value is not None:
                out.append((key, value))
        return tuple(out)

    # ------------------------------------------------------------------ changes
    def create(self, name: str) -> tuple[ClientKey, str]:
        """A new key named ``name``: (the key as listed, its secret).  Raises
        :class:`ApiKeyError` for a bad or taken name, or too many keys."""
        name = check_name(name)
        keys = self.listed()
        if any(k.name.casefold() == name.casefold() for k in keys):
            raise ApiKeyError(
                f"There is already an API key named {name!r}.",
                "Choose another name, or revoke that key first.",
            )
        if len(keys) >= MAX_KEYS:
            raise ApiKeyError(
                f"There are already {len(keys)} API keys, the most k3desk keeps.",
                "Revoke keys no tool uses any more.",
            )
        value = new_secret()
        key_id = secrets.token_hex(6)
        place: KeyPlace = "keyring"
        if self._store.set(_user(key_id), value, what="API key") != "keyring":
            self._store.delete(_user(key_id))  # the session copy: the file is the place
            secret_map = self._file_secrets()
            secret_map[key_id] = value
            self._write_secrets(secret_map)
            place = "file"
        key = ClientKey(key_id, name, time.time(), value[-4:], place)
        self._write_index([*keys, key])
        return key, value

    def revoke(self, name: str) -> ClientKey:
        """Forget the key named ``name`` (its secret too); returns it as it was listed."""
        key = self.find(name)
        self._write_index([k for k in self.listed() if k.id != key.id])
        if key.place == "keyring":
            self._store.delete(_user(key.id))
        secret_map = self._file_secrets()
        if secret_map.pop(key.id, None) is not None:
            self._write_secrets(secret_map)
        return key

    # ------------------------------------------------------------------ internals
    def _secret_or_none(self, key: ClientKey) -> str | None:
        if key.place == "keyring":
            value = self._store.get(_user(key.id))
        else:
            value = self._file_secrets().get(key.id)
        if value is None or not _valid_secret(value) or value[-4:] != key.tail:
            return None
        return value

    def _file_secrets(self) -> dict[str, str]:
        found, _ = load_checked(self.secret_file, _parse_secrets, what="file of API keys")
        return found or {}

    def _write_secrets(self, secret_map: dict[str, str]) -> None:
        write_private(self.secret_file, json.dumps(secret_map, indent=1) + "\n", fsync=True)

    def _write_index(self, keys: list[ClientKey]) -> None:
        data = {
            "schema": SCHEMA,
            "keys": [
                {
                    "id": k.id,
                    "name": k.name,
                    "created": k.created,
                    "tail": k.tail,
                    "place": k.place,
                }
                for k in keys
            ],
        }
        write_private(self.index_file, json.dumps(data, indent=1) + "\n", fsync=True)


def _user(key_id: str) -> str:
    return f"api-key:{key_id}"


def _valid_secret(value: str) -> bool:
    body = value[len(PREFIX) :]
    return value.startswith(PREFIX) and re.fullmatch(r"[A-Za-z0-9_-]{16,200}", body) is not None


def _parse_index(data: Any) -> list[ClientKey]:
    d = check_dict(data, "the list of API keys")
    items = d["keys"]
    if not isinstance(items, list) or len(items) > MAX_KEYS:
        raise ValueError(f"keys must be a list of at most {MAX_KEYS}")
    out: list[ClientKey] = []
    for item in items:
        k = check_dict(item, "a key")
        key_id = check_text(k["id"], "id", 12)
        if not _ID.fullmatch(key_id):
            raise ValueError(f"id {key_id!r} is not 12 hexadecimal digits")
        name = check_text(k["name"], "name", 40)
        if not _NAME.fullmatch(name):
            raise ValueError(f"name {name!r} is not a key's name")
        tail = check_text(k["tail"], "tail", 4)
        place = check_text(k["place"], "place", 8)
        if place not in ("keyring", "file"):
            raise ValueError(f"place {place!r} is neither keyring nor file")
        created = check_float(k["created"], "created", 0.0, 1e11)
        where: KeyPlace = "keyring" if place == "keyring" else "file"
        out.append(ClientKey(key_id, name, created, tail, where))
    return out


def _parse_secrets(data: Any) -> dict[str, str]:
    d = check_dict(data, "the file of API keys")
    out = {}
    for key_id, value in d.items():
        if _ID.fullmatch(key_id) and isinstance(value, str) and _valid_secret(value):
            out[key_id] = value
    return out
