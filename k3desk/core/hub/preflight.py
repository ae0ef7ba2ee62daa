"""Checks made on the target folder before a byte is fetched: space, filesystem, write access."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

from k3desk.core.errors import HubError
from k3desk.core.hub.errors import Where, disk_error
from k3desk.core.hub.state import state_dir
from k3desk.core.private import fresh_file, refuse_links_under, shared_dir
from k3desk.core.units import fmt_bytes

FAT_TYPES = frozenset({"vfat", "msdos", "fat", "fat32", "fat16", "umsdos"})
FAT_MAX_FILE = 4 * 1024**3 - 1


def existing_parent(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def free_bytes(path: Path) -> int:
    import psutil

    return int(psutil.disk_usage(str(existing_parent(path))).free)


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (``ext4``, ``vfat``, ...) or ``""``."""
    import psutil

    p = str(existing_parent(path).resolve())
    best, fstype = "", ""
    try:
        parts = psutil.disk_partitions(all=True)
    except OSError:
        return ""
    for part in parts:
        mp = part.mountpoint
        inside = p == mp or p.startswith(mp.rstrip(os.sep) + os.sep)
        if inside and len(mp) > len(best):
            best, fstype = mp, part.fstype
    return fstype.lower()


@dataclass(frozen=True)
class SpaceCheck:
    free: int
    needed: int
    margin: int
    filesystem: str

    @property
    def missing(self) -> int:
        return max(0, self.needed + self.margin - self.free)


def check_writable(target: Path, where: Where) -> None:
    """Create ``target`` (as readable as the folder it is made in, never writable by
    others) and its state folder (0700, checked: not a link, not another user's, no link
    planted in it), and prove a file can be written there (a fresh file, made
    exclusively, then removed)."""
    try:
        shared_dir(target)
        probe, f = fresh_file(refuse_links_under(state_dir(target)), ".write-probe")
        try:
            with f:
                f.write(b"k3desk")
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
    except NotADirectoryError as exc:
        raise HubError(
            f"{target} is not a folder (a file is in the way: {exc.filename}).",
            "Choose another target folder with --to DIR.",
        ) from exc
    except OSError as exc:
        raise disk_error(exc, replace(where, local=str(target))) from exc


def check_space(
    target: Path, needed: int, margin: int, largest_file: int, where: Where
) -> tuple[SpaceCheck, list[str]]:
    """Refuse (HubError) when ``needed`` + ``margin`` bytes do not fit; return warnings."""
    check = SpaceCheck(free_bytes(target), needed, margin, filesystem_type(target))
    warnings: list[str] = []
    if check.filesystem in FAT_TYPES:
        if largest_file > FAT_MAX_FILE:
            raise HubError(
                f"{target} is on a {check.filesystem} (FAT) filesystem, which cannot hold files "
                f"over 4 GiB, and this download has files of {fmt_bytes(largest_file)}.",
                "Choose a folder on a disk formatted with ext4, XFS, btrfs, NTFS, APFS or "
                "exFAT (--to DIR).",
            )
        warnings.append(
            f"{target} is on a {check.filesystem} (FAT) filesystem: files over 4 GiB cannot be "
            "stored there. This download fits, but larger tiers will not."
        )
    if check.missing > 0:
        raise HubError(
            f"Not enough free space in {existing_parent(target)}: the download needs "
            f"{fmt_bytes(needed)} more (plus a {fmt_bytes(margin)} safety margin) but only "
            f"{fmt_bytes(check.free)} is free; {fmt_bytes(check.missing)} is missing.",
            f"Free {fmt_bytes(check.missing)} or choose a folder on a larger disk with --to DIR. "
            "Nothing was downloaded.",
        )
    return check, warnings
