"""Markdown to the HTML subset QTextBrowser renders, fast enough for live streams.

Block by block: fenced code (highlighted with Pygments when it is installed,
each with a copy link), headings, lists, block quotes, tables, rules and
paragraphs; inline code, bold, italic, strike-through and links.  Rendered
blocks are cached by their text, so re-rendering a growing answer 30 times a
second only does real work for the block that is still changing.  An unclosed
code fence (mid-stream) renders as code up to the end.

No Qt here: the output is a string.
"""

from __future__ import annotations

import html
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

try:  # optional: plain monospace without it
    from pygments import highlight as _pyg_highlight  # type: ignore[import-untyped]
    from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]
    from pygments.lexers import get_lexer_by_name  # type: ignore[import-untyped]
    from pygments.util import ClassNotFound  # type: ignore[import-untyped]

    HAVE_PYGMENTS = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_PYGMENTS = False


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


_FENCE = re.compile(r"^(\s{0,3})(`{3,}|~{3,})\s*([\w+#.-]*)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ULIST = re.compile(r"^(\s*)[-*+]\s+(.*)")
_OLIST = re.compile(r"^(\s*)(\d{1,9})[.)]\s+(.*)")
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")

_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\[([^\]]+)\]\((\S+?)(?:\s+\"[^\"]*\")?\)")
_AUTOLINK = re.compile(r"(?<![\"'=>])\b(https?://[^\s<>\"')\]]+)")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_ITALIC = re.compile(
    r"(?<![*\w])\*(?=\S)(.+?)(?<=\S)\*(?!\*)|(?<![_\w])_(?=\S)(.+?)(?<=\S)_(?![_\w])"
)
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")


def _safe_url(url: str) -> str:
    url = url.strip()
    if re.match(r"^(https?|mailto):", url, re.I):
        return html.escape(url, quote=True)
    return ""


def inline(text: str, colors: CodeColors) -> str:
    """Inline Markdown to HTML (escapes everything else)."""
    codes: list[str] = []

    def keep_code(m: re.Match[str]) -> str:
        codes.append(
            f'<code style="background:{colors.background};">'
            f"{html.escape(m.group(2).strip())}</code>"
        )
        return f"\x00{len(codes) - 1}\x00"

    text = _INLINE_CODE.sub(keep_code, text)
    links: list[str] = []

    def keep_link(m: re.Match[str]) -> str:
        url = _safe_url(m.group(2))
        label = html.escape(m.group(1))
        links.append(f'<a href="{url}">{label}</a>' if url else label)
        return f"\x01{len(links) - 1}\x01"

    text = _LINK.sub(keep_link, text)
    out = html.escape(text, quote=False)
    out = _AUTOLINK.sub(lambda m: f'<a href="{html.escape(m.group(1))}">{m.group(1)}</a>', out)
    out = _BOLD.sub(r"<b>\2</b>", out)
    out = _ITALIC.sub(lambda m: f"<i>{m.group(1) or m.group(2)}</i>", out)
    out = _STRIKE.sub(r"<s>\1</s>", out)
    out = re.sub("\x01(\\d+)\x01", lambda m: links[int(m.group(1))], out)
    return re.sub("\x00(\\d+)\x00", lambda m: codes[int(m.group(1))], out)


# ------------------------------------------------------------------ code


def _pygments_html(code: str, lang: str, colors: CodeColors) -> str | None:
    if not HAVE_PYGMENTS or not lang:
        return None
    try:
        lexer = get_lexer_by_name(lang, stripnl=False)
    except ClassNotFound:
        return None
    formatter = HtmlFormatter(nowrap=True, noclasses=True, style=_style_for(colors))
    return str(_pyg_highlight(code, lexer, formatter))


_STYLE_CACHE: dict[CodeColors, type] = {}


def _style_for(colors: CodeColors) -> type:
    """A Pygments style class built from the theme's code colours."""
    if colors not in _STYLE_CACHE:
        from pygments.style import Style  # type: ignore[import-untyped]
        from pygments.token import Comment, Keyword, Name, Number, Operator, String  # type: ignore[import-untyped]

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
            "K3CodeStyle",
            (Style,),
            {"styles": styles, "background_color": colors.background},
        )
    return _STYLE_CACHE[colors]


