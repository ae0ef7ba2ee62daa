"""Chat Markdown as the user sees it: rendered into a real QTextDocument and read back."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QTextBlockFormat, QTextDocument, QTextTable
from pytestqt.qtbot import QtBot

from k3desk.ui.chat.markdown import MarkdownRenderer, code_blocks
from k3desk.ui.chat.view import MessageView, MessageVM
from tests.ui.test_markdown_oracle import corpus


def document(src: str) -> QTextDocument:
    doc = QTextDocument()
    doc.setHtml(MarkdownRenderer().render(src, lambda i: f"k3:copy-code/m1/{i}")[0])
    return doc


def tables(doc: QTextDocument) -> list[QTextTable]:
    found: list[QTextTable] = []
    stack = [doc.rootFrame()]
    while stack:
        frame = stack.pop()
        if isinstance(frame, QTextTable):
            found.append(frame)
        stack.extend(frame.childFrames())
    return found


def anchors(doc: QTextDocument) -> list[tuple[str, str]]:
    out = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().isAnchor():
                out.append((frag.text(), frag.charFormat().anchorHref()))
            it += 1
        block = block.next()
    return out


def test_a_table_with_escaped_pipes_in_code_is_a_table(qtbot: QtBot) -> None:
    doc = document("| Flag | Meaning |\n|---|---|\n| `a\\|b` | either |\n| `-c` | ctx |\n")
    (table,) = tables(doc)
    assert (table.rows(), table.columns()) == (3, 2)
    assert table.cellAt(1, 0).firstCursorPosition().block().text() == "a|b"


def test_escaped_stars_show_as_stars_not_tags(qtbot: QtBot) -> None:
    assert document("\\*not italic\\*").toPlainText() == "*not italic*"


def test_task_lists_get_checkboxes(qtbot: QtBot) -> None:
    doc = document("- [x] downloaded\n- [ ] verified\n")
    markers = {}
    block = doc.begin()
    while block.isValid():
        markers[block.text()] = block.blockFormat().marker()
        block = block.next()
    assert markers == {
        "downloaded": QTextBlockFormat.MarkerType.Checked,
        "verified": QTextBlockFormat.MarkerType.Unchecked,
    }


def test_copy_gives_exactly_the_code_of_a_block_inside_a_list() -> None:
    src = "1. Build:\n\n   ```bash\n   cmake -B build\n     cmake --build build\n   ```\n"
    html, codes = MarkdownRenderer().render(src, lambda i: f"k3:copy-code/m1/{i}")
    assert codes == ["cmake -B build\n  cmake --build build"]
    assert 'href="k3:copy-code/m1/0"' in html
    assert code_blocks("```\nls -l\n```\n\n    indented\n") == ["ls -l", "indented"]


def test_a_lexer_that_drops_a_last_line_falls_back_to_plain_code(qtbot: QtBot) -> None:
    # Pygments' console lexer keeps a last output line without a newline to itself
    src = "```console\n$ nvidia-smi\nNVIDIA H100 80GB HBM3, 81559 MiB\n```"
    assert "81559 MiB" in document(src).toPlainText()


def test_raw_html_is_shown_as_text_and_never_run(qtbot: QtBot) -> None:
    doc = document("<script>alert(1)</script>\n\ntext <img src=x onerror=alert(1)> more")
    text = doc.toPlainText()
    assert "<script>alert(1)</script>" in text
    assert "<img src=x onerror=alert(1)>" in text


def test_only_web_and_mail_links_are_links(qtbot: QtBot) -> None:
    doc = document(
        "[web](https://example.org) [mail](mailto:a@b.org) [app](k3:regenerate/m1/0) "
        "[js](javascript:alert(1)) [rel](notes.md) www.example.com ![chart](https://x.org/c.png)"
    )
    assert anchors(doc) == [
        ("web", "https://example.org"),
        ("mail", "mailto:a@b.org"),
        ("www.example.com", "http://www.example.com"),
        ("🖼 chart", "https://x.org/c.png"),
    ]


def test_an_unclosed_fence_renders_as_code_while_streaming() -> None:
    html, codes = MarkdownRenderer().render("Here:\n\n```js\nconst a = 1;\nconst b")
    assert codes == ["const a = 1;\nconst b"]
    assert "<pre" in html


def _long_answer() -> str:
    docs = dict(corpus())
    return "\n\n".join(src for name, src in docs.items() if name.startswith("answers_long"))


def test_streaming_renders_every_prefix_as_a_fresh_render_would() -> None:
    text = _long_answer()
    streaming = MarkdownRenderer()
    step = 31
    for end in range(1, len(text) + step, step):
        prefix = text[:end]
        fresh = MarkdownRenderer().render(prefix, lambda i: f"k3:copy-code/m/{i}")
        assert streaming.render(prefix, lambda i: f"k3:copy-code/m/{i}") == fresh, end
    assert streaming.full_parses <= 3  # the rest were parsed from the last block on


def test_a_reference_defined_late_relinks_an_earlier_paragraph() -> None:
    r = MarkdownRenderer()
    first, _ = r.render("See [the card].\n\nMore text.")
    assert "<a " not in first
    second, _ = r.render("See [the card].\n\nMore text.\n\n[the card]: https://hf.co/x")
    assert '<a href="https://hf.co/x">the card</a>' in second


def test_rendering_a_growing_answer_reuses_finished_blocks() -> None:
    r = MarkdownRenderer()
    text = "\n\n".join(f"Paragraph {i} with **bold** text." for i in range(200))
    first, _ = r.render(text)
    cached = len(r._cache)
    second, _ = r.render(text + " more")
    assert second.startswith(first[: len(first) - 200])
    assert len(r._cache) == cached + 1  # only the changed last block was rendered again


@pytest.mark.gui
def test_the_chat_view_copies_code_from_a_nested_list(qtbot: QtBot) -> None:
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QGuiApplication

    view = MessageView()
    qtbot.addWidget(view)
    src = "- step\n  - inner:\n\n    ```python\n    def f():\n        return 1\n    ```\n"
    view.set_messages([MessageVM("a1", "assistant", src)])
    view._anchor(QUrl("k3:copy-code/a1/0"))
    assert QGuiApplication.clipboard().text() == "def f():\n    return 1"


@pytest.mark.gui
def test_a_streamed_answer_shows_what_the_finished_answer_shows(qtbot: QtBot) -> None:
    text = _long_answer()
    streamed = MessageView()
    qtbot.addWidget(streamed)
    streamed.set_messages([MessageVM("u1", "user", "Which tier?")])
    vm = MessageVM("a1", "assistant", streaming=True)
    streamed.begin_stream(vm)
    for end in range(0, len(text), 97):
        vm.content = text[:end]
        streamed.update_stream(vm)
    vm.content = text
    streamed.update_stream(vm)
    vm.streaming = False
    streamed.end_stream(vm)
    finished = MessageView()
    qtbot.addWidget(finished)
    finished.set_messages(
        [MessageVM("u1", "user", "Which tier?"), MessageVM("a1", "assistant", text)]
    )
    assert streamed.toPlainText() == finished.toPlainText()
    assert len(tables(streamed.document())) == len(tables(finished.document()))


@pytest.mark.gui
def test_while_streaming_settled_blocks_are_not_inserted_again(qtbot: QtBot) -> None:
    view = MessageView()
    qtbot.addWidget(view)
    vm = MessageVM("a1", "assistant", streaming=True)
    view.set_messages([MessageVM("u1", "user", "hi")])
    view.begin_stream(vm)
    vm.content = "\n\n".join(f"Paragraph {i} with **bold**." for i in range(50))
    view.update_stream(vm)
    settled = view._frozen_end
    vm.content += " More words"
    view.update_stream(vm)
    assert view._frozen_end == settled  # only the last paragraph and the footer changed
    assert view.toPlainText().count("Paragraph 49 with bold. More words") == 1


@pytest.mark.gui
def test_a_long_command_wraps_in_its_block_instead_of_widening_the_conversation(
    qtbot: QtBot,
) -> None:
    """At a small window's transcript width (about 500 px at 1024x700) a long command in a
    code block wraps inside its frame: the person reads it without scrolling the whole
    conversation sideways, and Copy still gives the command as one line."""
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QGuiApplication

    command = (
        "k3desk serve models/atomicchat-q3ks/Kimi-K3-Q3_K_S-00001-of-00027.gguf "
        "--ctx 8192 --parallel 2"
    )
    view = MessageView()
    qtbot.addWidget(view)
    view.resize(500, 400)
    view.show()
    qtbot.waitExposed(view)
    view.set_messages([MessageVM("a1", "assistant", f"Start it:\n\n```bash\n{command}\n```\n")])
    qtbot.wait(50)
    assert view.horizontalScrollBar().maximum() == 0
    view._anchor(QUrl("k3:copy-code/a1/0"))
    assert QGuiApplication.clipboard().text() == command
