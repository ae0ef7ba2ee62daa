"""Vocabularies already found free of duplicate tokens, kept by the digest of their bytes.

llama.cpp aborts on a vocabulary in which two tokens are the same bytes
(``llama_vocab::impl::load``, llama-vocab.cpp), so validation compares every token
of part 1: 163,840 of them for Kimi-K3, about half of what checking a 94-part set
takes in a fresh process.  Every published tier of Kimi-K3 carries the same
vocabulary byte for byte, so the verdict is kept by what it is about: the SHA-256 of
the ``tokenizer.ggml.tokens`` array as it lies in the file (every length prefix and
every byte the comparison reads; the bytes fix the number of tokens too).  A later
check reads the same 2.7 MB and hashes them in a few milliseconds; when the digest is
known it is done, and a vocabulary that differs in any byte is compared again.

The record (``checked-vocabularies.json`` in k3desk's cache folder, 0600) holds at
most :data:`MAX_ENTRIES` digests, newest last.  A damaged record is set aside and
counts as absent (the next check compares and writes a new one); a record that
cannot be written costs only the time of comparing next time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any

from k3desk.core.localfiles import check_dict, check_int, load_checked
from k3desk.core.paths import default_paths
from k3desk.core.private import write_private

FILE = "checked-vocabularies.json"
SCHEMA = 1
MAX_ENTRIES = 32
MAX_FILE_BYTES = 64 * 1024
_HEX = re.compile(r"[0-9a-f]{64}")
_lock = threading.Lock()


def digest(array_bytes: bytes) -> str:
    """The key of a vocabulary: the SHA-256 of its array's bytes, in hex."""
    return hashlib.sha256(array_bytes).hexdigest()


def _parse(data: Any) -> list[str]:
    d = check_dict(data, "checked vocabularies")
    if check_int(d.get("schema"), "schema", SCHEMA, SCHEMA) != SCHEMA:
        raise ValueError("unknown schema")
    entries = d.get("vocabularies")
    if not isinstance(entries, list):
        raise ValueError("vocabularies must be a list")
    out: list[str] = []
    for item in entries[:MAX_ENTRIES]:
        if not isinstance(item, str) or not _HEX.fullmatch(item):
            raise ValueError("a vocabulary's digest must be 64 hexadecimal digits")
        out.append(item)
    return out


class CheckedVocabularies:
    """The digests of the vocabularies found free of duplicates, in ``folder``
    (None: k3desk's cache folder, as ``K3DESK_HOME`` or the platform names it when
    the record is used)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self.note = ""  # said when a damaged record was set aside

    @property
    def path(self) -> Path:
        if self.folder is not None:
            return self.folder / FILE
        return default_paths().cache / FILE

    def _read(self, path: Path) -> list[str]:
        found, note = load_checked(
            path, _parse, what="record of checked vocabularies", limit=MAX_FILE_BYTES
        )
        if note:
            self.note = note
        return found or []

    def known(self, key: str) -> bool:
        return key in self._read(self.path)

    def add(self, key: str) -> None:
        """Keep ``key``; a record that cannot be written is left as it was."""
        path = self.path
        with _lock:
            kept = [k for k in self._read(path) if k != key][-(MAX_ENTRIES - 1) :]
            payload = {"schema": SCHEMA, "vocabularies": [*kept, key]}
            # a read-only or refused cache folder: the tokens are compared again next time
            with contextlib.suppress(OSError):
                write_private(path, json.dumps(payload, indent=1) + "\n")
