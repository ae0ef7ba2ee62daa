"""Markdown as GitHub renders it, to the HTML subset QTextBrowser shows; fast while streaming.

Parsing is markdown-it-py's CommonMark parser with the GFM extensions GitHub's
cmark-gfm has (tables, strike-through with one or two tildes, task lists, bare
``www.``/``https://``/e-mail autolinks: mdit-py-plugins' ``gfm_autolink``, adjusted
in :mod:`k3desk.ui.chat.autolink`).
``tests/ui/test_markdown_oracle.py`` checks the structure against cmark-gfm itself on a
corpus; :data:`QT_EXCEPTIONS` lists what is shown differently and why.

The output is what Qt's rich text understands: code blocks are framed tables with a
language label and a Copy link, highlighted with Pygments; block quotes are tables with
a bar; raw HTML is shown as text, never interpreted; links open outside the app only
for http(s) and mailto targets.

Streaming: a document is split into its top-level blocks.  When the new text extends
the text rendered last (a growing answer), only the last block and what follows it
are parsed again, and every block's HTML is cached by its source, so 30 updates a
second only do real work for the block that is still changing.  An unclosed code
fence renders as code up to the end, as CommonMark says.

No Qt here: the output is a string.
"""

from __future__ import annotations

import html
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight as _pyg_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.style import Style
from pygments.token import Comment, Keyword, Name, Number, Operator, String
from pygments.util import ClassNotFound

from k3desk.ui.chat.autolink import use_gfm_autolinks

# Where the HTML differs from GitHub's because Qt's rich text (or the app's safety)
# cannot show the construct as a browser does: (construct, what the user sees instead).
QT_EXCEPTIONS: tuple[tuple[str, str], ...] = (
    (
        "raw HTML (blocks and inline tags)",
        "the HTML source as text; GitHub interprets a safe subset of it, k3desk never "
        "interprets HTML from an answer",
    ),
    (
        "images ![alt](url)",
        "a link '🖼 alt' that opens the image outside the app; the chat loads nothing "
        "from the network by itself",
    ),
    (
        "links to anything but http(s):// and mailto: (relative paths, file:, k3:, "
        "javascript: ...)",
        "the link's text without a link: there is nothing outside the app to open, and an "
        "answer must not reach the app's own k3: actions",
    ),
)

# Heading sizes inside a chat message (a browser's h1 is too large there).
HEADING_SIZES = {1: "x-large", 2: "large", 3: "medium", 4: "medium", 5: "small", 6: "small"}
SAFE_SCHEMES = ("http://", "https://", "mailto:")

# classes on the wrappers Qt shows in place of GitHub's elements (Qt ignores them; the
# oracle test reads them back)
CODE_CLASS, QUOTE_CLASS, RAW_CLASS, IMAGE_CLASS = "k3-code", "k3-quote", "k3-raw", "k3-image"


@dataclass(frozen=True)
class CodeColors:
    """Colours for highlighted code, chosen by the theme."""

    background: str = "#f4f5f7"
    text: str = "#1f2328"
    keyword: str = "#7c3aed"
    string: str = "#0f766e"
    comment: str = "#6b7280"
    number: str = "#b45309"
    name: str = "#1d4ed8"
    link: str = "#4338ca"
    muted: str = "#667085"
    border: str = "#d8dce3"


def make_parser() -> MarkdownIt:
    """CommonMark plus the GFM extensions cmark-gfm has (the GFM spec's, no footnotes).

    Raw HTML is recognised (so block structure is GitHub's) and then shown as text.
    Every link target is accepted by the parser, as cmark-gfm does; :func:`safe_href`
    decides at render time which ones become links.
    """
    md = MarkdownIt("commonmark", {"html": True})
    md.enable(["table", "strikethrough"])
    md.options["tasklists"] = True  # markdown-it-py >= 4.1 (see mdit_py_plugins.gfm)
    md.options["strikethrough_single_tilde"] = True
    use_gfm_autolinks(md)
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    return md


def safe_href(url: str) -> str:
    """``url`` when the app may open it outside (http, https, mailto), else ''."""
    url = url.strip()
    return url if url.lower().startswith(SAFE_SCHEMES) else ""


# ------------------------------------------------------------------ code


_STYLE_CACHE: dict[CodeColors, type[Style]] = {}


