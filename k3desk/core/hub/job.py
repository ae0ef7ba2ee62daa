"""One download, start to finish: list, cross-check, preflight, reuse, transfer, verify.

    job = DownloadJob(request, target, options, on_event=print, cancel=token)
    summary = job.run()           # blocks; events arrive on worker threads

Pause is ``job.pause()`` (or cancelling the token): transfers stop within a
second or so and partial files are kept.  ``job.cancel()`` also deletes the
partial files.  Resume is simply running the same request again.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

from k3desk.core.errors import Cancelled, HubError, K3Error
from k3desk.core.hub.cache import find_cached, hf_cache_dir
from k3desk.core.hub.errors import (
    Where,
    disk_error,
    hub_error,
    is_disk_error,
    is_transient,
    retry_after_seconds,
)
from k3desk.core.hub.hashing import StreamHasher, hash_file
from k3desk.core.hub.listing import (
    crosscheck,
    list_remote,
    manifest_check,
    refusals_text,
    resolve_endpoint,
    select,
)
from k3desk.core.hub.model import (
    Done,
    DownloadEvent,
    DownloadOptions,
    DownloadRequest,
    DownloadSummary,
    FileDone,
    FileSource,
    FileStarted,
    HubWaiting,
    HubWarning,
    Listing,
    ListingDone,
    Phase,
    Preflight,
    Queued,
    QueuedFile,
    RemoteFile,
    Retrying,
    Stalled,
    Verified,
)
from k3desk.core.hub.preflight import check_space, check_writable
from k3desk.core.hub.projectors import PROJECTORS, is_projector, projectors_for
from k3desk.core.hub.reporting import Events, FileTask, Overall
from k3desk.core.hub.state import Partial, TargetState, expected_hash, meta_dir, model_dirs
from k3desk.core.hub.transfer import Context, Offsets, child_attempt, http_attempt, xet_usable
from k3desk.core.private import copy_new, own_dir, put_in_place
from k3desk.core.progress import CancelToken
from k3desk.core.safepaths import UnsafeName, confined

log = logging.getLogger(__name__)

Kind = Literal["trusted", "existing", "hf-cache", "fetch"]
T = TypeVar("T")


@dataclass
class _Item:
    index: int
    file: RemoteFile
    kind: Kind
    resumable: int = 0
    cached: Path | None = None


# workers beyond ``parallel``: files that have their metadata and wait for a connection
SPARE_WORKERS = 2


class _Slots:
    """``count`` connections, each handed to the waiting file queued first (lowest
    ``order``): among the files ready for one, the listing's order."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiting: list[int] = []  # a heap of the orders waiting
        self._cond = threading.Condition()

    def acquire(self, order: int, stop: CancelToken) -> None:
        with self._cond:
            heapq.heappush(self._waiting, order)
            try:
                while not (self._free and self._waiting[0] == order):
                    stop.raise_if_cancelled()
                    self._cond.wait(0.1)
            finally:
                self._waiting.remove(order)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
            self._free -= 1

    def release(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()


class _Stop(CancelToken):
    """The job's own stop flag: set by the caller's token, a pause/cancel, or a failed file."""


class DownloadJob:
    def __init__(
        self,
        request: DownloadRequest,
        target: Path,
        options: DownloadOptions | None = None,
        on_event: Callable[[DownloadEvent], None] | None = None,
        cancel: CancelToken | None = None,
    ) -> None:
        self.request = request
        self.target = Path(target)
        self.options = options or DownloadOptions()
        self._events = Events(on_event)
        self._user_cancel = cancel or CancelToken()
        self._stop = _Stop()
        self._user_cancel.on_cancel(self._stop.cancel)
        self._discard = False
        self._tasks: set[FileTask] = set()
        self._tasks_lock = threading.Lock()
        self._refetched: list[str] = []
        self._warnings: list[str] = []
        self._reused = 0
        self._count_lock = threading.Lock()
        self._waiting = 0  # files of the pool that have not yet held a connection
        self._slots = _Slots(max(1, self.options.parallel))
        self._worker = threading.local()  # the calling worker's file: see _transfer_slot
        self._refused: list[tuple[str, str]] = []  # (listed name, why it is not written)
        self.listing: Listing | None = None
        # files that wait for the Hub's bytes now (inside _with_retries), since when, the
        # last reason an attempt failed, and whether "waiting for the Hub" was said
        self._net_files = 0
        self._net_since = 0.0
        self._last_reason = ""
        self._hub_wait_at = 0.0  # when "waiting for the Hub" was said (0: it is not)
        self._overall: Overall | None = None

    # ------------------------------------------------------------ control
    def pause(self) -> None:
        """Stop soon, keeping partial files so the next run resumes."""
        self._user_cancel.cancel()

    def cancel(self) -> None:
        """Stop soon and delete partial files."""
        self._discard = True
        self._user_cancel.cancel()

    @property
    def discarding(self) -> bool:
        """True after :meth:`cancel` (partials deleted), False after a pause."""
        return self._discard

    # ------------------------------------------------------------ helpers
    def _emit(self, event: DownloadEvent) -> None:
        self._events.emit(event)

    def _warn(self, message: str, path: str = "") -> None:
        self._warnings.append(message)
        log.warning("%s", message)
        self._emit(HubWarning(message, path))

    def _where(self, path: str = "", local: str = "") -> Where:
        listing = self.listing
        return Where(
            repo=self.request.repo,
            endpoint=listing.endpoint if listing else resolve_endpoint(self.options.endpoint),
            revision=listing.revision if listing else self.request.revision,
            path=path,
            local=local,
            has_token=bool(self.options.token),
        )

    def _dest(self, f: RemoteFile) -> Path:
        """Where ``f`` goes: inside the target folder, or :class:`UnsafeName`."""
        return confined(self.target, f.path, what="The listed file")

    def _place(self, src: Path, f: RemoteFile) -> Path:
        """Move a verified ``src`` to ``f``'s place (checked again around the mkdir, so
        that a link planted meanwhile cannot lead it out of the target folder), as
        readable as the target folder is, never writable by others (model_dirs)."""
        file_mode = model_dirs(self.target, self._dest(f).parent)
        return put_in_place(src, self._dest(f), file_mode)

    def _refuse(self, name: str, why: str) -> None:
        self._refused.append((name, why))
        self._warn(f"{name!r} is listed by the Hub but was refused: {why}.", name)

    def _count_reused(self) -> None:
        with self._count_lock:
            self._reused += 1

    def _interruptible(self, fn: Callable[[], T]) -> T:
        """Run a blocking Hub call (listing) so that a cancel returns at once."""
        box: list[T] = []
        err: list[BaseException] = []
        finished = threading.Event()

        def work() -> None:
            try:
                box.append(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                err.append(exc)
            finally:
                finished.set()

        threading.Thread(target=work, name="download-listing", daemon=True).start()
        t0 = time.monotonic()
        said = False
        while not finished.wait(0.1):
            self._stop.raise_if_cancelled()
            quiet = time.monotonic() - t0
            if not said and quiet >= self.options.wait_notice_seconds:
                said = True
                self._emit(HubWaiting(True, quiet, "the Hub has not answered the listing yet"))
        if said:
            self._emit(HubWaiting(False, time.monotonic() - t0, "the Hub answered"))
        if err:
            raise err[0]
        return box[0]

    def _mark(self, state: TargetState, f: RemoteFile) -> None:
        assert self.listing is not None
        state.mark_verified(f, self.listing.repo, self.listing.revision)

    # ------------------------------------------------------------ run
    def run(self) -> DownloadSummary:
        started = time.monotonic()
        try:
            return self._run(started)
        except Cancelled:
            if self._discard:
                from k3desk.core.hub.state import discard_partials

                discard_partials(self.target)
            raise
        finally:
            _prune_empty_dirs(meta_dir(self.target) / "staging")
            _prune_empty_dirs(meta_dir(self.target) / "partial")

    def _run(self, started: float) -> DownloadSummary:
        opts = self.options
        listing = self._list()
        state = self._open_target(listing)
        items = self._classify(listing, state)
        if not items:  # every listed file was refused
            raise self._refused_error(listing)
        self._emit(Queued(tuple(_queued(it) for it in items)))
        have = self._preflight(items)
        ctx = Context(
            repo=listing.repo,
            revision=listing.revision,
            endpoint=listing.endpoint,
            token=opts.token,
            options=opts,
            cancel=self._stop,
            may_split=self._no_file_waiting,
            slot=self._transfer_slot,
        )
        # the set's size from the start, what is on disk already counted done: a resumed
        # download shows the same total as the first run
        overall = Overall(sum(it.file.size for it in items), have)
        self._fetch_all(items, ctx, state, overall, listing)
        if self._refused:
            raise self._refused_error(listing)

        seconds = time.monotonic() - started
        summary = DownloadSummary(
            repo=listing.repo,
            revision=listing.revision,
            target=str(self.target),
            files=len(listing.files),
            total_bytes=listing.total_bytes,
            fetched_bytes=overall.fetched,
            reused_files=self._reused,
            refetched=tuple(self._refetched),
            seconds=seconds,
            warnings=tuple(self._warnings),
        )
        self._emit(Done(summary))
        return summary

    def _list(self) -> Listing:
        """The repository's files at the pinned revision; refused if none is to fetch."""
        opts = self.options
        endpoint = resolve_endpoint(opts.endpoint)
        self._stop.raise_if_cancelled()
        asked = self.request
        if asked.projector_of:  # the repository's projectors too, to choose the set's
            asked = replace(asked, allow_patterns=(*asked.allow_patterns, PROJECTORS))
        listing = self._interruptible(
            lambda: list_remote(asked, endpoint=endpoint, token=opts.token, cancel=self._stop)
        )
        if self.request.projector_of:
            listing = self._with_projector(listing)
        self.listing = listing
        self._emit(
            ListingDone(listing.repo, listing.revision, len(listing.files), listing.total_bytes)
        )
        if not listing.files:  # the error says it all; no warning repeating it first
            if listing.refused:
                raise HubError(
                    f"Nothing to download: every file in {listing.repo} at "
                    f"{listing.revision[:12]} that matches "
                    f"{', '.join(self.request.allow_patterns)} was refused: "
                    + refusals_text(listing.refused)
                    + ".",
                    "These names or entries cannot be written safely; ask the repository's "
                    "owner, or pick another repository.",
                )
            raise HubError(
                f"Nothing to download: no file in {listing.repo} at {listing.revision[:12]} "
                f"matches {', '.join(self.request.allow_patterns)}.",
                f"Check the include patterns against {listing.repo_url()}/tree/main.",
            )
        for name, why in listing.refused:
            self._refuse(name, why)
        for w in crosscheck(self.request, listing):
            self._warn(w)
        return listing

    def _with_projector(self, listing: Listing) -> Listing:
        """``listing`` with what the request's patterns select and, of the repository's
        projectors, the one for the set (:func:`projectors_for`), no other."""
        req = self.request
        paths = [f.path for f in listing.files]
        wanted = set(select(paths, req.allow_patterns))
        found = [f for f in listing.files if is_projector(f.path)]
        # the set's first part: the first that projector_of selects, or the path it
        # names where only the projector is asked for; patterns that select no set
        # bring no projector
        parts = sorted(p for p in select(paths, [req.projector_of]) if not is_projector(p))
        anchor = parts[0] if parts else "" if req.allow_patterns else req.projector_of
        chosen = projectors_for(anchor, found) if anchor else ()
        if not chosen and not req.allow_patterns:  # only the projector was asked for
            raise HubError(
                f"{listing.repo} at {listing.revision[:12]} has no vision projector (mmproj) "
                f"for {req.projector_of}.",
                "This set reads no images: send text only, or download a set whose "
                "repository ships an mmproj file.",
            )
        wanted |= {f.path for f in chosen}
        return replace(listing, files=tuple(f for f in listing.files if f.path in wanted))

    def _open_target(self, listing: Listing) -> TargetState:
        """The target folder, checked writable, with the listing recorded in its state."""
        check_writable(self.target, self._where(local=str(self.target)))
        state = TargetState(self.target)
        if state.load_error:
            self._warn(state.load_error)
        shutil.rmtree(meta_dir(self.target) / "staging", ignore_errors=True)
        state.record_listing(
            self.request.label or self.request.repo,
            listing.repo,
            listing.revision,
            listing.endpoint,
            listing.files,
        )
        return state

    def _preflight(self, items: list[_Item]) -> int:
        """Check the free space for what is to come (a copy from the HF cache on another
        filesystem included) and report it; returns the bytes of the set already here
        (files to reuse, partial files to resume)."""
        opts = self.options
        needed = 0
        target_dev = os.stat(self.target).st_dev
        for it in items:
            if it.kind == "fetch":
                needed += it.file.size - it.resumable
            elif it.kind == "hf-cache" and it.cached is not None:
                with contextlib.suppress(OSError):
                    if it.cached.stat().st_dev != target_dev:
                        needed += it.file.size
        fetch_items = [it for it in items if it.kind == "fetch"]
        fetch_bytes = sum(it.file.size - it.resumable for it in fetch_items)
        have = sum(it.file.size for it in items) - fetch_bytes
        largest = max(it.file.size for it in items)
        check, fs_warnings = check_space(
            self.target, needed, opts.margin_bytes, largest, self._where(local=str(self.target))
        )
        self._emit(
            Preflight(
                target=str(self.target),
                filesystem=check.filesystem,
                free_bytes=check.free,
                needed_bytes=needed,
                margin_bytes=opts.margin_bytes,
                to_fetch=len(fetch_items),
                fetch_bytes=fetch_bytes,
                partial_bytes=sum(it.resumable for it in fetch_items),
                reuse=len(items) - len(fetch_items),
                have_bytes=have,
            )
        )
        for w in fs_warnings:
            self._warn(w)
        return have

    def _fetch_all(
        self,
        items: list[_Item],
        ctx: Context,
        state: TargetState,
        overall: Overall,
        listing: Listing,
    ) -> None:
        """Every item, the manifest first, with the stall watch running."""
        self._stop.on_cancel(self._abort_all)
        self._overall = overall
        self._monitor_wake = threading.Event()
        self._stop.on_cancel(self._monitor_wake.set)
        monitor = threading.Thread(
            target=self._watch_stalls, name="download-stall-watch", daemon=True
        )
        monitor.start()
        try:
            # the manifest first (it is small): it cross-checks every other file
            manifest = self.request.manifest
            first = [it for it in items if manifest and it.file.path == manifest]
            for it in first:
                self._process(it, ctx, state, overall)
            if first:
                self._check_manifest(listing)
            rest = [it for it in items if it not in first]
            rest.sort(key=lambda it: (it.file.size > 64 * 1024 * 1024, it.index))
            self._run_pool(rest, ctx, state, overall)
        finally:
            self._monitor_done = True
            self._monitor_wake.set()  # not a quarter second's nap at the end of every run
            monitor.join(timeout=5)

    def _refused_error(self, listing: Listing) -> HubError:
        names = ", ".join(repr(n) for n, _ in self._refused[:5])
        more = f" and {len(self._refused) - 5} more" if len(self._refused) > 5 else ""
        n = len(self._refused)
        rest = len(listing.files) - sum(
            1 for name, _ in self._refused if any(f.path == name for f in listing.files)
        )
        done = (
            f"The other {rest} file{'s' if rest != 1 else ''} were downloaded and verified "
            f"in {self.target}. "
            if rest
            else "Nothing was written. "
        )
        return HubError(
            f"{listing.repo} at {listing.revision[:12]} lists {n} file{'s' if n != 1 else ''} "
            f"k3desk will not write ({names}{more}): {self._refused[0][1]}.",
            done + "A repository (or an HF_ENDPOINT mirror) that lists such files is broken "
            "or hostile: check HF_ENDPOINT and tell the repository's owner.",
        )

    def _run_pool(
        self, items: list[_Item], ctx: Context, state: TargetState, overall: Overall
    ) -> None:
        if not items:
            return
        errors: list[BaseException] = []
        with self._count_lock:
            self._waiting = len(items)

        def process(it: _Item, order: int) -> None:
            self._worker.order, self._worker.holder, self._worker.started = order, False, None
            try:
                self._process(it, ctx, state, overall)
            finally:
                self._held_a_slot()  # a file reused, verified in place, or failed early

        # SPARE_WORKERS more workers than connections: a file's hash is finished and the
        # file placed after its connection is let go, while the next file, its metadata
        # request already answered, takes the connection (_transfer_slot)
        workers = max(1, self.options.parallel) + SPARE_WORKERS
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="download") as pool:
            futures: list[Future[None]] = [
                pool.submit(process, it, n) for n, it in enumerate(items, 1)
            ]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for fut in done:
                exc = fut.exception()
                if exc is not None and not isinstance(exc, Cancelled):
                    errors.append(exc)
            if errors or self._stop.cancelled:
                self._stop.cancel()  # a file failed for good: stop the others too
                for fut in pending:
                    fut.cancel()
            for fut in futures:
                if fut.cancelled():
                    continue
                exc = fut.exception()
                if exc is not None and not isinstance(exc, Cancelled) and exc not in errors:
                    errors.append(exc)
        if errors and not self._user_cancel.cancelled:
            first = errors[0]
            if isinstance(first, K3Error):
                raise first
            log.error("download failed unexpectedly", exc_info=first)
            raise hub_error(first, self._where())
        if self._stop.cancelled:
            raise Cancelled("Paused: partial files are kept; run the same download to resume.")

    def _held_a_slot(self) -> None:
        """The calling worker's file no longer waits for a connection (once per file)."""
        if not getattr(self._worker, "holder", True):
            self._worker.holder = True
            with self._count_lock:
                self._waiting -= 1

    @contextlib.contextmanager
    def _transfer_slot(self) -> Iterator[None]:
        """One of the ``parallel`` connections, for one attempt of the calling worker's
        file, waited for in the order the files were queued (a pause or cancel ends
        the wait), and given back as the attempt's last byte is written.  The first
        time a file holds one it stops counting as waiting (_no_file_waiting), and
        only then is it shown as started."""
        self._slots.acquire(getattr(self._worker, "order", 0), self._stop)
        try:
            self._held_a_slot()
            started = getattr(self._worker, "started", None)
            if started is not None:
                self._worker.started = None
                started()
            yield
        finally:
            self._slots.release()

    def _no_file_waiting(self) -> bool:
        """Whether every file has held a connection: only then does a large file take
        several connections (ranges).  Before, each connection is another file's single
        stream, hashed as it arrives; a file in ranges arrives out of order and its
        hash holds the windows in flight in memory (or, past that, reads them back,
        doubling its disk traffic: README, "Downloads: where the time goes").  So ranges
        serve the end of a download, where the connections of files that finished
        would otherwise sit idle."""
        with self._count_lock:
            return self._waiting <= 0

    def _check_manifest(self, listing: Listing) -> None:
        name = self.request.manifest
        try:
            data = (self.target / name).read_bytes()
        except OSError as exc:
            self._warn(f"{name} could not be read for the cross-check ({exc.strerror}).")
            return
        for w in manifest_check(data, listing, name):
            self._warn(w)

    # ------------------------------------------------------------ stalls & aborts
    _monitor_done = False
    _monitor_wake: threading.Event

    def _watch_stalls(self) -> None:
        limit = self.options.stall_seconds
        while not self._monitor_done and not self._stop.cancelled:
            now = time.monotonic()
            with self._tasks_lock:
                tasks = list(self._tasks)
            for task in tasks:
                if task.active and not task.abort_reason and now - task.last_byte > limit:
                    task.stalled_for = now - task.last_byte
                    task.abort("stalled")
            self._watch_hub(now)
            self._monitor_wake.wait(min(0.25, limit / 4))

    def _watch_hub(self, now: float) -> None:
        """Say "waiting for the Hub" once no byte has come for ``wait_notice_seconds``
        while files wait for it (a retry's back-off, a connection that answers nothing,
        a stall before the stall limit), and say when bytes come again."""
        overall = self._overall
        if overall is None:
            return
        with self._count_lock:
            busy, since = self._net_files, self._net_since
        last = overall.last_byte
        if self._hub_wait_at:
            if last > self._hub_wait_at:
                self._emit(HubWaiting(False, now - self._hub_wait_at, "bytes come again"))
                self._hub_wait_at = 0.0
            return
        quiet = now - max(last, since)
        if busy and quiet >= self.options.wait_notice_seconds:
            self._hub_wait_at = now
            reason = self._last_reason or f"no data for {quiet:.0f} s"
            self._emit(HubWaiting(True, quiet, reason))

    @contextlib.contextmanager
    def _waits_for_hub(self) -> Iterator[None]:
        """The calling file waits for the Hub's bytes (see _watch_hub)."""
        with self._count_lock:
            if not self._net_files:
                self._net_since = time.monotonic()
            self._net_files += 1
        try:
            yield
        finally:
            with self._count_lock:
                self._net_files -= 1

    def _abort_all(self) -> None:
        with self._tasks_lock:
            tasks = list(self._tasks)
        for task in tasks:
            task.abort("cancelled")

    def _new_task(
        self, f: RemoteFile, overall: Overall, phase: Phase = "download", counted: int = 0
    ) -> FileTask:
        """``counted``: bytes of ``f`` the overall total already holds (see FileTask)."""
        interval = self.options.progress_interval
        task = FileTask(f.path, f.size, self._events, overall, interval, phase, counted)
        with self._tasks_lock:
            self._tasks.add(task)
        return task

    def _drop_task(self, task: FileTask) -> None:
        with self._tasks_lock:
            self._tasks.discard(task)

    # ------------------------------------------------------------ classification
    def _classify(self, listing: Listing, state: TargetState) -> list[_Item]:
        cache = hf_cache_dir(self.options.hf_cache_dir) if self.options.use_hf_cache else None
        items = []
        for i, f in enumerate(listing.files):
            try:
                dest = self._dest(f)
                partial = Partial(self.target, f, listing.repo, listing.revision)
            except UnsafeName as exc:
                self._refuse(f.path, exc.reason)
                continue
            if state.is_trusted(f):
                items.append(_Item(i, f, "trusted"))
                continue
            try:
                present = dest.is_file() and dest.stat().st_size == f.size
            except OSError:
                present = False
            if present:
                items.append(_Item(i, f, "existing"))
                continue
            resumable = partial.resumable_bytes()
            cached = find_cached(cache, listing.repo, f) if cache is not None else None
            if cached is not None and resumable == 0:
                items.append(_Item(i, f, "hf-cache", cached=cached))
                continue
            items.append(_Item(i, f, "fetch", resumable=resumable))
        return items

    # ------------------------------------------------------------ per file
    def _process(self, it: _Item, ctx: Context, state: TargetState, overall: Overall) -> None:
        f = it.file
        self._stop.raise_if_cancelled()
        if it.kind == "trusted":
            digest = expected_hash(f)[1]
            self._emit(Verified(f.path, True, "state", digest, digest))
            self._emit(FileDone(f.path, f.size, 0, 0.0, "state"))
            self._count_reused()
            return
        if it.kind == "existing":
            if self._verify_in_place(f, state, overall):
                return
            self._refetch_note(f, "existing")
        elif it.kind == "hf-cache" and it.cached is not None:
            if self._reuse_cached(f, it.cached, state, overall):
                return
            self._refetch_note(f, "hf-cache")
        self._fetch(it, ctx, state, overall)

    def _refetch_note(self, f: RemoteFile, where: str) -> None:
        what = (
            "The file already in the target folder"
            if where == "existing"
            else ("The copy in the Hugging Face cache")
        )
        self._warn(f"{what} for {f.path} does not match the Hub's hash; fetching it again.", f.path)
        self._refetched.append(f.path)

    def _hash_with_progress(
        self, path: Path, f: RemoteFile, overall: Overall, phase: Phase
    ) -> tuple[bool, str, str]:
        kind, expected = expected_hash(f)
        task = self._new_task(f, overall, phase)
        try:
            actual = hash_file(
                path, kind, cancel=self._stop, on_bytes=lambda n: task.add(n, network=False)
            )
        finally:
            self._drop_task(task)
        return actual == expected, expected, actual

    def _verify_in_place(self, f: RemoteFile, state: TargetState, overall: Overall) -> bool:
        t0 = time.monotonic()
        dest = self._dest(f)
        ok, expected, actual = self._hash_with_progress(dest, f, overall, "verify")
        self._emit(Verified(f.path, ok, "existing", expected, actual))
        if ok:
            self._mark(state, f)
            self._emit(FileDone(f.path, f.size, 0, time.monotonic() - t0, "existing"))
            self._count_reused()
        return ok

    def _reuse_cached(
        self, f: RemoteFile, blob: Path, state: TargetState, overall: Overall
    ) -> bool:
        t0 = time.monotonic()
        dest = self._dest(f)
        tmp = confined(meta_dir(self.target) / "partial", f.path + ".from-cache")
        try:
            own_dir(tmp.parent, below=self.target)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            try:
                os.link(blob.resolve(), tmp)
                how = "hard link"
            except OSError:
                copy_new(blob, tmp)
                how = "copy"
            ok, expected, actual = self._hash_with_progress(tmp, f, overall, "verify")
            self._emit(Verified(f.path, ok, "hf-cache", expected, actual))
            if not ok:
                return False
            self._place(tmp, f)
        except OSError as exc:
            raise disk_error(exc, self._where(f.path, str(dest))) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        log.info("reused %s from the Hugging Face cache (%s)", f.path, how)
        self._mark(state, f)
        self._emit(FileDone(f.path, f.size, 0, time.monotonic() - t0, "hf-cache"))
        self._count_reused()
        return True

    def _transport_for(self, f: RemoteFile, resumable: int) -> str:
        t = self.options.transport
        if t == "auto":
            return "hub" if f.xet_hash and resumable == 0 and xet_usable() else "http"
        return t

    def _fetch(self, it: _Item, ctx: Context, state: TargetState, overall: Overall) -> None:
        f = it.file
        dest = self._dest(f)
        for round_ in (1, 2):
            t0 = time.monotonic()
            transport = self._transport_for(f, it.resumable if round_ == 1 else 0)
            # what of it the overall count holds: its partial data on a first fetch; all
            # of it for a copy that was bad, or a second round after a bad hash
            counted = it.resumable if round_ == 1 and it.kind == "fetch" else f.size
            task = self._new_task(f, overall, counted=counted)
            try:
                if transport == "hub":
                    digest_ok, expected, actual = self._fetch_child(f, ctx, task, overall)
                else:
                    digest_ok, expected, actual = self._fetch_http(f, ctx, task)
            finally:
                self._drop_task(task)
            self._emit(Verified(f.path, digest_ok, "download", expected, actual))
            if digest_ok:
                state.mark_verified(f, ctx.repo, ctx.revision)
                self._emit(
                    FileDone(f.path, f.size, task.fetched, time.monotonic() - t0, "download")
                )
                return
            state.forget_verified(f.path)
            if round_ == 2:
                raise HubError(
                    f"{f.path} arrived twice with the wrong content (sha256 {actual[:16]}…, "
                    f"the Hub lists {expected[:16]}…).",
                    "Something between you and the Hub alters the data (proxy, antivirus, "
                    "failing disk or RAM). The bad copy was deleted.",
                )
            if f.path not in self._refetched:
                self._refetched.append(f.path)
            self._warn(
                f"{f.path} did not match the Hub's hash after download; fetching it again.",
                f.path,
            )
            self._emit(Retrying(f.path, 1, 1, 0.0, "hash mismatch"))
            with contextlib.suppress(FileNotFoundError):
                dest.unlink()

    def _fetch_http(self, f: RemoteFile, ctx: Context, task: FileTask) -> tuple[bool, str, str]:
        dest = self._dest(f)
        partial = Partial(self.target, f, ctx.repo, ctx.revision)
        where = self._where(f.path, str(dest))
        try:
            offset = partial.prepare()
        except OSError as exc:
            raise disk_error(exc, where) from exc
        kind, expected = expected_hash(f)
        hasher = StreamHasher(
            partial.data, kind, f.size, prefix=offset, direct=ctx.options.direct_io
        )
        offsets = Offsets(written=offset, durable=offset)
        task.start_at(offset)
        # shown as started once it holds a connection (_transfer_slot)
        self._worker.started = functools.partial(
            self._emit, FileStarted(f.path, f.size, offset, "http")
        )
        try:
            self._with_retries(
                f, task, lambda: http_attempt(ctx, f, partial, task, hasher, offsets), offsets
            )
            actual = hasher.hexdigest()
        except BaseException:
            hasher.close()
            raise
        if actual != expected:
            partial.discard()
            return False, expected, actual
        try:
            self._place(partial.data, f)
        except OSError as exc:
            raise disk_error(exc, where) from exc
        partial.discard()
        return True, expected, actual

    def _fetch_child(
        self, f: RemoteFile, ctx: Context, task: FileTask, overall: Overall
    ) -> tuple[bool, str, str]:
        dest = self._dest(f)
        staging = meta_dir(self.target) / "staging" / f"{abs(hash(f.path)):x}"
        self._worker.started = functools.partial(self._emit, FileStarted(f.path, f.size, 0, "hub"))

        def attempt() -> Path:
            with self._transfer_slot():
                task.start_at(0)
                return child_attempt(ctx, f, staging, task)

        try:
            got = self._with_retries(f, task, attempt, None)
            if not os.path.realpath(got).startswith(os.path.realpath(staging) + os.sep):
                raise HubError(
                    f"The download process put {f.path} at {got}, outside its scratch "
                    f"folder {staging}; it was not used.",
                    "Run the download again with --transport http.",
                )
            ok, expected, actual = self._hash_with_progress(got, f, overall, "verify")
            if ok:
                self._place(got, f)
            return ok, expected, actual
        except OSError as exc:
            raise disk_error(exc, self._where(f.path, str(dest))) from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _with_retries(
        self, f: RemoteFile, task: FileTask, attempt: Callable[[], T], offsets: Offsets | None
    ) -> T:
        """Run ``attempt`` until it succeeds, retrying stalls and transient failures.

        Waits double per failed attempt (``backoff_base`` .. ``backoff_max``);
        a 429 waits at least its Retry-After.  An attempt that got further into
        the file than any before resets the count, so a long download on a
        flaky line keeps going; one that only moved bytes again (a server that
        ignores Range and drops the connection at the same place each time)
        does not, so a hostile or broken server cannot keep it going forever.
        """
        with self._waits_for_hub():
            return self._retrying(f, task, attempt, offsets)

    def _retrying(
        self, f: RemoteFile, task: FileTask, attempt: Callable[[], T], offsets: Offsets | None
    ) -> T:
        opts = self.options
        failures = 0
        furthest = task.done
        while True:
            self._stop.raise_if_cancelled()
            try:
                return attempt()
            except Cancelled:
                raise
            except Exception as exc:
                if self._stop.cancelled:
                    raise Cancelled() from exc
                where = self._where(f.path, str(self._dest(f)))
                stalled = task.abort_reason == "stalled"
                if stalled:
                    self._emit(Stalled(f.path, round(task.stalled_for, 1), task.done))
                    reason = f"no data for {task.stalled_for:.0f} s"
                elif is_transient(exc):
                    reason = _short(exc)
                elif isinstance(exc, OSError) and is_disk_error(exc):
                    kept = offsets.durable if offsets is not None else 0
                    raise disk_error(exc, where, kept=kept) from exc
                else:
                    raise hub_error(exc, where) from exc
                if task.done > furthest:
                    furthest = task.done
                    failures = 0
                failures += 1
                if failures > opts.max_retries:
                    if stalled:
                        raise HubError(
                            f"The transfer of {f.path} stalled {failures} times in a row "
                            f"(no data for {opts.stall_seconds:.0f} s each time).",
                            "Check the network connection; partial data is kept and the "
                            "download resumes when run again.",
                        ) from exc
                    raise hub_error(exc, where) from exc
                wait_s = min(opts.backoff_max, opts.backoff_base * 2 ** (failures - 1))
                retry_after = retry_after_seconds(exc)
                if retry_after is not None:
                    if retry_after > opts.max_retry_after:
                        raise hub_error(exc, where) from exc
                    wait_s = max(wait_s, retry_after)
                    reason = f"rate limited by the Hub (429), retry after {retry_after:.0f} s"
                self._last_reason = reason
                self._emit(Retrying(f.path, failures, opts.max_retries, wait_s, reason))
                log.info("retrying %s in %.1f s: %s", f.path, wait_s, reason)
                if self._stop.wait(wait_s):
                    raise Cancelled() from exc


_SOURCE: dict[Kind, FileSource] = {
    "trusted": "state",
    "existing": "existing",
    "hf-cache": "hf-cache",
    "fetch": "download",
}


def _queued(it: _Item) -> QueuedFile:
    return QueuedFile(it.file.path, it.file.size, _SOURCE[it.kind], it.resumable)


def _prune_empty_dirs(root: Path) -> None:
    if not root.is_dir():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
