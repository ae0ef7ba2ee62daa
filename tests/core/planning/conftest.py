"""Planning test helpers: the shipped hardware files and layouts of the catalog's tiers.

``machine("8xH100-2TB")`` reads ``resources/hardware/8xH100-2TB.json``;
``twin_layout("grearl-iq1s")`` validates the tier's sparse twin (real headers),
``estimated("grearl-iq1s")`` is the catalog estimate used before download.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from k3desk.core.catalog.loader import Catalog
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.estimate import estimate_layout

Machine = Callable[[str], HardwareProfile]
Layout = Callable[[str], ModelLayout]


@pytest.fixture
def machine(hardware_file: Callable[[str], Path]) -> Machine:
    def get(name: str) -> HardwareProfile:
        return HardwareProfile.from_json_file(hardware_file(name))

    return get


@pytest.fixture(scope="session")
def _twin_layouts() -> dict[str, ModelLayout]:
    return {}


@pytest.fixture
def twin_layout(
    twin_factory: Callable[[str], list[Path]], _twin_layouts: dict[str, ModelLayout]
) -> Layout:
    def get(tier_id: str) -> ModelLayout:
        if tier_id not in _twin_layouts:
            _twin_layouts[tier_id] = validate_shard_set(twin_factory(tier_id)[0])
        return _twin_layouts[tier_id]

    return get


@pytest.fixture
def estimated(twin_catalog: Catalog) -> Layout:
    def get(tier_id: str) -> ModelLayout:
        return estimate_layout(twin_catalog.get(tier_id))

    return get
