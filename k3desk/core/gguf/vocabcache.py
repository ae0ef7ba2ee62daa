"""Part 1's long string arrays, walked and compared once, kept by the digest of their bytes.

llama.cpp aborts on a vocabulary in which two tokens are the same bytes
(``llama_vocab::impl::load``, llama-vocab.cpp), so validation compares every token
of part 1 (163,840 for Kimi-K3), and to find the keys after them the reader walks the
tokens and the 163,328 merges string by string: together most of what checking a
94-part set takes in a fresh process.  Every published tier of Kimi-K3 carries the
same vocabulary byte for byte, so both are kept by what they are about: the SHA-256
of each array as it lies in the file (every length prefix and every byte; the bytes
fix where the array ends).  A later check hashes the same bytes (6.4 MB, a few
milliseconds) instead of walking them, and a vocabulary found free of duplicates is
not compared again; an array that differs in any byte is walked and compared anew.

The record (``checked-vocabularies.json`` in k3desk's cache folder, 0600) holds at
most :data:`MAX_ENTRIES` arrays, newest last.  A damaged record is set aside and
counts as absent (the next check walks, compares and writes a new one); a record
that cannot be written costs only that time next time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3desk.core.gguf.reader import MAX_KNOWN_SPAN, MAX_STRING_ARRAY
from k3desk.core.localfiles import check_dict, check_int, load_checked
from k3desk.core.paths import default_paths
from k3desk.core.private import write_private

FILE = "checked-vocabularies.json"
SCHEMA = 2
MAX_ENTRIES = 32
MAX_FILE_BYTES = 64 * 1024
_HEX = re.compile(r"[0-9a-f]{64}")
_lock = threading.Lock()


def digest(array_bytes: bytes) -> str:
    """The key of an array: the SHA-256 of its bytes, in hex."""
    return hashlib.sha256(array_bytes).hexdigest()


@dataclass(frozen=True)
class Walked:
    """A string array walked once: its element count, its bytes, their SHA-256, and
    whether its strings were compared and found all different (a vocabulary)."""

    strings: int
    nbytes: int
    sha256: str
    no_duplicates: bool


def _parse(data: Any) -> list[Walked]:
    d = check_dict(data, "checked vocabularies")
    if check_int(d.get("schema"), "schema", SCHEMA, SCHEMA) != SCHEMA:
        raise ValueError("unknown schema")
    entries = d.get("arrays")
    if not isinstance(entries, list):
        raise ValueError("arrays must be a list")
    out: list[Walked] = []
    for item in entries[:MAX_ENTRIES]:
        e = check_dict(item, "array")
        sha = e["sha256"]
        if not isinstance(sha, str) or not _HEX.fullmatch(sha):
            raise ValueError("an array's sha256 must be 64 hexadecimal digits")
        unique = e["no_duplicates"]
        if not isinstance(unique, bool):
            raise ValueError("no_duplicates must be true or false")
        strings = check_int(e["strings"], "strings", 1, MAX_STRING_ARRAY)
        nbytes = check_int(e["bytes"], "bytes", 8 * strings, MAX_KNOWN_SPAN)
        out.append(Walked(strings, nbytes, sha, unique))
    return out


class CheckedVocabularies:
    """The string arrays of part 1 walked and compared before, in ``folder`` (None:
    k3desk's cache folder, as ``K3DESK_HOME`` or the platform names it when the
    record is used).  It is the :class:`~k3desk.core.gguf.reader.KnownSpans` the
    reader asks, and says which vocabularies were found free of duplicates."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self.note = ""  # said when a damaged record was set aside

    @property
    def path(self) -> Path:
        if self.folder is not None:
            return self.folder / FILE
        return default_paths().cache / FILE

    def _read(self, path: Path) -> list[Walked]:
        found, note = load_checked(
            path, _parse, what="record of checked vocabularies", limit=MAX_FILE_BYTES
        )
        if note:
            self.note = note
        return found or []

    def spans(self, count: int) -> Sequence[tuple[int, str]]:
        return [(w.nbytes, w.sha256) for w in self._read(self.path) if w.strings == count]

    def known(self, key: str) -> bool:
        """Whether the array of SHA-256 ``key`` was compared and found free of duplicates."""
        return any(w.sha256 == key and w.no_duplicates for w in self._read(self.path))

    def add(self, *walked: Walked) -> None:
        """Keep ``walked`` (newest last); a record that cannot be written is left as it was."""
        path = self.path
        with _lock:
            new = {w.sha256 for w in walked}
            kept = [w for w in self._read(path) if w.sha256 not in new]
            kept = [*kept, *walked][-MAX_ENTRIES:]
            arrays = [
                {
                    "strings": w.strings,
                    "bytes": w.nbytes,
                    "sha256": w.sha256,
                    "no_duplicates": w.no_duplicates,
                }
                for w in kept
            ]
            payload = {"schema": SCHEMA, "arrays": arrays}
            # a read-only or refused cache folder: the arrays are walked again next time
            with contextlib.suppress(OSError):
                write_private(path, json.dumps(payload, indent=1) + "\n")
