"""A custom-painted chart: for each tier, what it needs vs what the judged machine has.

Three thin bars per tier (VRAM, RAM, disk).  The track is what the plan may use on
that resource (after the margins k3desk keeps free); the filled part is what the
tier's plan uses; a bar that overflows is drawn to the edge in the warning colour
with the missing amount written after it.  Every figure comes from the core's
:class:`~k3desk.core.app.tiers.TierRow` (:class:`~k3desk.core.app.tiers.Need`), the
same rows the tiers table and ``k3desk tiers`` show; the chart only draws them, and
keeps the strings it drew last in :attr:`FitChart.painted`.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPaintEvent
from PySide6.QtWidgets import QSizePolicy, QWidget

from k3desk.core.app.cells import pick_mark
from k3desk.core.app.tiers import Need, TierJudgement, TierRow
from k3desk.ui import theme

LEGEND = "track = what the plan may use there, fill = what the tier needs"


@dataclass(frozen=True)
class ChartRow:
    """One tier as the chart draws it."""

    name: str
    verdict: str  # the verdict in the words the tiers table uses
    bars: tuple[Need, ...]
    recommended: bool = False

    fits: bool = True

    @classmethod
    def of(cls, row: TierRow) -> ChartRow:
        return cls(
            f"{row.tier.name} · {row.tier.publisher}",
            row.label,
            row.needs,
            row.recommended,
            row.fits,
        )


class FitChart(QWidget):
    ROW = 58
    LABEL_W = 210

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fitChart")
        self.rows: list[ChartRow] = []
        self.painted: list[str] = []  # every string the last paint drew, in order
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(60)

    def set_judgement(self, judged: TierJudgement) -> None:
        self.rows = [ChartRow.of(r) for r in judged.rows]
        self.setFixedHeight(max(60, 28 + self.ROW * len(self.rows)))
        self.update()

    def pick_top(self) -> int | None:
        """Where the preselected tier's row starts (None: no pick)."""
        rows = [i for i, r in enumerate(self.rows) if r.recommended]
        return 28 + self.ROW * rows[0] if rows else None

    def sizeHint(self) -> QSize:
        return QSize(700, max(60, 28 + self.ROW * len(self.rows)))

    def label_width(self) -> int:
        """The column of names and verdicts: as wide as its longest text (so the bars
        never cover one), from :attr:`LABEL_W` up to two fifths of the chart."""
        bold = QFont(self.font())
        bold.setBold(True)
        small = QFont(self.font())
        small.setPointSizeF(max(7.0, self.font().pointSizeF() * 0.85))
        names, verdicts = QFontMetrics(bold), QFontMetrics(small)
        widest = max(
            (
                max(
                    names.horizontalAdvance(pick_mark(r.recommended, r.fits) + r.name),
                    verdicts.horizontalAdvance(r.verdict),
                )
                for r in self.rows
            ),
            default=0,
        )
        return max(self.LABEL_W, min(widest + 16, self.width() * 2 // 5))

    def _text(self, p: QPainter, rect: QRectF, flags: Qt.AlignmentFlag, text: str) -> None:
        self.painted.append(text)
        p.drawText(rect, flags, text)

    def paintEvent(self, _e: QPaintEvent) -> None:
        c = theme.current()
        self.painted = []
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        width = self.width()
        small = QFont(self.font())
        small.setPointSizeF(max(7.0, self.font().pointSizeF() * 0.85))
        bold = QFont(self.font())
        bold.setBold(True)
        colors = {"VRAM": c.bar_vram, "RAM": c.bar_ram, "Disk": c.bar_disk}
        label_w = self.label_width()
        # legend
        x = float(label_w)
        p.setFont(small)
        for name, col in colors.items():
            p.setBrush(QColor(col))
            p.setPen(Qt.PenStyle.NoPen)
            p.drawRoundedRect(QRectF(x, 6, 10, 10), 2, 2)
            p.setPen(QColor(c.muted))
            self._text(p, QRectF(x + 14, 0, 120, 22), Qt.AlignmentFlag.AlignVCenter, name)
            x += 70
        self._text(p, QRectF(x + 10, 0, width - x - 10, 22), Qt.AlignmentFlag.AlignVCenter, LEGEND)
        bar_w = max(80.0, width - label_w - 190.0)
        y = 28.0
        for row in self.rows:
            if row.recommended:
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(QColor(c.sidebar_sel))
                p.drawRoundedRect(QRectF(0, y - 3, width, self.ROW - 4), 6, 6)
            p.setPen(QColor(c.text))
            p.setFont(bold if row.recommended else self.font())
            name = pick_mark(row.recommended, row.fits) + row.name
            self._text(
                p,
                QRectF(8, y, label_w - 12, 20),
                Qt.AlignmentFlag.AlignVCenter,
                p.fontMetrics().elidedText(name, Qt.TextElideMode.ElideRight, label_w - 12),
            )
            p.setFont(small)
            p.setPen(QColor(c.muted))
            self._text(
                p,
                QRectF(8, y + 20, label_w - 12, 18),
                Qt.AlignmentFlag.AlignVCenter,
                p.fontMetrics().elidedText(row.verdict, Qt.TextElideMode.ElideRight, label_w - 12),
            )
            by = y + 2
            step = (self.ROW - 12) / max(1, len(row.bars))
            for bar in row.bars:
                track = QRectF(label_w, by, bar_w, step - 5)
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(QColor(c.bar_track))
                p.drawRoundedRect(track, 3, 3)
                frac = min(1.0, bar.fraction)
                fill = QRectF(track.x(), track.y(), track.width() * frac, track.height())
                p.setBrush(QColor(colors.get(bar.resource, c.accent) if bar.fits else c.danger))
                p.drawRoundedRect(fill, 3, 3)
                p.setPen(QColor(c.text if bar.fits else c.danger))
                self._text(
                    p,
                    QRectF(label_w + bar_w + 8, by - 3, 184, step),
                    Qt.AlignmentFlag.AlignVCenter,
                    bar.text(),
                )
                by += step
            y += self.ROW
        p.end()
