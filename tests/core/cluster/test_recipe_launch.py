"""k3desk's SparkInfer launch against the recipe's one-command launcher, rank by rank.

The recipe's ``scripts/k3_cluster.sh`` is not part of this repository: what it gives each
rank (environment and command line, for TP3 and TP4, over several hosts and on one PC)
is written down, with the line of the launcher each value was read from, in
``tests/fixtures/recipe/k3_cluster_facts.json``.  Each test here compares k3desk's launch
with those facts: the dry run's text, and what the stand-in engine
(``tests/fakes/sparkinfer/kimi_k3_dist_generate``) records when k3desk really starts it
over ssh.  Where k3desk chooses otherwise on purpose, the facts file says so
(``k3desk_differs``) and the tests hold k3desk to exactly that difference.

``K3_RECIPE_LAUNCHER=/path/to/k3_cluster.sh`` (a local copy of the recipe's launcher)
also runs the launcher itself against the same stand-in engine, one PC, and compares it
with the same facts; without it that test is skipped.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from k3desk.app import Services
from k3desk.cli import main
from k3desk.core.cluster.group import GroupPolicy
from k3desk.core.cluster.nodes import Cluster, ClusterStore, Node
from k3desk.core.cluster.sparkinfer import SparkInferCluster, SparkInferConfig
from k3desk.core.cluster.sparkinfer_dist import check_dist
from k3desk.core.engines.ports import free_port
from k3desk.core.errors import EngineError
from k3desk.core.paths import default_paths
from tests.core.cluster.twin import write_recipe_twin
from tests.fakes.sparkinfer.stand_in import install_recipe, write_model_extras
from tests.fixtures.engine import environ_of
from tests.fixtures.sshd import SshServer

FAKES = Path(__file__).resolve().parents[2] / "fakes" / "sparkinfer"
FACTS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "recipe" / "k3_cluster_facts.json")
    .read_text(encoding="utf-8")
)
SHARD1 = "Kimi-K3-UD-IQ1_S-00001-of-00009.gguf"
LIBS = ("libsparkinfer_runtime.so", "libsparkinfer_moe.so")  # k3_cluster.sh:74-75
KEEP = ("NCCL_", "SPARKINFER_", "CUDA_", "LD_LIBRARY_PATH")  # what the launcher sets


def k3(*argv: str) -> int:
    return main(list(argv), Services())


def _sub(value: str, subs: Mapping[str, str]) -> str:
    for k, v in subs.items():
        value = value.replace("{" + k + "}", v)
    return value


def recipe_rank(
    launch: str, rank: int, subs: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The launcher's environment (the variables it sets) and command line for ``rank``."""
    facts = FACTS["launches"][launch]
    world = len(facts["roles"])
    subs = {**subs, "RANK": str(rank), "WORLD": str(world)}
    env = {k: _sub(v["value"], subs) for k, v in FACTS["rank_env"].items()}
    env["CUDA_VISIBLE_DEVICES"] = facts["gpus"][rank]  # the role's GPU
    argv = FACTS["rank_argv"]
    role = FACTS["rank_argv"]["coordinator" if rank == 0 else "worker"]["value"]
    assert argv["slots"]["value"][facts["roles"][rank]] == rank
    return env, [
        _sub(argv["program"]["value"], subs),
        *(_sub(a, subs) for a in argv["every_rank"]["value"]),
        *(_sub(a, subs) for a in role),
    ]


def flags(argv: Sequence[str]) -> dict[str, str]:
    """``--flag value`` pairs by name (every flag the launch uses takes a value)."""
    assert len(argv) % 2 == 0, argv
    pairs = dict(zip(argv[::2], argv[1::2], strict=True))
    assert len(pairs) == len(argv) // 2, f"a flag given twice: {argv}"
    return pairs


def k3desk_wants(env: dict[str, str], argv: list[str], subs: Mapping[str, str]) -> None:
    """The recipe's launch turned into k3desk's by the differences the facts file argues."""
    differs = FACTS["k3desk_differs"]
    env["CUDA_DEVICE_ORDER"] = differs["CUDA_DEVICE_ORDER"]["k3desk"]
    if "--listen" in argv:
        at = argv.index("--listen") + 1
        assert argv[at] == _sub(differs["--listen"]["recipe"], subs)
        argv[at] = _sub(differs["--listen"]["k3desk"], subs)


