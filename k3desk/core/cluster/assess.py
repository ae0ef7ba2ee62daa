"""One answer to "can this cluster run Kimi-K3 with this engine?": refusals, warnings, plan.

The desktop app asks it every time the person changes the engine, the tier or a
setting, and after every probe; it combines the checks the engines already make
(:func:`~k3desk.core.cluster.sparkinfer.check_sparkinfer`,
:func:`~k3desk.core.cluster.rpc.check_rpc`) with the cross-node plan
(:mod:`~k3desk.core.cluster.plan`) and the probe's failures, and keeps their
texts verbatim.  Nothing here contacts a node: it works on probe reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from k3desk.core.cluster.nodes import Cluster
from k3desk.core.cluster.plan import ClusterPlan, plan_rpc, plan_sparkinfer
from k3desk.core.cluster.probe import NodeReport
from k3desk.core.cluster.rpc import DEFAULT_RPC_PORT, RpcConfig, check_rpc
from k3desk.core.cluster.sparkinfer import SparkInferConfig, check_sparkinfer
from k3desk.core.gguf.shards import discover
from k3desk.core.planning.argv import rpc_base_args

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier
    from k3desk.core.hardware.profile import HardwareProfile

EngineKind = Literal["sparkinfer", "rpc"]

RPC_NEEDS_MODEL = (
    "llama.cpp RPC needs the model's first shard on this machine (…-00001-of-000NN.gguf): "
    "only this machine needs the files; the workers receive the layers over the network."
)
RPC_NEEDS_SERVER = (
    "No llama-server was found on this machine: build one on the Engine page "
    "(or `k3desk engine install`), or set one in Settings."
)


@dataclass(frozen=True)
class Assessment:
    """What k3desk can tell before starting ``engine`` on a cluster."""

    engine: EngineKind
    title: str  # "SparkInfer TP3", "llama.cpp RPC (2 workers)"
    refusals: tuple[str, ...]  # any of these stops the launch
    warnings: tuple[str, ...]
    plan: ClusterPlan | None  # None until the nodes were probed (and a size is known)
    probed: bool  # every node has a probe report

    @property
    def ok(self) -> bool:
        return not self.refusals


def engine_title(engine: EngineKind, nodes: int) -> str:
    if engine == "sparkinfer":
        if nodes in (3, 4):
            return f"SparkInfer TP{nodes}"
        return f"SparkInfer ({nodes} node{'s' if nodes != 1 else ''}; it needs 3 or 4)"
    return f"llama.cpp RPC ({nodes} worker{'s' if nodes != 1 else ''})"


def reports_for(cluster: Cluster, reports: Sequence[NodeReport]) -> list[NodeReport]:
    """The reports that still describe ``cluster``'s nodes (an edited node drops its report)."""
    nodes = set(cluster.nodes)
    return [r for r in reports if r.node in nodes]


def _probe_refusals(reports: Sequence[NodeReport]) -> list[str]:
    return [f"Node {r.node.label} cannot be probed: {r.error}" for r in reports if not r.ok]


def assess_sparkinfer(
    config: SparkInferConfig,
    *,
    tier: Tier | None = None,
    reports: Sequence[NodeReport] = (),
) -> Assessment:
    """SparkInfer's refusals and warnings, and the per-rank plan once the nodes are probed."""
    reports = reports_for(config.cluster, reports)
    profiles: Mapping[str, HardwareProfile | None] = {
        r.node.label: r.hardware for r in reports if r.ok
    }
    check = check_sparkinfer(config, tier=tier, profiles=profiles, reports=reports)
    plan = None
    if reports and tier is not None:
        plan = plan_sparkinfer(reports, tier.size_bytes, config.max_ctx)
    return Assessment(
        "sparkinfer",
        engine_title("sparkinfer", config.world),
        (*_probe_refusals(reports), *check.refusals),
        check.warnings,
        plan,
        probed=len(reports) == len(config.cluster.nodes),
    )


def shard_set_bytes(first: Path) -> int:
    """Bytes of the split set ``first`` belongs to (the parts that exist)."""
    return discover(first).bytes_present()


def rpc_config(
    cluster: Cluster,
    model: Path | None,
    server: Path | None,
    *,
    ctx: int = 8192,
    port: int = DEFAULT_RPC_PORT,
    bind: Mapping[str, str] | None = None,
    allow_public: bool = False,
) -> RpcConfig:
    """The RPC launch for ``cluster`` (``model``/``server`` None: not chosen or not found)."""
    model_bytes = shard_set_bytes(model) if model is not None else 0
    return RpcConfig(
        cluster,
        model if model is not None else Path(),
        server if server is not None else Path(),
        server_args=rpc_base_args(ctx),
        port=port,
        bind=dict(bind or {}),
        allow_public=allow_public,
        model_bytes=model_bytes,
    )


def assess_rpc(
    config: RpcConfig,
    *,
    reports: Sequence[NodeReport] = (),
    local: HardwareProfile | None = None,
) -> Assessment:
    """RPC's refusals (exposed binds, missing files) and warnings (always: no authentication)."""
    reports = reports_for(config.cluster, reports)
    refusals, warnings = check_rpc(config)
    unset = Path()
    own: list[str] = []
    drop: set[str] = set()  # check_rpc's texts for a path that was never chosen
    if config.model == unset:
        own.append(RPC_NEEDS_MODEL)
        drop.add(f"The model file {unset} does not exist on this machine.")
    if config.server == unset:
        own.append(RPC_NEEDS_SERVER)
        drop.add(f"llama-server was not found at {unset}.")
    refusals = tuple(r for r in refusals if r not in drop)
    plan = None
    if reports and config.model_bytes:
        plan = plan_rpc(reports, config.model_bytes, local=local)
    return Assessment(
        "rpc",
        engine_title("rpc", len(config.cluster.nodes)),
        (*_probe_refusals(reports), *own, *refusals),
        warnings,
        plan,
        probed=len(reports) == len(config.cluster.nodes),
    )
