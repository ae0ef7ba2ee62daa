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

# the one place the split naming is parsed: llama_split_path / llama_split_prefix in
# src/llama.cpp (b11434) write and read "%s-%05d-of-%05d.gguf"
SPLIT_RE = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")


@dataclass(frozen=True)
class SplitName:
    """A split part's name taken apart: ``prefix``-``number``-of-``count``.gguf.

    ``prefix`` keeps any folders of the string it came from ("UD-IQ1_S/Kimi-K3-UD-IQ1_S"
    for a repo path), so :meth:`part` gives names in the same form."""

    prefix: str
    number: int  # 1-based, as in the name (0 for a bad "00000-of-" name)
    count: int

    def part(self, number: int) -> str:
        """The name of the 1-based part ``number`` of the same set."""
        return f"{self.prefix}-{number:05d}-of-{self.count:05d}.gguf"

    def names(self) -> list[str]:
        """Every part's name, part 1 first."""
        return [self.part(i) for i in range(1, self.count + 1)]


def parse_split_name(name: str) -> SplitName | None:
    """``name`` (a file name or a path) as a split part, or None when it is not named so."""
    m = SPLIT_RE.fullmatch(name)
    if m is None:
        return None
    return SplitName(m.group("prefix"), int(m.group("no")), int(m.group("count")))


def split_part_names(first: str) -> list[str]:
    """Every part's name of the set whose part 1 is ``first``; [first] for anything else."""
    parsed = parse_split_name(first)
    if parsed is None or parsed.number != 1:
        return [first]
    return parsed.names()


@dataclass(frozen=True)
class ShardSet:
    prefix: str  # file name without "-NNNNN-of-MMMMM.gguf" (or without ".gguf")
    directory: Path
    count: int  # 1 for an unsplit file
    given: Path  # the path the caller passed
    given_index: int  # 0-based index of the given part (-1 for a bad "00000-of-" name)
    # a whole model under a name no part can have ("-00010-of-00009.gguf"), which
    # llama.cpp loads by itself: its header says it is no split part (see validate)
    alone: bool = False

    @property
    def split(self) -> bool:
        # a name without ".gguf" ("model.bin", "notes.txt") is a set of one, not a
        # split set whose first part would be "notes.txt-00001-of-00001.gguf"
        if self.alone:
            return False
        return self.count > 1 or parse_split_name(self.given.name) is not None

    @property
    def numbered(self) -> bool:
        """Whether the given name numbers a part a set can have (part 1 to ``count``);
        "-00000-of-", "-00010-of-00009" and "-00001-of-00000" number none."""
        return not self.split or 0 <= self.given_index < self.count

    def by_itself(self) -> ShardSet:
        """The given file as a set of one, whatever its name says."""
        stem = self.given.name.removesuffix(".gguf")
        return ShardSet(stem, self.directory, 1, self.given, 0, alone=True)

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

    def bytes_present(self) -> int:
        """Bytes of the parts that are in the folder as files (missing ones count 0)."""
        total = 0
        for path in self.paths:
            try:
                if path.is_file():
                    total += path.stat().st_size
            except OSError:
                continue
        return total


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # follows symbolic links, like the loader's open()
    except OSError:
        return False


def discover(path: Path | str) -> ShardSet:
    """The set ``path`` belongs to (an unsplit file is a set of one)."""
    p = Path(path)
    parsed = parse_split_name(p.name)
    if parsed is None:
        stem = p.name[: -len(".gguf")] if p.name.endswith(".gguf") else p.name
        return ShardSet(stem, p.parent, 1, p, 0)
    return ShardSet(parsed.prefix, p.parent, parsed.count, p, parsed.number - 1)
