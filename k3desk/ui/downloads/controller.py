"""Shard downloads through the core DownloadJob; its typed events become Qt signals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from k3desk.core.app.downloads import (
    Done,
    DownloadJob,
    DownloadOptions,
    DownloadRequest,
    DownloadSummary,
    FileDone,
    FileProgress,
    FileStarted,
    HubWaiting,
    HubWarning,
    ListingDone,
    Preflight,
    Queued,
    Retrying,
    Stalled,
    Verified,
    start_download,
)
from k3desk.core.app.operations import Change, OpChanges, Operation
from k3desk.core.app.values import K3Error, fmt_bytes
from k3desk.ui.bridge import Relay
from k3desk.ui.errors import describe

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext


FINISHED = OpChanges.of(Change.DOWNLOADS, Change.MODELS)
RECENT_KEY = "download"  # Settings.recent: the unfinished download, resumed on the next start


def request_to_json(request: DownloadRequest) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(request).items()}


def request_from_json(data: dict[str, Any]) -> DownloadRequest:
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return DownloadRequest(**values)


@dataclass
class FileRow:
    path: str
    size: int = 0
    done: int = 0
    # queued, downloading, verifying, verified (fetched now), reused (already had it),
    # retrying, failed; paused or cancelled when the job stopped while it was moving
    state: str = "queued"
    speed: float = 0.0
    note: str = ""


@dataclass
class DownloadState:
    """Everything the panel shows about one download, updated from events."""

    request: DownloadRequest
    target: Path
    # starting, listing, running, waiting for the Hub, paused, cancelled, done, failed
    status: str = "starting"
    files: dict[str, FileRow] = field(default_factory=dict)
    total: int = 0
    done: int = 0
    speed: float = 0.0
    eta: float | None = None
    free: int = 0
    needed: int = 0
    warnings: list[str] = field(default_factory=list)
    summary: DownloadSummary | None = None
    error: str = ""
    waiting: str = ""  # why no byte comes from the Hub now ('' while bytes come)

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


class DownloadsController(QObject):
    """Signals:
    changed(object): the DownloadState after an event.
    finished(object): the DownloadState at the end (done, paused, cancelled, failed).
    """

    changed = Signal(object)
    finished = Signal(object)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.endpoint: str | None = None  # None: HF_ENDPOINT or the public Hub
        self.state: DownloadState | None = None
        self.job: DownloadJob | None = None
        self._task: Any = None
        self._resume_next = False  # a pause that is the app closing: resumed next start
        self._relay = Relay(self)
        self._relay.fired.connect(self._on_event)
        self._restore()

    # ------------------------------------------------ across app restarts
    def _restore(self) -> None:
        """Show the download the app was running (or had paused) when it last closed, and
        resume it unless the user paused it."""
        saved = self.ctx.settings.recent.get(RECENT_KEY)
        if not isinstance(saved, dict):
            return
        try:
            request = request_from_json(saved["request"])
            target = Path(saved["target"])
        except (KeyError, TypeError, ValueError):
            self._remember(None)  # unreadable (an older format): forget it
            return
        # as it ended: failed with its reason, or paused, with the bytes it had
        status = saved.get("status")
        self.state = DownloadState(
            request,
            target,
            status=status if status in ("paused", "failed") else "paused",
            total=_count(saved.get("total")),
            done=_count(saved.get("done")),
            error=str(saved.get("error") or ""),
        )
        if saved.get("resume"):
            QTimer.singleShot(0, self.resume)

    def _remember(self, state: DownloadState | None, *, resume: bool = False) -> None:
        recent = dict(self.ctx.settings.recent)
        if state is None:
            if RECENT_KEY not in recent:
                return
            recent.pop(RECENT_KEY)
        else:
            recent[RECENT_KEY] = {
                "request": request_to_json(state.request),
                "target": str(state.target),
                "resume": resume,
                "status": "failed" if state.status == "failed" else "paused",
                "error": state.error,
                "total": state.total,
                "done": state.done,
            }
        try:
            self.ctx.update_settings(recent=recent)
        except K3Error as exc:
            self.ctx.reporter.report(exc)

    @property
    def running(self) -> bool:
        return self._task is not None

    def options(self) -> DownloadOptions:
        """The Hub (None: HF_ENDPOINT's, else the public one) and the files at once."""
        return DownloadOptions(endpoint=self.endpoint, parallel=self.ctx.settings.download_workers)

    def start(self, request: DownloadRequest, target: Path) -> None:
        """Start (or resume: finished files and partial data are reused)."""
        if self.running:
            raise K3Error("A download is already running.", "Pause or cancel it first.")
        old = self.state
        state = DownloadState(request, target)
        if old is not None and old.request == request and old.target == target:
            state.files = old.files  # keep rows while resuming
            state.total, state.done = old.total, old.done
        self.state = state
        self._remember(state, resume=True)  # even a killed app resumes it next start
        self._resume_next = True  # until the user pauses it
        job = start_download(
            self.ctx.services,
            request,
            target,
            tokens=self.ctx.token_store,
            options=self.options(),
            on_event=self._relay,
        )
        self.job = job
        state.status = "listing"

        def done(summary: DownloadSummary) -> None:
            state.summary = summary
            state.status = "done"
            state.done = state.total
            self._end(state)

        def cancelled() -> None:
            state.status = "cancelled" if job.discarding else "paused"
            self._end(state)

        def error(exc: BaseException) -> None:
            state.status = "failed"
            message, hint = describe(exc)
            state.error = f"{message} {hint}" if hint else message
            self._end(state)
            self.ctx.reporter.report(exc)

        # a finished set lies in the download folder, which My models lists
        self._task = self.ctx.ops.run(
            Operation("download", lambda _t: job.run(), FINISHED),
            on_success=done,
            on_cancelled=cancelled,
            on_failure=error,
        )
        self.changed.emit(state)

    def pause(self) -> None:
        if self.job is not None and self.running:
            self.job.pause()
            self._resume_next = False
            if self.state is not None:
                self._remember(self.state, resume=False)  # paused by the user: stays paused

    def resume(self) -> None:
        if self.state is not None and not self.running:
            self.start(self.state.request, self.state.target)

    def cancel(self) -> None:
        if self.job is not None and self.running:
            self.job.cancel()

    @property
    def discardable(self) -> bool:
        """A stopped download (paused or failed) whose partial data can be deleted."""
        st = self.state
        return st is not None and not self.running and st.status in ("paused", "failed")

    def discard(self) -> int:
        """Delete a stopped download's partial files and forget it (finished, verified
        files stay). Returns how many partial files were deleted."""
        from k3desk.core.app.downloads import discard_partials

        state = self.state
        if state is None or not self.discardable:
            return 0
        n = discard_partials(state.target)
        state.status = "cancelled"
        state.error = ""
        self._remember(None)
        self.changed.emit(state)
        self.finished.emit(state)
        return n

    def close(self) -> None:
        if self.job is not None and self.running:
            self.job.pause()  # keep partial data for next time (resumed on the next start)

    def _end(self, state: DownloadState) -> None:
        self._task = None
        if state is self.state:
            if state.status in ("done", "cancelled"):
                self._remember(None)
            elif state.status in ("failed", "paused"):  # with its reason and its bytes
                self._remember(state, resume=state.status == "paused" and self._resume_next)
        for row in state.files.values():
            if row.state in ("downloading", "verifying", "retrying") and state.status != "done":
                row.state = state.status
        self.changed.emit(state)
        self.finished.emit(state)

    @Slot(object)
    def _on_event(self, ev: Any) -> None:
        state = self.state
        if state is None:
            return
        if isinstance(ev, ListingDone):
            state.total = ev.total_bytes
            state.status = "running"
        elif isinstance(ev, Queued):
            state.files = _queued_rows(ev, state.files)
        elif isinstance(ev, Preflight):
            state.free, state.needed = ev.free_bytes, ev.needed_bytes
            state.done = ev.have_bytes  # the same total as before a resume, what is here done
        elif isinstance(ev, HubWaiting):
            self._waiting(state, ev)
        elif isinstance(ev, FileStarted):
            row = state.files.setdefault(ev.path, FileRow(ev.path))
            row.size, row.done, row.state = ev.size, ev.resume_from, "downloading"
        elif isinstance(ev, FileProgress):
            row = state.files.setdefault(ev.path, FileRow(ev.path, ev.size))
            row.done, row.size, row.speed = ev.done, ev.size, ev.speed
            row.state = "verifying" if ev.phase == "verify" else "downloading"
            state.done, state.total = ev.overall_done, ev.overall_total
            state.speed, state.eta = ev.overall_speed, ev.overall_eta
            if state.waiting and ev.phase == "download":
                self._waiting(state, None)
        elif isinstance(ev, Stalled):
            row = state.files.setdefault(ev.path, FileRow(ev.path))
            row.note = f"stalled {ev.seconds:.0f} s, reconnecting"
        elif isinstance(ev, Retrying):
            row = state.files.setdefault(ev.path, FileRow(ev.path))
            row.state = "retrying"
            row.note = f"retry {ev.attempt}/{ev.max_attempts} in {ev.wait:.0f} s: {ev.reason}"
        elif isinstance(ev, Verified):
            row = state.files.setdefault(ev.path, FileRow(ev.path))
            row.state = "verified" if ev.ok else "failed"
            row.note = "" if ev.ok else f"checksum mismatch ({ev.actual[:12]}…), fetching again"
        elif isinstance(ev, FileDone):
            row = state.files.setdefault(ev.path, FileRow(ev.path, ev.size))
            row.done = row.size = ev.size
            if ev.source == "download":
                row.state, row.note = "verified", ""
            else:
                row.state, row.note = "reused", _REUSED[ev.source]
        elif isinstance(ev, HubWarning):
            state.warnings.append(ev.message)
        elif isinstance(ev, Done):
            state.summary = ev.summary
        self.changed.emit(state)

    @staticmethod
    def _waiting(state: DownloadState, ev: HubWaiting | None) -> None:
        """No byte comes from the Hub (``ev.waiting``), or bytes come again."""
        if ev is not None and ev.waiting:
            state.status = "waiting for the Hub"
            state.waiting = f"no data for {ev.seconds:.0f} s: {ev.reason}; retrying"
            state.speed, state.eta = 0.0, None
        elif state.status == "waiting for the Hub":
            state.status = "running" if state.total else "listing"
            state.waiting = ""


def _count(value: object) -> int:
    """A byte count read back from the settings (0 when missing or not a count)."""
    return value if isinstance(value, int) and value >= 0 else 0


_REUSED = {
    "existing": "already in the folder; sha256 checked",
    "hf-cache": "from the Hugging Face cache; sha256 checked",
    "state": "verified by an earlier download",
}


def _queued_rows(ev: Queued, before: dict[str, FileRow]) -> dict[str, FileRow]:
    """A row for every file of the download, each saying how it will be obtained."""
    rows: dict[str, FileRow] = {}
    for q in ev.files:
        old = before.get(q.path)
        if old is not None and old.state == "verified" and q.source == "state":
            rows[q.path] = old  # fetched before a pause in this session: keep saying so
            continue
        row = FileRow(q.path, q.size, q.resume_from)
        if q.source == "download" and q.resume_from:
            row.note = f"{fmt_bytes(q.resume_from)} already here; resumes from there"
        elif q.source == "existing":
            row.note = "already in the folder; its sha256 is checked before it is reused"
        elif q.source == "hf-cache":
            row.note = "in the Hugging Face cache; its sha256 is checked before it is reused"
        elif q.source == "state":
            row.note = "verified by an earlier download"
        rows[q.path] = row
    return rows
