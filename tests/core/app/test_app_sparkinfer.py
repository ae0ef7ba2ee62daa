"""Configuring a SparkInfer launch: one use-case for both shells."""

from __future__ import annotations

import pytest

from k3desk.core.app.sparkinfer_launch import SparkInferRequest, configure_sparkinfer
from k3desk.core.cluster.nodes import Cluster, ClusterError, Node
from k3desk.core.cluster.recipe import DEFAULT_PROFILE, PROFILES
from k3desk.core.cluster.sparkinfer import DEFAULT_BRIDGE, SparkInferConfig

SPARKS = Cluster("sparks", tuple(Node(f"10.0.0.{11 + i}", model_path="/m") for i in range(3)))


@pytest.mark.parametrize(("profile", "said"), [("bogus", "'bogus'"), ("  ", "No profile chosen")])
def test_a_profile_the_recipe_lacks_is_an_error_not_a_fallback(profile: str, said: str) -> None:
    with pytest.raises(ClusterError) as err:
        configure_sparkinfer(SPARKS, SparkInferRequest(profile=profile))
    assert said in err.value.message
    for name in PROFILES:
        assert name in err.value.hint


def test_defaults_are_the_recipes_and_a_request_overrides_them() -> None:
    cfg = configure_sparkinfer(SPARKS, SparkInferRequest(profile=DEFAULT_PROFILE))
    assert cfg == SparkInferConfig(SPARKS)
    assert cfg.bridge_argv == DEFAULT_BRIDGE
    other = next(p for p in PROFILES if p != DEFAULT_PROFILE)
    cfg = configure_sparkinfer(
        SPARKS,
        SparkInferRequest(profile=other, max_ctx=4096, coord_port=30000, tokenizer_dir=" /t "),
    )
    assert (cfg.profile, cfg.max_ctx, cfg.coord_port, cfg.tokenizer_dir) == (
        other,
        4096,
        30000,
        "/t",
    )
    assert cfg.recipe_profile is PROFILES[other]
