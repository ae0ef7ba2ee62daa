"""Speeds read as numbers, and the machine the person sits at is "this machine"."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from k3desk.core.app.services import Services
from k3desk.core.planning.recommend import recommend
from k3desk.core.units import fmt_tps

REPO = Path(__file__).resolve().parents[3]


def test_speeds_never_in_exponent_form() -> None:
    assert [fmt_tps(v) for v in (6612.0, 13.4, 0.55)] == ["6,600", "13", "0.55"]


def test_a_detected_machine_is_this_machine_not_its_host_name(k3_home: Path) -> None:
    services = Services()
    laptop = services.load_hardware(REPO / "resources/hardware/no-gpu-laptop-32GB.json")
    here = dataclasses.replace(laptop, source="detected", label="", hostname="vm")
    summary = recommend(here, services.catalog_tiers()).summary
    assert "No tier fits in the memory of this machine" in summary
    assert " vm" not in summary
    named = recommend(laptop, services.catalog_tiers()).summary
    assert f"the memory of {laptop.label}" in named  # a hardware file keeps its name
