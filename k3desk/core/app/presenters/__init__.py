"""Presenters: a row of the app's data -> the cells a table shows (text, tooltip, tone).

Plain Python, so what a person reads in a table is decided (and tested) without Qt;
a widget only writes the cells and maps each :data:`Tone` to its theme's colour.

=====================================  ==========================================
table                                  module
=====================================  ==========================================
the Cluster page's nodes               :mod:`.cluster_nodes`
a cluster engine: verdict, plan, ranks :mod:`.cluster_engine`
the published tiers                    :mod:`.tiers`
My models                              :mod:`.my_models`
the downloads                          :mod:`.downloads`
the attached servers                   :mod:`.endpoints`
=====================================  ==========================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Tone = Literal["ok", "warn", "danger"]  # the theme's colours of a verdict


@dataclass(frozen=True)
class Cell:
    """One table cell: its text, its tooltip (None: the text itself), its tone."""

    text: str
    tip: str | None = None
    tone: Tone | None = None

    @property
    def tooltip(self) -> str:
        return self.text if self.tip is None else self.tip
