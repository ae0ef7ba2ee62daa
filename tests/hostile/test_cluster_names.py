"""Names that become paths on the cluster's machines: shard 1's file name is joined to
every node's model folder, and a node's folders go into remote shell commands."""

from __future__ import annotations

import pytest

from k3desk.core.cluster.nodes import Cluster, ClusterError, Node, parse_node_spec
from k3desk.core.cluster.sparkinfer import SparkInferConfig, check_sparkinfer, rank_argv
from tests.hostile.conftest import no_traceback, run_k3desk

NODES = tuple(
    Node(host=f"spark{i}", address=f"10.0.0.{11 + i}", model_path="/models/k3") for i in range(3)
)


@pytest.mark.parametrize(
    "name",
    [
        "../../../home/alice/.ssh/id_ed25519.gguf",
        "/etc/shadow.gguf",
        "sub/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf",
        "K3\x1b[2J-00001-of-00009.gguf",
    ],
)
def test_shard_1_must_be_a_file_name_in_the_model_folder(name: str) -> None:
    cfg = SparkInferConfig(Cluster("spark", NODES), model_file=name)
    refusals = check_sparkinfer(cfg).refusals
    assert any(
        r.startswith(
            f"--model must be shard 1's file name in each node's model folder, not {name!r}"
        )
        for r in refusals
    ), refusals
    with pytest.raises(ClusterError):
        check_sparkinfer(cfg).raise_if_refused()


def test_a_plain_shard_name_is_joined_to_the_folder() -> None:
    cfg = SparkInferConfig(Cluster("spark", NODES))
    assert check_sparkinfer(cfg).ok
    argv = rank_argv(cfg, 1)
    assert argv[argv.index("--model") + 1] == "/models/k3/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf"


@pytest.mark.parametrize("field", ["model", "workdir", "identity"])
def test_node_folders_with_control_characters_are_refused(field: str) -> None:
    with pytest.raises(ClusterError, match="contains control characters or undecodable bytes"):
        parse_node_spec(f"alice@spark1,{field}=/data/\x1b]0;pwned\x07k3")
    with pytest.raises(ClusterError, match="contains control characters or undecodable bytes"):
        parse_node_spec(f"alice@spark1,{field}=/data/\udcffk3")


def test_the_cli_refuses_such_a_node_with_a_message() -> None:
    r = run_k3desk("cluster", "add", "sparks", "--node", b"alice@spark1,model=/data/\x1b[2Jk3")
    assert r.returncode == 1
    no_traceback(r.stderr)
    assert b"contains control characters or undecodable bytes" in r.stderr
