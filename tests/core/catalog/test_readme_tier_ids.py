"""Every tier id the README and the docs name is one the catalog has: a reader copies them
into ``k3desk download`` and looks for them in ``k3desk tiers``."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# a Markdown link to a file of this repository (not to the web)
LINK = re.compile(r"\]\((?!https?:|mailto:)([^)\s]+)\)")
# catalog ids: <maker>-<quant>[-<variant>...], e.g. grearl-iq1s, 6block-iq1s-xxs-832e
TIER_ID = re.compile(r"\b[a-z0-9]+(?:-ud)?-(?:iq|q)[0-9][a-z0-9_]*(?:-[a-z0-9]+)*\b")


DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_tier_id_the_readme_and_docs_name_is_in_the_catalog() -> None:
    catalog = json.loads((REPO / "resources" / "catalog.json").read_text(encoding="utf-8"))
    known = {t["id"] for t in catalog["tiers"]}
    for doc in DOCUMENTS:
        named = set(TIER_ID.findall(doc.read_text(encoding="utf-8")))
        unknown = sorted(named - known)
        assert not unknown, f"named in {doc.relative_to(REPO)}, not in the catalog: {unknown}"
    readme = set(TIER_ID.findall((REPO / "README.md").read_text(encoding="utf-8")))
    assert readme, "the README names no tier id: the pattern no longer matches the catalog's"


def test_every_link_between_the_readme_and_docs_leads_somewhere() -> None:
    """A newcomer follows the README's links into docs/ and back: each relative link names a
    file that exists (anchors aside)."""
    broken = []
    for doc in DOCUMENTS:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if path and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not broken, "links to nothing: " + ", ".join(broken)