def compare_rank(
    env: Mapping[str, str], argv: Sequence[str], launch: str, rank: int, subs: Mapping[str, str],
    *, as_k3desk: bool = True,
) -> None:  # fmt: skip
    """``env`` (all of a process's, or the variables a command line sets) and ``argv``
    against the launcher's for ``rank``."""
    want_env, want_argv = recipe_rank(launch, rank, subs)
    if as_k3desk:
        k3desk_wants(want_env, want_argv, subs)
    got = {k: v for k, v in env.items() if k.startswith(KEEP)}
    # the launcher puts $DIST before what was there (k3_cluster.sh:131)
    assert got.pop("LD_LIBRARY_PATH", "").split(":")[0] == want_env.pop("LD_LIBRARY_PATH")
    assert got == want_env, (launch, rank)
    assert argv[0] == want_argv[0]
    assert flags(argv[1:]) == flags(want_argv[1:]), (launch, rank)


# ------------------------------------------------------------------ the dry run


def parse_dry_line(line: str) -> tuple[str, str, dict[str, str], list[str]]:
    """``label: [LD_LIBRARY_PATH=...] env K=V ... argv`` -> (label, LD prefix, env, argv)."""
    label, _, command = line.partition(": ")
    words = shlex.split(command, posix=True)
    ld = words.pop(0).removeprefix("LD_LIBRARY_PATH=") if words[0].startswith("LD_") else ""
    env: dict[str, str] = {}
    if words and words[0] == "env":
        words.pop(0)
        while "=" in words[0] and not words[0].startswith(("/", "-")):
            k, _, v = words.pop(0).partition("=")
            env[k] = v
    return label, ld, env, words


def add_cluster(name: str, addresses: Sequence[str]) -> None:
    specs = [
        f"{a},name={name}{i},model=/k3/model,sparkinfer=/k3/dist/kimi_k3_dist_generate"
        for i, a in enumerate(addresses)
    ]
    assert k3("cluster", "add", name, *[x for s in specs for x in ("--node", s)]) == 0


