"""The chat's Markdown against GitHub's own renderer, cmark-gfm, on a corpus of documents.

Each document in ``tests/ui/markdown_corpus/*.md`` (separated by ``%%% name`` lines) is
rendered by k3desk and by cmark-gfm (the ``cmarkgfm`` bindings, GFM extensions on) and
both are normalised to structure (``markdown_oracle``).  They must agree on every one;
what Qt cannot show as a browser does is mapped on both sides as ``QT_EXCEPTIONS`` says.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from k3desk.ui.chat.markdown import QT_EXCEPTIONS, MarkdownRenderer
from tests.ui.markdown_oracle import cmark_html, normalise

CORPUS = Path(__file__).with_name("markdown_corpus")


def corpus() -> list[tuple[str, str]]:
    docs: list[tuple[str, str]] = []
    for path in sorted(CORPUS.glob("*.md")):
        name, lines = "", []
        for line in [*path.read_text(encoding="utf-8").split("\n"), "%%% end"]:
            if line.startswith("%%% "):
                if name:
                    docs.append((f"{path.stem}: {name}", "\n".join(lines).strip("\n") + "\n"))
                name, lines = line[4:].strip(), []
            else:
                lines.append(line)
    return docs


def test_the_corpus_covers_what_answers_contain() -> None:
    docs = corpus()
    assert len(docs) >= 200
    text = "\n".join(src for _name, src in docs)
    for construct in ("| --- |", "`\\|`", "- [x]", "~~", "www.", "<div>", "$$", "```python",
                      "<think>", "\\*", "&copy;", "> >", "1)"):  # fmt: skip
        assert construct in text, construct
    assert sum(len(src) > 300 for _n, src in docs) >= 12  # long, real-style answers


def test_every_document_has_the_structure_cmark_gfm_gives_it() -> None:
    renderer = MarkdownRenderer()
    failures = []
    for name, src in corpus():
        ours = normalise(renderer.render(src, lambda i: f"k3:copy-code/m/{i}")[0], ours=True)
        theirs = normalise(cmark_html(src), ours=False)
        if ours != theirs:
            failures.append(f"{name}\n  k3desk: {ours}\n  cmark:  {theirs}")
    assert not failures, f"{len(failures)} of {len(corpus())} differ:\n" + "\n".join(failures)


@pytest.mark.parametrize("construct", [c for c, _ in QT_EXCEPTIONS])
def test_each_exception_says_what_the_user_sees_instead(construct: str) -> None:
    seen = dict(QT_EXCEPTIONS)[construct]
    assert len(seen.split()) >= 5
