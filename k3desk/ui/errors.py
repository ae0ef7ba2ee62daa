"""No tracebacks in the UI.

A :class:`K3Error` becomes a message box with its message and hint.  Anything
else is an unexpected failure: the full traceback goes to the log file
(``AppPaths.logs_dir / "k3desk.log"``) and the user sees a short dialog that
says where the details are.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QMessageBox, QWidget

from k3desk.core.app.values import Cancelled, K3Error, private_dir, private_file

log = logging.getLogger("k3desk")


class _PrivateLogFile(logging.handlers.RotatingFileHandler):
    """A rotating log whose every file is created 0600 (see k3desk.core.private)."""

    def _open(self) -> Any:
        private_file(Path(self.baseFilename))
        return super()._open()


def setup_logging(logs_dir: Path) -> Path:
    """Log to ``logs_dir/k3desk.log`` (rotated at 2 MB, 3 kept, all private); return the file."""
    private_dir(logs_dir)
    path = logs_dir / "k3desk.log"
    root = logging.getLogger()
    if not any(getattr(h, "baseFilename", None) == str(path) for h in root.handlers):
        handler = _PrivateLogFile(
            path, maxBytes=2_000_000, backupCount=3, encoding="utf-8"
        )
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
        )
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
    return path


def describe(exc: BaseException) -> tuple[str, str]:
    """(message, hint) a person can read, for any exception."""
    if isinstance(exc, K3Error):
        return exc.message, exc.hint
    if isinstance(exc, MemoryError):
        return "The app ran out of memory.", "Close other programs and try again."
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}.", "Check the path and its permissions."
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"Unexpected error: {name}{': ' + text if text else ''}", ""


class ErrorReporter(QObject):
    """Shows errors to the user; logs unexpected ones with their traceback.

    Signals:
        reported(str, str, bool): message, hint, unexpected (for tests and the automation hook).
    """

    reported = Signal(str, str, bool)

    def __init__(self, log_file: Path | None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.log_file = log_file
        self.parent_widget: QWidget | None = None
        self.show_dialogs = True
        self.last: tuple[str, str, bool] | None = None
        self._open: QMessageBox | None = None

    def report(self, exc: BaseException, context: str = "") -> None:
        """Show ``exc`` (main thread only)."""
        if isinstance(exc, Cancelled):
            return
        unexpected = not isinstance(exc, K3Error)
        message, hint = describe(exc)
        if context:
            message = f"{context}: {message}"
        if unexpected:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            log.error("unexpected error%s\n%s", f" ({context})" if context else "", tb)
            where = f"Details are in {self.log_file}." if self.log_file else ""
            hint = " ".join(p for p in (hint, where) if p)
        else:
            log.warning("%s | %s", message, hint)
        self.last = (message, hint, unexpected)
        self.reported.emit(message, hint, unexpected)
        if self.show_dialogs:
            self._show(message, hint, unexpected)

    def _show(self, message: str, hint: str, unexpected: bool) -> None:
        if self._open is not None and self._open.isVisible():
            # One dialog at a time: append to the open one instead of stacking.
            self._open.setInformativeText(
                f"{self._open.informativeText()}\n\nAlso: {message} {hint}".strip()
            )
            return
        box = QMessageBox(self.parent_widget)
        box.setIcon(QMessageBox.Icon.Critical if unexpected else QMessageBox.Icon.Warning)
        box.setWindowTitle("Something went wrong" if unexpected else "k3desk")
        box.setText(message)
        box.setInformativeText(hint)
        box.setStandardButtons(QMessageBox.StandardButton.Ok)
        if unexpected and self.log_file is not None:
            open_btn = box.addButton("Open log folder", QMessageBox.ButtonRole.ActionRole)
            folder = self.log_file.parent
            open_btn.clicked.connect(
                lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))
            )
        box.setObjectName("errorDialog")
        box.setModal(True)
        self._open = box
        box.open()

    # -------------------------------------------------------- global hooks
    def install_hooks(self, post: Callable[[Callable[[], None]], None]) -> None:
        """Route uncaught exceptions (main thread and worker threads) to :meth:`report`.

        ``post`` queues a function onto the main thread (``TaskManager.run_on_main``).
        """

        def hook(
            etype: type[BaseException], value: BaseException, tb: TracebackType | None
        ) -> None:
            if issubclass(etype, KeyboardInterrupt):
                sys.__excepthook__(etype, value, tb)
                return
            value.__traceback__ = tb
            post(lambda: self.report(value))

        def thread_hook(args: threading.ExceptHookArgs) -> None:
            if args.exc_value is not None:
                exc = args.exc_value
                post(lambda: self.report(exc))

        sys.excepthook = hook
        threading.excepthook = thread_hook
