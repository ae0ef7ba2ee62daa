"""Use-case: configure a SparkInfer launch across DGX Sparks.

Both shells build a :class:`SparkInferRequest` from what was asked (flags, or the
Cluster page's fields) and get the :class:`~k3desk.core.cluster.sparkinfer.SparkInferConfig`
from :func:`configure_sparkinfer`.  A profile the recipe does not have is an error
here, in words, for both shells alike: nobody falls back to another profile
behind the user's back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.cluster.nodes import Cluster, ClusterError
from k3desk.core.cluster.recipe import LAUNCHER_MAX_CTX, PROFILES, profile_names
from k3desk.core.cluster.sparkinfer_config import DEFAULT_BRIDGE, SparkInferConfig

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier


@dataclass(frozen=True)
class SparkInferRequest:
    """What a person asked for; empty strings and None mean "the recipe's default"."""

    profile: str
    tier: Tier | None = None  # the model file is its first shard unless model_file says
    model_file: str = ""
    max_ctx: int | None = None  # None: the recipe launcher's
    spec_draft: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    coord_port: int | None = None
    serve_port: int | None = None
    bridge_port: int | None = None
    bridge_argv: tuple[str, ...] = ()
    recipe_dir: str = ""
    tokenizer_dir: str = ""
    chat_template: str = ""
    load_timeout: float | None = None


def configure_sparkinfer(cluster: Cluster, request: SparkInferRequest) -> SparkInferConfig:
    """The launch configuration for ``request`` on ``cluster``.

    Raises :class:`ClusterError` for a profile the recipe does not have (or none)."""
    profile = request.profile.strip()
    if profile not in PROFILES:
        what = f"There is no SparkInfer profile {profile!r}" if profile else "No profile chosen"
        raise ClusterError(f"{what}.", f"The recipe's profiles: {profile_names()}.")
    base = SparkInferConfig(cluster)
    model_file = request.model_file.strip()
    if not model_file:
        model_file = Path(request.tier.first_shard).name if request.tier else base.model_file
    return SparkInferConfig(
        cluster,
        model_file=model_file,
        max_ctx=request.max_ctx or LAUNCHER_MAX_CTX,
        profile=profile,
        spec_draft=request.spec_draft,
        env=dict(request.env),
        coord_port=request.coord_port or base.coord_port,
        serve_port=request.serve_port or base.serve_port,
        bridge_port=request.bridge_port or base.bridge_port,
        bridge_argv=request.bridge_argv or DEFAULT_BRIDGE,
        recipe_dir=request.recipe_dir.strip(),
        tokenizer_dir=request.tokenizer_dir.strip(),
        chat_template=request.chat_template.strip(),
        load_timeout=base.load_timeout if request.load_timeout is None else request.load_timeout,
    )
