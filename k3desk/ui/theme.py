"""Colours, style sheet and icons.  The theme follows the system (dark/light) unless set.

One palette per scheme feeds both the QPalette (Fusion style) and the
``resources/qss/app.qss`` tokens; line icons in ``resources/icons/ui`` are SVGs
whose ``COLOR`` placeholder is replaced by the theme's text colour.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from PySide6.QtCore import QByteArray, QObject, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

from k3desk.core.resources import resources_dir


@dataclass(frozen=True)
class Colors:
    dark: bool
    window: str
    base: str
    alt: str
    text: str
    muted: str
    border: str
    button: str
    hover: str
    sidebar: str
    sidebar_sel: str
    accent: str
    accent_hover: str
    accent_text: str
    link: str
    danger: str
    ok: str
    warn: str
    banner: str
    banner_border: str
    code_bg: str
    reasoning_bg: str
    # fit bars: what a tier needs vs what the machine has
    bar_vram: str
    bar_ram: str
    bar_disk: str
    bar_track: str


LIGHT = Colors(
    dark=False,
    window="#f5f6f8",
    base="#ffffff",
    alt="#f7f8fa",
    text="#1f2328",
    muted="#667085",
    border="#d8dce3",
    button="#ffffff",
    hover="#eceef2",
    sidebar="#eef0f4",
    sidebar_sel="#dfe2f7",
    accent="#4f46e5",
    accent_hover="#4338ca",
    accent_text="#ffffff",
    link="#4338ca",
    danger="#c0362c",
    ok="#15803d",
    warn="#b45309",
    banner="#fff7e6",
    banner_border="#f3d19e",
    code_bg="#f4f5f7",
    reasoning_bg="#f3f1fb",
    bar_vram="#7c3aed",
    bar_ram="#0d9488",
    bar_disk="#d97706",
    bar_track="#e5e7eb",
)

DARK = Colors(
    dark=True,
    window="#1d1e21",
    base="#16171a",
    alt="#1f2024",
    text="#e7e8ea",
    muted="#9aa0aa",
    border="#34373d",
    button="#26282c",
    hover="#2c2f34",
    sidebar="#1a1b1e",
    sidebar_sel="#30324a",
    accent="#6366f1",
    accent_hover="#7477f5",
    accent_text="#ffffff",
    link="#a5b4fc",
    danger="#f87171",
    ok="#4ade80",
    warn="#fbbf24",
    banner="#2d2716",
    banner_border="#5c4a1c",
    code_bg="#202226",
    reasoning_bg="#232235",
    bar_vram="#a78bfa",
    bar_ram="#2dd4bf",
    bar_disk="#fbbf24",
    bar_track="#30333a",
)


_current: list[Colors] = [LIGHT]
STYLE_PROPERTY = "k3deskStyle"


def system_prefers_dark() -> bool:
    hints = QGuiApplication.styleHints()
    return bool(hints.colorScheme() == Qt.ColorScheme.Dark)


def resolve(theme: str) -> Colors:
    if theme == "dark":
        return DARK
    if theme == "light":
        return LIGHT
    return DARK if system_prefers_dark() else LIGHT


def palette_for(c: Colors) -> QPalette:
    p = QPalette()
    roles = {
        QPalette.ColorRole.Window: c.window,
        QPalette.ColorRole.WindowText: c.text,
        QPalette.ColorRole.Base: c.base,
        QPalette.ColorRole.AlternateBase: c.alt,
        QPalette.ColorRole.Text: c.text,
        QPalette.ColorRole.Button: c.button,
        QPalette.ColorRole.ButtonText: c.text,
        QPalette.ColorRole.ToolTipBase: c.base,
        QPalette.ColorRole.ToolTipText: c.text,
        QPalette.ColorRole.Highlight: c.accent,
        QPalette.ColorRole.HighlightedText: c.accent_text,
        QPalette.ColorRole.Link: c.link,
        QPalette.ColorRole.PlaceholderText: c.muted,
        QPalette.ColorRole.Mid: c.border,
        QPalette.ColorRole.Midlight: c.hover,
        QPalette.ColorRole.Dark: c.muted,
    }
    for role, color in roles.items():
        p.setColor(role, QColor(color))
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(c.muted))
    return p


@lru_cache(maxsize=4)
def _qss_template(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def style_sheet(c: Colors, resources: Path | None = None) -> str:
    path = (resources or resources_dir()) / "qss" / "app.qss"
    values = {k: str(v) for k, v in c.__dict__.items()}
    return re.sub(r"@([a-z_]+)", lambda m: values.get(m.group(1), m.group(0)), _qss_template(path))


class ThemeManager(QObject):
    """Applies a theme to the application and re-applies it when the system scheme changes."""

    def __init__(self, app: QApplication, theme: str = "system") -> None:
        super().__init__(app)
        self._app = app
        self.theme = theme
        self.colors = resolve(theme)
        if app.property(STYLE_PROPERTY) != "Fusion":
            # once per application: Qt crashes when the style is replaced while a QWizard
            # is open (a second context, as in tests, would do that)
            app.setStyle("Fusion")
            app.setProperty(STYLE_PROPERTY, "Fusion")
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._system_changed)
        self.apply(theme)

    def apply(self, theme: str) -> None:
        self.theme = theme
        self.colors = resolve(theme)
        _current[0] = self.colors
        self._app.setPalette(palette_for(self.colors))
        self._app.setStyleSheet(style_sheet(self.colors))
        icon.cache_clear()

    def _system_changed(self, _scheme: Qt.ColorScheme) -> None:
        if self.theme == "system":
            self.apply("system")


def current() -> Colors:
    """The colours in use (for custom painting and generated HTML)."""
    return _current[0]


@lru_cache(maxsize=128)
def icon(name: str, color: str | None = None, size: int = 24) -> QIcon:
    """A line icon from ``resources/icons/ui/<name>.svg`` in ``color`` (theme text by default)."""
    path = resources_dir() / "icons" / "ui" / f"{name}.svg"
    svg = path.read_text(encoding="utf-8").replace("COLOR", color or current().text)
    renderer = QSvgRenderer(QByteArray(svg.encode()))
    result = QIcon()
    for scale in (1, 2):
        pm = QPixmap(QSize(size * scale, size * scale))
        pm.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pm)
        renderer.render(painter)
        painter.end()
        pm.setDevicePixelRatio(scale)
        result.addPixmap(pm)
    return result


def app_icon() -> QIcon:
    """The application icon (PNGs 48..512 plus the SVG)."""
    base = resources_dir() / "icons"
    result = QIcon()
    for size in (48, 64, 128, 256, 512):
        png = base / "hicolor" / f"{size}x{size}" / "apps" / "k3desk.png"
        if png.is_file():
            result.addFile(str(png), QSize(size, size))
    svg = base / "k3desk.svg"
    if result.isNull() and svg.is_file():
        result.addFile(str(svg))
    return result
