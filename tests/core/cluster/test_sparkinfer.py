"""SparkInfer TP3 through real ssh, with the stand-in engine and bridge on loopback "nodes"."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from k3desk.core.chat.client import ChatClient, ChatMessage, EngineUnavailableError
from k3desk.core.chat.model import ChatSettings
from k3desk.core.cluster.group import GroupEvent, GroupPolicy, GroupState
from k3desk.core.cluster.nodes import Cluster, ClusterError, ClusterStore, Node
from k3desk.core.cluster.probe import ShardSetSpec, probe_cluster
from k3desk.core.cluster.recipe import PROFILES
from k3desk.core.cluster.sparkinfer import (
    DEFAULT_BRIDGE,
    GEOMETRY_ERROR,
    SparkInferCluster,
    SparkInferConfig,
    check_sparkinfer,
    describe_launch,
    explain_card_command,
    rank_argv,
)
from k3desk.core.errors import EngineError
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.secrets import SecretStore
from tests.core.cluster.twin import RECIPE_NAMES, write_recipe_twin
from tests.fakes.sparkinfer.stand_in import install_recipe, write_model_extras
from tests.fixtures.engine import environ_of
from tests.fixtures.hub import FakeKeyringModule, MemoryKeyring
from tests.fixtures.sshd import SshServer

FAKES = Path(__file__).resolve().parents[2] / "fakes" / "sparkinfer"
HARDWARE = Path(__file__).resolve().parents[3] / "resources" / "hardware"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_nodes(sshd: SshServer, tag: str, n: int = 3, expert_ff: int = 1536) -> list[Node]:
    """n loopback nodes, each with its own model copy; the recipe's clone in rank 0's workdir."""
    nodes = []
    for i in range(n):
        node = sshd.node(
            f"{tag}{i}",
            sparkinfer_bin=str(FAKES / "kimi_k3_dist_generate"),
            python="/usr/bin/python3",
        )
        write_recipe_twin(Path(node.model_path), expert_feed_forward_length=expert_ff)
        write_model_extras(node.model_path)  # tokenizer/ and the chat template, as downloaded
        nodes.append(node)
    install_recipe(nodes[0].workdir)
    return nodes


def config_for(nodes: list[Node], name: str, **kw: object) -> SparkInferConfig:
    base = SparkInferConfig(
        Cluster(name, tuple(nodes)),
        coord_port=free_port(),
        serve_port=free_port(),
        bridge_port=free_port(),
        connect_timeout=30,
        load_timeout=60,
        ready_timeout=30,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def supervisor(
    cfg: SparkInferConfig,
    events: list[GroupEvent] | None = None,
    secrets: SecretStore | None = None,
    **policy: float,
) -> SparkInferCluster:
    paths = default_paths()
    return SparkInferCluster(
        cfg,
        paths,
        ClusterStore(paths).known_hosts,
        policy=GroupPolicy(backoff_initial=0.1, **policy),  # type: ignore[arg-type]
        on_event=None if events is None else events.append,
        secrets=secrets,
    )


def test_the_recipes_environment_and_flags_on_every_rank_not_the_cards() -> None:
    nodes = tuple(
        Node(
            host=f"spark{i}",
            address=f"10.0.0.{11 + i}",
            model_path="/k3/model",
            sparkinfer_bin="/k3/dist/kimi_k3_dist_generate",
        )
        for i in range(3)
    )
    cfg = SparkInferConfig(Cluster("spark", nodes), api_key="s3cret-key")
    shard1 = "/k3/model/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf"
    binary = "/k3/dist/kimi_k3_dist_generate"
    # scripts/k3_cluster.sh: --max-ctx 4096 and the K=8/P8 drafter flags on every rank
    drafter = ["--spec-draft", "8", "--spec-ngram-min", "1", "--spec-ngram-max", "8",
               "--spec-min-occur", "2", "--spec-majority", "2/3"]  # fmt: skip
    assert rank_argv(cfg, 0) == [
        binary, "--rank", "0", "--world", "3", "--listen", "10.0.0.11:29500",
        "--model", shard1, "--max-ctx", "4096", "--serve", "127.0.0.1:29600", *drafter,
    ]  # fmt: skip
    assert rank_argv(cfg, 2) == [
        binary, "--rank", "2", "--world", "3", "--coord", "10.0.0.11:29500",
        "--model", shard1, "--max-ctx", "4096", *drafter,
    ]  # fmt: skip
    commands = describe_launch(cfg)
    assert [n for n, _ in commands] == ["spark0", "spark1", "spark2", "spark0"]
    # k3_cluster.sh worker(): exact arithmetic (no expert skipping, no CUDA graphs), the
    # launcher's prefill chunk, head banding, P8 projections, GPU 0, dist/ libraries first
    recipe_env = (
        "env CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 NCCL_NVLS_ENABLE=0 "
        "SPARKINFER_K3_MOE_WEPS=0 SPARKINFER_K3_GRAPH=0 SPARKINFER_K3_PREFILL_CHUNK=16 "
        "SPARKINFER_K3_DIST_HEAD_BAND=1 SPARKINFER_K3_PROJ_TOKS=8 "
    )
    for _, command in commands[:3]:
        assert command.startswith(
            "LD_LIBRARY_PATH=/k3/dist${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} " + recipe_env + binary
        ), command
    # the bridge: a key (masked), replies as long as the context, the recipe's layout
    assert commands[3][1] == (
        "env CUDA_DEVICE_ORDER=PCI_BUS_ID K3_TOKENIZER_DIR=/k3/tokenizer "
        "K3_CHAT_TEMPLATE=/k3/model/k3_chat_template.jinja K3_API_HOST=10.0.0.11 "
        "K3_API_PORT=8000 K3_SERVE_HOST=127.0.0.1 K3_SERVE_PORT=29600 "
        "K3_MODEL_NAME=kimi-k3-neuron K3_MAX_CONTEXT_TOKENS=4096 K3_MAX_TOKENS=4096 "
        "K3_DEFAULT_MAX_TOKENS=512 'K3_API_KEY=********' "
        "bash kimi-k3-neuron-tp3-dgxspark-recipe/api-server/run-api.sh"
    )
    assert all("s3cret-key" not in c for _, c in commands)
    # the other profiles the recipe measured
    k4 = rank_argv(replace(cfg, profile="k4"), 1)
    assert k4[k4.index("--spec-draft") :] == ["--spec-draft", "4", *drafter[2:]]
    k4_env = replace(cfg, profile="k4").rank_env
    assert "SPARKINFER_K3_PROJ_TOKS" not in k4_env
    assert k4_env["SPARKINFER_K3_MOE_WEPS"] == "0"
    baseline = replace(cfg, profile="baseline")
    assert "--spec-draft" not in rank_argv(baseline, 0)
    assert baseline.rank_env["SPARKINFER_K3_GRAPH"] == "0"
    assert "--spec-draft" not in rank_argv(replace(cfg, spec_draft=0), 1)
    # the launcher's SPEC_K=5: its n-gram window follows K; the K=4 receipt's stays 8
    assert rank_argv(replace(cfg, spec_draft=5), 1)[-10:] == [
        "--spec-draft", "5", "--spec-ngram-min", "1", "--spec-ngram-max", "5", *drafter[6:],
    ]  # fmt: skip
    assert rank_argv(replace(cfg, profile="k4", spec_draft=5), 1)[-10:] == [
        "--spec-draft", "5", *drafter[2:],
    ]  # fmt: skip
    # an open bridge is described without a key only when asked to be
    assert "K3_API_KEY" not in describe_launch(replace(cfg, api_key=""), keyed=False)[3][1]
    assert "'K3_API_KEY=********'" in describe_launch(replace(cfg, api_key=""))[3][1]

    placed = replace(
        cfg,
        cluster=Cluster("spark", (replace(nodes[0], workdir="/srv/k3"), *nodes[1:])),
        tokenizer_dir="/hf/Kimi-K3",
        max_ctx=8192,
    )
    bridge = describe_launch(placed)[3][1]
    assert "K3_TOKENIZER_DIR=/hf/Kimi-K3 " in bridge
    assert "K3_CHAT_TEMPLATE=/k3/model/k3_chat_template.jinja " in bridge
    assert "K3_MAX_CONTEXT_TOKENS=8192 K3_MAX_TOKENS=8192 K3_DEFAULT_MAX_TOKENS=512 " in bridge
    assert bridge.endswith(" bash /srv/k3/kimi-k3-neuron-tp3-dgxspark-recipe/api-server/run-api.sh")
    assert check_sparkinfer(cfg).ok
    text = explain_card_command()
    for wrong in ("`sparkinfer`", "--tp", "--ctx-len", "--jdba-band", "9000", "first shard file"):
        assert wrong in text, wrong
    assert "kimi_k3_dist_generate --rank 0 --world 3 --listen" in text
    assert "SPARKINFER_K3_MOE_WEPS=0" in text
    assert "--spec-draft 8 --spec-ngram-min 1 --spec-ngram-max 8" in text
    assert "K3_TOKENIZER_DIR=/k3/tokenizer" in text
    assert "hf download moonshotai/Kimi-K3 --local-dir /k3/tokenizer" in text
    assert "K3_API_KEY=" in text
    assert "api-server/run-api.sh" in text


def test_spec_draft_is_refused_only_where_the_engine_refuses_it(tmp_path: Path) -> None:
    nodes = tuple(Node(host=f"10.0.0.{i}", model_path="/models/k3") for i in range(1, 4))
    cfg = SparkInferConfig(Cluster("c", nodes))

    def refusals(**kw: object) -> tuple[str, ...]:
        return check_sparkinfer(replace(cfg, **kw)).refusals  # type: ignore[arg-type]

    assert refusals() == ()
    assert refusals(spec_draft=17) == ("--spec-draft must be between 2 and 16, not 17.",)
    assert refusals(spec_draft=1) == ("--spec-draft must be between 2 and 16, not 1.",)
    # no PREFILL_CHUNK at all: the engine's default chunk (64) covers K=8 and K=16
    unset = {"SPARKINFER_K3_PREFILL_CHUNK": ""}
    assert refusals(profile="baseline", spec_draft=16, env=unset) == ()
    assert refusals(env={"SPARKINFER_K3_PREFILL_CHUNK": "junk"}) == ()  # atoi -> 0 -> 64
    small = refusals(env={"SPARKINFER_K3_PREFILL_CHUNK": "4"})
    assert small == (
        "--spec-draft 8 needs SPARKINFER_K3_PREFILL_CHUNK >= 8 on every rank, and "
        "SPARKINFER_K3_PREFILL_CHUNK=4 gives a prefill chunk of 4.",
    )
    assert refusals(env={"SPARKINFER_K3_PREFILL_CHUNK": "8"}) == ()
    assert refusals(profile="nonsense")[0].startswith("There is no SparkInfer profile")
    # the same verdicts from the stand-in of the engine, which applies the checks of
    # patches 0024-0026 itself: k3desk refuses exactly what makes it exit 2 with a reason
    # about the drafter (past them it stops at the missing model file instead)
    binary = str(FAKES / "kimi_k3_dist_generate")
    cases = [
        ({}, None),
        ({"SPARKINFER_K3_PREFILL_CHUNK": "junk"}, None),
        ({"SPARKINFER_K3_PREFILL_CHUNK": ""}, 16),
        ({"SPARKINFER_K3_PREFILL_CHUNK": "4"}, None),
        ({"SPARKINFER_K3_PREFILL_CHUNK": "4"}, 4),
        ({"SPARKINFER_K3_PREFILL_CHUNK": "2"}, 3),
        ({}, 17),
        ({}, 0),
    ]
    for env, k in cases:
        c = replace(cfg, env=env, spec_draft=k)
        argv = [binary, *rank_argv(c, 1)[1:]]
        argv[argv.index("--model") + 1] = str(tmp_path / "absent-00001-of-00009.gguf")
        done = subprocess.run(argv, env={**os.environ, **c.rank_env}, capture_output=True,
                              text=True, timeout=20, check=False)  # fmt: skip
        assert done.returncode == 2, done.stderr
        past_the_drafter = "--model must be the first .gguf shard file" in done.stderr
        assert past_the_drafter == check_sparkinfer(c).ok, (env, k, done.stderr)


def test_bridge_without_tokenizer_or_template_is_refused() -> None:
    bare = tuple(Node(host=f"10.0.0.{11 + i}") for i in range(3))  # no model folder anywhere
    cfg = SparkInferConfig(Cluster("bare", bare))
    refusals = check_sparkinfer(cfg).refusals
    assert refusals == (
        "The recipe's HTTP bridge (api-server/run-api.sh) needs the model's tokenizer folder "
        "(K3_TOKENIZER_DIR) and its chat template (K3_CHAT_TEMPLATE), and rank 0 (10.0.0.11) "
        "has no model folder to find them in: set model=FOLDER for that node (the recipe "
        "keeps k3_chat_template.jinja with the shards and tokenizer/ beside that folder) or "
        "give --tokenizer-dir and --chat-template.",
    )
    with pytest.raises(ClusterError, match="needs the model's tokenizer folder"):
        check_sparkinfer(cfg).raise_if_refused()
    # one of the two given: the other is still named
    half = check_sparkinfer(replace(cfg, tokenizer_dir="/hf/tok")).refusals
    assert len(half) == 1
    assert "needs the model's chat template (K3_CHAT_TEMPLATE), and" in half[0]
    assert check_sparkinfer(replace(cfg, tokenizer_dir="/hf/tok", chat_template="/t.jinja")).ok
    # a bridge of one's own that needs neither
    assert check_sparkinfer(replace(cfg, bridge_argv=("my-bridge", "--port", "{port}"))).ok
    # workers without a model folder do not matter: only rank 0 runs the bridge
    ranked = (Node(host="10.0.0.11", model_path="/models/k3"), *bare[1:])
    assert check_sparkinfer(SparkInferConfig(Cluster("r", ranked))).ok


def test_refusals_name_the_reason(catalog_tiers: dict[str, object]) -> None:
    gb10 = HardwareProfile.from_json_file(HARDWARE / "3xGB10-node.json")
    h200 = HardwareProfile.from_json_file(HARDWARE / "1xH200-141GB.json")
    rtx5090 = HardwareProfile.from_json_file(HARDWARE / "1xRTX5090-256GB.json")
    nodes = tuple(Node(host=f"10.0.0.{i}", model_path="/models/k3") for i in range(1, 4))
    cfg = SparkInferConfig(Cluster("c", nodes))
    good = {n.label: gb10 for n in nodes}
    assert check_sparkinfer(cfg, tier=catalog_tiers["vcruz305-ud-iq1s"], profiles=good).ok

    wrong_tier = check_sparkinfer(cfg, tier=catalog_tiers["grearl-iq1s"], profiles=good)
    assert "loads only the pruned 9-shard vcruz305/Kimi-K3-GGUF" in wrong_tier.refusals[0]
    assert GEOMETRY_ERROR in wrong_tier.refusals[0]

    hopper = check_sparkinfer(cfg, profiles={**good, "10.0.0.2": h200})
    assert len(hopper.refusals) == 1
    assert "Node 10.0.0.2 has NVIDIA H200 (Hopper, sm_90)" in hopper.refusals[0]
    with pytest.raises(ClusterError, match="SparkInfer cannot run this"):
        hopper.raise_if_refused()

    other_blackwell = check_sparkinfer(cfg, profiles={**good, "10.0.0.3": rtx5090})
    assert other_blackwell.ok
    assert "qualifies TP3 on GB10 (sm_121) only" in other_blackwell.warnings[0]

    tp4 = SparkInferConfig(Cluster("c4", (*nodes, Node(host="10.0.0.4"))))
    tp4_check = check_sparkinfer(tp4, profiles={**good, "10.0.0.4": gb10})
    assert tp4_check.ok
    assert "TP4 is experimental" in tp4_check.warnings[0]
    assert not check_sparkinfer(SparkInferConfig(Cluster("c2", nodes[:2]))).ok

    named = SparkInferConfig(Cluster("n", (replace(nodes[0], host="spark1"), *nodes[1:])))
    assert "IPv4 literals only" in check_sparkinfer(named).refusals[0]
    assert "'spark1' is a host name" in check_sparkinfer(named).refusals[0]
    v6_node = replace(nodes[0], host="s", address="fd00::2")
    v6 = SparkInferConfig(Cluster("v6", (v6_node, *nodes[1:])))
    assert "is an IPv6 address" in check_sparkinfer(v6).refusals[0]


@pytest.fixture
def catalog_tiers() -> dict[str, object]:
    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.resources import resources_dir

    catalog = load_catalog(resources_dir() / "catalog.json")
    return {t.id: t for t in catalog.tiers}


def test_start_chat_worker_death_restart_and_stop(sshd: SshServer, tmp_path: Path) -> None:
    nodes = spark_nodes(sshd, "tp3-")
    dump = tmp_path / "env"
    cfg = config_for(nodes, "tp3", env={"FAKE_SPARKINFER_ENV_DUMP": str(dump)})
    # the probe sees three complete copies with the recipe's geometry
    reports = probe_cluster(
        cfg.cluster,
        ClusterStore(default_paths()).known_hosts,
        spec=ShardSetSpec(RECIPE_NAMES, expert_count=896, expert_feed_forward_length=1536),
    )
    assert all(r.copy is not None and r.copy.complete for r in reports)
    assert check_sparkinfer(cfg, reports=reports).refusals == ()

    events: list[GroupEvent] = []
    keyring = MemoryKeyring()
    sup = supervisor(cfg, events, SecretStore(keyring_module=FakeKeyringModule(keyring)))
    sup.start()
    try:
        ep = sup.wait_ready(60)
        assert ep.root == cfg.url
        # the bridge's key: made on first use, kept in the keyring, handed to the chat
        key = keyring.get_password("k3desk", "sparkinfer-bridge:tp3")
        assert key
        assert len(key) >= 32
        assert ep.api_key == key
        assert sup.new_key
        assert httpx.get(f"{ep.root}/v1/models").status_code == 401
        assert httpx.get(f"{ep.root}/healthz").status_code == 200  # health stays open
        assert all(key not in (p.command_line) for p in [*sup.ranks, sup.bridge] if p)
        logs = [p for p in Path(default_paths().logs_dir).rglob("*") if p.is_file()]
        assert logs
        assert all(key not in p.read_text() for p in logs)
        # every rank (over ssh) got the recipe's environment and the PCI GPU order
        for rank in range(3):
            seen = json.loads((dump / f"rank{rank}.json").read_text())
            for k, v in {**PROFILES["k8-p8"].env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}.items():
                assert seen.get(k) == v, (rank, k)
        assert sup.bridge is not None
        assert sup.bridge.remote_pid is not None
        bridge_env = environ_of(sup.bridge.remote_pid)  # what the bridge process really got
        assert bridge_env["K3_API_KEY"] == key  # over the ssh connection's stdin
        assert bridge_env["K3_MAX_TOKENS"] == "4096"
        assert bridge_env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        spec_line = next(line for line in sup.ranks[0].tail(200) if "[spec-draft] ON" in line)
        assert "K=8 ngram n=[1,8] min_occur=2 agree=0 majority=2/3" in spec_line
        # replies may be as long as the context (the bridge's default cap of 512 is gone),
        # and asking for more than that is refused by the bridge itself
        body = {"model": "kimi-k3-neuron", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {key}"}
        long = httpx.post(f"{ep.root}/v1/chat/completions", headers=headers,
                          json={**body, "max_tokens": 4000}, timeout=30)  # fmt: skip
        assert long.status_code == 200, long.text
        over = httpx.post(f"{ep.root}/v1/chat/completions", headers=headers,
                          json={**body, "max_tokens": 4097}, timeout=30)  # fmt: skip
        assert over.status_code == 400
        assert over.json()["error"]["code"] == "max_tokens_exceeded"
        phases = [e.progress.stage for e in events if e.progress is not None]
        assert phases[0] == "starting rank 0"
        assert (
            phases.index("rank 0 waiting for workers")
            < phases.index("workers connected (NCCL ready), loading weights")
            < phases.index("bridge ready")
        )
        details = [e.progress.detail for e in events if e.progress is not None]
        assert "rank 0: shard 9/9 mapped" in details
        assert [p.name for p in sup.ranks] == ["rank 0", "rank 1", "rank 2"]

        with ChatClient(ep) as client:
            assert client.capabilities().model == "kimi-k3-neuron"
            result = client.chat(
                [ChatMessage("user", "hello over three sparks")], ChatSettings(thinking=False)
            )
        assert "hello over three sparks" in result.text
        assert result.model == "kimi-k3-neuron"
        assert result.reasoning == ""
        with ChatClient(ep) as client:  # the client sends the bridge its top-level "thinking"
            thought = client.chat([ChatMessage("user", "think first")], ChatSettings(thinking=True))
        assert thought.reasoning.startswith("The user wrote")
        assert "think first" in thought.text
        deadline = time.monotonic() + 5
        while len(sup.stats) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sup.stats[-1].generated_tokens > 0
        assert sup.stats[-1].decode_tokens_per_s > 0

        # a worker dies: noticed through its ssh connection, without any request
        victim = sup.ranks[2]
        assert victim.remote_pid is not None
        t0 = time.monotonic()
        os.kill(victim.remote_pid, 9)
        assert sup.wait_state(GroupState.RESTARTING, 5), sup.state
        noticed = time.monotonic() - t0
        assert noticed < 3
        restart = [e.message for e in events if e.state is GroupState.RESTARTING]
        assert any("rank 2 on tp3-2 killed by SIGKILL" in m for m in restart), restart
        ep2 = sup.wait_ready(60)
        assert len(sup.attempts) == 2
        assert all(p.alive for p in sup.ranks)
        assert victim.remote_pid not in [p.remote_pid for p in sup.ranks]
        assert ep2.api_key == key  # the same key after a restart
        with ChatClient(ep2) as client:
            again = client.chat([ChatMessage("user", "still there?")], ChatSettings(thinking=False))
        assert "still there?" in again.text
        pids = [p.remote_pid for p in sup.ranks] + [sup.bridge.remote_pid if sup.bridge else 0]
    finally:
        sup.stop()
    assert sup.state is GroupState.STOPPED
    for pid in pids:  # every rank and the bridge are gone
        assert pid is not None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"process {pid} survived stop")
    with pytest.raises(EngineUnavailableError), ChatClient(ep2) as client:
        client.chat([ChatMessage("user", "anyone?")])


def test_rank0_alone_only_notices_at_the_next_request(sshd: SshServer) -> None:
    """What the real engine does when nobody watches the workers (why k3desk watches them)."""
    nodes = spark_nodes(sshd, "blind-")
    cfg = config_for(nodes, "blind")
    sup = supervisor(cfg, max_failures=5)
    sup.start()
    try:
        ep = sup.wait_ready(60)
        worker = sup.ranks[1]
        worker.stopping = True  # hide this death from the supervisor
        assert worker.remote_pid is not None
        os.kill(worker.remote_pid, 9)
        worker.wait(5)
        assert httpx.get(f"{ep.root}/readyz").status_code == 200  # still "ready"
        with pytest.raises(Exception, match="prefill failed"), ChatClient(ep) as client:
            client.chat([ChatMessage("user", "hi")])
        # ... but rank 0's own log line makes k3desk restart everything
        assert sup.wait_state(GroupState.RESTARTING, 5)
        sup.wait_ready(60)
    finally:
        sup.stop()


def test_wrong_geometry_is_refused_and_not_retried(sshd: SshServer) -> None:
    nodes = spark_nodes(sshd, "geo-", expert_ff=3072)
    cfg = config_for(nodes, "geo")
    reports = probe_cluster(
        cfg.cluster, ClusterStore(default_paths()).known_hosts, spec=ShardSetSpec(RECIPE_NAMES)
    )
    refusals = check_sparkinfer(cfg, reports=reports).refusals
    assert len(refusals) == 3
    assert "896 experts of width 3072" in refusals[0]
    # started anyway: the engine refuses it and k3desk does not loop
    events: list[GroupEvent] = []
    sup = supervisor(cfg, events)
    sup.start()
    with pytest.raises(EngineError) as err:
        sup.wait_ready(60)
    assert GEOMETRY_ERROR in err.value.message
    assert "Only the pruned 9-shard" in err.value.hint
    assert len(sup.attempts) == 1
    assert sup.state is GroupState.FAILED
    assert events[-1].final
    sup.stop()


def test_unknown_arg_and_missing_binary_are_fatal(sshd: SshServer) -> None:
    nodes = spark_nodes(sshd, "args-")
    bad = config_for(nodes, "args", bridge_argv=("true",))
    bad_nodes = (replace(nodes[0], sparkinfer_bin=f"{FAKES / 'kimi_k3_dist_generate'}"), *nodes[1:])
    sup = supervisor(replace(bad, cluster=Cluster("args", bad_nodes), max_ctx=-1))
    sup.start()
    with pytest.raises(EngineError, match="rejected its arguments: --max-ctx must be a number"):
        sup.wait_ready(30)
    assert len(sup.attempts) == 1
    missing = (replace(nodes[0], sparkinfer_bin="/opt/nowhere/kimi_k3_dist_generate"), *nodes[1:])
    sup2 = supervisor(replace(bad, cluster=Cluster("args2", missing)))
    sup2.start()
    with pytest.raises(EngineError, match="was not found on the node") as err:
        sup2.wait_ready(30)
    assert "sparkinfer=PATH" in err.value.hint


def test_bridge_without_readyz_is_ready_by_healthz_and_the_serve_port(sshd: SshServer) -> None:
    """Older bridges answer /readyz with 404: k3desk does not wait for it forever."""
    nodes = spark_nodes(sshd, "old-")
    cfg = config_for(nodes, "old", bridge_argv=(*DEFAULT_BRIDGE, "--no-readyz"))
    events: list[GroupEvent] = []
    sup = supervisor(cfg, events)
    sup.start()
    try:
        ep = sup.wait_ready(60)
        assert httpx.get(f"{ep.root}/readyz").status_code == 404
        assert httpx.get(f"{ep.root}/healthz").status_code == 200
        ready = [e.progress for e in events if e.progress and e.progress.stage == "bridge ready"]
        assert ready[-1].detail == f"{cfg.url} (no /readyz: /healthz and the serve port answer)"
        with ChatClient(ep) as client:
            result = client.chat([ChatMessage("user", "hello old bridge")])
        assert "hello old bridge" in result.text
    finally:
        sup.stop()


def test_bridge_without_its_chat_template_fails_once_and_says_what_is_missing(
    sshd: SshServer,
) -> None:
    nodes = spark_nodes(sshd, "tmpl-")
    template = Path(nodes[0].model_path) / "k3_chat_template.jinja"
    template.unlink()
    sup = supervisor(config_for(nodes, "tmpl"))
    sup.start()
    with pytest.raises(EngineError) as err:
        sup.wait_ready(60)
    # the bridge's environment check renders one prompt before rank 0 loads for minutes
    assert err.value.message == (
        "The SparkInfer cluster failed: The recipe's bridge on rank 0 (tmpl-0) has no chat "
        f"template (K3_CHAT_TEMPLATE) {template}: run-api.sh stops with 'Tokenizer directory "
        "or chat-template file does not exist.'"
    )
    assert "the recipe fetches the tokenizer from moonshotai/Kimi-K3" in err.value.hint
    assert len(sup.attempts) == 1
    assert sup.state is GroupState.FAILED
    sup.stop()


def _serve(port: int, line: str) -> list[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(line.encode())
        return s.makefile("r").read().splitlines()


def test_serve_socket_speaks_the_recipe_line_protocol(tmp_path: Path) -> None:
    """The stand-in engine's socket, as the recipe's bridge talks to it (no ssh here)."""
    import sys

    model = write_recipe_twin(tmp_path / "m")[0]
    write_model_extras(tmp_path / "m")
    vocab = json.loads((tmp_path / "tokenizer" / "vocab.json").read_text())
    coord, serve = free_port(), free_port()
    common = ["--world", "3", "--model", str(model), "--max-ctx", "64"]
    binary = [sys.executable, str(FAKES / "kimi_k3_dist_generate")]
    env = {**os.environ, "FAKE_SPARKINFER_SHARD_DELAY_S": "0"}
    rank0 = subprocess.Popen(
        [*binary, "--rank", "0", "--listen", f"127.0.0.1:{coord}",
         "--serve", f"127.0.0.1:{serve}", *common],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    workers = [
        subprocess.Popen(
            [*binary, "--rank", str(r), "--coord", f"127.0.0.1:{coord}", *common],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        for r in (1, 2)
    ]
    try:
        assert rank0.stdout is not None
        for line in rank0.stdout:
            if "serve mode listening" in line:
                break
        o, c, sep, end, sp = (vocab[k] for k in ("<|open|>", "<|close|>", "<|sep|>",
                                                 "<|end_of_msg|>", "▁"))  # fmt: skip
        words = [vocab["hello"], sp, vocab["over"], sp, vocab["three"], sp, vocab["sparks"]]
        user = [o, vocab["message"], sp, vocab['role="user"'], sep]
        assistant = [o, vocab["message"], sp, vocab['role="assistant"'], sep]
        # the K3 template's rendering of one user turn, then the generation prompt (think)
        prompt = [*user, *words, c, vocab["message"], sep, end, *assistant, o, vocab["think"], sep]
        ids = ",".join(map(str, prompt))

        streamed = _serve(serve, f"prompt_ids={ids};n_predict=200;stop_ids={end};stream=1\n")
        toks = [int(x.removeprefix("tok=")) for x in streamed[:-1]]
        assert all(x.startswith("tok=") for x in streamed[:-1])
        final = dict(kv.split("=", 1) for kv in streamed[-1].split(";"))
        assert final["ok"] == "1"
        assert final["stop_reason"] == "stop"
        assert [int(x) for x in final["generated_ids"].split(",")] == toks
        # reasoning first (the prompt left think open), then K3's switch to the response
        switch = [c, vocab["think"], sep, o, vocab["response"], sep]
        at = next(i for i in range(len(toks)) if toks[i : i + len(switch)] == switch)
        assert at > 0
        closing = [c, vocab["response"], sep, c, vocab["message"], sep]
        assert toks[-len(closing) :] == closing  # the message closed; <|end_of_msg|> stops it
        assert toks[-len(closing) - len(words) : -len(closing)] == words  # the words, echoed
        assert end not in toks  # the stop id ends the answer and is not part of it

        plain = _serve(serve, f"prompt_ids={ids};n_predict=3;stop_ids={end};stream=0\n")
        assert len(plain) == 1  # no tok= lines without stream
        assert plain[0].startswith("ok=1;generated_ids=")
        assert ";stop_reason=length" in plain[0]
        assert plain[0].split(";")[1] == "generated_ids=" + ",".join(map(str, toks[:3]))

        too_long = ",".join(["7"] * 65)
        assert _serve(serve, f"prompt_ids={too_long};n_predict=4;stop_ids=;stream=0\n") == [
            "ok=0;error=prompt of 65 tokens exceeds --max-ctx 64"
        ]
        assert _serve(serve, "prompt_ids=a,b;n_predict=4;stream=1\n") == [
            "ok=0;error=bad request: prompt_ids must be comma-separated token ids"
        ]

        workers[0].kill()
        workers[0].wait(5)
        assert _serve(serve, f"prompt_ids={ids};n_predict=4;stop_ids={end};stream=1\n") == [
            "ok=0;error=prefill failed"
        ]
    finally:
        for p in (rank0, *workers):
            p.kill()
            p.wait(5)
        if rank0.stdout is not None:
            rank0.stdout.close()
