"""The message view: one QTextBrowser showing a conversation as generated HTML.

Each message is rendered once to HTML (Markdown, highlighted code with copy
links, images as thumbnails, K3 reasoning in a collapsible block).  Only the
last :attr:`MessageView.page_size` messages are laid out; a link at the top shows
earlier ones, so a 10,000-message conversation opens as fast as a short one.
While an answer streams, only its own HTML (from a remembered document
position to the end) is replaced on each batch.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QRect, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QCursor,
    QDesktopServices,
    QGuiApplication,
    QImage,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import QTextBrowser, QTextEdit, QToolTip, QWidget

from k3desk.core.app.cells import (
    NO_TEXT_NOTE,
    ONLY_REASONING_NOTE,
    no_text,
    only_reasoning,
    reasoning_title,
)
from k3desk.ui import theme
from k3desk.ui.chat.markdown import CodeColors, MarkdownRenderer

LIVE_REASONING_CHARS = 1500  # how much of a still-thinking answer's reasoning is shown


@dataclass
class ImageVM:
    key: str  # unique resource key (e.g. sha256)
    name: str
    thumb: QImage | None = None


@dataclass
class MessageVM:
    """What the view needs to draw one message."""

    id: str
    role: str  # "user" / "assistant" / "system"
    content: str = ""
    reasoning: str = ""
    images: list[ImageVM] = field(default_factory=list)
    partial: bool = False  # cut short (stopped, or the engine died)
    partial_note: str = ""
    streaming: bool = False
    branch: tuple[int, int] = (1, 1)  # (this one, of how many siblings)
    stats: str = ""  # e.g. "42.1 tok/s · 512 tokens"
    error: str = ""


def _colors() -> CodeColors:
    c = theme.current()
    if c.dark:
        return CodeColors(
            background=c.code_bg,
            text=c.text,
            keyword="#c4b5fd",
            string="#5eead4",
            comment="#8b93a1",
            number="#fbbf24",
            name="#93c5fd",
            link=c.link,
            muted=c.muted,
            border=c.border,
        )
    return CodeColors(
        background=c.code_bg, text=c.text, link=c.link, muted=c.muted, border=c.border
    )


class MessageView(QTextBrowser):
    """Signals:
    action(str, str, int): (verb, message id, argument) for "copy", "copy-code", "edit",
        "regenerate", "branch" (argument -1/+1), "reasoning" (toggle), "earlier".
    """

    action = Signal(str, str, int)

    def __init__(self, parent: QWidget | None = None, page_size: int = 150) -> None:
        super().__init__(parent)
        self.setObjectName("messageView")
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._anchor)
        self.page_size = page_size
        self.renderer = MarkdownRenderer(_colors())
        self._messages: list[MessageVM] = []
        self._shown_from = 0
        self._expanded: set[str] = set()
        self._codes: dict[str, list[str]] = {}
        self._html_cache: dict[str, tuple[tuple[object, ...], str]] = {}
        self._stream_pos: int | None = None
        self._frozen: list[object] = []  # keys of the streaming message's settled parts
        self._frozen_end = 0  # the document position after them
        self._empty_html = ""
        self.last_render_s = 0.0
        self.document().setDocumentMargin(18)

    # ------------------------------------------------------------ content
    def set_empty_text(self, text: str, links: tuple[tuple[str, str], ...] = ()) -> None:
        """Show ``text`` while there are no messages; ``links`` are (title, page key)
        pairs shown under it that emit ``action("page", key, 0)`` when clicked."""
        c = theme.current()
        more = "&nbsp;&nbsp;·&nbsp;&nbsp;".join(
            f'<a href="k3:page/{html.escape(key)}/0">{html.escape(title)}</a>'
            for title, key in links
        )
        more = f"<br/><br/>{more}" if more else ""
        self._empty_html = (
            f'<div align="center" style="color:{c.muted}; font-size:large;">'
            f"<br/><br/><br/>{html.escape(text)}{more}</div>"
        )
        if not self._messages:
            self.setHtml(self._empty_html)

    def set_messages(self, messages: list[MessageVM], keep_scroll: bool = False) -> None:
        """Show ``messages`` (the last :attr:`page_size` of them)."""
        self._messages = list(messages)
        self._shown_from = max(0, len(messages) - self.page_size)
        self._rebuild(keep_scroll)

    def messages(self) -> list[MessageVM]:
        return list(self._messages)

    def restyle(self) -> None:
        """Render every shown message again (the theme changed)."""
        self._rebuild(keep_scroll=True)

    def show_earlier(self) -> None:
        self._shown_from = max(0, self._shown_from - self.page_size)
        self._rebuild(keep_scroll=False)
        self.verticalScrollBar().setValue(0)

    def update_message(self, vm: MessageVM) -> None:
        """Redraw one message (e.g. after its reasoning was toggled)."""
        for i, m in enumerate(self._messages):
            if m.id == vm.id:
                self._messages[i] = vm
        self._rebuild(keep_scroll=True)

    def _rebuild(self, keep_scroll: bool) -> None:
        t0 = time.perf_counter()
        self.renderer.set_colors(_colors())
        bar = self.verticalScrollBar()
        pos = bar.value()
        if not self._messages:
            self._stream_pos = None
            self.setHtml(self._empty_html)
            return
        parts = [self._document_head()]
        if self._shown_from > 0:
            c = theme.current()
            parts.append(
                f'<p align="center"><a href="k3:earlier/-/0" style="color:{c.link};">'
                f"Show earlier messages ({self._shown_from} more)</a></p>"
            )
        streaming = self._messages[-1].streaming
        shown = self._messages[self._shown_from :]
        body = shown[:-1] if streaming else shown
        for m in body:
            parts.append(self._message_html(m))
        self.setHtml("".join(parts))
        self._stream_pos = None
        if streaming:
            self.begin_stream(self._messages[-1], replace_last=False)
        if keep_scroll:
            bar.setValue(pos)
        else:
            bar.setValue(bar.maximum())
        self.last_render_s = time.perf_counter() - t0

    # ---------------------------------------------------------- streaming
    def begin_stream(self, vm: MessageVM, replace_last: bool = True) -> None:
        """Start showing ``vm`` (an answer being generated) at the end."""
        if self._stream_pos is not None and self._messages and self._messages[-1].id == vm.id:
            self.update_stream(vm)
            return
        if replace_last and self._messages and self._messages[-1].id == vm.id:
            self._messages[-1] = vm
        elif replace_last:
            self._messages.append(vm)
            if not self._stream_pos and len(self._messages) == 1:
                self.setHtml(self._document_head())
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if cursor.block().length() > 1:  # start the answer in a block of its own
            cursor.insertBlock()
        self._stream_pos = cursor.position()
        self._frozen, self._frozen_end = [], self._stream_pos
        self.update_stream(vm)

    def update_stream(self, vm: MessageVM) -> None:
        """Show ``vm``'s new text (fast path, 30 Hz).

        Parts of the message that can no longer change (the header, and every Markdown
        block but the last) are inserted once and then left alone; each update only
        replaces what follows them, so a 20,000-token answer costs what its last
        block costs.
        """
        if self._stream_pos is None:
            self.begin_stream(vm)
            return
        t0 = time.perf_counter()
        self._messages[-1] = vm
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        parts = self._message_parts(vm)
        # the last Markdown block and the footer may still change while streaming
        live_from = max(1, len(parts) - 2) if vm.streaming else len(parts)
        n = len(self._frozen)
        if self._frozen != [k for k, _h in parts[:n]]:
            self._frozen, self._frozen_end, n = [], self._stream_pos, 0
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._frozen_end)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.beginEditBlock()
        cursor.removeSelectedText()
        freeze = parts[n:live_from]
        if freeze:
            self._new_block(cursor)
            cursor.insertHtml("".join(h for _k, h in freeze))
            self._frozen += [k for k, _h in freeze]
            self._frozen_end = cursor.position()
        live = parts[max(n, live_from) :]
        if live:
            self._new_block(cursor)
            cursor.insertHtml("".join(h for _k, h in live))
        cursor.endEditBlock()
        if at_bottom:
            bar.setValue(bar.maximum())
        self.last_render_s = time.perf_counter() - t0

    @staticmethod
    def _new_block(cursor: QTextCursor) -> None:
        """Start a fresh, plain block unless the cursor's block is empty (so inserted HTML
        never merges into the text, list or heading before it)."""
        if cursor.block().length() > 1:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())

    def end_stream(self, vm: MessageVM) -> None:
        vm.streaming = False
        self.update_stream(vm)
        self._stream_pos = None

    # ------------------------------------------------------------- render
    def _document_head(self) -> str:
        c = theme.current()
        return (
            f"<html><head><style>"
            f"a {{ color: {c.link}; }}"
            f"pre {{ font-family: monospace; }}"
            f"code {{ font-family: monospace; }}"
            f"h2, h3, h4 {{ margin-top: 10px; margin-bottom: 4px; }}"
            f"p {{ margin-top: 4px; margin-bottom: 6px; }}"
            f"</style></head><body style='color:{c.text};'>"
        )

    def _message_html(self, m: MessageVM) -> str:
        key = (
            m.role,
            m.content,
            m.reasoning,
            m.partial,
            m.partial_note,
            m.streaming,
            m.branch,
            m.stats,
            m.error,
            m.id in self._expanded,
            tuple(i.key for i in m.images),
            theme.current(),
        )
        cached = self._html_cache.get(m.id)
        if cached is not None and cached[0] == key:
            return cached[1]
        out = self._render_message(m)
        self._html_cache[m.id] = (key, out)
        return out

    def _render_message(self, m: MessageVM) -> str:
        return "".join(h for _k, h in self._message_parts(m))

    def _message_parts(self, m: MessageVM) -> list[tuple[object, str]]:
        """``m`` as (key, HTML) parts: the header, each top-level Markdown block, the
        footer.  A part whose key is unchanged has unchanged HTML (streaming uses it)."""
        c = theme.current()
        mid = html.escape(m.id)
        who = {"user": "You", "assistant": "Kimi-K3", "system": "System prompt"}.get(m.role, m.role)
        color = c.accent if m.role == "user" else c.ok if m.role == "assistant" else c.muted
        links: list[str] = []
        if not m.streaming:
            links.append(f'<a href="k3:copy/{mid}/0">Copy</a>')
            if m.role == "user":
                links.append(f'<a href="k3:edit/{mid}/0">Edit</a>')
            if m.role == "assistant":
                links.append(f'<a href="k3:regenerate/{mid}/0">Regenerate</a>')
        if m.branch[1] > 1:
            prev_ = f'<a href="k3:branch/{mid}/-1">‹</a>' if m.branch[0] > 1 else "<span>‹</span>"
            next_ = (
                f'<a href="k3:branch/{mid}/1">›</a>'
                if m.branch[0] < m.branch[1]
                else "<span>›</span>"
            )
            links.append(f"{prev_} {m.branch[0]}/{m.branch[1]} {next_}")
        meta = " &nbsp;·&nbsp; ".join(links)
        stats = (
            f' &nbsp;<span style="color:{c.muted};">{html.escape(m.stats)}</span>'
            if m.stats
            else ""
        )
        head = [
            f'<a name="msg-{mid}"></a>'
            f'<p style="margin-top:14px; margin-bottom:2px;"><b style="color:{color};">{who}</b>'
            f'{stats} &nbsp;&nbsp;<span style="font-size:small;">{meta}</span></p>'
        ]
        if m.reasoning:
            head.append(self._reasoning_html(m))
        if m.images:
            imgs = " ".join(
                f'<img src="k3img:{html.escape(i.key)}" height="96" title="{html.escape(i.name)}"/>'
                for i in m.images
            )
            head.append(f"<p>{imgs}</p>")
        head_key = (
            "head", m.role, m.id, m.reasoning, m.streaming and not m.content, m.stats,
            m.branch, m.streaming, m.id in self._expanded, tuple(i.key for i in m.images),
        )  # fmt: skip
        parts: list[tuple[object, str]] = [(head_key, "".join(head))]
        if m.role == "system":
            text = f'<p style="color:{c.muted};"><i>{html.escape(m.content)}</i></p>'
            parts.append((("system", m.content), text))
        elif m.content:
            blocks = self.renderer.render_blocks(m.content, lambda i: f"k3:copy-code/{mid}/{i}")
            self._codes[m.id] = [code for b in blocks for code in b.codes]
            parts += [(b.key, b.html) for b in blocks]
        tail: list[str] = []
        if m.role == "assistant" and only_reasoning(m.content, m.reasoning, m.streaming):
            note = html.escape(ONLY_REASONING_NOTE)
            tail.append(f'<p style="color:{c.muted};"><i>{note}</i></p>')
        ended = m.role == "assistant" and not m.partial and not m.error
        if ended and no_text(m.content, m.reasoning, m.streaming):
            tail.append(f'<p style="color:{c.muted};"><i>{html.escape(NO_TEXT_NOTE)}</i></p>')
        if m.streaming and not m.content and not m.reasoning:
            tail.append(f'<p style="color:{c.muted};"><i>Waiting for the first token…</i></p>')
        if m.streaming:
            tail.append(f'<p style="color:{c.muted};">▍</p>')
        if m.partial:
            note = m.partial_note or "The answer was cut short."
            tail.append(
                f'<p style="color:{c.warn};"><i>⚠ Partial answer: {html.escape(note)}</i></p>'
            )
        if m.error:
            tail.append(f'<p style="color:{c.danger};">{html.escape(m.error)}</p>')
        tail_key = (
            "tail", m.streaming, m.partial, m.partial_note, m.error, bool(m.content.strip()),
            bool(m.reasoning.strip()),
        )  # fmt: skip
        parts.append((tail_key, "".join(tail)))
        return parts

    def _reasoning_html(self, m: MessageVM) -> str:
        c = theme.current()
        mid = html.escape(m.id)
        thinking = m.streaming and not m.content
        # while the answer so far is all reasoning, the reasoning is what is shown
        # streaming (its latest part), so the answer never looks empty
        # an answer that is only reasoning shows it open: else its body is empty
        alone = only_reasoning(m.content, m.reasoning, m.streaming)
        open_ = (m.id in self._expanded) != alone or thinking
        arrow = "▾" if open_ else "▸"
        head = (
            f'<a href="k3:reasoning/{mid}/0" style="color:{c.muted}; text-decoration:none;">'
            f"{arrow} {html.escape(reasoning_title(m.reasoning, thinking))}</a>"
        )
        if not open_:
            return f'<p style="margin:2px 0;">{head}</p>'
        text = m.reasoning
        if thinking and m.id not in self._expanded and len(text) > LIVE_REASONING_CHARS:
            text = "…" + text[-LIVE_REASONING_CHARS:]
        body = html.escape(text).replace("\n", "<br/>")
        return (
            f'<table width="100%" cellspacing="0" cellpadding="8" '
            f'style="background:{c.reasoning_bg}; margin:2px 0 6px 0;">'
            f'<tr><td>{head}<br/><span style="color:{c.muted};">{body}</span></td></tr></table>'
        )

    # ------------------------------------------------------------- images
    def add_image(self, key: str, image: QImage) -> None:
        self.document().addResource(
            QTextDocument.ResourceType.ImageResource.value, QUrl(f"k3img:{key}"), image
        )

    # -------------------------------------------------------------- links
    def highlight(self, words: list[str], message_id: str = "") -> int:
        """Mark every occurrence of ``words`` and scroll to the first one in the message
        ``message_id`` (else the first one at all); no words: clear the marks.  Returns
        how many places were marked."""
        marks: list[QTextEdit.ExtraSelection] = []
        fmt = QTextCharFormat()
        c = theme.current()
        fmt.setBackground(QColor(c.mark))
        fmt.setForeground(QColor(c.mark_text))
        doc = self.document()
        for w in words:
            cursor = doc.find(w, 0)
            while not cursor.isNull():
                sel = QTextEdit.ExtraSelection()
                sel.cursor = cursor
                sel.format = fmt
                marks.append(sel)
                cursor = doc.find(w, cursor)
        self.setExtraSelections(marks)
        if not marks:
            return 0
        target = marks[0].cursor
        if message_id:
            start = self._message_start(message_id)
            if start is not None:
                after = [m.cursor for m in marks if m.cursor.position() >= start]
                target = min(after, key=lambda cur: cur.position()) if after else target
        shown = QTextCursor(target)
        shown.clearSelection()
        self.setTextCursor(shown)
        self.ensureCursorVisible()
        return len(marks)

    def marked(self) -> list[str]:
        """The texts :meth:`highlight` marked."""
        return [sel.cursor.selectedText() for sel in self.extraSelections()]

    def _message_start(self, message_id: str) -> int | None:
        """Where message ``message_id`` begins in the document (its anchor), if shown."""
        block = self.document().begin()
        name = f"msg-{message_id}"
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                frag = it.fragment()
                if frag.isValid() and name in frag.charFormat().anchorNames():
                    return frag.position()
                it += 1
            block = block.next()
        return None

    def code_blocks(self, message_id: str) -> list[str]:
        return list(self._codes.get(message_id, []))

    def toggle_reasoning(self, message_id: str) -> None:
        if message_id in self._expanded:
            self._expanded.discard(message_id)
        else:
            self._expanded.add(message_id)
        if self._messages and self._messages[-1].id == message_id and self._stream_pos is not None:
            self.update_stream(self._messages[-1])
        else:
            self._rebuild(keep_scroll=True)

    def _copied(self, text: str) -> None:
        """Say so where the person clicked (a tooltip that fades after 1.5 s)."""
        QToolTip.showText(QCursor.pos(), text, self.viewport(), QRect(), 1500)

    def _anchor(self, url: QUrl) -> None:
        text = url.toString()
        if not text.startswith("k3:"):
            QDesktopServices.openUrl(url)
            return
        verb, _, rest = text[3:].partition("/")
        mid, _, arg = rest.rpartition("/")
        n = int(arg) if arg.lstrip("-").isdigit() else 0
        if verb == "earlier":
            self.show_earlier()
        elif verb == "reasoning":
            self.toggle_reasoning(mid)
        elif verb == "copy-code":
            codes = self._codes.get(mid, [])
            if 0 <= n < len(codes):
                QGuiApplication.clipboard().setText(codes[n])
                self._copied("Copied the code")
        elif verb == "copy":
            vm = next((m for m in self._messages if m.id == mid), None)
            if vm is not None:  # an answer that is only reasoning: its reasoning
                QGuiApplication.clipboard().setText(vm.content or vm.reasoning)
                self._copied("Copied" if vm.content else "Copied the reasoning")
        self.action.emit(verb, mid, n)
