"""Named operations: one small object per user action, and what it changed.

A page never starts work or decides what to refresh by itself.  It builds an
:class:`Operation` (a name, the work ``fn(token) -> result`` that runs off the GUI
thread, and the :class:`OpChanges` it makes when it succeeds) and hands it to the
shell's runner (:class:`k3desk.ui.operations.OperationRunner`).  The runner runs it,
tells the caller success, failure or cancellation, and then broadcasts the operation's
changes once; every page that shows one of the changed kinds refreshes itself from that
broadcast, whoever started the operation.  (The design follows Anki's ``aqt/operations``:
``CollectionOp`` and ``OpChanges`` with its one ``operation_did_execute`` hook.)

This module is plain Python: the operation descriptions, the change kinds and the cancel
token (:class:`~k3desk.core.progress.CancelToken`, re-exported) are the same for the CLI,
which may call :meth:`Operation.run` directly.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from k3desk.core.progress import CancelToken

__all__ = ["NO_CHANGES", "CancelToken", "Change", "OpChanges", "Operation"]

T = TypeVar("T")


class Change(enum.Enum):
    """A kind of state the pages show, which an operation may change."""

    MODELS = "models"  # My models: the sets added, removed or found in the model folders
    TOKEN = "token"  # the saved Hugging Face token
    SETTINGS = "settings"  # the settings file
    DOWNLOADS = "downloads"  # the downloads (queued, finished, removed)
    ENGINE = "engine"  # the local engine (started, stopped)
    CLUSTERS = "clusters"  # the clusters and their engines
    ENDPOINTS = "endpoints"  # the attached servers
    CHATS = "chats"  # the chat history
    MACHINE = "machine"  # the machine judged (detected, loaded from a file)


@dataclass(frozen=True)
class OpChanges:
    """The kinds of state an operation changed (empty: it only read)."""

    kinds: frozenset[Change] = frozenset()

    @classmethod
    def of(cls, *kinds: Change) -> OpChanges:
        return cls(frozenset(kinds))

    def touches(self, *kinds: Change) -> bool:
        """Whether any of ``kinds`` changed (what a page asks before it refreshes)."""
        return not self.kinds.isdisjoint(kinds)

    def __or__(self, other: OpChanges) -> OpChanges:
        return OpChanges(self.kinds | other.kinds)

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def __iter__(self) -> Iterator[Change]:
        return iter(sorted(self.kinds, key=lambda c: c.value))

    def __str__(self) -> str:
        return ", ".join(c.value for c in self) or "nothing"


NO_CHANGES = OpChanges()


@dataclass(frozen=True)
class Operation(Generic[T]):
    """One user action: ``work(token)`` runs off the GUI thread and returns the result.

    ``changes`` is what it changes when it succeeds: fixed, or computed from the result
    (an add that added nothing changed nothing).  A failed or cancelled operation changes
    nothing the pages show (its work either completes or raises).  ``serial`` operations
    (history database writes) run one at a time in the order they were started.
    """

    name: str
    work: Callable[[CancelToken], T]
    changes: OpChanges | Callable[[T], OpChanges] = NO_CHANGES
    serial: bool = False
    token: CancelToken = field(default_factory=CancelToken, compare=False)

    def changes_for(self, result: T) -> OpChanges:
        """What this operation changed, given the result it returned."""
        return self.changes(result) if callable(self.changes) else self.changes

    def cancel(self) -> None:
        """Ask the work to stop at its next safe point."""
        self.token.cancel()

    @property
    def cancelled(self) -> bool:
        return self.token.cancelled

    def run(self) -> tuple[T, OpChanges]:
        """Run the work here, on this thread (the CLI, or a test): the result and its
        changes.  Raises what the work raises (:class:`~k3desk.core.errors.Cancelled`
        once cancelled)."""
        self.token.raise_if_cancelled()
        result = self.work(self.token)
        return result, self.changes_for(result)


def changes_if(kinds: Iterable[Change], pred: Callable[[T], bool]) -> Callable[[T], OpChanges]:
    """``kinds`` changed when ``pred(result)`` holds, else nothing (an add that added none)."""
    changed = OpChanges(frozenset(kinds))
    return lambda result: changed if pred(result) else NO_CHANGES
