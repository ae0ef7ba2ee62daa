"""K3's channel markers taken out of streamed text, however the stream is cut.

The raw replies are K3's tagged format as llama.cpp b11434's parser describes it
(common/parsers/kimi-k3.cpp: think / response sections, message closer, <|end_of_msg|>).
"""

from __future__ import annotations

import pytest

from k3desk.core.chat.channels import MARKERS, ChannelSplitter, StopCutter, strip_markers

THINKING = (
    "what is here<|close|>think<|sep|><|open|>response<|sep|>hello world"
    "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
)
OPENED = (
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>a < b, [x]"
    "<|close|>think<|sep|><|open|>response<|sep|>yes<|end_of_msg|>after the end"
)


def run(raw: str, step: int) -> tuple[str, str, int]:
    s = ChannelSplitter()
    out = []
    for i in range(0, len(raw), step):
        out += s.feed(raw[i : i + step])
    out += s.flush()
    content = "".join(t for k, t in out if k == "content")
    reasoning = "".join(t for k, t in out if k == "reasoning")
    return content, reasoning, s.moved_to_reasoning


@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 13, 1000])
def test_a_reply_that_began_inside_think_is_split_at_its_closing_tag(step: int) -> None:
    content, reasoning, moved = run(THINKING, step)
    # streamed as content until </think> showed it was reasoning: the reader moves it
    assert content == "what is herehello world"
    assert moved == len("what is here")
    assert reasoning == ""


@pytest.mark.parametrize("step", [1, 4, 7, 1000])
def test_an_opened_think_section_is_reasoning_and_text_after_the_end_is_dropped(
    step: int,
) -> None:
    content, reasoning, moved = run(OPENED, step)
    assert reasoning == "a < b, [x]"  # "<" and "[" that are no marker stay
    assert content == "yes"
    assert moved == 0


def test_no_marker_survives_and_plain_text_is_untouched() -> None:
    assert strip_markers("<|open|>tools<|sep|>call [EOS] done<|end_of_msg|>") == "call  done"
    assert strip_markers("x <|close| y") == "x <|close| y"  # not a marker: kept at the end
    s = ChannelSplitter()
    assert s.plain("Hello, world")
    assert not s.plain("a <b")
    for m in MARKERS:
        assert m not in strip_markers(f"a{m}b")
    # a tag that never closes (random weights write such things): the marker still goes
    assert strip_markers("a<|open|>b") == "ab"
    assert strip_markers("a<|open|>b<|close|>c") == "abc"
    assert strip_markers("x" + "<|open|>" + "y" * 300) == "x" + "y" * 300


def test_the_reasoning_a_server_separated_itself_only_loses_markers() -> None:
    s = ChannelSplitter()
    assert s.feed("think<|sep|>ing", "reasoning") == [("reasoning", "thinking")]
    assert s.feed("answer", "content") == [("content", "answer")]


@pytest.mark.parametrize("chunks", [["abEN", "Dcd"], ["ab", "E", "N", "Dcd"], ["abEND"]])
def test_a_stop_sequence_cuts_the_answer_even_across_pieces(chunks: list[str]) -> None:
    cut = StopCutter(("END", "STOP"))
    shown = "".join(cut.feed(c) for c in chunks) + cut.flush()
    assert shown == "ab"
    assert cut.stopped


def test_text_that_only_looked_like_a_stop_sequence_is_shown() -> None:
    cut = StopCutter(("END",))
    assert cut.feed("the EN") == "the "
    assert cut.feed("d") == "ENd"
    assert cut.feed(" E") == " "
    assert cut.flush() == "E"
    assert not cut.stopped
