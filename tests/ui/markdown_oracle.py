"""Normalise rendered HTML to structure, so k3desk's chat HTML can be compared with cmark-gfm's.

Both sides become the same small tree: block tags and their nesting (paragraphs, headings
with their level, lists with start number and task state, quotes, code blocks with
language and exact code, tables with cell alignment, rules), inline marks (strong,
emphasis, strike-through, code, links with their target, line breaks) and text with
runs of white space collapsed.  k3desk's presentation wrappers (a code block is a framed
table, a quote a table with a bar) are read back through their classes; the constructs
in ``QT_EXCEPTIONS`` are mapped the same way on both sides (raw HTML -> a "raw" marker,
an image -> its target and alt text, a link the app does not open -> its text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

import cmarkgfm
from cmarkgfm.cmark import Options

from k3desk.ui.chat.markdown import (
    CODE_CLASS,
    IMAGE_CLASS,
    QUOTE_CLASS,
    RAW_CLASS,
    safe_href,
)

VOID = {"br", "hr", "img", "input", "meta", "link"}
BLOCK_TEXT = {"p", "li", "h", "td", "th", "doc", "quote"}
Norm = tuple[object, ...]


@dataclass
class El:
    tag: str
    attrs: dict[str, str] = field(default_factory=dict)
    children: list[El | str] = field(default_factory=list)

    def cls(self) -> str:
        return self.attrs.get("class", "")


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = El("doc")
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = El(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(el)
        if tag not in VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(El(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)

    def handle_comment(self, data: str) -> None:
        if "raw HTML omitted" in data:
            self.stack[-1].children.append(El("raw"))


def parse(html_text: str) -> El:
    b = _TreeBuilder()
    b.feed(html_text)
    b.close()
    return b.root


def text_of(el: El | str) -> str:
    if isinstance(el, str):
        return el
    return "".join(text_of(c) for c in el.children)


def _canon(el: El, ours: bool) -> list[Norm | str]:
    """The normalised children of ``el``."""
    out: list[Norm | str] = []
    for c in el.children:
        if isinstance(c, str):
            out.append(c)
        else:
            out.extend(_node(c, ours))
    return out


def _node(el: El, ours: bool) -> list[Norm | str]:
    t = el.tag
    cls = el.cls()
    if ours and t == "table" and cls == CODE_CLASS:
        pre = _find(el, "pre")
        assert pre is not None
        return [("code_block", pre.attrs.get("lang", ""), text_of(pre))]
    if ours and t == "table" and cls == QUOTE_CLASS:
        cells = _find_all(el, "td")
        return [("quote", *_finish(_canon(cells[1], ours), True))]
    if ours and cls == RAW_CLASS:
        return [("raw",)]
    if ours and cls == IMAGE_CLASS:
        return [("img", el.attrs.get("href", ""), text_of(el).removeprefix("🖼 "))]
    if t == "raw":
        return [("raw",)]
    if t == "pre":
        code = _find(el, "code")
        text = text_of(code if code is not None else el).removesuffix("\n")
        return [("code_block", el.attrs.get("lang", ""), text)]
    if t == "blockquote":
        return [("quote", *_finish(_canon(el, ours), True))]
    if t == "img":
        return [("img", safe_href(el.attrs.get("src", "")), el.attrs.get("alt", ""))]
    if t == "a":
        href = safe_href(el.attrs.get("href", ""))
        inner = _finish(_canon(el, ours), False)
        return [("a", href, *inner)] if href else inner
    if t in ("strong", "b"):
        return [("b", *_finish(_canon(el, ours), False))]
    if t in ("em", "i"):
        return [("i", *_finish(_canon(el, ours), False))]
    if t in ("del", "s"):
        return [("s", *_finish(_canon(el, ours), False))]
    if t == "code":
        return [("code", text_of(el))]
    if t == "br":
        return [("br",)]
    if t == "hr":
        return [("hr",)]
    if t == "input":  # cmark-gfm's task checkbox; read by the li
        return [("checkbox", "checked" in el.attrs)]
    if re.fullmatch(r"h[1-6]", t):
        return [("h", int(t[1]), *_finish(_canon(el, ours), True))]
    if t == "p":
        return [("p", *_finish(_canon(el, ours), True))]
    if t == "ul":
        return [("ul", *_items(el, ours))]
    if t == "ol":
        return [("ol", int(el.attrs.get("start", "1") or 1), *_items(el, ours))]
    if t == "li":
        return [_item(el, ours)]
    if t == "table":
        rows = [r for r in _find_all(el, "tr")]
        return [("table", *(_row(r, ours) for r in rows))]
    if t in ("thead", "tbody", "span", "div", "section", "sup", "font", "html", "body"):
        return _canon(el, ours)
    if t in ("head", "style"):
        return []
    raise AssertionError(f"unexpected element <{t}> in rendered HTML")


def _items(el: El, ours: bool) -> list[Norm]:
    return [n for n in _canon(el, ours) if not isinstance(n, str)]  # type: ignore[misc]


def _item(el: El, ours: bool) -> Norm:
    kids = _finish(_canon(el, ours), True)
    task: object = None
    if ours and el.cls() in ("checked", "unchecked"):
        task = el.cls() == "checked"
    else:  # cmark-gfm: a checkbox first, in the item or in its first paragraph
        first = kids[0] if kids else None
        if isinstance(first, tuple) and first[0] == "checkbox":
            task, kids = first[1], _finish(list(kids[1:]), True)
        elif isinstance(first, tuple) and first[0] == "p" and len(first) > 1:
            inner = first[1]
            if isinstance(inner, tuple) and inner[0] == "checkbox":
                task = inner[1]
                kids = [("p", *_finish(list(first[2:]), True)), *kids[1:]]
    return ("li", task, *kids)


def _row(tr: El, ours: bool) -> Norm:
    cells = [c for c in tr.children if isinstance(c, El) and c.tag in ("th", "td")]
    return (
        "tr",
        *(
            (c.tag, c.attrs.get("align", ""), *_finish(_canon(c, ours), True))
            for c in cells
        ),
    )


def _find(el: El, tag: str) -> El | None:
    for c in el.children:
        if isinstance(c, El):
            if c.tag == tag:
                return c
            found = _find(c, tag)
            if found is not None:
                return found
    return None


def _find_all(el: El, tag: str) -> list[El]:
    found: list[El] = []
    for c in el.children:
        if isinstance(c, El):
            if c.tag == tag:
                found.append(c)
            else:
                found.extend(_find_all(c, tag))
    return found


def _finish(items: list[Norm | str], block: bool) -> list[Norm | str]:
    """Merge adjacent text, collapse white space; at block level strip the ends."""
    merged: list[Norm | str] = []
    for it in items:
        if isinstance(it, str) and merged and isinstance(merged[-1], str):
            merged[-1] += it
        else:
            merged.append(it)
    out: list[Norm | str] = []
    for i, it in enumerate(merged):
        if isinstance(it, str):
            it = re.sub(r"\s+", " ", it)
            # a line break swallows the white space around it
            if i > 0 and merged[i - 1] == ("br",):
                it = it.lstrip()
            if i + 1 < len(merged) and merged[i + 1] == ("br",):
                it = it.rstrip()
            if not it:
                continue
        out.append(it)
    if block:
        # white space next to a block element (or the container's edge) is not shown
        result: list[Norm | str] = []
        for i, it in enumerate(out):
            if isinstance(it, str):
                prev_block = i == 0 or _is_block(out[i - 1])
                next_block = i == len(out) - 1 or _is_block(out[i + 1])
                if prev_block:
                    it = it.lstrip()
                if next_block:
                    it = it.rstrip()
                if not it:
                    continue
            result.append(it)
        out = result
    return out


def _is_block(n: Norm | str) -> bool:
    return isinstance(n, tuple) and n[0] in (
        "p", "h", "ul", "ol", "li", "quote", "code_block", "hr", "table", "raw", "br",
        "checkbox",
    )  # fmt: skip


def normalise(html_text: str, *, ours: bool) -> Norm:
    return ("doc", *_finish(_canon(parse(html_text), ours), True))


def cmark_html(source: str) -> str:
    """GitHub's renderer: cmark-gfm with its GFM extensions, raw HTML omitted."""
    return cmarkgfm.github_flavored_markdown_to_html(source, options=Options.CMARK_OPT_DEFAULT)
