"""K3's channel markers and control tokens, taken out of text a server returns inline.

Kimi-K3 writes its answer in tagged sections (llama.cpp b11434
``common/parsers/kimi-k3.cpp``; ``models/templates/Kimi-K3.jinja``)::

    <|open|>TAG attrs<|sep|> ... <|close|>TAG<|sep|>      TAG: message, think, response, tools, ...
    assistant := [think] [response] [tools] <|close|>message<|sep|> <|end_of_msg|>

The generation prompt already opens ``think`` (or ``response`` without thinking), so raw
output usually starts inside a section.  llama-server parses this itself; a server that
does not (the SparkInfer bridge's content when its own extraction misses, a vLLM
without a reasoning parser, a plain completion server) hands the markers through.
:class:`ChannelSplitter` turns such a stream back into reasoning and content and drops
every marker, holding back only the few characters that could be the start of one.

:class:`StopCutter` cuts content at a stop sequence, for servers that take none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["content", "reasoning"]

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
END_OF_MSG = "<|end_of_msg|>"
# the tokenizer's other control tokens (CONTROL in the K3 GGUF vocabulary)
CONTROL_TOKENS = (END_OF_MSG, "<|kimi_image_placeholder|>", "[EOS]", "[BOS]", "[PAD]", "[UNK]")
MARKERS = (OPEN, CLOSE, SEP, *CONTROL_TOKENS)
REASONING_TAGS = ("think",)
MAX_HEADER = 256  # a tag header longer than this is not a header: show it as text


def _partial_marker_at_end(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a marker."""
    best = 0
    for m in MARKERS:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


@dataclass
class ChannelSplitter:
    """Feed text as it arrives; get (kind, text) pieces without any K3 marker."""

    kind: Kind = "content"
    ended: bool = False  # <|end_of_msg|> or </message> seen: the rest is not the answer
    seen_marker: bool = False
    # how many characters of content, from the start, were reasoning after all (a closing
    # think tag came before any opening one); the reader moves them
    moved_to_reasoning: int = 0
    _buf: str = ""
    _header: str | None = None  # inside <|open|>... or <|close|>... until <|sep|>
    _closing: bool = False
    _implicit: bool = True  # no opening tag seen yet: the prompt opened the section
    _pending: int = 0  # characters of content shown while _implicit

    def plain(self, text: str) -> bool:
        """Whether ``text`` (content) can be shown as it is: no marker in it or pending.
        The fast path of a stream from a server that parses K3's format itself."""
        if self._buf or self._header is not None or self.ended or self.kind != "content":
            return False
        if "<" in text or "[" in text:
            return False
        if self._implicit:
            self._pending += len(text)
        return True

    def feed(self, text: str, kind: Kind = "content") -> list[tuple[Kind, str]]:
        """Pieces of ``text`` (which the server labelled ``kind``) ready to show."""
        if kind == "reasoning" and not self.seen_marker and not self._buf:
            # the server separated reasoning itself: only drop markers in it
            return [("reasoning", t)] if (t := strip_markers(text)) else []
        if not self._buf and self._header is None and "<" not in text and "[" not in text:
            if self.ended:
                return []
            return self._emit(self.kind if kind == "content" else kind, text)
        self._buf += text
        return self._drain(final=False)

    def flush(self) -> list[tuple[Kind, str]]:
        """What is left at the end of the answer (a held-back partial marker is text)."""
        out = self._drain(final=True)
        if self._header is not None:  # a tag that never closed: its words are text
            tail, self._header = self._header, None
            out += self._emit(self.kind, tail)
        return out

    def _emit(self, kind: Kind, text: str) -> list[tuple[Kind, str]]:
        if not text or self.ended:
            return []
        if kind == "content" and self._implicit:
            self._pending += len(text)
        return [(kind, text)]

    def _drain(self, *, final: bool) -> list[tuple[Kind, str]]:
        out: list[tuple[Kind, str]] = []
        while self._buf:
            if self._header is not None:
                j = self._buf.find(SEP)
                k, other = _first_marker(self._buf)
                if other is not None and other != SEP and k < (j if j >= 0 else len(self._buf)):
                    # another marker before <|sep|>: this was no tag; its words are text
                    out += self._emit(self.kind, self._header + self._buf[:k])
                    self._header = None
                    self._buf = self._buf[k:]
                    continue
                if j < 0:
                    keep = 0 if final else _partial_marker_at_end(self._buf)
                    self._header += self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep :]
                    if len(self._header) > MAX_HEADER or final:
                        # too long for a tag header: the marker goes, the words are text
                        out += self._emit(self.kind, self._header)
                        self._header = None
                        continue
                    break
                self._header += self._buf[:j]
                self._buf = self._buf[j + len(SEP) :]
                out += self._section(self._header.strip(), closing=self._closing)
                self._header = None
                continue
            i, marker = _first_marker(self._buf)
            if marker is None:
                keep = 0 if final else _partial_marker_at_end(self._buf)
                text = self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
                out += self._emit(self.kind, text)
                break
            out += self._emit(self.kind, self._buf[:i])
            self._buf = self._buf[i + len(marker) :]
            self.seen_marker = True
            if marker in (OPEN, CLOSE):
                self._header = ""
                self._closing = marker == CLOSE
            elif marker == END_OF_MSG:
                self.ended = True
            # a lone <|sep|> or another control token: dropped
        return out

    def _section(self, header: str, *, closing: bool) -> list[tuple[Kind, str]]:
        tag = header.split(" ", 1)[0]
        out: list[tuple[Kind, str]] = []
        if closing:
            if tag in REASONING_TAGS:
                if self._implicit and self._pending:
                    # the prompt had opened <think>: what came so far was reasoning
                    self.moved_to_reasoning += self._pending
                self._implicit = False
                self._pending = 0
                self.kind = "content"
            elif tag == "message":
                self.ended = True
            else:
                self._implicit = False
                self._pending = 0
            return out
        self._implicit = False
        self._pending = 0
        if tag in REASONING_TAGS:
            self.kind = "reasoning"
        elif tag != "message":
            self.kind = "content"
        return out


def _first_marker(text: str) -> tuple[int, str | None]:
    best, found = len(text), None
    for m in MARKERS:
        i = text.find(m)
        if 0 <= i < best:
            best, found = i, m
    return best, found


def strip_markers(text: str) -> str:
    """``text`` without any K3 marker or control token (tag headers included)."""
    if "<|" not in text and "[" not in text:
        return text
    s = ChannelSplitter()
    return "".join(t for _k, t in [*s.feed(text), *s.flush()])


@dataclass
class StopCutter:
    """Cuts content at the first stop sequence (for servers that take none)."""

    stops: tuple[str, ...]
    stopped: bool = False
    _held: str = ""

    def feed(self, text: str) -> str:
        if self.stopped or not self.stops:
            return "" if self.stopped else text
        buf = self._held + text
        cut = min((i for s in self.stops if (i := buf.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held


__all__ = ["CONTROL_TOKENS", "MARKERS", "ChannelSplitter", "StopCutter", "strip_markers"]
