"""The one task manager: every long operation of the app runs here, off the GUI thread.

A task is a plain function ``fn(token) -> result`` (usually a core call with a
:class:`~k3desk.core.progress.CancelToken`).  Its ``on_done`` / ``on_error``
callbacks always run on the main thread, so they may touch widgets; the
function itself must not (it runs on a worker thread).

Two pools: ``serial=True`` tasks (history database writes) run one at a time
in submission order; the rest share a small pool.

A user action is an operation, run (and its changes announced) by
:class:`k3desk.ui.operations.OperationRunner` over this manager.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from PySide6.QtCore import QObject, Signal, Slot

from k3desk.core.app.values import Cancelled, CancelToken

T = TypeVar("T")
log = logging.getLogger(__name__)

ErrorHandler = Callable[[BaseException], None]


class Task(Generic[T]):
    """A handle on one submitted operation."""

    def __init__(self, name: str, token: CancelToken) -> None:
        self.name = name
        self.token = token
        self.future: Future[T] | None = None

    def cancel(self) -> None:
        """Ask the operation to stop (it stops at its next safe point)."""
        self.token.cancel()

    @property
    def running(self) -> bool:
        return self.future is not None and not self.future.done()

    def __repr__(self) -> str:
        state = "running" if self.running else "done"
        return f"<Task {self.name} {state}>"


class TaskManager(QObject):
    """Runs functions on worker threads and their callbacks on the main thread.

    Signals:
        busy_changed(int): the number of running tasks changed.
    """

    busy_changed = Signal(int)
    _closures_pending = Signal()

    def __init__(self, parent: QObject | None = None, max_workers: int = 6) -> None:
        super().__init__(parent)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="k3-task")
        self._serial = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k3-serial")
        self._lock = threading.Lock()
        self._closures: list[Callable[[], None]] = []
        self._tasks: set[Task[Any]] = set()
        self._closed = False
        self.default_error_handler: ErrorHandler = self._log_error
        self._closures_pending.connect(self._run_closures)

    # ------------------------------------------------------------------ API
    def run(
        self,
        fn: Callable[[CancelToken], T],
        *,
        on_done: Callable[[T], None] | None = None,
        on_error: ErrorHandler | None = None,
        on_cancelled: Callable[[], None] | None = None,
        on_finally: Callable[[], None] | None = None,
        name: str = "task",
        serial: bool = False,
        token: CancelToken | None = None,
    ) -> Task[T]:
        """Run ``fn(token)`` in the background.

        Exactly one of ``on_done`` / ``on_error`` / ``on_cancelled`` runs on the
        main thread when it ends (errors without ``on_error`` go to
        :attr:`default_error_handler`), then ``on_finally``.  Once the manager is shut
        down (the app is quitting) nothing starts: the task comes back cancelled, and
        no callback runs.
        """
        task: Task[T] = Task(name, token or CancelToken())
        if self._closed:
            # a late signal's handler (a refresh after the last change) at quit
            log.debug("%s not started: the app is quitting", name)
            task.cancel()
            return task

        def work() -> T:
            return fn(task.token)

        def finished(fut: Future[T]) -> None:
            def deliver() -> None:
                self._tasks.discard(task)
                self.busy_changed.emit(len(self._tasks))
                try:
                    exc = fut.exception()
                    if exc is None:
                        if on_done is not None:
                            on_done(fut.result())
                    elif isinstance(exc, Cancelled) or task.token.cancelled:
                        if on_cancelled is not None:
                            on_cancelled()
                    else:
                        (on_error or self.default_error_handler)(exc)
                finally:
                    if on_finally is not None:
                        on_finally()

            self.run_on_main(deliver)

        self._tasks.add(task)
        self.busy_changed.emit(len(self._tasks))
        fut = (self._serial if serial else self._pool).submit(work)
        task.future = fut
        fut.add_done_callback(finished)
        return task

    def run_on_main(self, fn: Callable[[], None]) -> None:
        """Queue ``fn`` to run on the main thread (safe to call from any thread)."""
        with self._lock:
            self._closures.append(fn)
        self._closures_pending.emit()

    @property
    def closed(self) -> bool:
        """Shut down: the app is quitting and no task starts any more."""
        return self._closed

    @property
    def active(self) -> int:
        return len(self._tasks)

    def tasks(self) -> list[Task[Any]]:
        return list(self._tasks)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel every task and wait (up to ``timeout`` s) for the workers to finish."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        futures = [t.future for t in self._tasks if t.future is not None]
        for fut in futures:
            try:
                fut.exception(timeout=timeout)
            except TimeoutError:
                log.warning("task still running at shutdown")
            except Exception:  # the result is no longer wanted
                log.debug("task ended with an error at shutdown", exc_info=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._serial.shutdown(wait=False, cancel_futures=True)
        self._run_closures()

    # ------------------------------------------------------------ internals
    @Slot()
    def _run_closures(self) -> None:
        with self._lock:
            closures, self._closures = self._closures, []
        for fn in closures:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - reported, never lost
                self.default_error_handler(exc)

    @staticmethod
    def _log_error(exc: BaseException) -> None:
        log.error("background task failed", exc_info=exc)
