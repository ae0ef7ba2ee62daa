"""GFM's extended autolinks where mdit-py-plugins' ``gfm_autolink`` differs from cmark-gfm.

The plugin handles ``www.`` links as cmark-gfm does.  Two cases follow cmark-gfm's
``extensions/autolink.c`` (0.29.0.gfm) here instead:

- ``scheme://`` links: the scheme is the run of letters before ``:`` (``http``,
  ``https`` or ``ftp``, any case) and may follow any character (``<http://a.b>``
  with a space inside still links ``http://a.b``); the plugin asks for white space or
  ``*_~(`` before it.
- bare e-mail addresses are found in the finished text (cmark-gfm's
  ``postprocess_text``), so a local part with ``_`` (an emphasis delimiter while
  parsing) is whole: ``a.b-c_d@a.b``.
"""

from __future__ import annotations

import unicodedata

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token
from mdit_py_plugins.gfm_autolink import gfm_autolink_plugin

SCHEMES = ("http", "https", "ftp")


def use_gfm_autolinks(md: MarkdownIt) -> None:
    md.use(gfm_autolink_plugin)
    md.inline.ruler.at("gfm_autolink_protocol", _scheme_rule)
    md.inline.ruler.disable("gfm_autolink_email")
    md.core.ruler.push("k3_email_autolinks", _email_core_rule)


def _hostchar(ch: str) -> bool:
    return not ch.isspace() and not unicodedata.category(ch).startswith("P")


def check_domain(data: str, allow_short: bool) -> int | None:
    """Length of the domain at the start of ``data`` (autolink.c ``check_domain``)."""
    np = uscore1 = uscore2 = 0
    for i, ch in enumerate(data):
        if ch == "_":
            uscore2 += 1
        elif ch == ".":
            uscore1, uscore2 = uscore2, 0
            np += 1
        elif not _hostchar(ch) and ch != "-":
            if uscore1 == 0 and uscore2 == 0 and (allow_short or np > 0):
                return i
            return None
    if uscore1 > 0 or uscore2 > 0:
        return None
    return len(data) if allow_short or np > 0 else None


def autolink_delim(data: str, end: int) -> int:
    """Trim trailing punctuation, unbalanced ``)`` and entity-like ``&x;`` (autolink_delim)."""
    lt = data.find("<", 0, end)
    if lt >= 0:
        end = lt
    while end > 0:
        c = data[end - 1]
        if c in "?!.,:*_~'\"":
            end -= 1
        elif c == ";":
            i = end - 2
            while i > 0 and data[i].isalpha():
                i -= 1
            end = i if i < end - 2 and data[i] == "&" else end - 1
        elif c == ")":
            if data[:end].count(")") <= data[:end].count("("):
                break
            end -= 1
        else:
            break
    return end


def _scheme_rule(state: StateInline, silent: bool) -> bool:
    if state.linkLevel > 0 or state.src[state.pos] != ":":
        return False
    pending = state.pending
    i = len(pending)
    while i > 0 and pending[i - 1].isascii() and pending[i - 1].isalpha():
        i -= 1
    scheme = pending[i:]
    if scheme.lower() not in SCHEMES:
        return False
    rest = state.src[state.pos : state.posMax]
    if not rest.startswith("://"):
        return False
    dom = check_domain(rest[3:], True)
    if dom is None:
        return False
    end = 3 + dom
    while end < len(rest) and not rest[end].isspace():
        end += 1
    text = scheme + rest
    end = autolink_delim(text, len(scheme) + end)
    if end <= len(scheme) + 3 or silent:
        return False
    url = text[:end]
    state.pending = pending[:i]
    _push_link(state, url, url)
    state.pos += end - len(scheme)
    return True


def _push_link(state: StateInline, href: str, label: str) -> None:
    tok = state.push("link_open", "a", 1)
    tok.attrs = {"href": state.md.normalizeLink(href)}
    tok.markup, tok.info = "autolink", "auto"
    tok = state.push("text", "", 0)
    tok.content = state.md.normalizeLinkText(label)
    tok = state.push("link_close", "a", -1)
    tok.markup, tok.info = "autolink", "auto"


def find_email(text: str, start: int = 0) -> tuple[int, int] | None:
    """(start, end) of the first e-mail address in ``text`` from ``start`` (postprocess_text)."""
    at = text.find("@", start)
    while at >= 0:
        b = at
        while b > start and (
            text[b - 1].isascii() and (text[b - 1].isalnum() or text[b - 1] in ".+-_")
        ):
            b -= 1
        if b < at:
            e = at + 1
            periods = 0
            while e < len(text):
                c = text[e]
                if (c.isascii() and c.isalnum()) or c in "-_":
                    pass
                elif c == "." and e + 1 < len(text) and text[e + 1].isascii() and (
                    text[e + 1].isalnum()
                ):
                    periods += 1
                else:
                    break
                e += 1
            last = text[e - 1]
            if e - at > 2 and periods and ((last.isascii() and last.isalpha()) or last == "."):
                end = b + autolink_delim(text[b:e], e - b)
                if end > at + 1:
                    return b, end
        at = text.find("@", at + 1)
    return None


def _email_core_rule(state: StateCore) -> None:
    for block in state.tokens:
        if block.type != "inline" or not block.children or "@" not in block.content:
            continue
        out: list[Token] = []
        depth = 0
        for tok in block.children:
            if tok.type == "link_open":
                depth += 1
            elif tok.type == "link_close":
                depth -= 1
            if tok.type != "text" or depth > 0 or "@" not in tok.content:
                out.append(tok)
                continue
            text, pos = tok.content, 0
            while (found := find_email(text, pos)) is not None:
                b, e = found
                if text[max(pos, b - 7) : b].lower() == "mailto:":
                    b -= 7  # "mailto:a@b.c" links as a whole
                if b > pos:
                    out.append(_text(text[pos:b], tok.level))
                address = text[b:e]
                href = address if address.lower().startswith("mailto:") else "mailto:" + address
                link = Token("link_open", "a", 1, level=tok.level)
                link.attrs = {"href": state.md.normalizeLink(href)}
                link.markup, link.info = "autolink", "auto"
                out += [link, _text(address, tok.level + 1), Token("link_close", "a", -1)]
                pos = e
            if pos < len(text):
                out.append(_text(text[pos:], tok.level))
        block.children = out


def _text(content: str, level: int) -> Token:
    tok = Token("text", "", 0, level=level)
    tok.content = content
    return tok
