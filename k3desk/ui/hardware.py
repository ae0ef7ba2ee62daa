"""The machine the app plans for (detected, or read from a hardware file) and its recommendation.

Detection and planning run through the task manager; results arrive as signals.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.recommend import Recommendation, recommend
from k3desk.ui.errors import describe

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext


class HardwareController(QObject):
    """Signals:
    changed(object): the HardwareProfile now planned for.
    recommended(object): the Recommendation for it.
    failed(str): why detection or a hardware file failed.
    """

    changed = Signal(object)
    recommended = Signal(object)
    failed = Signal(str)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.profile: HardwareProfile | None = None
        self.recommendation: Recommendation | None = None
        self.from_file: Path | None = None
        self._gen = 0

    @property
    def busy(self) -> bool:
        return self.profile is None or self.recommendation is None

    def ensure(self) -> None:
        """Detect this machine once (unless a file was loaded)."""
        if self.profile is None and self._gen == 0:
            self.detect()

    def detect(self, disk: Path | None = None) -> None:
        self.from_file = None
        target = disk or self.ctx.settings.effective_download_dir(
            self.ctx.services.paths.models_dir
        )

        def work(_t: Any) -> HardwareProfile:
            # the quick form: the RAM bandwidth is estimated, not measured (a second saved)
            return self.ctx.services.detect_hardware(target, measure_bandwidth=False)

        self._start(work)

    def load_file(self, path: str | Path) -> None:
        """Plan for the machine described in ``path`` (``k3desk doctor --json`` output)."""
        p = Path(path)
        self.from_file = p
        self._start(lambda _t: self.ctx.services.load_hardware(p))

    def _start(self, work: Any) -> None:
        self._gen += 1
        gen = self._gen
        self.recommendation = None

        def done(hw: HardwareProfile) -> None:
            if gen != self._gen:
                return
            self.profile = hw
            self.changed.emit(hw)
            self.plan(gen)

        def error(exc: BaseException) -> None:
            if gen == self._gen:
                self.failed.emit(describe(exc)[0])
                self.ctx.reporter.report(exc)

        self.ctx.tasks.run(work, on_done=done, on_error=error, name="hardware")

    def options(self) -> PlanOptions:
        s = self.ctx.settings
        return PlanOptions(ctx=s.ctx, temperature=s.temperature, top_p=s.top_p)

    def plan(self, gen: int | None = None) -> None:
        hw = self.profile
        if hw is None:
            return
        gen = self._gen if gen is None else gen
        opts = self.options()
        catalog = self.ctx.services.catalog

        def done(rec: Recommendation) -> None:
            if gen == self._gen:
                self.recommendation = rec
                self.recommended.emit(rec)

        self.ctx.tasks.run(lambda _t: recommend(hw, catalog, opts), on_done=done, name="recommend")