def code_block(code: str, lang: str, colors: CodeColors, copy_href: str = "") -> str:
    code = code.rstrip("\n")
    body = _pygments_html(code, lang, colors) or html.escape(code)
    head = html.escape(lang) if lang else "code"
    copy = (
        f' &nbsp;<a href="{copy_href}" style="color:{colors.link}; text-decoration:none;">Copy</a>'
        if copy_href
        else ""
    )
    return (
        f'<table width="100%" cellspacing="0" cellpadding="8" '
        f'style="background:{colors.background}; border:1px solid {colors.border}; '
        f'margin-top:4px; margin-bottom:6px;">'
        f'<tr><td style="color:{colors.muted}; font-size:small;">{head}{copy}</td></tr>'
        f'<tr><td><pre style="margin:0; color:{colors.text};">{body}</pre></td></tr></table>'
    )


# ------------------------------------------------------------------ blocks


@dataclass
class _Block:
    kind: str  # "code", "text"
    text: str
    lang: str = ""
    closed: bool = True


def split_blocks(source: str) -> list[_Block]:
    """Split Markdown into code fences and runs of other lines (separated by blank lines)."""
    blocks: list[_Block] = []
    lines = source.split("\n")
    buf: list[str] = []
    i = 0

    def flush() -> None:
        if buf:
            blocks.append(_Block("text", "\n".join(buf)))
            buf.clear()

    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m:
            flush()
            fence = m.group(2)
            lang = m.group(3).lower()
            code: list[str] = []
            i += 1
            closed = False
            while i < len(lines):
                if (
                    lines[i].strip().startswith(fence[0] * len(fence))
                    and not lines[i].strip(fence[0]).strip()
                ):
                    closed = True
                    break
                code.append(lines[i])
                i += 1
            blocks.append(_Block("code", "\n".join(code), lang, closed))
            i += 1
            continue
        if not line.strip():
            flush()
        else:
            buf.append(line)
        i += 1
    flush()
    return blocks


def _text_block(text: str, colors: CodeColors) -> str:
    lines = text.split("\n")
    out: list[str] = []
    para: list[str] = []
    list_stack: list[str] = []  # "ul"/"ol"

    def end_para() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(s.strip() for s in para), colors)}</p>")
            para.clear()

    def close_lists(depth: int = 0) -> None:
        while len(list_stack) > depth:
            out.append(f"</{list_stack.pop()}>")

    i = 0
    while i < len(lines):
        line = lines[i]
        if _RULE.match(line):
            end_para()
            close_lists()
            out.append("<hr/>")
            i += 1
            continue
        h = _HEADING.match(line)
        if h:
            end_para()
            close_lists()
            level = min(6, len(h.group(1)) + 1)  # h1 is too large inside a chat bubble
            out.append(f"<h{level}>{inline(h.group(2), colors)}</h{level}>")
            i += 1
            continue
        if line.lstrip().startswith(">"):
            end_para()
            close_lists()
            quoted = []
            while i < len(lines) and lines[i].lstrip().startswith(">"):
                quoted.append(lines[i].lstrip()[1:].lstrip())
                i += 1
            inner = _text_block("\n".join(quoted), colors)
            out.append(
                f'<table cellspacing="0" cellpadding="6" style="margin:4px 0;"><tr>'
                f'<td style="background:{colors.border};" width="3"></td>'
                f'<td style="color:{colors.muted};">{inner}</td></tr></table>'
            )
            continue
        if "|" in line and i + 1 < len(lines) and _TABLE_SEP.match(lines[i + 1]):
            end_para()
            close_lists()
            rows = [line]
            i += 2
            while i < len(lines) and "|" in lines[i]:
                rows.append(lines[i])
                i += 1
            out.append(_table(rows, colors))
            continue
        ul, ol = _ULIST.match(line), _OLIST.match(line)
        if ul or ol:
            end_para()
            m = ul or ol
            assert m is not None
            depth = len(m.group(1).replace("\t", "    ")) // 2 + 1
            kind = "ul" if ul else "ol"
            if len(list_stack) < depth:
                while len(list_stack) < depth:
                    start = f' start="{ol.group(2)}"' if ol and ol.group(2) != "1" else ""
                    out.append(f"<{kind}{start}>")
                    list_stack.append(kind)
            else:
                close_lists(depth)
                if list_stack and list_stack[-1] != kind:
                    out.append(f"</{list_stack.pop()}>")
                    out.append(f"<{kind}>")
                    list_stack.append(kind)
            item = m.group(2) if ul else m.group(3)
            # continuation lines (indented, not a new item)
            i += 1
            while (
                i < len(lines)
                and lines[i].startswith(("  ", "\t"))
                and not _ULIST.match(lines[i])
                and not _OLIST.match(lines[i])
            ):
                item += " " + lines[i].strip()
                i += 1
            out.append(f"<li>{inline(item, colors)}</li>")
            continue
        if list_stack and line.startswith(("  ", "\t")):
            out.append(f"<p>{inline(line.strip(), colors)}</p>")
            i += 1
            continue
        close_lists()
        para.append(line)
        i += 1
    end_para()
    close_lists()
    return "".join(out)


