"""Render resources/icons/k3desk.svg to the PNG sizes the desktop and the app use.

Run after editing the SVG: ``QT_QPA_PLATFORM=offscreen python packaging/render_icons.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

SIZES = (48, 64, 128, 256, 512)
ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"


def main() -> int:
    _app = QGuiApplication(sys.argv)
    renderer = QSvgRenderer(str(ICONS / "k3desk.svg"))
    if not renderer.isValid():
        sys.stderr.write("k3desk.svg is not a valid SVG\n")
        return 1
    for size in SIZES:
        image = QImage(QSize(size, size), QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        out = ICONS / "hicolor" / f"{size}x{size}" / "apps" / "k3desk.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        image.save(str(out))
        sys.stdout.write(f"{out.relative_to(ICONS.parents[1])}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
