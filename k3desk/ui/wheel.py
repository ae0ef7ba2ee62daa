"""The mouse wheel scrolls the page; it changes a spin box, a combo box or a slider only
once that control has the keyboard focus (clicked or tabbed to).

Without this, scrolling a settings page with the pointer passing over a spin box changes
its value (Context 8192 became 5120).  One application-wide event filter: a wheel event
for such a control without focus goes to the scroll area around it instead.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QScrollBar,
    QWidget,
)

_GUARDED = (QAbstractSpinBox, QComboBox, QAbstractSlider)


def _guarded(obj: QObject) -> QWidget | None:
    """The guarded control ``obj`` is (or is part of, e.g. a spin box's line edit)."""
    w = obj if isinstance(obj, QWidget) else None
    while w is not None:
        if isinstance(w, QScrollBar):
            return None  # scroll bars take the wheel: that is what they are for
        if isinstance(w, _GUARDED):
            return w
        if isinstance(w, QAbstractScrollArea):
            return None
        w = w.parentWidget()
    return None


class WheelGuard(QObject):
    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Polish and isinstance(obj, _GUARDED):
            # Qt.WheelFocus (their default) would hand them the focus on the first turn
            if obj.focusPolicy() == Qt.FocusPolicy.WheelFocus:
                obj.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            return False
        if event.type() != QEvent.Type.Wheel:
            return False
        control = _guarded(obj)
        if control is None or control.hasFocus():
            return False
        if isinstance(control, QComboBox) and control.view().isVisible():
            return False  # its open list scrolls
        area = control.parentWidget()
        while area is not None and not isinstance(area, QAbstractScrollArea):
            area = area.parentWidget()
        if area is not None:
            angle = event.angleDelta()  # type: ignore[attr-defined]
            horizontal = abs(angle.x()) > abs(angle.y())
            bar = area.horizontalScrollBar() if horizontal else area.verticalScrollBar()
            QApplication.sendEvent(bar, event)
        return True  # the control keeps its value


def install(app: QApplication) -> WheelGuard:
    """Guard the application's controls (once per application)."""
    existing = app.findChild(WheelGuard)
    if isinstance(existing, WheelGuard):
        return existing
    guard = WheelGuard(app)
    app.installEventFilter(guard)
    return guard
