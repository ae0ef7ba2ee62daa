"""Clusters for the shells: the nodes and their store, the probe of each node, the
judgement of a cluster for an engine (llama.cpp RPC or SparkInfer), the plan and the
recipe it launches with, and the group of processes that serves it.

The use-cases both shells call: :func:`cluster_store` (the saved clusters),
:func:`add_cluster` (a cluster from ``[user@]host`` node specs), :func:`probe_nodes`
(every node's hardware, engines and copy of a tier), :func:`plan_cluster`
(the cross-node memory plan for probed nodes), :func:`launch_config` and
:func:`assess_cluster` (what a :class:`ClusterLaunch` would start, and its refusals,
warnings and plan), and :func:`start_group` (the processes that serve it).  The values
below them are re-exported as they are.

The tiers judged for a cluster are :mod:`k3desk.core.app.cluster_tiers`; a SparkInfer
launch's settings are :mod:`k3desk.core.app.sparkinfer_launch`; remote endpoints are
:mod:`k3desk.core.app.endpoints`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.sparkinfer_launch import SparkInferRequest, configure_sparkinfer
from k3desk.core.cluster.assess import (
    RPC_NEEDS_MODEL,
    Assessment,
    EngineKind,
    assess_rpc,
    assess_sparkinfer,
    rpc_config,
)
from k3desk.core.cluster.group import GroupEvent, GroupPolicy, GroupState, GroupSupervisor
from k3desk.core.cluster.members import Member, group_members, launch_fraction
from k3desk.core.cluster.nodes import Cluster, ClusterError, ClusterStore, Node, parse_node_spec
from k3desk.core.cluster.plan import ClusterPlan, plan_rpc, plan_sparkinfer
from k3desk.core.cluster.probe import NodeReport, ShardSetSpec, probe_cluster
from k3desk.core.cluster.recipe import (
    DEFAULT_PROFILE,
    LAUNCHER_MAX_CTX,
    PROFILES,
    SPARKINFER_TIER,
    RecipeProfile,
    spec_draft_note,
)
from k3desk.core.cluster.rpc import (
    DEFAULT_RPC_PORT,
    RPC_WARNING,
    RpcCluster,
    RpcConfig,
    worker_argv,
)
from k3desk.core.cluster.sparkinfer import (
    BRIDGE_PORT,
    CARD_COMMAND,
    CHAT_TEMPLATE_NAME,
    COORD_PORT,
    PHASE_TEXT,
    SERVE_PORT,
    ServeStats,
    SparkInferCluster,
    SparkInferConfig,
    bridge_key_name,
    check_sparkinfer,
    check_tier,
    describe_launch,
    explain_card_command,
    reply_caps,
)
from k3desk.core.cluster.ssh import SshClient, SshError, remote_command
from k3desk.core.engines.discovery import find_llama_server
from k3desk.core.errors import K3Error
from k3desk.core.progress import CancelToken, ProgressCallback, no_progress

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.core.catalog.model import Tier
    from k3desk.core.cluster.group import EventCallback
    from k3desk.core.cluster.sparkinfer import StatsCallback
    from k3desk.core.hardware.profile import HardwareProfile

__all__ = [
    "BRIDGE_PORT",
    "CARD_COMMAND",
    "CHAT_TEMPLATE_NAME",
    "COORD_PORT",
    "DEFAULT_PROFILE",
    "DEFAULT_RPC_PORT",
    "LAUNCHER_MAX_CTX",
    "PHASE_TEXT",
    "PROFILES",
    "RPC_NEEDS_MODEL",
    "RPC_WARNING",
    "SERVE_PORT",
    "SPARKINFER_TIER",
    "Assessment",
    "Cluster",
    "ClusterError",
    "ClusterLaunch",
    "ClusterPlan",
    "ClusterStore",
    "EngineKind",
    "GroupEvent",
    "GroupPolicy",
    "GroupState",
    "GroupSupervisor",
    "Member",
    "Node",
    "NodeReport",
    "RecipeProfile",
    "RpcCluster",
    "RpcConfig",
    "ServeStats",
    "ShardSetSpec",
    "SparkInferCluster",
    "SparkInferConfig",
    "SshClient",
    "SshError",
    "add_cluster",
    "assess_cluster",
    "assess_rpc",
    "assess_sparkinfer",
    "bridge_key_name",
    "check_sparkinfer",
    "check_tier",
    "cluster_store",
    "describe_launch",
    "explain_card_command",
    "group_members",
    "launch_config",
    "launch_fraction",
    "parse_node_spec",
    "plan_cluster",
    "plan_rpc",
    "plan_sparkinfer",
    "probe_cluster",
    "probe_nodes",
    "remote_command",
    "reply_caps",
    "rpc_config",
    "spec_draft_note",
    "start_group",
    "worker_argv",
]


@dataclass(frozen=True)
class ClusterLaunch:
    """What a person picked for one launch on a cluster (the Cluster page's fields)."""

    engine: EngineKind = "sparkinfer"
    tier_id: str = SPARKINFER_TIER
    ctx: int = 8192
    profile: str = DEFAULT_PROFILE  # the SparkInfer recipe's launch profile (recipe.PROFILES)
    spec_draft: int | None = None  # instead of the profile's K
    coord_port: int = COORD_PORT
    serve_port: int = SERVE_PORT
    bridge_port: int = BRIDGE_PORT
    model: str = ""  # RPC: the first shard on this machine
    rpc_port: int = DEFAULT_RPC_PORT
    bind: tuple[tuple[str, str], ...] = ()  # RPC: (node, address) a worker listens on
    allow_public: bool = False
    # SparkInfer's bridge, on rank 0; "" = where the recipe keeps them (tokenizer/ beside the
    # model folder, the chat template in it)
    tokenizer_dir: str = ""
    chat_template: str = ""


def cluster_store(services: Services) -> ClusterStore:
    """The saved clusters (``<config>/clusters.json``) and the ssh known-hosts file."""
    return ClusterStore(services.paths)


def add_cluster(
    services: Services,
    name: str,
    specs: Sequence[str],
    *,
    defaults: Mapping[str, str] | None = None,
    replace_existing: bool = False,
) -> tuple[Cluster, ClusterStore]:
    """Save cluster ``name`` with a node for each ``[user@]host[:port][,key=value...]`` spec
    (rank 0 first); ``defaults`` fill what a spec leaves out (user, identity, model_path,
    workdir).  A bad spec or a taken name raises :class:`ClusterError`."""
    nodes = tuple(parse_node_spec(spec, **dict(defaults or {})) for spec in specs)
    cluster = Cluster(name, nodes, created=time.strftime("%Y-%m-%d %H:%M:%S"))
    store = cluster_store(services)
    store.add(cluster, replace_existing=replace_existing)
    return cluster, store


def probe_nodes(
    services: Services,
    cluster: Cluster,
    *,
    tier: Tier | None = None,
    spec: ShardSetSpec | None = None,
    rank0_paths: Sequence[str] = (),
    check_sha256: bool = False,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
) -> list[NodeReport]:
    """Every node of ``cluster`` probed over ssh, in parallel, reports in node order: its
    hardware and engines, its copy of ``tier`` (or of ``spec``: a tier's files with the
    hashes of a download record), and on rank 0 ``rank0_paths`` (SparkInfer's bridge
    reads its tokenizer folder and chat template there).  An unreachable node is a report
    that says why, never an exception."""
    if spec is None and tier is not None:
        spec = ShardSetSpec.from_tier(tier)
    return probe_cluster(
        cluster,
        cluster_store(services).known_hosts,
        spec=spec,
        check_sha256=check_sha256,
        progress=progress,
        cancel=cancel,
        rank0_paths=rank0_paths,
    )


def plan_cluster(
    services: Services,
    engine: EngineKind,
    reports: Sequence[NodeReport],
    model_bytes: int,
    ctx: int,
) -> ClusterPlan:
    """The cross-node memory plan of ``engine`` for probed nodes; RPC counts this machine
    too (llama-server runs here)."""
    if engine == "sparkinfer":
        return plan_sparkinfer(reports, model_bytes, ctx)
    local = services.detect_hardware(None, measure_bandwidth=False)
    return plan_rpc(reports, model_bytes, local=local)


def _tier(services: Services, tier_id: str) -> Tier | None:
    try:
        return services.catalog.get(tier_id)
    except K3Error:
        return None


def launch_config(
    services: Services,
    cluster: Cluster,
    launch: ClusterLaunch,
    *,
    engine_binary: str | Path | None = None,
    model_bytes: int | None = None,
) -> SparkInferConfig | RpcConfig:
    """What ``launch`` starts on ``cluster``: SparkInfer's configuration (an unknown profile
    raises :class:`ClusterError`), or RPC's with the llama-server found here
    (``engine_binary``: the one the settings name).  ``model_bytes`` (RPC): a model of that
    size not on this machine yet, instead of ``launch.model``'s files."""
    if launch.engine == "sparkinfer":
        return configure_sparkinfer(
            cluster,
            SparkInferRequest(
                profile=launch.profile,
                tier=_tier(services, launch.tier_id),
                max_ctx=launch.ctx,
                spec_draft=launch.spec_draft,
                coord_port=launch.coord_port,
                serve_port=launch.serve_port,
                bridge_port=launch.bridge_port,
                tokenizer_dir=launch.tokenizer_dir,
                chat_template=launch.chat_template,
            ),
        )
    model = Path(launch.model.strip()).expanduser() if launch.model.strip() else None
    config = rpc_config(
        cluster,
        None if model_bytes is not None else model,
        find_llama_server(services.paths, configured=engine_binary),
        ctx=launch.ctx,
        port=launch.rpc_port,
        bind=dict(launch.bind),
        allow_public=launch.allow_public,
    )
    return config if model_bytes is None else replace(config, model_bytes=model_bytes)


def assess_cluster(
    services: Services,
    cluster: Cluster,
    launch: ClusterLaunch,
    *,
    reports: Sequence[NodeReport] = (),
    local: HardwareProfile | None = None,
    engine_binary: str | Path | None = None,
    model_bytes: int | None = None,
) -> Assessment:
    """Refusals, warnings and the plan for ``launch`` on ``cluster`` (no network).

    ``local``: this machine, where RPC's llama-server runs.  ``model_bytes`` (RPC): judge a
    model of that size that is not on this machine yet (a tier about to be downloaded)."""
    config = launch_config(
        services, cluster, launch, engine_binary=engine_binary, model_bytes=model_bytes
    )
    if isinstance(config, SparkInferConfig):
        return assess_sparkinfer(config, tier=_tier(services, launch.tier_id), reports=reports)
    a = assess_rpc(config, reports=reports, local=local)
    if model_bytes is None:
        return a
    # the files come with the download: judge the tier's size, not a chosen file
    return replace(a, refusals=tuple(r for r in a.refusals if r != RPC_NEEDS_MODEL))


def start_group(
    services: Services,
    config: SparkInferConfig | RpcConfig,
    *,
    on_event: EventCallback | None = None,
    on_stats: StatsCallback | None = None,
    policy: GroupPolicy | None = None,
) -> GroupSupervisor:
    """The group of processes that serves ``config`` (not started yet: the shell keeps it,
    then calls ``start()``).  SparkInfer's bridge key is read from the app's secret store
    off the caller's thread."""
    known_hosts = cluster_store(services).known_hosts
    if isinstance(config, SparkInferConfig):
        return SparkInferCluster(
            config,
            services.paths,
            known_hosts,
            policy=policy,
            on_event=on_event,
            on_stats=on_stats,
            secrets=services.secrets,
        )
    return RpcCluster(config, services.paths, known_hosts, policy=policy, on_event=on_event)