def _style_for(colors: CodeColors) -> type[Style]:
    """A Pygments style class built from the theme's code colours."""
    if colors not in _STYLE_CACHE:
        styles = {
            Comment: f"italic {colors.comment}",
            Keyword: f"bold {colors.keyword}",
            Keyword.Constant: colors.keyword,
            Name.Builtin: colors.name,
            Name.Function: colors.name,
            Name.Class: f"bold {colors.name}",
            Name.Decorator: colors.name,
            String: colors.string,
            Number: colors.number,
            Operator.Word: colors.keyword,
        }
        _STYLE_CACHE[colors] = type(
            "K3CodeStyle", (Style,), {"styles": styles, "background_color": colors.background}
        )
    return _STYLE_CACHE[colors]


def _highlighted(code: str, lang: str, colors: CodeColors) -> str | None:
    """Pygments' HTML for ``code``, or None (unknown language, or a lexer that would not
    show the code exactly: some drop a last line without a newline)."""
    if not lang:
        return None
    try:
        lexer = get_lexer_by_name(lang, stripnl=False)
    except ClassNotFound:
        return None
    formatter = HtmlFormatter(nowrap=True, noclasses=True, style=_style_for(colors))
    out = str(_pyg_highlight(code + "\n", lexer, formatter)).removesuffix("\n")
    if html.unescape(_TAG.sub("", out)) != code:
        return None
    return out


_TAG = re.compile(r"<[^>]*>")


def code_block(code: str, lang: str, colors: CodeColors, copy_href: str = "") -> str:
    """A framed code block: language label, Copy link, highlighted code."""
    body = _highlighted(code, lang, colors) or html.escape(code)
    head = html.escape(lang) if lang else "code"
    copy = (
        f' &nbsp;<a href="{copy_href}" style="color:{colors.link}; text-decoration:none;">Copy</a>'
        if copy_href
        else ""
    )
    lang_attr = f' lang="{html.escape(lang)}"' if lang else ""
    return (
        f'<table class="{CODE_CLASS}" width="100%" cellspacing="0" cellpadding="8" '
        f'style="background:{colors.background}; border:1px solid {colors.border}; '
        f'margin-top:4px; margin-bottom:6px;">'
        f'<tr><td style="color:{colors.muted}; font-size:small;">{head}{copy}</td></tr>'
        # pre-wrap: a long line wraps inside the frame, not the whole conversation
        # scrolled sideways on a small window; Copy gives the code's own lines
        f'<tr><td><pre{lang_attr} style="margin:0; white-space:pre-wrap; '
        f'color:{colors.text};">{body}</pre>'
        f"</td></tr></table>"
    )


# ------------------------------------------------------------------ tokens to HTML


