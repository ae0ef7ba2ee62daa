"""A custom-painted chart: for each tier, what it needs vs what this machine has.

Three thin bars per tier (VRAM, RAM, disk).  The track is what the machine has;
the filled part is what the tier's plan uses; a bar that overflows is drawn to
the edge in the warning colour with the missing amount written after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPaintEvent
from PySide6.QtWidgets import QSizePolicy, QWidget

from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.recommend import Recommendation, TierVerdict
from k3desk.core.units import fmt_bytes
from k3desk.ui import theme


@dataclass(frozen=True)
class Need:
    """One bar: what is needed and what there is (bytes)."""

    label: str
    need: int
    have: int

    @property
    def fraction(self) -> float:
        return self.need / self.have if self.have > 0 else (1.0 if self.need else 0.0)

    @property
    def fits(self) -> bool:
        return self.need <= self.have


@dataclass(frozen=True)
class TierNeeds:
    name: str
    verdict: str
    bars: tuple[Need, ...]
    recommended: bool = False


def needs_for(tv: TierVerdict, hw: HardwareProfile) -> TierNeeds:
    """VRAM / RAM / disk needs of a tier's plan against the machine."""
    plan = tv.plan
    vram_need = ram_need = 0
    if plan is not None:
        for d in plan.devices:
            if d.device == "RAM":
                ram_need += d.used
            else:
                vram_need += d.used
        if plan.verdict in ("stream", "no-fit"):
            ram_need += plan.shortfall
    vram_have = hw.total_vram
    ram_have = hw.memory.usable_total
    disk_have = hw.disk.free if hw.disk is not None else 0
    bars = []
    if vram_have > 0:
        bars.append(Need("VRAM", vram_need, vram_have))
    bars.append(Need("RAM", ram_need, ram_have))
    bars.append(Need("Disk", tv.tier.size_bytes, disk_have))
    return TierNeeds(f"{tv.tier.name} · {tv.tier.publisher}", tv.verdict, tuple(bars))


class FitChart(QWidget):
    ROW = 58
    LABEL_W = 210

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fitChart")
        self.rows: list[TierNeeds] = []
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(60)

    def set_data(self, rec: Recommendation, hw: HardwareProfile) -> None:
        chosen = rec.best or rec.closest
        rows = []
        for tv in rec.verdicts:
            n = needs_for(tv, hw)
            rows.append(TierNeeds(n.name, n.verdict, n.bars, chosen is not None and tv is chosen))
        self.rows = rows
        self.setFixedHeight(max(60, 28 + self.ROW * len(rows)))
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(700, max(60, 28 + self.ROW * len(self.rows)))

    def paintEvent(self, _e: QPaintEvent) -> None:
        c = theme.current()
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        width = self.width()
        small = QFont(self.font())
        small.setPointSizeF(max(7.0, self.font().pointSizeF() * 0.85))
        bold = QFont(self.font())
        bold.setBold(True)
        colors = {"VRAM": c.bar_vram, "RAM": c.bar_ram, "Disk": c.bar_disk}
        # legend
        x = float(self.LABEL_W)
        p.setFont(small)
        for name, col in colors.items():
            p.setBrush(QColor(col))
            p.setPen(Qt.PenStyle.NoPen)
            p.drawRoundedRect(QRectF(x, 6, 10, 10), 2, 2)
            p.setPen(QColor(c.muted))
            p.drawText(QRectF(x + 14, 0, 120, 22), Qt.AlignmentFlag.AlignVCenter, name)
            x += 70
        p.drawText(
            QRectF(x + 10, 0, width - x - 10, 22),
            Qt.AlignmentFlag.AlignVCenter,
            "track = what this machine has, fill = what the tier needs",
        )
        bar_w = max(80.0, width - self.LABEL_W - 190.0)
        y = 28.0
        for row in self.rows:
            if row.recommended:
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(QColor(c.sidebar_sel))
                p.drawRoundedRect(QRectF(0, y - 3, width, self.ROW - 4), 6, 6)
            p.setPen(QColor(c.text))
            p.setFont(bold if row.recommended else self.font())
            p.drawText(
                QRectF(8, y, self.LABEL_W - 12, 20),
                Qt.AlignmentFlag.AlignVCenter,
                ("★ " if row.recommended else "") + row.name,
            )
            p.setFont(small)
            p.setPen(QColor(c.muted))
            p.drawText(
                QRectF(8, y + 20, self.LABEL_W - 12, 18),
                Qt.AlignmentFlag.AlignVCenter,
                row.verdict,
            )
            by = y + 2
            step = (self.ROW - 12) / max(1, len(row.bars))
            for bar in row.bars:
                track = QRectF(self.LABEL_W, by, bar_w, step - 5)
                p.setPen(Qt.PenStyle.NoPen)
                p.setBrush(QColor(c.bar_track))
                p.drawRoundedRect(track, 3, 3)
                frac = min(1.0, bar.fraction)
                fill = QRectF(track.x(), track.y(), track.width() * frac, track.height())
                p.setBrush(QColor(colors.get(bar.label, c.accent) if bar.fits else c.danger))
                p.drawRoundedRect(fill, 3, 3)
                p.setPen(QColor(c.text if bar.fits else c.danger))
                text = f"{bar.label} {fmt_bytes(bar.need)} / {fmt_bytes(bar.have)}"
                if not bar.fits:
                    text = f"{bar.label}: {fmt_bytes(bar.need - bar.have)} short"
                p.drawText(
                    QRectF(self.LABEL_W + bar_w + 8, by - 3, 184, step),
                    Qt.AlignmentFlag.AlignVCenter,
                    text,
                )
                by += step
            y += self.ROW
        p.end()
