"""The chat header's model picker: the model loaded now, and the models of My models one
choice away (as LM Studio's and Jan's model selectors are).

Choosing one asks before anything is stopped (the model loaded now and how long the new
one takes to load), then plans the new one for this machine, launches it as "Chat with
it" on the Models page does, and starts a new conversation for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtGui import QPaintEvent
from PySide6.QtWidgets import QComboBox, QStyle, QStyleOptionComboBox, QStylePainter, QWidget

from k3desk.core.app.cells import shown_path

if TYPE_CHECKING:
    from k3desk.core.app.library import LocalModel
    from k3desk.ui.context import AppContext

NONE_LOADED = "No model loaded"
TIP = "The model answering here; pick another of your models to load it"


class ModelPicker(QComboBox):
    """Signals:
    chosen(object): the LocalModel picked (never the one loaded now).
    """

    chosen = Signal(object)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.setObjectName("modelPicker")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.setMaximumWidth(320)
        self.setToolTip(TIP)
        self.setFrame(False)  # reads as the line under the title, with an arrow
        self.loaded_text = ""  # what answers here, as the header says it
        self.models: tuple[LocalModel, ...] = ()
        self._gen = 0
        self._task: Any = None
        self.activated.connect(self._activated)
        ctx.engine.state_changed.connect(lambda _s, _m: self._fill())
        ctx.settings_changed.connect(lambda _s: self.refresh())
        self._fill()
        self.refresh()

    def minimumSizeHint(self) -> QSize:
        """As narrow as about a dozen characters: a long model name is elided in a narrow
        header (the list it opens shows every name whole)."""
        hint = super().minimumSizeHint()
        least = self.fontMetrics().horizontalAdvance("x" * 14) + 40  # the arrow and padding
        return QSize(min(hint.width(), least), hint.height())

    def paintEvent(self, _event: QPaintEvent) -> None:
        """The box as Qt draws it, its text elided at the width it has now (narrower than
        its widest in a narrow header), never clipped mid-word."""
        painter = QStylePainter(self)
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        full = self.itemData(self.currentIndex(), Qt.ItemDataRole.ToolTipRole)
        text = full if isinstance(full, str) and full else opt.currentText
        opt.currentText = self.fontMetrics().elidedText(
            text, Qt.TextElideMode.ElideRight, self.text_room(self.width())
        )
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, opt)
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, opt)

    def shown_text(self) -> str:
        """The box's text as drawn at its width now."""
        full = self.itemData(self.currentIndex(), Qt.ItemDataRole.ToolTipRole)
        text = full if isinstance(full, str) and full else self.currentText()
        room = self.text_room(self.width())
        return self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, room)

    def refresh(self) -> None:
        """Read My models again (in the background: each set's headers are read)."""
        from k3desk.core.app.library import local_models

        self._gen += 1
        gen = self._gen
        services = self.ctx.services

        def done(result: tuple[tuple[LocalModel, ...], tuple[str, ...]]) -> None:
            if gen == self._gen:
                self.models = tuple(m for m in result[0] if m.ok)
                self._fill()

        self.ctx.tasks.run(lambda _t: local_models(services), on_done=done, name="model-picker")

    def loaded_name(self) -> str:
        engine = self.ctx.engine
        return engine.model_name() if engine.running else ""

    def _loaded_shard(self) -> Path | None:
        from k3desk.ui.model_switch import running_shard

        return running_shard(self.ctx.engine)

    def label(self, model: LocalModel) -> str:
        """"Load <name>", with its folder where two sets share a name."""
        same = sum(m.name == model.name for m in self.models) > 1
        return f"Load {model.name}" + (f" ({shown_path(model.shard.parent)})" if same else "")

    def set_loaded_text(self, text: str) -> None:
        """The model answering here ("<name> · this machine"), shown as the first item."""
        if text != self.loaded_text:
            self.loaded_text = text
            self._fill()

    def _fill(self) -> None:
        loaded = self.loaded_name()
        head = self.loaded_text or loaded
        shard = self._loaded_shard()
        self.blockSignals(True)
        self.clear()
        shown = head or NONE_LOADED
        self.addItem(self.fitted(shown), None)
        self.setItemData(0, shown, Qt.ItemDataRole.ToolTipRole)
        self.setToolTip(f"{shown}\n{TIP}" if shown != self.itemText(0) else TIP)
        for m in self.models:
            if m.shard != shard:
                self.addItem(self.label(m), m.id)
        self.setCurrentIndex(0)
        self.setEnabled(self.count() > 1 or bool(head))
        self.blockSignals(False)

    def text_room(self, width: int | None = None) -> int:
        """How wide a text the box shows whole at ``width`` (its widest, by default)."""
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        opt.rect = QRect(0, 0, self.maximumWidth() if width is None else width, self.height())
        field = self.style().subControlRect(
            QStyle.ComplexControl.CC_ComboBox, opt, QStyle.SubControl.SC_ComboBoxEditField, self
        )
        # the label is drawn 1 px in at each side (Qt's QCommonStyle, CE_ComboBoxLabel)
        return field.width() - 2

    def fitted(self, text: str) -> str:
        """``text`` elided ("…") where the box at its widest would cut it (a long model
        name, "kept in the background"): never a clipped word; the whole in the tooltip."""
        return self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, self.text_room())

    def choices(self) -> list[str]:
        """What the list offers, as shown."""
        return [self.itemText(i) for i in range(self.count())]

    def choose(self, model_id: str) -> None:
        """Pick the model ``model_id`` (what choosing it in the list does)."""
        for i in range(self.count()):
            if self.itemData(i) == model_id:
                self._activated(i)
                return

    def _activated(self, index: int) -> None:
        key = self.itemData(index)
        self.setCurrentIndex(0)  # the list shows what is loaded until the switch is done
        model = next((m for m in self.models if m.id == key), None)
        if model is not None:
            self.chosen.emit(model)
