"""The app's named operations over the core's use-cases: one factory per user action.

Each returns an :class:`~k3desk.core.app.operations.Operation` that says what it does
(its work, run off the GUI thread by the desktop shell, or here by the CLI) and what it
changes when it succeeds.  Reads change nothing; their result is what the caller shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.operations import NO_CHANGES, Change, OpChanges, Operation
from k3desk.core.errors import K3Error

if TYPE_CHECKING:
    from k3desk.core.app.hardware import CpuProbe
    from k3desk.core.app.library import AddResult, ModelsJudgement
    from k3desk.core.app.services import Services
    from k3desk.core.app.subject import Subject
    from k3desk.core.app.tiers import TierJudgement, TierRequest
    from k3desk.core.catalog.model import Tier
    from k3desk.core.hardware.profile import DiskInfo, HardwareProfile

MODELS = OpChanges.of(Change.MODELS)


# ------------------------------------------------------------------ my models
def list_models(
    services: Services, hw: HardwareProfile, subject: Subject, ctx: int
) -> Operation[ModelsJudgement]:
    """Every local model judged for ``hw`` (a read: it changes nothing)."""
    from k3desk.core.app import library

    return Operation("my-models", lambda _t: library.list_models(services, hw, subject, ctx=ctx))


@dataclass(frozen=True)
class AddOutcome:
    """What adding several paths did: the adds that went through, and each refusal."""

    added: tuple[AddResult, ...]
    failed: tuple[K3Error, ...]

    @property
    def changed(self) -> bool:
        """Whether the list of my models is another one now."""
        return any(not a.already for a in self.added)


def add_models(services: Services, paths: Sequence[Path]) -> Operation[AddOutcome]:
    """Add each path (file or folder) to my models; a refusal does not stop the others."""
    from k3desk.core.app.library import add_model

    def work(_t: object) -> AddOutcome:
        added, failed = [], []
        for p in paths:
            try:
                added.append(add_model(services, p))
            except K3Error as exc:
                failed.append(exc)
        return AddOutcome(tuple(added), tuple(failed))

    return Operation("add-model", work, changes=lambda out: MODELS if out.changed else NO_CHANGES)


def remove_model(services: Services, key: str) -> Operation[Path]:
    """Take a model off my models (the files stay); the result is the entry removed."""
    from k3desk.core.app import library

    return Operation("remove-model", lambda _t: library.remove_model(services, key), MODELS)


# ------------------------------------------------------------------ machine
def measure_disk(path: Path) -> Operation[DiskInfo]:
    """The free space where ``path`` is (or would be) stored (a read)."""
    from k3desk.core.hardware.detect import detect_disk

    return Operation("disk", lambda _t: detect_disk(path))


def check_cpu(services: Services) -> Operation[CpuProbe]:
    """Time the engine's kernels on this CPU and keep the result (later plans here
    predict with it: the machine's tiers are judged again)."""
    from k3desk.core.app import hardware

    return Operation(
        "check-cpu",
        lambda t: hardware.check_cpu(services, cancel=t),
        OpChanges.of(Change.MACHINE),
    )


def judge_tiers(request: TierRequest, tiers: Iterable[Tier]) -> Operation[TierJudgement]:
    """Every tier judged for the request's machine (a read)."""
    from k3desk.core.app import tiers as app_tiers

    return Operation("judge", lambda _t: app_tiers.judge_tiers(request, tiers))
