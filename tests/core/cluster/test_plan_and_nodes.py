"""Cluster inventory files and planning across nodes (no network needed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.cluster.nodes import Cluster, ClusterError, ClusterStore, Node, parse_node_spec
from k3desk.core.cluster.plan import plan_rpc, plan_sparkinfer, sparkinfer_rank_bytes
from k3desk.core.cluster.probe import CopyCheck, NodeReport
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.units import GiB

HARDWARE = Path(__file__).resolve().parents[3] / "resources" / "hardware"
TIER_BYTES = 330_167_807_328


def profile(name: str) -> HardwareProfile:
    return HardwareProfile.from_json_file(HARDWARE / f"{name}.json")


def test_node_specs() -> None:
    n = parse_node_spec("alice@spark1:2222,address=10.0.0.11,model=/data/k3,name=s1")
    assert (n.user, n.host, n.port, n.address, n.model_path, n.label) == (
        "alice", "spark1", 2222, "10.0.0.11", "/data/k3", "s1",
    )  # fmt: skip
    v6 = parse_node_spec("[fd00::2]:22", workdir="/srv/k3")
    assert (v6.host, v6.port, v6.workdir) == ("fd00::2", 22, "/srv/k3")
    with pytest.raises(ClusterError, match="unknown option 'colour'"):
        parse_node_spec("h,colour=red")
    with pytest.raises(ClusterError, match="port 'x' is not a number"):
        parse_node_spec("h:x")
    with pytest.raises(ClusterError, match="between 1 and 65535"):
        parse_node_spec("h:70000")
    with pytest.raises(ClusterError, match="not key=value"):
        parse_node_spec("h,oops")


def test_store_round_trip_and_errors() -> None:
    store = ClusterStore(default_paths())
    assert store.load() == []
    nodes = (Node(host="a", model_path="/m"), Node(host="b", port=2200, identity="~/.ssh/k"))
    store.add(Cluster("lab", nodes))
    data = json.loads(store.file.read_text())
    assert data["clusters"][0]["nodes"][0] == {"host": "a", "model_path": "/m"}
    assert ClusterStore(default_paths()).get("lab").nodes == nodes
    with pytest.raises(ClusterError, match="already exists"):
        store.add(Cluster("lab", nodes))
    with pytest.raises(ClusterError, match="lists a more than once"):
        store.add(Cluster("dup", (nodes[0], nodes[0])))
    with pytest.raises(ClusterError, match="has no nodes"):
        store.add(Cluster("empty", ()))
    with pytest.raises(ClusterError, match=r"no cluster named 'nope'.*") as err:
        store.get("nope")
    assert err.value.hint == "Known clusters: lab."
    store.update_node("lab", "b:2200", address="10.0.0.2")
    assert store.get("lab").nodes[1].address == "10.0.0.2"
    store.remove("lab")
    assert store.names() == []
    store.file.write_text('{"clusters": [{"name": "x", "nodes": [{"hots": "a"}]}]}')
    with pytest.raises(ClusterError, match=r"Unknown node field\(s\) hots .*clusters.json"):
        store.load()
    store.file.write_text("{nope")
    with pytest.raises(ClusterError, match="cannot be read"):
        store.load()


def report(label: str, hw: HardwareProfile | None, complete: bool = True) -> NodeReport:
    copy = CopyCheck(
        "/models/k3",
        complete,
        (),
        TIER_BYTES if complete else 0,
        () if complete else ("x is missing",),
    )
    return NodeReport(
        Node(host=label),
        hw is not None,
        hardware=hw,
        copy=copy,
        engines={"ggml-rpc-server": "/usr/bin/ggml-rpc-server"},
    )


def test_sparkinfer_plan_on_three_gb10() -> None:
    gb10 = profile("3xGB10-node")
    need = sparkinfer_rank_bytes(TIER_BYTES, 3)
    assert need == 113 * GiB  # calibrated on the recipe
    plan = plan_sparkinfer([report(f"spark{i}", gb10) for i in range(3)], TIER_BYTES)
    assert plan.verdict in ("fits", "tight")
    assert [b.role for b in plan.nodes][:2] == ["rank 0 (coordinator, bridge)", "rank 1 (worker)"]
    assert all(b.memory_kind == "unified memory (GB10)" for b in plan.nodes)
    assert "calibrated on the recipe's ~113 GiB" in plan.notes[0]
    # two GB10s cannot hold half the model each
    two = plan_sparkinfer([report(f"spark{i}", gb10) for i in range(2)], TIER_BYTES)
    assert two.verdict == "no-fit"
    assert "short" in two.reason
    # a node without a copy and without room for one
    full_disk = replace(gb10, disk=replace(gb10.disk, free=100 * GiB)) if gb10.disk else gb10
    reps = [report("spark0", gb10), report("spark1", gb10), report("spark2", full_disk, False)]
    plan = plan_sparkinfer(reps, TIER_BYTES)
    assert plan.verdict == "no-fit"
    assert "not enough for" in plan.nodes[2].disk
    unknown = plan_sparkinfer([report("a", gb10), report("b", gb10), report("c", None)], TIER_BYTES)
    assert unknown.verdict == "unknown"
    assert "c" in unknown.reason


def test_rpc_plan_sums_the_workers() -> None:
    h100 = profile("8xH100-2TB")
    laptop = profile("no-gpu-laptop-32GB")
    plan = plan_rpc([report("big", h100), report("small", laptop)], TIER_BYTES)
    assert plan.verdict == "fits"
    big, small = plan.nodes
    assert big.memory_kind == "GPU memory (8 GPUs)"
    assert small.memory_kind == "RAM"
    assert big.need > small.need  # layers follow the memory
    assert sum(b.need for b in plan.nodes) == pytest.approx(TIER_BYTES + 2 * GiB, rel=1e-6)
    assert small.disk.startswith("no copy needed")
    short = plan_rpc([report("small", laptop), report("small2", laptop)], TIER_BYTES)
    assert short.verdict == "no-fit"
    assert "together" in short.reason
    rendered = plan.render()
    assert rendered.startswith("rpc: fits")
    assert "big" in rendered
