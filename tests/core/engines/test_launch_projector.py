"""A wrong file given as the vision projector is named before any engine starts.

Without this check llama-server fails on it with "the model file is not a GGUF
file", which sends the user to re-download shards that are fine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from k3desk.core.engines.launch import prepare_launch
from k3desk.core.errors import ValidationError
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.planning.model import PlanOptions
from k3desk.devtools.tinyk3 import TinyModel


@pytest.fixture
def laptop(hardware_file: Callable[[str], Path]) -> HardwareProfile:
    return HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))


def prepare(model: TinyModel, mmproj: Path | None, engine: Path, hw: HardwareProfile) -> object:
    return prepare_launch(
        model.first_part,
        mmproj=mmproj,
        hardware=hw,
        options=PlanOptions(ctx=1024),
        paths=default_paths(),
        engine=engine,
    )


def test_a_projector_that_is_not_gguf_is_named_with_what_to_do(
    fake_engine: Callable[..., Path], tiny_k3: TinyModel, laptop: HardwareProfile, tmp_path: Path
) -> None:
    page = tmp_path / "mmproj-F16.gguf"
    page.write_text("<html>Access denied</html>")
    with pytest.raises(ValidationError) as err:
        prepare(tiny_k3, page, fake_engine("serve"), laptop)
    assert f"The vision projector {page} cannot be used" in err.value.message
    assert "not a GGUF file" in err.value.message
    assert "mmproj-*.gguf" in err.value.hint


def test_a_model_shard_given_as_projector_is_refused(
    fake_engine: Callable[..., Path], tiny_k3: TinyModel, laptop: HardwareProfile
) -> None:
    with pytest.raises(ValidationError) as err:
        prepare(tiny_k3, tiny_k3.first_part, fake_engine("serve"), laptop)
    assert f"{tiny_k3.first_part} is not a vision projector" in err.value.message
    assert "'kimi-k3' model file" in err.value.message
    with pytest.raises(ValidationError, match="a part of a split model"):
        prepare(tiny_k3, tiny_k3.parts[1], fake_engine("serve"), laptop)


def test_the_real_projector_is_accepted(
    fake_engine: Callable[..., Path], tiny_k3: TinyModel, laptop: HardwareProfile
) -> None:
    assert tiny_k3.mmproj is not None
    prepared = prepare(tiny_k3, tiny_k3.mmproj, fake_engine("serve"), laptop)
    assert "--mmproj" in prepared.plan.server_args  # type: ignore[attr-defined]


def test_a_k3_projector_the_engine_does_not_know_is_refused_with_the_fork_to_build(
    llama_server: Path, fake_engine: Callable[..., Path], tiny_k3: TinyModel,
    laptop: HardwareProfile, tmp_path: Path,
) -> None:  # fmt: skip
    """Upstream b11434 takes the LLaVA test projector but not Kimi-K3's ('kimik3', the type of
    the unsloth fork's MoonViT): refused before a launch that would die loading it."""
    from k3desk.core.engines.canary import write_mlp_projector
    from k3desk.core.errors import EngineError

    k3_proj = write_mlp_projector(tmp_path / "mmproj-BF16.gguf", 64, projector_type="kimik3")
    with pytest.raises(EngineError) as err:
        prepare(tiny_k3, k3_proj, llama_server, laptop)
    assert "does not know the 'kimik3' vision projector" in err.value.message
    assert "`k3desk engine install --source unsloth`" in err.value.hint
    # an engine that knows it (as the fork does) starts with it
    fork = fake_engine("serve", FAKE_PROJECTOR_TYPES="mlp,kimik3")
    prepared = prepare(tiny_k3, k3_proj, fork, laptop)
    assert "--mmproj" in prepared.plan.server_args  # type: ignore[attr-defined]
