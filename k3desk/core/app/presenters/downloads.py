"""The Downloads page: one download's title, numbers and notes, and a row per file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from k3desk.core.app.presenters import Cell
from k3desk.core.hub.model import DownloadRequest, DownloadSummary
from k3desk.core.units import fmt_bytes

FILE_COLUMNS = ("File", "Progress", "Size", "State")
STATE_TEXT = {
    "queued": "queued",
    "downloading": "downloading",
    "verifying": "verifying sha256",
    "verified": "✓ verified",
    "reused": "✓ reused",
    "failed": "✗ failed",
    "retrying": "retrying",
    "paused": "paused",
    "cancelled": "cancelled",
}
NO_DOWNLOAD = ("No download yet.", "Pick a tier in the wizard (Models page) to download it.")


class FileRowLike(Protocol):
    """One file of a download, as the shell keeps it (its ``FileRow``)."""

    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def done(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def note(self) -> str: ...


class DownloadStateLike(Protocol):
    """One download, as the shell keeps it (its ``DownloadState``)."""

    @property
    def request(self) -> DownloadRequest: ...
    @property
    def target(self) -> Path: ...
    @property
    def status(self) -> str: ...
    @property
    def files(self) -> Mapping[str, FileRowLike]: ...
    @property
    def total(self) -> int: ...
    @property
    def done(self) -> int: ...
    @property
    def speed(self) -> float: ...
    @property
    def eta(self) -> float | None: ...
    @property
    def free(self) -> int: ...
    @property
    def warnings(self) -> Sequence[str]: ...
    @property
    def summary(self) -> DownloadSummary | None: ...
    @property
    def error(self) -> str: ...
    @property
    def waiting(self) -> str: ...


def fmt_eta(seconds: float | None) -> str:
    """A duration for people: "—" while unknown, "< 1 s" rather than "0 s"."""
    if seconds is None or seconds < 0:
        return "—"
    if seconds < 1:
        return "< 1 s"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


def title_text(st: DownloadStateLike) -> str:
    return f"{st.request.label or st.request.repo}: {st.status}"


def where_text(st: DownloadStateLike) -> str:
    return f"{st.request.repo} → {st.target}"


def numbers_text(st: DownloadStateLike) -> str:
    """Bytes done of the total, then the speed and ETA while running and the free disk;
    once done, the files, the size and how long the whole took (all verified)."""
    if st.summary is not None and st.status == "done":
        return (
            f"{st.summary.files} files, {fmt_bytes(st.summary.total_bytes)}, "
            f"all verified in {fmt_eta(st.summary.seconds)}"
        )
    parts = [f"{fmt_bytes(st.done)} of {fmt_bytes(st.total)}"]
    if st.status == "running":
        # unknown for the first seconds: a rate is said over seconds, not a burst
        parts.append(f"{fmt_bytes(st.speed)}/s" if st.speed > 0 else "measuring speed")
        parts.append(f"ETA {fmt_eta(st.eta)}")
    elif st.status == "waiting for the Hub" and st.waiting:
        parts.append(st.waiting)
    if st.free:
        parts.append(f"free on disk {fmt_bytes(st.free)}")
    return "  ·  ".join(parts)


def notes(st: DownloadStateLike) -> list[str]:
    """The error first, then the last three warnings."""
    return ([st.error] if st.error else []) + list(st.warnings[-3:])


@dataclass(frozen=True)
class FileLine:
    """A file's row: its name, its progress in thousandths, its size and state cells."""

    path: str
    permille: int
    size: Cell
    state: Cell


def file_rows(st: DownloadStateLike) -> list[FileLine]:
    """The files in name order."""
    return [
        FileLine(
            r.path,
            int(1000 * r.done / r.size) if r.size else 0,
            Cell(fmt_bytes(r.size), ""),
            Cell(STATE_TEXT.get(r.state, r.state), r.note),
        )
        for r in sorted(st.files.values(), key=lambda r: r.path)
    ]