@pytest.mark.parametrize(
    ("launch", "addresses"),
    [
        ("tp3-remote", ("10.0.0.11", "10.0.0.12", "10.0.0.13")),
        ("tp4-remote", ("10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14")),
        ("tp3-local", ("127.0.0.1",) * 3),
        ("tp4-local", ("127.0.0.1",) * 4),
    ],
)
def test_dry_run_gives_every_rank_the_launchers_environment_and_flags(
    launch: str, addresses: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    add_cluster("rc", addresses)
    capsys.readouterr()
    assert k3("cluster", "serve", "rc", "--engine", "sparkinfer", "--dry-run") == 0
    lines = capsys.readouterr().out.splitlines()
    commands = [parse_dry_line(x) for x in lines if not x.startswith("#")]
    notes = "\n".join(x for x in lines if x.startswith("#"))
    world = len(addresses)
    assert len(commands) == world + 1  # every rank, then the bridge
    subs = {"DIST": "/k3/dist", "BIN": "/k3/dist/kimi_k3_dist_generate",
            "MODEL": f"/k3/model/{SHARD1}", "FABRIC": addresses[0],
            "LISTEN_PORT": "29500", "SERVE_PORT": "29600"}  # fmt: skip
    assert FACTS["defaults"]["LISTEN"]["value"].endswith(":29500")
    for rank, (label, ld, env, argv) in enumerate(commands[:world]):
        assert label == f"rc{rank}"
        compare_rank({**env, "LD_LIBRARY_PATH": ld.split("$")[0]}, argv, launch, rank, subs)
        assert ld == "/k3/dist${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # the launcher's own dry-run prints no warning; k3desk's says TP4 is experimental
    tp4 = "# warning: TP4 is experimental in the recipe" in notes
    assert tp4 == (world == 4), notes
    # the bridge: the recipe's settings but where k3desk argues otherwise
    _, _, bridge, _ = commands[world]
    for key, fact in FACTS["bridge_env"].items():
        if key.startswith("K3_") and key not in FACTS["k3desk_differs"]:
            assert bridge[key] == fact["value"], key
    assert bridge["K3_API_HOST"] == addresses[0]
    assert bridge["K3_MAX_TOKENS"] == FACTS["defaults"]["MAX_CTX"]["value"]
    assert "512 when a request names no limit" in notes


def test_dry_run_spec_draft_4_is_the_launchers_spec_k_4(capsys: pytest.CaptureFixture[str]) -> None:
    add_cluster("k4", ("10.0.0.11", "10.0.0.12", "10.0.0.13"))
    capsys.readouterr()
    assert k3("cluster", "serve", "k4", "--engine", "sparkinfer", "--dry-run",
              "--spec-draft", "4") == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    _, _, env, argv = parse_dry_line(lines[1])
    drafter = argv[argv.index("--spec-draft") :]
    assert drafter == FACTS["spec_k4"]["value"]
    assert env["SPARKINFER_K3_PROJ_TOKS"] == "8"  # the launcher keeps its environment
    notes = "\n".join(x for x in lines if x.startswith("#"))
    assert "is the launcher with SPEC_K=4" in notes
    assert "The K=4 receipt's own combination is --profile k4." in notes


# ------------------------------------------------------------------ the real launch


def make_dist(folder: Path) -> Path:
    """A dist/ as the recipe's README step 2 makes it: the engine and its two libraries."""
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / "kimi_k3_dist_generate"
    shutil.copy2(FAKES / "kimi_k3_dist_generate", binary)
    for lib in LIBS:
        (folder / lib).write_bytes(b"\x7fELF stand-in " + lib.encode())
    return binary


def spark_nodes(sshd: SshServer, tag: str, addresses: Sequence[str], binary: Path) -> list[Node]:
    nodes = []
    for i, address in enumerate(addresses):
        node = sshd.node(f"{tag}{i}", sparkinfer_bin=str(binary), python="/usr/bin/python3",
                         address=address)  # fmt: skip
        write_recipe_twin(Path(node.model_path))
        write_model_extras(node.model_path)
        nodes.append(node)
    install_recipe(nodes[0].workdir)
    return nodes


def launch(nodes: list[Node], name: str, dump: Path) -> SparkInferCluster:
    cfg = SparkInferConfig(
        Cluster(name, tuple(nodes)),
        coord_port=free_port(),
        serve_port=free_port(),
        bridge_port=free_port(),
        env={"FAKE_SPARKINFER_ENV_DUMP": str(dump), "FAKE_SPARKINFER_SHARD_DELAY_S": "0"},
        connect_timeout=30,
        load_timeout=60,
        ready_timeout=30,
    )
    paths = default_paths()
    return SparkInferCluster(
        cfg, paths, ClusterStore(paths).known_hosts, policy=GroupPolicy(max_failures=1)
    )


def listening(port: int) -> set[str]:
    """The local addresses something listens on at ``port`` (from /proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, _, p = local.partition(":")
        if state == "0A" and int(p, 16) == port:
            out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


@pytest.mark.parametrize(
    ("launch_name", "addresses"),
    [
        # three machines (each its own loopback address): every rank on its GPU 0
        ("tp3-remote", ("127.0.0.1", "127.0.0.2", "127.0.0.3")),
        # one PC: four ranks on one address take GPUs 0..3 (k3_cluster.sh MODE=local)
        ("tp4-local", ("127.0.0.1",) * 4),
    ],
)
def test_real_launch_gives_every_rank_the_launchers_environment_and_flags(
    sshd: SshServer, tmp_path: Path, launch_name: str, addresses: tuple[str, ...]
) -> None:
    binary = make_dist(tmp_path / "dist")
    nodes = spark_nodes(sshd, f"{launch_name}-", addresses, binary)
    dump = tmp_path / "seen"
    sup = launch(nodes, launch_name, dump)
    sup.start()
    try:
        ep = sup.wait_ready(90)
        cfg = sup.config
        subs = {"DIST": str(binary.parent), "BIN": str(binary),
                "FABRIC": addresses[0], "LISTEN_PORT": str(cfg.coord_port),
                "SERVE_PORT": str(cfg.serve_port)}  # fmt: skip
        for rank, node in enumerate(nodes):
            env = json.loads((dump / f"rank{rank}.json").read_text())
            argv = json.loads((dump / f"rank{rank}.argv.json").read_text())
            model = {"MODEL": f"{node.model_path}/{SHARD1}"}
            compare_rank(env, argv, launch_name, rank, {**subs, **model})
        # rank 0 listens on the fabric address only, and the workers, started with the
        # launcher's own --coord FABRIC:PORT (k3_cluster.sh:142), reached it
        assert listening(cfg.coord_port) == {addresses[0]}
        # the bridge: a request without max_tokens and a prompt over 2,048 tokens is
        # answered, as with the recipe's settings (up to 4096 - 512 = 3,584)
        assert sup.bridge is not None
        assert sup.bridge.remote_pid is not None
        bridge = environ_of(sup.bridge.remote_pid)
        default = FACTS["bridge_env"]["K3_DEFAULT_MAX_TOKENS"]["value"]
        assert bridge["K3_DEFAULT_MAX_TOKENS"] == default
        headers = {"Authorization": f"Bearer {ep.api_key}"} if ep.api_key else {}
        words = " ".join(["hello"] * 1500)  # 2,999 tokens of the stand-in's vocabulary
        body = {"model": "kimi-k3-neuron", "messages": [{"role": "user", "content": words}]}
        r = httpx.post(f"{ep.root}/v1/chat/completions", headers=headers, json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > 2048
        too_long = {**body, "messages": [{"role": "user", "content": words + " hello" * 300}]}
        r = httpx.post(f"{ep.root}/v1/chat/completions", headers=headers, json=too_long, timeout=60)
        assert r.status_code == 400  # over 3,584: refused as the recipe's bridge refuses it
    finally:
        sup.stop()


def test_ranks_of_different_builds_are_not_started(sshd: SshServer, tmp_path: Path) -> None:
    """k3_cluster.sh checks one dist/'s SHA256SUMS on every peer before it starts (sync,
    lines 108-116 and 209): k3desk compares every rank's binary and libraries."""
    good = make_dist(tmp_path / "a" / "dist")
    other = make_dist(tmp_path / "b" / "dist")
    (other.parent / "libsparkinfer_moe.so").write_bytes(b"\x7fELF another build")
    nodes = spark_nodes(sshd, "mixed-", ("127.0.0.1", "127.0.0.2", "127.0.0.3"), good)
    nodes[2] = replace(nodes[2], sparkinfer_bin=str(other))
    dump = tmp_path / "seen"
    sup = launch(nodes, "mixed", dump)
    sup.start()
    with pytest.raises(EngineError) as err:
        sup.wait_ready(60)
    sup.stop()
    assert "The ranks do not run the same SparkInfer build: libsparkinfer_moe.so differs" in (
        err.value.message
    )
    assert "on rank 2 (mixed-2)" in err.value.message
    assert "k3_cluster.sh sync" in err.value.hint
    assert not dump.exists()  # nothing was started
    assert len(sup.attempts) == 1