class _HtmlWriter:
    """Walks markdown-it tokens of one top-level block and writes Qt's HTML subset."""

    def __init__(
        self, colors: CodeColors, copy_href: Callable[[int], str] | None, first_code: int
    ) -> None:
        self.colors = colors
        self.copy_href = copy_href
        self.codes: list[str] = []
        self.first_code = first_code
        self.out: list[str] = []

    def blocks(self, tokens: Sequence[Token]) -> str:
        c = self.colors
        out = self.out
        for tok in tokens:
            t = tok.type
            if t == "inline":
                out.append(self.inline(tok.children or []))
            elif t == "paragraph_open":
                if not tok.hidden:
                    out.append("<p>")
            elif t == "paragraph_close":
                if not tok.hidden:
                    out.append("</p>")
            elif t == "heading_open":
                level = int(tok.tag[1])
                out.append(f'<{tok.tag} style="font-size:{HEADING_SIZES[level]};">')
            elif t == "heading_close":
                out.append(f"</{tok.tag}>")
            elif t == "bullet_list_open":
                out.append("<ul>")
            elif t == "ordered_list_open":
                start = tok.attrs.get("start")
                out.append(f'<ol start="{int(start)}">' if start is not None else "<ol>")
            elif t in ("bullet_list_close", "ordered_list_close"):
                out.append(f"</{tok.tag}>")
            elif t == "list_item_open":
                checked = tok.meta.get("checked") if tok.meta else None
                if checked is None:
                    out.append("<li>")
                else:  # Qt draws a checkbox for these (QTextBlockFormat.MarkerType)
                    out.append(f'<li class="{"checked" if checked else "unchecked"}">')
            elif t == "list_item_close":
                out.append("</li>")
            elif t == "blockquote_open":
                out.append(
                    f'<table class="{QUOTE_CLASS}" cellspacing="0" cellpadding="6" '
                    f'style="margin:4px 0;"><tr>'
                    f'<td style="background:{c.border};" width="3"></td>'
                    f'<td style="color:{c.muted};">'
                )
            elif t == "blockquote_close":
                out.append("</td></tr></table>")
            elif t in ("fence", "code_block"):
                self.code(tok)
            elif t == "hr":
                out.append("<hr/>")
            elif t == "html_block":
                text = html.escape(tok.content.rstrip("\n")).replace("\n", "<br/>")
                out.append(
                    f'<p class="{RAW_CLASS}" style="color:{c.muted}; font-family:monospace;">'
                    f"{text}</p>"
                )
            elif t == "table_open":
                out.append(
                    f'<table cellspacing="0" cellpadding="5" border="1" '
                    f'style="border-collapse:collapse; border-color:{c.border}; margin:4px 0;">'
                )
            elif t in ("table_close", "tr_open", "tr_close", "th_close", "td_close"):
                out.append(f"<{'/' if t.endswith('close') else ''}{tok.tag}>")
            elif t in ("th_open", "td_open"):
                style = str(tok.attrs.get("style", ""))
                align = style.removeprefix("text-align:") if style else ""
                out.append(f'<{tok.tag} align="{align}">' if align else f"<{tok.tag}>")
            # thead/tbody: Qt needs neither
        return "".join(out)

    def code(self, tok: Token) -> None:
        code = tok.content.removesuffix("\n")
        lang = tok.info.strip().split(maxsplit=1)[0] if tok.info.strip() else ""
        index = self.first_code + len(self.codes)
        self.codes.append(code)
        href = self.copy_href(index) if self.copy_href else ""
        self.out.append(code_block(code, lang, self.colors, href))

    def inline(self, children: Sequence[Token]) -> str:
        c = self.colors
        out: list[str] = []
        links: list[bool] = []  # per open link: was an <a> written
        for tok in children:
            t = tok.type
            if t == "text":
                out.append(html.escape(tok.content, quote=False))
            elif t == "softbreak":
                out.append("\n")
            elif t == "hardbreak":
                out.append("<br/>")
            elif t == "code_inline":
                out.append(
                    f'<code style="background:{c.background};">'
                    f"{html.escape(tok.content, quote=False)}</code>"
                )
            elif t in ("em_open", "strong_open", "s_open"):
                out.append({"em_open": "<i>", "strong_open": "<b>", "s_open": "<s>"}[t])
            elif t in ("em_close", "strong_close", "s_close"):
                out.append({"em_close": "</i>", "strong_close": "</b>", "s_close": "</s>"}[t])
            elif t == "link_open":
                href = safe_href(str(tok.attrs.get("href", "")))
                links.append(bool(href))
                if href:
                    out.append(f'<a href="{html.escape(href, quote=True)}">')
            elif t == "link_close":
                if links and links.pop():
                    out.append("</a>")
            elif t == "image":
                alt = html.escape(_plain(tok.children or []), quote=False)
                src = safe_href(str(tok.attrs.get("src", "")))
                if src:
                    out.append(
                        f'<a class="{IMAGE_CLASS}" href="{html.escape(src, quote=True)}">'
                        f"🖼 {alt}</a>"
                    )
                else:
                    out.append(f'<span class="{IMAGE_CLASS}">🖼 {alt}</span>')
            elif t == "html_inline":
                out.append(
                    f'<span class="{RAW_CLASS}" style="color:{c.muted};">'
                    f"{html.escape(tok.content, quote=False)}</span>"
                )
        return "".join(out)


def _plain(children: Sequence[Token]) -> str:
    """The text of inline tokens (an image's alt text is its label's plain text)."""
    parts: list[str] = []
    for tok in children:
        if tok.type in ("text", "code_inline", "html_inline"):
            parts.append(tok.content)
        elif tok.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif tok.type == "image":
            parts.append(_plain(tok.children or []))
    return "".join(parts)


# ------------------------------------------------------------------ blocks


@dataclass
class _Block:
    """One top-level block: its source lines and tokens."""

    start: int  # first source line (0-based)
    end: int  # one past its last line
    tokens: list[Token]
    source: str = ""
    refs: tuple[tuple[str, str, str], ...] = ()


@dataclass
class _Parsed:
    source: str
    lines: list[str]
    blocks: list[_Block]
    refs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderedBlock:
    """A top-level block's HTML and the code of its fenced blocks (in order)."""

    key: tuple[object, ...]
    html: str
    codes: tuple[str, ...]


