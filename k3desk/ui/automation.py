"""A tiny automation hook for end-to-end tests: JSON lines on stdout and stdin.

Enabled only with ``K3DESK_AUTOMATION=1``.  On start the app prints
``{"event": "ready", "startup_s": ..., "page": ..., "first_run": ..., "wizard": ...}``.
Each line read from stdin is a JSON object with a ``cmd``; each gets exactly
one JSON line back, ``{"event": "ok", "cmd": ..., ...}`` or
``{"event": "error", "cmd": ..., "message": ...}``.  Commands:

- ``state``: the page shown, the pages built, the wizard's page, the engine state, the
  window's size and the screen's free area.
- ``page`` ``{"name": "engine"}``: show a page.
- ``wizard``: open the wizard; ``wizard-next`` / ``wizard-back``: move it.
- ``grab`` ``{"path": "x.png"}``: save a picture of the main window.
- ``models``: the Models page's "My models" rows as the table shows them (built and
  listed first when needed), and the machine they are judged for.
- ``errors``: the last error shown to the user, if any.
- ``launch`` ``{"shard": ..., "mmproj": ...}``: check, plan and launch a model (as the
  Engine page's Launch does); ``relaunch``: the chat's "Relaunch" button.
- ``send`` ``{"text": ...}``: send a chat message; ``chat``: the messages shown, whether an
  answer streams, the chat's header and its relaunch offer.
- ``close`` ``{"engine": "keep" | "stop"}``: close the window, answering the question
  about a running engine that way (kept: the process goes on without a window).
- ``quit``: close the app (the answer comes before the exit).

For tests that drive the window with real input (xdotool on an X display):

- ``find`` ``{"text": ...}`` or ``{"name": ...}``: where a shown button (by its text) or
  widget (by its object name) is on the screen, ``x``/``y`` its centre, and whether it is
  enabled; the open dialog is searched first.
- ``dialog``: the dialog open now (``title``, ``text``, ``buttons``), or ``open: false``.
- ``screen`` ``{"path": "x.png"}``: save a picture of the whole screen (dialogs included).
- ``wizard-engine``: what the wizard's engine step shows: the engines found (``path``,
  ``source``, ``verdict``) and its note.
- ``picker``: what the chat header's model picker offers, and whether the text it shows
  now (``shown``) fits in it whole.
- ``conversations``: the chat's conversation list, as shown, and the one open.
- ``hub``: the wizard's Hub results (their texts), whether the search still runs, its status.
- ``download``: the download now (status, error, folder, the files there) and what the
  wizard's download step says of the set's projector.
- ``layout``: what is cut, overflows or overlaps in the wizard (when open) or the window
  (``tests/ui/layout_check.py``; only where the tests are on the path).

``find`` scrolls what it finds into view first (a step or table taller than a small
screen), so a click at its centre lands on it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QApplication

from k3desk.ui.pages import PageKey

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext
    from k3desk.ui.window import MainWindow


class Automation(QObject):
    _command = Signal(object)

    def __init__(self, ctx: AppContext, window: MainWindow, started: float) -> None:
        super().__init__(window)
        self.ctx = ctx
        self.window = window
        self.started = started
        self._command.connect(self._run)
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, name="k3-automation", daemon=True)
        self._reader.start()

    @staticmethod
    def send(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def announce_ready(self) -> None:
        self.send(
            {
                "event": "ready",
                "startup_s": round(time.perf_counter() - self.started, 3),
                **self.state(),
            }
        )

    def state(self) -> dict[str, Any]:
        wizard = self.window.wizard
        built = self.ctx.engine_if_built
        engine = built.state_name() if built is not None else "not started"
        return {
            "page": self.window.current_page(),
            "pages_built": self.window.built_pages(),
            "first_run": self.ctx.first_run,
            "wizard": wizard is not None and wizard.isVisible(),
            "wizard_page": wizard.current_key() if wizard is not None else "",
            "engine": engine,
            "engine_message": built.message if built is not None else "",
            "engine_pid": self._engine_pid(),
            "background": built is not None and built.background is not None,
            "title": self.window.windowTitle(),
            "visible": self.window.isVisible(),
            "size": [self.window.width(), self.window.height()],
            "screen": self._free_area(),
        }

    def _free_area(self) -> list[int]:
        screen = self.window.screen() or QApplication.primaryScreen()
        free = screen.availableGeometry() if screen is not None else None
        return [free.width(), free.height()] if free is not None else []

    def _engine_pid(self) -> int | None:
        built = self.ctx.engine_if_built
        ep = built.endpoint() if built is not None else None
        return ep.pid if ep is not None else None

    def chat(self) -> dict[str, Any]:
        page = self.window.chat_page()
        return {
            "messages": [
                {"role": m.role, "content": m.content, "images": len(m.images)}
                for m in page.view.messages()
            ],
            "streaming": page.chat.streaming,
            "attached": len(page.composer.attachments),
            "title": page.title.text(),
            "model": page.model_label.text(),
            "relaunch": page.relaunch_text(),
            "status": page.status.text(),
            "notice": "" if page.composer.notice.isHidden() else page.composer.notice.text(),
        }

    def _read(self) -> None:
        for line in sys.stdin:
            if self._stop.is_set():
                return
            line = line.strip()
            if not line:
                continue
            try:
                cmd = json.loads(line)
            except json.JSONDecodeError as exc:
                self.send({"event": "error", "cmd": line, "message": f"not JSON: {exc}"})
                continue
            self._command.emit(cmd)

    @Slot(object)
    def _run(self, cmd: Any) -> None:
        name = cmd.get("cmd", "") if isinstance(cmd, dict) else ""
        try:
            extra = self._dispatch(name, cmd)
        except Exception as exc:  # noqa: BLE001 - reported to the test driving the app
            self.send({"event": "error", "cmd": name, "message": f"{type(exc).__name__}: {exc}"})
            return
        self.send({"event": "ok", "cmd": name, **extra})
        if name == "quit":
            app = QApplication.instance()
            self.window.close_choice = self.window.close_choice or "stop"  # nobody to ask
            self.window.close()
            if app is not None:
                app.quit()
        elif name == "close":
            self.window.close_choice = str(cmd.get("engine", "stop"))
            self.window.close()

    def _dispatch(self, name: str, cmd: dict[str, Any]) -> dict[str, Any]:
        if name == "state":
            return self.state()
        if name == "page":
            self.window.show_page(PageKey(str(cmd["name"])))
            return self.state()
        if name == "wizard":
            self.window.open_wizard()
            return self.state()
        if name in ("wizard-next", "wizard-back"):
            wizard = self.window.wizard
            if wizard is None:
                raise RuntimeError("the wizard is not open")
            if name == "wizard-next":
                wizard.next()
            else:
                wizard.back()
            return self.state()
        if name == "grab":
            path = str(cmd["path"])
            if not self.window.grab().save(path):
                raise RuntimeError(f"could not save {path}")
            return {"path": path}
        if name == "models":
            mine = self.window.models_page().mine
            if mine.judgement is None:
                mine.refresh()
                raise RuntimeError("the models are still being read: ask again")
            return {"judged": mine.judgement.subject.describe(), "rows": mine.shown_rows()}
        if name == "errors":
            last = self.ctx.reporter.last
            return {"last": list(last) if last else None}
        if name == "launch":
            from pathlib import Path

            from k3desk.core.app.operations import Operation
            from k3desk.ui.engine.controller import prepare_engine_request

            shard = Path(str(cmd["shard"]))
            mm = cmd.get("mmproj")
            mmproj = Path(str(mm)) if mm else None
            ctx = self.ctx
            op = Operation(
                "prepare-launch", lambda t: prepare_engine_request(ctx, shard, mmproj, t)
            )
            ctx.ops.run(op, on_success=ctx.engine.launch)
            return {}
        if name == "relaunch":
            page = self.window.chat_page()
            if page.relaunch_btn.isHidden():
                raise RuntimeError("no relaunch is offered")
            page.relaunch_btn.click()
            return self.chat()
        if name == "send":
            page = self.window.chat_page()
            if "max_tokens" in cmd:  # bounded answers (a tiny model's random weights)
                import dataclasses

                prompt, settings = page.chat.conversation_settings()
                limit = int(cmd["max_tokens"])
                # repeatable and never empty: random weights may pick an end-of-generation
                # token first, or open a thinking block the answer never leaves
                bounded = dataclasses.replace(
                    settings,
                    max_tokens=limit,
                    thinking=False,
                    seed=1,
                    extra_body={**settings.extra_body, "ignore_eos": True},
                )
                page.chat.update_settings(prompt, bounded)
            page.composer.edit.setPlainText(str(cmd["text"]))
            page.composer.send_btn.click()
            return self.chat()
        if name == "chat":
            return self.chat()
        if name in ("quit", "close"):
            return {}
        if name in ("hub", "download", "layout"):
            return self._journey(name)
        return self._for_real_input(name, cmd)

    def _for_real_input(self, name: str, cmd: dict[str, Any]) -> dict[str, Any]:
        from PySide6.QtWidgets import QMessageBox

        if name == "find":
            return _find(cmd.get("text"), cmd.get("name"))
        if name == "dialog":
            modal = QApplication.activeModalWidget()
            if modal is None:
                return {"open": False}
            found: dict[str, Any] = {"open": True, "title": modal.windowTitle()}
            if isinstance(modal, QMessageBox):
                found["text"] = modal.text()
                found["informative"] = modal.informativeText()
                found["buttons"] = [b.text().replace("&", "") for b in modal.buttons()]
            return found
        if name == "screen":
            path = str(cmd["path"])
            screen = QApplication.primaryScreen()
            if screen is None or not screen.grabWindow(0).save(path):
                raise RuntimeError(f"could not save {path}")
            return {"path": path}
        if name == "wizard-engine":
            wizard = self.window.wizard
            if wizard is None:
                raise RuntimeError("the wizard is not open")
            panel = wizard.engine.panel
            table = panel.engines

            def cell(row: int, col: int) -> str:
                item = table.item(row, col)
                return item.text() if item is not None else ""

            rows = [
                {"path": cell(i, 0), "source": cell(i, 1), "verdict": cell(i, 2),
                 "usable": r.usable}
                for i, r in enumerate(panel.rows)
            ]  # fmt: skip
            return {
                "rows": rows,
                "note": panel.engines_note.text(),
                "building": panel.build.text() == "Cancel build",
                "bar": panel.build_bar.format() if panel.build_bar.isVisible() else "",
                "log": panel.build_log.toPlainText().splitlines()[-6:],
            }
        if name == "picker":
            picker = self.window.chat_page().picker
            shown = picker.currentText()
            room = picker.text_room(picker.width())
            return {
                "choices": picker.choices(),
                "shown": shown,
                "whole": picker.fontMetrics().horizontalAdvance(shown) <= room,
                "room": room,
                "needs": picker.fontMetrics().horizontalAdvance(shown),
                "width": picker.width(),
            }
        if name != "conversations":
            raise ValueError(f"unknown command {name!r}")
        page = self.window.chat_page()
        titles = [page.list.item(i).text() for i in range(page.list.count())]
        current = page.list.currentItem()
        return {"titles": titles, "open": current.text() if current is not None else ""}

    def _journey(self, name: str) -> dict[str, Any]:
        wizard = self.window.wizard
        if name == "hub":
            if wizard is None:
                raise RuntimeError("the wizard is not open")
            box = wizard.tiers.hub
            return {"searching": box.searching, "status": box.status.text(), "rows": box.texts()}
        if name == "download":
            state = self.ctx.downloads.state
            found: dict[str, Any] = {"status": "", "error": "", "target": "", "files": []}
            if state is not None:
                target = state.target
                files = sorted(p.name for p in target.rglob("*.gguf")) if target.is_dir() else []
                found = {"status": state.status, "error": state.error, "target": str(target),
                         "files": files}  # fmt: skip
            if wizard is not None:
                found["projector"] = wizard.download.projector.text()
            return found
        from tests.ui.layout_check import problems  # the tests' own check, on their path

        top = wizard if wizard is not None and wizard.isVisible() else self.window
        return {"problems": problems(top), "size": [top.width(), top.height()]}

    def close(self) -> None:
        self._stop.set()


def _find(text: Any, obj: Any) -> dict[str, Any]:
    """Where a shown button (by its text) or widget (by its object name) is, scrolled
    into view; the open dialog searched first."""
    from PySide6.QtWidgets import QAbstractButton, QWidget

    modal = QApplication.activeModalWidget()
    tops = [modal] if modal is not None else []
    tops += [w for w in QApplication.topLevelWidgets() if w.isVisible() and w is not modal]
    for top in tops:
        for w in [top, *top.findChildren(QWidget)]:
            if not w.isVisible():
                continue
            if obj is not None and w.objectName() != obj:
                continue
            if text is not None and not (
                isinstance(w, QAbstractButton) and w.text().replace("&", "") == text
            ):
                continue
            _reveal(w)
            centre = w.mapToGlobal(w.rect().center())
            hit = QApplication.widgetAt(centre)
            return {
                "x": centre.x(),
                "y": centre.y(),
                "enabled": w.isEnabled(),
                # what a click there reaches: this widget (or a part of it)
                "hit": hit is w or (hit is not None and w.isAncestorOf(hit)),
                "hit_name": f"{type(hit).__name__}({hit.objectName()})" if hit else "",
            }
    raise RuntimeError(f"nothing shown matches {text or obj!r}")


def _reveal(w: Any) -> None:
    """Scroll every scroll area and table ``w`` sits in so that ``w`` is shown."""
    from PySide6.QtWidgets import QAbstractItemView, QScrollArea

    child, parent = w, w.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractItemView) and child is parent.viewport():
            index = parent.indexAt(w.mapTo(child, w.rect().center()))
            if index.isValid():
                parent.scrollTo(index)
        if isinstance(parent, QScrollArea):
            parent.ensureWidgetVisible(w)
        child, parent = parent, parent.parentWidget()
