"""Find the whole split set from any one of its parts.

llama.cpp names split parts ``<prefix>-NNNNN-of-MMMMM.gguf`` (``llama_split_path``)
and derives the others from part 1's name, so every part must keep its published
name in one folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from k3desk.core.safepaths import what_is

SPLIT_RE = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")


@dataclass(frozen=True)
class ShardSet:
    prefix: str  # file name without "-NNNNN-of-MMMMM.gguf" (or without ".gguf")
    directory: Path
    count: int  # 1 for an unsplit file
    given: Path  # the path the caller passed
    given_index: int  # 0-based index of the given part (-1 for a bad "00000-of-" name)

    @property
    def split(self) -> bool:
        # a name without ".gguf" ("model.bin", "notes.txt") is a set of one, not a
        # split set whose first part would be "notes.txt-00001-of-00001.gguf"
        return self.count > 1 or SPLIT_RE.fullmatch(self.given.name) is not None

    def part_name(self, index: int) -> str:
        """File name of the 0-based part ``index``."""
        if not self.split:
            return self.given.name
        return f"{self.prefix}-{index + 1:05d}-of-{self.count:05d}.gguf"

    def part_label(self, index: int) -> str:
        return f"{index + 1:05d}-of-{self.count:05d}" if self.split else self.given.name

    @cached_property
    def paths(self) -> tuple[Path, ...]:
        return tuple(self.directory / self.part_name(i) for i in range(self.count))

    def _listing(self) -> dict[str, os.DirEntry[str]]:
        """The folder's entries by name (one directory listing; no file is opened)."""
        try:
            with os.scandir(self.directory) as it:
                return {e.name: e for e in it}
        except OSError:
            return {}

    def missing(self) -> list[int]:
        """The 0-based indices of the parts not in the folder at all (a part that is there
        but no regular file is named by :meth:`not_files`)."""
        present = self._listing()
        return [i for i in range(self.count) if self.part_name(i) not in present]

    def not_files(self) -> list[tuple[int, str]]:
        """Parts that exist but are no regular file: (index, "a folder" / "a named pipe
        (FIFO)" / ...).  Nothing is opened (a FIFO would block the reader); only the
        entries the listing does not call a file are looked at more closely."""
        entries = self._listing()
        odd: list[tuple[int, str]] = []
        for i in range(self.count):
            entry = entries.get(self.part_name(i))
            if entry is None or _is_file(entry):
                continue
            what = what_is(self.directory / entry.name)
            if what not in ("", "missing"):
                odd.append((i, what))
        return odd


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # follows symbolic links, like the loader's open()
    except OSError:
        return False


def discover(path: Path | str) -> ShardSet:
    """The set ``path`` belongs to (an unsplit file is a set of one)."""
    p = Path(path)
    m = SPLIT_RE.fullmatch(p.name)
    if m is None:
        stem = p.name[: -len(".gguf")] if p.name.endswith(".gguf") else p.name
        return ShardSet(stem, p.parent, 1, p, 0)
    count = int(m.group("count"))
    no = int(m.group("no"))
    return ShardSet(m.group("prefix"), p.parent, count, p, no - 1)