def _table(rows: list[str], colors: CodeColors) -> str:
    def cells(row: str) -> list[str]:
        row = row.strip()
        if row.startswith("|"):
            row = row[1:]
        if row.endswith("|"):
            row = row[:-1]
        return [c.strip() for c in row.split("|")]

    head = cells(rows[0])
    parts = [
        f'<table cellspacing="0" cellpadding="5" border="1" '
        f'style="border-collapse:collapse; border-color:{colors.border}; margin:4px 0;"><tr>'
    ]
    parts += [f"<th>{inline(c, colors)}</th>" for c in head]
    parts.append("</tr>")
    for row in rows[1:]:
        parts.append("<tr>" + "".join(f"<td>{inline(c, colors)}</td>" for c in cells(row)))
        parts.append("</tr>")
    parts.append("</table>")
    return "".join(parts)


class MarkdownRenderer:
    """Renders Markdown to HTML, caching each finished block (text or code) by content."""

    def __init__(self, colors: CodeColors | None = None, cache_size: int = 4096) -> None:
        self.colors = colors or CodeColors()
        self._cache: OrderedDict[tuple[str, str, str, bool], str] = OrderedDict()
        self._cache_size = cache_size

    def set_colors(self, colors: CodeColors) -> None:
        if colors != self.colors:
            self.colors = colors
            self._cache.clear()

    def render(
        self, source: str, copy_href: Callable[[int], str] | None = None
    ) -> tuple[str, list[str]]:
        """(HTML, the code of each fenced block in order) for ``source``.

        ``copy_href(i)`` gives the link target of block i's copy link.
        """
        parts: list[str] = []
        codes: list[str] = []
        for block in split_blocks(source):
            if block.kind == "code":
                href = copy_href(len(codes)) if copy_href else ""
                codes.append(block.text)
                key = ("code", block.lang, block.text + "\x00" + href, block.closed)
                html_ = self._cache.get(key)
                if html_ is None:
                    html_ = code_block(block.text, block.lang, self.colors, href)
                    self._remember(key, html_)
                parts.append(html_)
            else:
                key = ("text", "", block.text, True)
                html_ = self._cache.get(key)
                if html_ is None:
                    html_ = _text_block(block.text, self.colors)
                    self._remember(key, html_)
                parts.append(html_)
        return "".join(parts), codes

    def _remember(self, key: tuple[str, str, str, bool], value: str) -> None:
        self._cache[key] = value
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)


def to_plain_markdown_codes(source: str) -> list[str]:
    """The code of each fenced block (for copy links), without rendering."""
    return [b.text for b in split_blocks(source) if b.kind == "code"]
