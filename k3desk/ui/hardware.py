"""The machine the pages judge tiers for, and this machine, which every launch plans for.

What is judged is explicit state: a :class:`~k3desk.core.app.subject.Subject`, either
this machine or the machine a hardware file describes.  Judging a file is a question
asked of the planner; it never reaches a launch (the Engine page, the wizard's engine
step and the RPC cluster launch plan for :meth:`HardwareController.this_machine`).
Detection and judging run through the task manager; results arrive as signals.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from k3desk.core.app import actions
from k3desk.core.app.hardware import HardwareProfile, Recommendation
from k3desk.core.app.operations import Change, OpChanges, Operation
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierJudgement, TierRequest
from k3desk.core.app.values import CancelToken
from k3desk.ui.errors import describe

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext

MACHINE = OpChanges.of(Change.MACHINE)


class HardwareController(QObject):
    """Signals:
    changed(object): the Subject now judged (its profile is :attr:`profile`).
    judged(object): the TierJudgement for it.
    machine_known(object): this machine's HardwareProfile, detected.
    failed(str): why detection or a hardware file failed.
    """

    changed = Signal(object)
    judged = Signal(object)
    machine_known = Signal(object)
    failed = Signal(str)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.subject: Subject | None = None  # what the pages judge
        self.profile: HardwareProfile | None = None  # ... and its hardware
        self.judgement: TierJudgement | None = None
        self.machine: HardwareProfile | None = None  # this machine, once detected
        self._gen = 0

    # ------------------------------------------------------------ state
    @property
    def busy(self) -> bool:
        return self.profile is None or self.judgement is None

    @property
    def recommendation(self) -> Recommendation | None:
        """The planner's recommendation for the judged machine."""
        return self.judgement.recommendation if self.judgement is not None else None

    @property
    def from_file(self) -> Path | None:
        """The hardware file being judged, or None when it is this machine."""
        s = self.subject
        return s.path if s is not None and s.kind == "file" else None

    @property
    def judging_here(self) -> bool:
        """The pages judge this machine (not a hardware file)."""
        return self.subject is None or self.subject.here

    def describe(self) -> str:
        """Which machine the pages judge, in words."""
        return self.subject.describe() if self.subject is not None else "this machine"

    def this_machine(self) -> HardwareProfile:
        """This machine's profile (blocking: call it from a task).  What launches plan for,
        whatever the pages judge."""
        return self.ctx.services.this_machine(self._disk())

    # ---------------------------------------------------------- actions
    def ensure(self) -> None:
        """Judge this machine once (unless a file was loaded)."""
        if self.profile is None and self._gen == 0:
            self.detect()

    def detect(self, disk: Path | None = None) -> None:
        """Judge this machine (again): the way back from a hardware file."""
        target = disk or self._disk()

        def work(_t: CancelToken) -> tuple[HardwareProfile, Subject]:
            # the RAM bandwidth kept for this machine (measured the first time only)
            hw = self.ctx.services.this_machine(target)
            return hw, Subject.this_machine(hw)

        self._start(Operation("hardware", work, MACHINE))

    def load_file(self, path: str | Path) -> None:
        """Judge the machine described in ``path`` (``k3desk doctor --json`` output)."""
        p = Path(path)

        def work(_t: CancelToken) -> tuple[HardwareProfile, Subject]:
            hw = self.ctx.services.load_hardware(p)
            return hw, Subject.hardware_file(p, hw)

        self._start(Operation("hardware-file", work, MACHINE))
        self._know_this_machine()

    def _know_this_machine(self) -> None:
        """Detect this machine in the background while another one is judged: what runs
        here (a cluster's llama-server, say) is planned with it."""
        if self.machine is not None:
            return

        def done(hw: HardwareProfile) -> None:
            self.machine = hw
            self.machine_known.emit(hw)

        self.ctx.ops.run(Operation("this-machine", lambda _t: self.this_machine()), on_success=done)

    def judge(self, gen: int | None = None) -> None:
        """Judge every tier for the machine (again, e.g. after the context size changed)."""
        hw, subject = self.profile, self.subject
        if hw is None or subject is None:
            return
        gen = self._gen if gen is None else gen
        s = self.ctx.settings
        request = TierRequest(
            hw,
            subject,
            ctx=s.ctx,
            temperature=s.temperature,
            top_p=s.top_p,
            state_dir=self.ctx.services.paths.state,
        )
        tiers = self.ctx.services.catalog.tiers

        def done(judgement: TierJudgement) -> None:
            if gen == self._gen:
                self.judgement = judgement
                self.judged.emit(judgement)

        self.ctx.ops.run(actions.judge_tiers(request, tiers), on_success=done)

    def close(self) -> None:
        self._gen += 1  # results still on their way are dropped

    # --------------------------------------------------------- internals
    def _disk(self) -> Path:
        return self.ctx.settings.effective_download_dir(self.ctx.services.paths.models_dir)

    def _start(self, op: Operation[tuple[HardwareProfile, Subject]]) -> None:
        self._gen += 1
        gen = self._gen
        self.judgement = None

        def done(result: tuple[HardwareProfile, Subject]) -> None:
            if gen != self._gen:
                return
            hw, subject = result
            self.profile, self.subject = hw, subject
            self.changed.emit(subject)
            if subject.here:
                self.machine = hw
                self.machine_known.emit(hw)
            self.judge(gen)

        def error(exc: BaseException) -> None:
            if gen == self._gen:
                self.failed.emit(describe(exc)[0])
                self.ctx.reporter.report(exc)

        self.ctx.ops.run(op, on_success=done, on_failure=error)
