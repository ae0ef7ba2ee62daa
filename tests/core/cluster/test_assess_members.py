"""The cluster assessment the desktop app shows (refusals, warnings, plan) and the member list
of a group, on probe reports of nodes that are not here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.catalog.loader import load_catalog
from k3desk.core.catalog.model import Tier
from k3desk.core.cluster.assess import (
    RPC_NEEDS_MODEL,
    RPC_NEEDS_SERVER,
    assess_rpc,
    assess_sparkinfer,
    rpc_config,
    shard_set_bytes,
)
from k3desk.core.cluster.group import GroupState
from k3desk.core.cluster.members import group_members, launch_fraction
from k3desk.core.cluster.nodes import Cluster, ClusterStore, Node
from k3desk.core.cluster.rpc import RPC_WARNING, RpcCluster
from k3desk.core.cluster.sparkinfer import (
    GEOMETRY_ERROR,
    PHASE_TEXT,
    SparkInferCluster,
    SparkInferConfig,
)
from k3desk.core.paths import default_paths
from k3desk.core.progress import Progress
from k3desk.core.resources import resources_dir
from tests.core.cluster.reports import report

pytestmark = pytest.mark.usefixtures("k3_home")


@pytest.fixture
def tiers() -> dict[str, Tier]:
    return {t.id: t for t in load_catalog(resources_dir() / "catalog.json").tiers}


def sparks(n: int = 3) -> tuple[Node, ...]:
    return tuple(
        Node(host=f"spark{i}", address=f"10.0.0.{11 + i}", model_path="/models/k3")
        for i in range(n)
    )


def test_sparkinfer_before_and_after_the_probe(tiers: dict[str, Tier]) -> None:
    nodes = sparks()
    cfg = SparkInferConfig(Cluster("spark", nodes))
    tier = tiers["vcruz305-ud-iq1s"]
    before = assess_sparkinfer(cfg, tier=tier)
    assert before.ok
    assert before.title == "SparkInfer TP3"
    assert not before.probed
    assert before.plan is None
    assert [w for w in before.warnings if "hardware not probed; GB10 is assumed" in w] == [
        f"Node spark{i}: hardware not probed; GB10 is assumed." for i in range(3)
    ]

    after = assess_sparkinfer(cfg, tier=tier, reports=[report(n) for n in nodes])
    assert after.ok
    assert after.probed
    assert after.warnings == ()
    assert after.plan is not None
    assert after.plan.verdict in ("fits", "tight")
    assert [b.node for b in after.plan.nodes] == ["spark0", "spark1", "spark2"]
    assert after.plan.nodes[0].role == "rank 0 (coordinator, bridge)"

    # an H200 node, an incomplete copy and an unreachable node, each named
    mixed = [
        report(nodes[0], "1xH200-141GB"),
        report(nodes[1], complete=False),
        report(nodes[2], error="Nothing accepts SSH connections at spark2 (port 22)"),
    ]
    bad = assess_sparkinfer(cfg, tier=tier, reports=mixed)
    assert not bad.ok
    assert bad.refusals[0] == (
        "Node spark2 cannot be probed: Nothing accepts SSH connections at spark2 (port 22)"
    )
    assert any("Node spark0 has NVIDIA H200 (Hopper, sm_90)" in r for r in bad.refusals)
    assert any("Node spark1 has no complete copy of the model" in r for r in bad.refusals)

    # the wrong tier, TP4, a host name and an edited node
    wrong = assess_sparkinfer(cfg, tier=tiers["grearl-iq1s"])
    assert GEOMETRY_ERROR in wrong.refusals[0]
    tp4 = assess_sparkinfer(SparkInferConfig(Cluster("s4", sparks(4))), tier=tier)
    assert tp4.title == "SparkInfer TP4"
    assert "TP4 is experimental" in tp4.warnings[0]
    two = assess_sparkinfer(SparkInferConfig(Cluster("s2", sparks(2))), tier=tier)
    assert two.title == "SparkInfer (2 nodes; it needs 3 or 4)"
    assert "3 nodes (TP3) or 4 (TP4)" in two.refusals[0]
    named = (replace(nodes[0], address=""), *nodes[1:])
    edited = assess_sparkinfer(
        SparkInferConfig(Cluster("spark", named)), tier=tier, reports=[report(n) for n in nodes]
    )
    assert "'spark0' is a host name" in edited.refusals[0]
    assert not edited.probed  # the edited node's old report no longer counts


def test_rpc_refusals_warning_and_plan(tmp_path: Path) -> None:
    nodes = (Node(host="w1", address="192.168.1.21"), Node(host="w2", address="192.168.1.22"))
    cluster = Cluster("rpc", nodes)
    empty = assess_rpc(rpc_config(cluster, None, None))
    assert empty.title == "llama.cpp RPC (2 workers)"
    assert empty.refusals == (RPC_NEEDS_MODEL, RPC_NEEDS_SERVER)
    assert empty.warnings[0] == RPC_WARNING

    first = tmp_path / "K3-00001-of-00003.gguf"
    for i, size in ((1, 1000), (2, 2000), (3, 500)):
        (tmp_path / f"K3-0000{i}-of-00003.gguf").write_bytes(b"\0" * size)
    assert shard_set_bytes(first) == 3500
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    cfg = rpc_config(cluster, first, server, ctx=4096, bind={"w2": "0.0.0.0"})
    assert cfg.model_bytes == 3500
    assert "-c" in cfg.server_args
    assert "4096" in cfg.server_args
    exposed = assess_rpc(cfg)
    assert exposed.refusals == (
        "Node w2: binding the RPC worker to 0.0.0.0 opens it to every network interface of "
        "the node, and RPC has no authentication. Pick the node's private address (bind=...), "
        "or allow it explicitly.",
    )
    allowed = assess_rpc(replace(cfg, allow_public=True))
    assert allowed.ok
    assert len(allowed.warnings) == 2

    probed = assess_rpc(
        rpc_config(cluster, first, server),
        reports=[report(n, "1xH200-141GB") for n in nodes],
    )
    assert probed.ok
    assert probed.probed
    assert probed.plan is not None
    assert [b.role for b in probed.plan.nodes] == ["RPC worker", "RPC worker"]


def test_members_of_a_group_that_has_not_started(tmp_path: Path) -> None:
    paths = default_paths()
    known = ClusterStore(paths).known_hosts
    nodes = sparks()
    spark = SparkInferCluster(SparkInferConfig(Cluster("spark", nodes)), paths, known)
    members = group_members(spark)
    assert [(m.name, m.node, m.state) for m in members] == [
        ("rank 0", "spark0", "stopped"),
        ("rank 1", "spark1", "stopped"),
        ("rank 2", "spark2", "stopped"),
        ("bridge", "spark0", "stopped"),
    ]
    assert members[0].role == "coordinator (--listen)"
    assert members[3].role == "OpenAI-compatible HTTP at http://10.0.0.11:8000"
    assert spark.state is GroupState.STOPPED

    model = tmp_path / "K3-00001-of-00001.gguf"
    model.write_bytes(b"GGUF")
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    workers = (Node(host="w1", user="ann", port=2222, address="192.168.1.21"),)
    rpc = RpcCluster(rpc_config(Cluster("rpc", workers), model, server), paths, known)
    rows = group_members(rpc)
    assert [(m.name, m.host, m.role) for m in rows] == [
        ("rpc worker", "ann@w1:2222", "RPC worker at 192.168.1.21:50052"),
        ("llama-server", "127.0.0.1", "main (--rpc)"),
    ]


def test_launch_fraction_counts_phases_and_shards() -> None:
    total = len(PHASE_TEXT)
    assert launch_fraction(Progress(PHASE_TEXT[0], 0, total)) == 0.0
    assert launch_fraction(Progress(PHASE_TEXT[1], 1, total)) == pytest.approx(1 / total)
    loading = Progress(PHASE_TEXT[2], 2, total, "rank 0: shard 3/9 mapped")
    assert launch_fraction(loading) == pytest.approx((2 + 3 / 9) / total)
    assert launch_fraction(Progress(PHASE_TEXT[6], 7, total)) == 1.0
    assert launch_fraction(Progress("RPC worker ready", 1, 4, "w1 at 10.0.0.2:50052")) == 0.25
