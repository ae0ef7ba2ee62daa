"""Clusters for the shells: the nodes and their store, the probe of each node, the
judgement of a cluster for an engine (llama.cpp RPC or SparkInfer), the plan and the
recipe it launches with, and the group of processes that serves it.

The tiers judged for a cluster are :mod:`k3desk.core.app.cluster_tiers`; a SparkInfer
launch's settings are :mod:`k3desk.core.app.sparkinfer_launch`; remote endpoints are
:mod:`k3desk.core.app.endpoints`.
"""

from __future__ import annotations

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
    "assess_rpc",
    "assess_sparkinfer",
    "bridge_key_name",
    "check_sparkinfer",
    "check_tier",
    "describe_launch",
    "explain_card_command",
    "group_members",
    "launch_fraction",
    "parse_node_spec",
    "plan_rpc",
    "plan_sparkinfer",
    "probe_cluster",
    "remote_command",
    "reply_caps",
    "rpc_config",
    "spec_draft_note",
    "worker_argv",
]
