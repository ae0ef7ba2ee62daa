"""Every tier id the README names is one the catalog has: a reader copies them into
``k3desk download --tier`` and ``k3desk tiers``."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# catalog ids: <maker>-<quant>[-<variant>...], e.g. grearl-iq1s, 6block-iq1s-xxs-832e
TIER_ID = re.compile(r"\b[a-z0-9]+(?:-ud)?-(?:iq|q)[0-9][a-z0-9_]*(?:-[a-z0-9]+)*\b")


def test_every_tier_id_the_readme_names_is_in_the_catalog() -> None:
    catalog = json.loads((REPO / "resources" / "catalog.json").read_text(encoding="utf-8"))
    known = {t["id"] for t in catalog["tiers"]}
    named = set(TIER_ID.findall((REPO / "README.md").read_text(encoding="utf-8")))
    assert named, "the README names no tier id: the pattern no longer matches the catalog's"
    assert named <= known, f"named in the README, not in the catalog: {sorted(named - known)}"