def test_a_bare_program_name_is_found_with_its_libraries(tmp_path: Path) -> None:
    """``sparkinfer=kimi_k3_dist_generate`` (found on the node's PATH) still gets its own
    folder before LD_LIBRARY_PATH, as k3_cluster.sh:131 gives $DIST: the folder the program
    really is in, through a link."""
    binary = make_dist(tmp_path / "dist")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "kimi_k3_dist_generate").symlink_to(binary)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}

    def run(node: Node, command: str) -> str:
        done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True,
                              timeout=30, check=True)  # fmt: skip
        return done.stdout

    nodes = [Node(host="127.0.0.1", name=f"n{i}", workdir=str(tmp_path)) for i in range(3)]
    dists = check_dist(nodes, ["kimi_k3_dist_generate"] * 3, run)
    assert [d.folder for d in dists] == [str(binary.parent)] * 3
    assert sorted(dists[0].files) == sorted(["kimi_k3_dist_generate", *LIBS])


# ------------------------------------------------------------------ the launcher itself


def _launcher() -> Path:
    path = os.environ.get("K3_RECIPE_LAUNCHER", "")
    if not path:
        pytest.skip("K3_RECIPE_LAUNCHER (a local copy of the recipe's k3_cluster.sh) is not set")
    return Path(path)


@pytest.mark.parametrize(("launch_name", "tp"), [("tp3-local", "3"), ("tp4-local", "4")])
def test_the_recipes_own_launcher_matches_the_facts(
    tmp_path: Path, launch_name: str, tp: str
) -> None:
    """The facts file checked against the launcher itself (one PC, MODE=local), run with the
    same stand-in engine; skipped unless K3_RECIPE_LAUNCHER names a copy."""
    script = _launcher()
    home = tmp_path / "k3home"
    binary = make_dist(home / "dist")
    model = write_recipe_twin(home / "model")[0]
    write_model_extras(home / "model")
    dump = tmp_path / "seen"
    coord, serve = free_port(), free_port()
    env = {**os.environ, "K3_HOME": str(home), "MODE": "local", "TP_SIZE": tp,
           "COORDINATOR_FABRIC": "127.0.0.1", "MODEL": str(model),
           "LISTEN": f"0.0.0.0:{coord}", "SERVE": f"127.0.0.1:{serve}",
           "FAKE_SPARKINFER_ENV_DUMP": str(dump), "FAKE_SPARKINFER_SHARD_DELAY_S": "0"}  # fmt: skip
    dry = subprocess.run(["bash", str(script), "dry-run"], env=env, capture_output=True,
                         text=True, timeout=30, check=True)  # fmt: skip
    assert "warning" not in (dry.stdout + dry.stderr).lower()
    subprocess.run(["bash", str(script), "start"], env=env, timeout=60, check=True)
    try:
        deadline = time.monotonic() + 30
        while len(list(dump.glob("rank*.argv.json"))) < int(tp) and time.monotonic() < deadline:
            time.sleep(0.1)
        subs = {"DIST": str(binary.parent), "BIN": str(binary), "MODEL": str(model),
                "FABRIC": "127.0.0.1", "LISTEN_PORT": str(coord),
                "SERVE_PORT": str(serve)}  # fmt: skip
        for rank in range(int(tp)):
            seen = json.loads((dump / f"rank{rank}.json").read_text())
            argv = json.loads((dump / f"rank{rank}.argv.json").read_text())
            compare_rank(seen, argv, launch_name, rank, subs, as_k3desk=False)
    finally:
        subprocess.run(["bash", str(script), "stop"], env=env, timeout=60, check=False)
