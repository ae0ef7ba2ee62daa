"""The cluster use-cases both shells call: save a cluster from node specs, plan and assess a
launch on probed nodes, and the group of processes that serves it (Qt-free; nodes that are
not here are probe reports, see tests/core/cluster/reports.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.app import Services
from k3desk.core.app.clusters import (
    RPC_NEEDS_MODEL,
    Cluster,
    ClusterError,
    ClusterLaunch,
    GroupState,
    RpcCluster,
    RpcConfig,
    SparkInferCluster,
    SparkInferConfig,
    add_cluster,
    assess_cluster,
    cluster_store,
    group_members,
    launch_config,
    plan_cluster,
    probe_nodes,
    start_group,
)
from tests.core.cluster.reports import profile, report
from tests.fixtures.sshd import SshServer

SPECS = ("spark0,address=10.0.0.11", "spark1,address=10.0.0.12", "spark2,address=10.0.0.13")
DEFAULTS = {"user": "ann", "identity": "", "model_path": "/models/k3", "workdir": ""}


def sparks(services: Services) -> tuple[Services, str]:
    cluster, _store = add_cluster(services, "spark", SPECS, defaults=DEFAULTS)
    return services, cluster.name


def test_add_cluster_saves_the_nodes_in_order_and_refuses_a_taken_name() -> None:
    services = Services()
    cluster, store = add_cluster(services, "spark", SPECS, defaults=DEFAULTS)
    assert [(n.host, n.user, n.address, n.model_path) for n in cluster.nodes] == [
        ("spark0", "ann", "10.0.0.11", "/models/k3"),
        ("spark1", "ann", "10.0.0.12", "/models/k3"),
        ("spark2", "ann", "10.0.0.13", "/models/k3"),
    ]
    assert cluster.created  # when it was described
    assert store.file == cluster_store(services).file
    assert [c.name for c in cluster_store(Services()).load()] == ["spark"]  # on disk

    with pytest.raises(ClusterError):
        add_cluster(services, "spark", SPECS[:1], defaults=DEFAULTS)
    again, _ = add_cluster(services, "spark", SPECS[:1], defaults=DEFAULTS, replace_existing=True)
    assert [len(c.nodes) for c in cluster_store(services).load()] == [len(again.nodes)] == [1]

    # a spec ssh could never use: refused, and nothing else saved
    with pytest.raises(ClusterError, match=r"host '\[bad' is not a host name or address"):
        add_cluster(services, "other", ("user@[bad",))
    assert [c.name for c in cluster_store(services).load()] == ["spark"]


def test_assess_a_sparkinfer_launch_before_and_after_the_probe() -> None:
    services, name = sparks(Services())
    cluster = cluster_store(services).get(name)
    launch = ClusterLaunch()  # the Cluster page's defaults: SparkInfer, the recipe's tier
    before = assess_cluster(services, cluster, launch)
    assert before.ok
    assert before.title == "SparkInfer TP3"
    assert not before.probed
    assert before.plan is None

    reports = [report(n) for n in cluster.nodes]
    after = assess_cluster(services, cluster, launch, reports=reports)
    assert after.ok
    assert after.probed
    assert after.plan is not None
    assert [b.node for b in after.plan.nodes] == [n.label for n in cluster.nodes]
    # the same plan the CLI prints for `cluster probe --engine sparkinfer`
    tier = services.catalog.get(launch.tier_id)
    plan = plan_cluster(services, "sparkinfer", reports, tier.size_bytes, launch.ctx)
    assert (plan.engine, plan.verdict, plan.nodes) == (
        "sparkinfer",
        after.plan.verdict,
        after.plan.nodes,
    )

    wrong = replace(launch, profile="turbo")
    with pytest.raises(ClusterError, match="There is no SparkInfer profile 'turbo'"):
        assess_cluster(services, cluster, wrong)


def test_assess_an_rpc_launch_of_a_chosen_file_and_of_a_tier_to_download(tmp_path: Path) -> None:
    services = Services()
    cluster, _ = add_cluster(
        services, "rpc", ("w1,address=192.168.1.21", "w2,address=192.168.1.22")
    )
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    local = profile("1xH200-141GB")
    reports = [report(n, "1xH200-141GB") for n in cluster.nodes]
    nothing = ClusterLaunch(engine="rpc", tier_id="grearl-iq1s")
    empty = assess_cluster(
        services, cluster, nothing, reports=reports, local=local, engine_binary=str(server)
    )
    assert RPC_NEEDS_MODEL in empty.refusals
    assert empty.title == "llama.cpp RPC (2 workers)"

    # a tier about to be downloaded: judged by its size, no file needed yet
    size = services.catalog.get("grearl-iq1s").size_bytes
    planned = assess_cluster(
        services,
        cluster,
        nothing,
        reports=reports,
        local=local,
        engine_binary=str(server),
        model_bytes=size,
    )
    assert RPC_NEEDS_MODEL not in planned.refusals
    assert planned.ok
    assert planned.plan is not None
    assert planned.plan.model_bytes == size

    first = tmp_path / "K3-00001-of-00002.gguf"
    first.write_bytes(b"\0" * 1000)
    (tmp_path / "K3-00002-of-00002.gguf").write_bytes(b"\0" * 500)
    chosen = replace(nothing, model=str(first), ctx=4096)
    config = launch_config(services, cluster, chosen, engine_binary=str(server))
    assert isinstance(config, RpcConfig)
    assert (config.model, config.server, config.model_bytes) == (first, server, 1500)
    assert "4096" in config.server_args
    assert assess_cluster(
        services, cluster, chosen, reports=reports, local=local, engine_binary=str(server)
    ).ok
    # a worker bound to every interface (`--bind w2=0.0.0.0`): refused unless allowed
    exposed = replace(chosen, bind=(("w2", "0.0.0.0"),))
    refused = assess_cluster(services, cluster, exposed, local=local, engine_binary=server)
    assert refused.refusals[0].startswith("Node w2: binding the RPC worker to 0.0.0.0 opens it")
    allowed = replace(exposed, allow_public=True)
    assert assess_cluster(services, cluster, allowed, local=local, engine_binary=server).ok


def test_start_group_builds_the_engine_of_the_launch_without_starting_it(
    tmp_path: Path,
) -> None:
    services, name = sparks(Services())
    cluster = cluster_store(services).get(name)
    spark_config = launch_config(services, cluster, ClusterLaunch())
    assert isinstance(spark_config, SparkInferConfig)
    seen: list[object] = []
    spark = start_group(services, spark_config, on_event=seen.append)
    assert isinstance(spark, SparkInferCluster)
    assert spark.state is GroupState.STOPPED
    assert [(m.name, m.node) for m in group_members(spark)] == [
        ("rank 0", "spark0"),
        ("rank 1", "spark1"),
        ("rank 2", "spark2"),
        ("bridge", "spark0"),
    ]

    model = tmp_path / "K3-00001-of-00001.gguf"
    model.write_bytes(b"GGUF")
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    workers, _ = add_cluster(services, "rpc", ("w1,address=192.168.1.21",))
    rpc_launch = ClusterLaunch(engine="rpc", model=str(model))
    rpc_config = launch_config(services, workers, rpc_launch, engine_binary=str(server))
    rpc = start_group(services, rpc_config)
    assert isinstance(rpc, RpcCluster)
    assert [(m.name, m.role) for m in group_members(rpc)] == [
        ("rpc worker", "RPC worker at 192.168.1.21:50052"),
        ("llama-server", "main (--rpc)"),
    ]
    assert seen == []  # nothing started, nothing reported


def test_probe_nodes_reports_each_node_in_order_through_the_saved_known_hosts(
    sshd: SshServer,
) -> None:
    services = Services()
    up = sshd.node("app-up")
    down = sshd.node("app-down", port=1)
    store = cluster_store(services)
    store.add(Cluster("mixed", (up, down)))
    (Path(up.model_path) / "chat_template.jinja").write_text("{{ messages }}")
    asked = (up.model_path, f"{up.model_path}/no-tokenizer")
    seen: list[object] = []
    reports = probe_nodes(services, store.get("mixed"), rank0_paths=asked, progress=seen.append)
    assert [r.node.label for r in reports] == [up.label, down.label]
    assert [r.ok for r in reports] == [True, False]
    assert reports[0].hardware is not None
    assert reports[0].paths == {asked[0]: "dir", asked[1]: "missing"}  # rank 0 only
    assert "connection refused" in reports[1].error
    assert seen  # the shells show the progress
    # the host key was learnt into the clusters' own known-hosts file
    assert store.known_hosts.read_text().strip()
