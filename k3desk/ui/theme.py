"""Colours, style sheet and icons.  The theme follows the system (dark/light) unless set.

One palette per scheme feeds both the QPalette (Fusion style) and the
``resources/qss/app.qss`` tokens; line icons in ``resources/icons/ui`` are SVGs
whose ``COLOR`` placeholder is replaced by the theme's text colour.
"""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from PySide6.QtCore import QByteArray, QObject, QSize, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QAbstractButton, QApplication

from k3desk.core.app.presenters import Tone
from k3desk.core.app.values import resources_dir


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
    # a search hit marked in the transcript: it must stand out from the page
    mark: str
    mark_text: str

    def tone(self, tone: Tone) -> str:
        """The colour of a presenter's tone (a verdict's ok / warn / danger)."""
        return {"ok": self.ok, "warn": self.warn, "danger": self.danger}[tone]


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
    mark="#fcd34d",
    mark_text="#1f2328",
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
    mark="#a16207",
    mark_text="#ffffff",
)


_current: list[Colors] = [LIGHT]
STYLE_PROPERTY = "k3deskStyle"
_manager: list[ThemeManager | None] = [None]  # the one that follows the system
ICON_PROPERTY = "themeIcon"  # a button's line icon, drawn again in a new theme's colours


def system_prefers_dark() -> bool:
    hints = QGuiApplication.styleHints()
    return bool(hints.colorScheme() == Qt.ColorScheme.Dark)


def resolve(theme: str, system_dark: bool | None = None) -> Colors:
    """The colours for ``theme`` ("system", "dark", "light"); ``system_dark``: the system's
    scheme when known (None: ask Qt)."""
    if theme == "dark":
        return DARK
    if theme == "light":
        return LIGHT
    dark = system_prefers_dark() if system_dark is None else system_dark
    return DARK if dark else LIGHT


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


# shapes the style sheet draws with (a style sheet takes images only from files)
_SHAPES = {
    "up": ("10", "6", '<path d="M0 6 L5 0 L10 6 Z" fill="{c}"/>'),
    "down": ("10", "6", '<path d="M0 0 L5 6 L10 0 Z" fill="{c}"/>'),
    "check": (
        "14",
        "14",
        '<path d="M3 7.5 L6 10.5 L11 4" stroke="{c}" stroke-width="2.2" fill="none" '
        'stroke-linecap="round" stroke-linejoin="round"/>',
    ),
}
_image_dir: list[Path] = []


def _qss_images(c: Colors) -> dict[str, str]:
    """The style sheet's images in ``c``'s colours, written once to a private folder of
    this process (``tempfile.mkdtemp``: 0700, removed at exit)."""
    if not _image_dir:
        folder = Path(tempfile.mkdtemp(prefix="k3desk-qss-"))
        atexit.register(shutil.rmtree, folder, True)
        _image_dir.append(folder)
    folder = _image_dir[0]
    out: dict[str, str] = {}
    for key, shape, color in (
        ("img_up", "up", c.text),
        ("img_down", "down", c.text),
        ("img_up_off", "up", c.border),
        ("img_down_off", "down", c.border),
        ("img_check", "check", c.accent_text),
    ):
        w, h, body = _SHAPES[shape]
        path = folder / f"{shape}-{color.lstrip('#')}.svg"
        if not path.exists():
            svg = (
                f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
                f'viewBox="0 0 {w} {h}">{body.format(c=color)}</svg>'
            )
            path.write_text(svg, encoding="utf-8")
        out[key] = path.as_posix()
    return out


def style_sheet(c: Colors, resources: Path | None = None) -> str:
    path = (resources or resources_dir()) / "qss" / "app.qss"
    values = {k: str(v) for k, v in c.__dict__.items()}
    values.update(_qss_images(c))
    return re.sub(r"@([a-z_]+)", lambda m: values.get(m.group(1), m.group(0)), _qss_template(path))


class ThemeManager(QObject):
    """Applies a theme to the application and re-applies it when the system scheme changes.

    Signals:
        changed(object): the :class:`Colors` now in use, after they were applied.
    """

    changed = Signal(object)

    def __init__(self, app: QApplication, theme: str = "system") -> None:
        super().__init__(app)
        self._app = app
        self.theme = theme
        hints = QGuiApplication.styleHints()
        self.system_dark = hints.colorScheme() == Qt.ColorScheme.Dark
        self.colors = resolve(theme, self.system_dark)
        if app.property(STYLE_PROPERTY) != "Fusion":
            # once per application: Qt crashes when the style is replaced while a QWizard
            # is open (a second context, as in tests, would do that)
            app.setStyle("Fusion")
            app.setProperty(STYLE_PROPERTY, "Fusion")
        previous = _manager[0]
        if previous is not None:
            previous.close()  # one theme manager per application: the newest context's
        _manager[0] = self
        hints.colorSchemeChanged.connect(self._system_changed)
        self._following = True
        self.apply(theme)

    def apply(self, theme: str) -> None:
        self.theme = theme
        self.colors = resolve(theme, self.system_dark)
        _current[0] = self.colors
        self._app.setPalette(palette_for(self.colors))
        self._app.setStyleSheet(style_sheet(self.colors))
        icon.cache_clear()
        for widget in self._app.allWidgets():
            # only buttons carry an icon's name; and PySide6 may hand back a stale wrapper
            # of another type (a layout's QWidgetItem) whose C++ object's address a widget
            # now has, which has no property() to ask
            if not isinstance(widget, QAbstractButton):
                continue
            name = widget.property(ICON_PROPERTY)
            if isinstance(name, str):
                widget.setIcon(icon(name))
        self.changed.emit(self.colors)

    def _system_changed(self, scheme: Qt.ColorScheme) -> None:
        # the signal carries the new scheme (colorScheme() may lag behind on some platforms)
        self.system_dark = scheme == Qt.ColorScheme.Dark
        if self.theme == "system":
            self.apply("system")

    def close(self) -> None:
        """Stop following the system (the app context is closing)."""
        if self._following:
            self._following = False
            QGuiApplication.styleHints().colorSchemeChanged.disconnect(self._system_changed)


def set_icon(button: QAbstractButton, name: str) -> None:
    """Give ``button`` the line icon ``name``, drawn again whenever the theme changes."""
    button.setProperty(ICON_PROPERTY, name)
    button.setIcon(icon(name))


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
