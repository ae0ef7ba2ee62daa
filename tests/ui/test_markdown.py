"""Markdown rendering for chat messages."""

from __future__ import annotations

from k3desk.ui.chat.markdown import MarkdownRenderer


def test_code_blocks_get_copy_links_and_their_code_is_returned() -> None:
    src = "Use this:\n\n```python\nprint('hi')\n```\n\nand\n\n```\nls -l\n```"
    html, codes = MarkdownRenderer().render(src, lambda i: f"k3:copy-code/m1/{i}")
    assert codes == ["print('hi')", "ls -l"]
    assert 'href="k3:copy-code/m1/0"' in html
    assert 'href="k3:copy-code/m1/1"' in html
    assert "<pre" in html


def test_an_unclosed_fence_renders_as_code_while_streaming() -> None:
    html, codes = MarkdownRenderer().render("Here:\n\n```js\nconst a = 1;\nconst b")
    assert codes == ["const a = 1;\nconst b"]
    assert "<pre" in html


def test_html_in_messages_is_escaped_not_executed() -> None:
    html, _ = MarkdownRenderer().render("<script>alert(1)</script> [x](javascript:alert(1))")
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    assert "javascript:" not in html


def test_inline_markup_lists_tables_and_links() -> None:
    src = (
        "# Title\n**bold** *it* ~~gone~~ `x<y` see https://example.org\n\n"
        "- a\n- b\n  - c\n\n1. one\n2. two\n\n| k | v |\n|---|---|\n| 1 | 2 |"
    )
    html, _ = MarkdownRenderer().render(src)
    for piece in (
        "<h2>Title</h2>",
        "<b>bold</b>",
        "<i>it</i>",
        "<s>gone</s>",
        "x&lt;y",
        '<a href="https://example.org">',
        "<ul><li>a</li><li>b</li><ul><li>c</li></ul></ul>",
        "<ol><li>one</li><li>two</li></ol>",
        "<th>k</th>",
        "<td>2</td>",
    ):
        assert piece in html, piece


def test_rendering_a_growing_answer_reuses_finished_blocks() -> None:
    r = MarkdownRenderer()
    text = "\n\n".join(f"Paragraph {i} with **bold** text." for i in range(200))
    first, _ = r.render(text)
    cached = len(r._cache)
    second, _ = r.render(text + " more")
    assert second.startswith(first[: len(first) - 200])
    assert len(r._cache) == cached + 1  # only the changed last block was rendered again
