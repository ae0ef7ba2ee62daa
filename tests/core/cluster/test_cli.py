"""``k3desk cluster ...`` end to end, in process, against the test sshd."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from k3desk.app import Services
from k3desk.cli import main
from k3desk.core.cluster.nodes import ClusterStore
from k3desk.core.engines.discovery import package_server
from k3desk.core.paths import default_paths
from tests.core.cluster.twin import write_recipe_twin
from tests.fakes.sparkinfer.stand_in import install_recipe, write_model_extras
from tests.fixtures.sshd import SshServer

FAKES = Path(__file__).resolve().parents[2] / "fakes" / "sparkinfer"


def k3(*argv: str) -> int:
    return main(list(argv), Services())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spec(sshd: SshServer, name: str, **extra: str) -> str:
    node = sshd.node(name)
    opts = {
        "identity": str(sshd.identity),
        "address": "127.0.0.1",
        "model": node.model_path,
        "workdir": node.workdir,
        "name": name,
        **extra,
    }
    return f"{sshd.user}@127.0.0.1:{sshd.port}," + ",".join(f"{k}={v}" for k, v in opts.items())


def test_add_list_probe_remove(sshd: SshServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert k3("cluster", "add", "lab", "--node", spec(sshd, "c0"), "--node", spec(sshd, "c1"),
              "--check") == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "Saved cluster 'lab' with 2 node(s)" in out
    assert "c0: ok (logged in to" in out
    assert k3("cluster", "list") == 0
    assert "lab (2 nodes)" in capsys.readouterr().out
    assert k3("cluster", "list", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in listed["clusters"][0]["nodes"]] == ["c0", "c1"]

    write_recipe_twin(Path(sshd.node("c0").model_path))
    assert k3("cluster", "probe", "lab", "--engine", "sparkinfer", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    c0, c1 = report["nodes"]
    assert c0["ok"]
    assert c0["hardware"]["memory"]["total"] > 0
    # the twin has the recipe's files and geometry but not the published 330 GB
    assert c0["copy"]["expert_feed_forward_length"] == 1536
    assert "the publisher lists 330167807328" in c0["copy"]["problems"][-1]
    assert all(f["present"] is False for f in c1["copy"]["files"])
    assert report["plan"]["engine"] == "sparkinfer"
    assert report["plan"]["verdict"] == "no-fit"  # no GB10 here, and no copies
    # rank 0 was also asked for the bridge's tokenizer folder and chat template
    m0 = sshd.node("c0").model_path
    assert c0["paths"] == {
        str(Path(m0).parent / "tokenizer"): "missing",
        f"{m0}/k3_chat_template.jinja": "missing",
    }
    assert c1["paths"] == {}

    assert k3("cluster", "probe", "lab") == 0
    text = capsys.readouterr().out
    assert "c0 (" in text
    assert "RAM:" in text
    assert "files:" not in text  # no engine named: no bridge files looked for

    assert k3("cluster", "remove", "lab") == 0
    assert k3("cluster", "remove", "lab") == 1
    err = capsys.readouterr().err
    assert "error: There is no cluster named 'lab'." in err


def test_bad_node_spec_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert k3("cluster", "add", "x", "--node", "host:99999") == 1
    err = capsys.readouterr().err
    assert "ssh port 99999 must be between 1 and 65535" in err
    assert "Traceback" not in err


def test_explain_card(capsys: pytest.CaptureFixture[str]) -> None:
    assert k3("cluster", "explain-card") == 0
    out = capsys.readouterr().out
    assert "no `sparkinfer` program" in out
    assert k3("cluster", "explain-card", "kimi_k3_dist_generate --rank 0 --world 3") == 0
    assert "none of the model card's known mistakes" in capsys.readouterr().out


def test_serve_sparkinfer_check_and_dry_run(
    sshd: SshServer, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = str(FAKES / "kimi_k3_dist_generate")
    nodes = [spec(sshd, f"s{i}", sparkinfer=binary, python="/usr/bin/python3") for i in range(3)]
    for i in range(3):
        write_recipe_twin(Path(sshd.node(f"s{i}").model_path))
        write_model_extras(sshd.node(f"s{i}").model_path)
    recipe = install_recipe(sshd.node("s0").workdir)
    assert k3("cluster", "add", "spark", *[a for n in nodes for a in ("--node", n)]) == 0
    capsys.readouterr()
    # a bridge command of one's own: here the recipe's, as an older bridge without /readyz
    bridge = "bash {recipe}/api-server/run-api.sh --no-readyz"
    ports = ["--coord-port", str(free_port()), "--serve-port", str(free_port()),
             "--bridge-port", str(free_port())]  # fmt: skip
    assert k3("cluster", "serve", "spark", "--engine", "sparkinfer", "--dry-run", *ports) == 0
    lines = capsys.readouterr().out.splitlines()
    out = [line for line in lines if not line.startswith("#")]
    assert len(out) == 4
    # the recipe's environment (from scripts/k3_cluster.sh) and its K=8/P8 flags on every rank;
    # three ranks on one address share a machine: GPUs 0, 1, 2 (k3_cluster.sh MODE=local)
    dist = str(FAKES)
    for i, line in enumerate(out[:3]):
        assert line.startswith(
            f"s{i}: LD_LIBRARY_PATH={dist}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} "
            f"env CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={i} NCCL_NVLS_ENABLE=0 "
            "SPARKINFER_K3_MOE_WEPS=0 SPARKINFER_K3_GRAPH=0 SPARKINFER_K3_PREFILL_CHUNK=16 "
            f"SPARKINFER_K3_DIST_HEAD_BAND=1 SPARKINFER_K3_PROJ_TOKS=8 {binary} --rank {i} "
        ), line
        assert line.endswith(
            "--max-ctx 4096 --spec-draft 8 --spec-ngram-min 1 --spec-ngram-max 8 "
            "--spec-min-occur 2 --spec-majority 2/3"
        ) or "--serve 127.0.0.1:" in line, line
    model_dir = Path(sshd.node("s0").model_path)
    # the bridge: the recipe's file layout, the key masked, replies as long as the context
    assert out[3].startswith(f"s0: env CUDA_DEVICE_ORDER=PCI_BUS_ID "
                             f"K3_TOKENIZER_DIR={model_dir.parent}/tokenizer "
                             f"K3_CHAT_TEMPLATE={model_dir}/k3_chat_template.jinja ")  # fmt: skip
    assert "K3_MAX_CONTEXT_TOKENS=4096 K3_MAX_TOKENS=4096 K3_DEFAULT_MAX_TOKENS=512 " in out[3]
    assert out[3].endswith(f" 'K3_API_KEY=********' bash {recipe}/api-server/run-api.sh")
    notes = "\n".join(line for line in lines if line.startswith("#"))
    assert "profile k8-p8: K=8/P8 (the recipe's launcher)" in notes
    assert "replies up to 4096 tokens (K3_MAX_TOKENS; 512 when a request names no limit)" in notes
    assert "K3_API_KEY is masked" in notes
    # another of the recipe's profiles, a draft width of one's own, a context of one's own
    assert k3("cluster", "serve", "spark", "--engine", "sparkinfer", "--dry-run", "--profile",
              "baseline", "--ctx", "8192", *ports) == 0  # fmt: skip
    base = capsys.readouterr().out
    assert "--spec-draft" not in base
    assert "SPARKINFER_K3_PROJ_TOKS" not in base
    assert "K3_MAX_CONTEXT_TOKENS=8192 K3_MAX_TOKENS=8192 " in base
    with pytest.raises(SystemExit):
        k3("cluster", "serve", "spark", "--engine", "sparkinfer", "--profile", "recipe")
    assert "invalid choice: 'recipe'" in capsys.readouterr().err
    # a probe would show no GB10 here: refused, with the reason
    assert k3("cluster", "serve", "spark", "--engine", "sparkinfer", *ports) == 1
    err = capsys.readouterr().err
    assert "SparkInfer cannot run this" in err
    assert "no NVIDIA GPU" in err
    assert k3("cluster", "serve", "spark", "--engine", "sparkinfer", "--tier", "grearl-iq1s") == 1
    assert "loads only the pruned 9-shard" in capsys.readouterr().err
    rc = k3("cluster", "serve", "spark", "--engine", "sparkinfer", "--no-probe", "--check",
            "--bridge-cmd", bridge, *ports)  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "Ready: http://127.0.0.1:" in captured.out
    assert "(model kimi-k3-neuron)" in captured.out
    assert "API key: " in captured.out  # shown once, when the bridge is ready
    assert "The bridge's API key is kept in " in captured.err
    assert "Chat check:" in captured.out
    assert "tok/s decode" in captured.out
    assert "rank 0: shard 9/9 mapped" in captured.err
    assert "hardware not probed; GB10 is assumed" in captured.err


def test_serve_rpc_check(
    sshd: SshServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from k3desk.devtools.tinyk3 import write_tiny_k3

    server = package_server()
    if server is None:
        pytest.skip("llama-server is not installed")
    rpc = str(server.with_name("ggml-rpc-server"))
    model = write_tiny_k3(tmp_path / "m", shards=3).first_part
    assert k3("cluster", "add", "rpc", "--node", spec(sshd, "r0", rpc=rpc)) == 0
    port = str(free_port())
    rc = k3("cluster", "serve", "rpc", "--engine", "rpc", "--model", str(model), "--ctx", "512",
            "--rpc-port", port, "--server", str(server), "--check")  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "no authentication and no encryption" in captured.err
    assert "Ready: http://127.0.0.1:" in captured.out
    assert "API key: " in captured.out
    assert "Chat check:" in captured.out
    assert k3("cluster", "serve", "rpc", "--engine", "rpc") == 1
    assert "pass --model PATH" in capsys.readouterr().err


def test_endpoints(capsys: pytest.CaptureFixture[str]) -> None:
    assert k3("cluster", "endpoint", "add", "vllm", "http://127.0.0.1:9/v1", "--no-check",
              "--key-env", "VLLM_KEY") == 0  # fmt: skip
    assert "API key read from $VLLM_KEY when used" in capsys.readouterr().out
    assert k3("cluster", "endpoint", "list") == 0
    assert "[$VLLM_KEY]" in capsys.readouterr().out
    assert k3("cluster", "endpoint", "check", "vllm") == 1
    assert "reads its API key from $VLLM_KEY, which is not set" in capsys.readouterr().err
    assert k3("cluster", "endpoint", "add", "open", "http://127.0.0.1:9", "--no-check") == 0
    capsys.readouterr()
    assert k3("cluster", "endpoint", "check", "open") == 1
    assert "open: DOWN — Endpoint 'open' is not answering" in capsys.readouterr().out
    assert k3("cluster", "endpoint", "remove", "open") == 0
    assert ClusterStore(default_paths()).load() == []
    shutil.rmtree(default_paths().config)