def _split(tokens: list[Token], offset: int) -> list[_Block]:
    """Group tokens into top-level blocks (level 0 open...close), lines shifted by offset."""
    blocks: list[_Block] = []
    depth = 0
    current: list[Token] = []
    start = 0
    for tok in tokens:
        if depth == 0:
            current = []
            start = tok.map[0] if tok.map else 0
        current.append(tok)
        depth += tok.nesting
        if depth == 0:
            end = next((t.map[1] for t in current if t.map), start + 1)
            blocks.append(_Block(start + offset, end + offset, current))
    return blocks


def _refs_key(refs: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        sorted((k, str(v.get("href", "")), str(v.get("title", ""))) for k, v in refs.items())
    )


class MarkdownRenderer:
    """Renders Markdown to HTML, caching each top-level block's HTML by its source."""

    def __init__(self, colors: CodeColors | None = None, cache_size: int = 4096) -> None:
        self.colors = colors or CodeColors()
        self.md = make_parser()
        self._cache: OrderedDict[tuple[object, ...], RenderedBlock] = OrderedDict()
        self._cache_size = cache_size
        self._last: _Parsed | None = None
        self.full_parses = 0  # how often a whole document was parsed (the bench reads it)

    def set_colors(self, colors: CodeColors) -> None:
        if colors != self.colors:
            self.colors = colors
            self._cache.clear()

    # -------------------------------------------------------------- parsing
    def _parse(self, source: str) -> _Parsed:
        last = self._last
        lines = source.split("\n")
        if last is not None and last.blocks and source.startswith(last.source):
            # a growing text: blocks before the last one are closed, parse from there on
            restart = last.blocks[-1].start
            kept = last.blocks[:-1]
            env: dict[str, Any] = {
                "references": {
                    k: v for k, v in last.refs.items() if v.get("map", [0])[0] < restart
                }
            }
            tokens = self.md.parse("\n".join(lines[restart:]), env)
            blocks = kept + _split(tokens, restart)
            refs = env.get("references", {})
            if _refs_key(refs) != _refs_key(last.refs) and kept:
                # a new link reference definition can change any earlier paragraph
                return self._parse_all(source, lines)
        else:
            return self._parse_all(source, lines)
        parsed = _Parsed(source, lines, blocks, refs)
        self._finish(parsed)
        return parsed

    def _parse_all(self, source: str, lines: list[str]) -> _Parsed:
        env: dict[str, Any] = {}
        tokens = self.md.parse(source, env)
        self.full_parses += 1
        parsed = _Parsed(source, lines, _split(tokens, 0), env.get("references", {}))
        self._finish(parsed)
        return parsed

    def _finish(self, parsed: _Parsed) -> None:
        refs = _refs_key(parsed.refs)
        for b in parsed.blocks:
            if not b.source:
                b.source = "\n".join(parsed.lines[b.start : b.end])
                b.refs = refs
        self._last = parsed

    # -------------------------------------------------------------- rendering
    def render_blocks(
        self, source: str, copy_href: Callable[[int], str] | None = None
    ) -> list[RenderedBlock]:
        """Each top-level block of ``source`` rendered (cached by source, code index, links)."""
        parsed = self._parse(source)
        out: list[RenderedBlock] = []
        n_codes = 0
        for b in parsed.blocks:
            href0 = copy_href(n_codes) if copy_href else ""
            key = (b.source, b.refs, n_codes, href0, b.tokens[0].type)
            done = self._cache.get(key)
            if done is None:
                writer = _HtmlWriter(self.colors, copy_href, n_codes)
                done = RenderedBlock(key, writer.blocks(b.tokens), tuple(writer.codes))
                self._cache[key] = done
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
            n_codes += len(done.codes)
            out.append(done)
        return out

    def render(
        self, source: str, copy_href: Callable[[int], str] | None = None
    ) -> tuple[str, list[str]]:
        """(HTML, the code of each fenced or indented block in order) for ``source``.

        ``copy_href(i)`` gives the link target of block i's copy link.
        """
        blocks = self.render_blocks(source, copy_href)
        return "".join(b.html for b in blocks), [code for b in blocks for code in b.codes]


def code_blocks(source: str) -> list[str]:
    """The code of each code block of ``source``, exactly as a Copy link copies it."""
    return MarkdownRenderer().render(source)[1]
