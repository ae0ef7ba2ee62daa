"""What the tuning tests share: this machine as detection describes it, and a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.devtools.tinyk3 import TinyModel


@pytest.fixture
def here(hardware_file: Callable[[str], Path]) -> HardwareProfile:
    """A profile as detect_hardware returns it for this machine (a 12-core laptop's)."""
    hw = HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))
    return replace(hw, source="detected", hostname="desk")


@pytest.fixture
def layout(tiny_k3_single: TinyModel) -> ModelLayout:
    return validate_shard_set(tiny_k3_single.first_part)
