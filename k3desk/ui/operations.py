"""The desktop shell's runner of named operations, and the one "what changed" broadcast.

A page builds a :class:`~k3desk.core.app.operations.Operation` for the user's action and
calls :meth:`OperationRunner.run`: the work runs on the task manager's worker threads,
then, on the main thread, exactly one of ``on_success`` / ``on_failure`` /
``on_cancelled`` runs (failures without ``on_failure`` go to the task manager's default
handler, the error reporter), then ``on_finally``.  When it succeeded and changed
something, :attr:`OperationRunner.did_execute` is emitted once with its
:class:`~k3desk.core.app.operations.OpChanges`, right after ``on_success``.  Pages
refresh from that signal (each asks ``changes.touches(...)`` for the kinds it shows),
so the page that started an action never refreshes the others itself.  Once the task
manager is shut down (the app is quitting) nothing is announced: no page is left to show
a change, and a page that refreshed would start work nothing runs any more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Signal

from k3desk.core.app.operations import OpChanges, Operation
from k3desk.ui.tasks import ErrorHandler, Task, TaskManager

T = TypeVar("T")


class OperationRunner(QObject):
    """Runs operations off the GUI thread and announces what they changed.

    Signals:
        did_execute(object, object): the :class:`OpChanges` of an operation that
            succeeded, and who started it (the ``initiator`` given to :meth:`run`, or None).
    """

    did_execute = Signal(object, object)

    def __init__(self, tasks: TaskManager, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.tasks = tasks

    def run(
        self,
        op: Operation[T],
        *,
        on_success: Callable[[T], None] | None = None,
        on_failure: ErrorHandler | None = None,
        on_cancelled: Callable[[], None] | None = None,
        on_finally: Callable[[], None] | None = None,
        initiator: object | None = None,
    ) -> Task[T]:
        """Start ``op``; the returned task cancels it (``task.cancel()`` or ``op.cancel()``)."""

        def succeeded(result: T) -> None:
            try:
                if on_success is not None:
                    on_success(result)
            finally:
                self.announce(op.changes_for(result), initiator)

        return self.tasks.run(
            op.work,
            on_done=succeeded,
            on_error=on_failure,
            on_cancelled=on_cancelled,
            on_finally=on_finally,
            name=op.name,
            serial=op.serial,
            token=op.token,
        )

    def announce(self, changes: OpChanges, initiator: Any = None) -> None:
        """Tell every page what changed (nothing is said for no change, nor once the app
        is quitting: an operation that ends during the shutdown changes no page)."""
        if changes and not self.tasks.closed:
            self.did_execute.emit(changes, initiator)
