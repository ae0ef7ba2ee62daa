"""SparkInfer TP3/TP4 over SSH, with the command line verified in its source.

SparkInfer (gittensor-ai-lab/sparkinfer-k3 v0.2.2 plus the vcruz305 recipe's
patch chain) runs one ``kimi_k3_dist_generate`` process per node::

    kimi_k3_dist_generate --rank R --world 3|4 (--listen IP:PORT | --coord IP:PORT)
                          --model <shard 1 .gguf> --max-ctx N [--serve IP:PORT]
                          [--spec-draft K --spec-ngram-min 1 --spec-ngram-max N ...]

with the environment and drafter flags of one of the recipe's own profiles
(:mod:`k3desk.core.cluster.recipe`, read from its ``scripts/k3_cluster.sh`` and receipts).

Rank 0 listens (``--listen``) and the workers connect to it (``--coord``); with
``--serve`` rank 0 opens a line-protocol socket (one TCP connection per request:
``prompt_ids=…;n_predict=N;stop_ids=…;stream=0|1``, answered by ``tok=ID`` lines and
one final ``ok=1;generated_ids=…;stop_reason=…`` or ``ok=0;error=…`` line).  The
recipe's FastAPI bridge (``api-server/run-api.sh`` -> ``server.py``), started beside
rank 0, tokenizes with the model's own tokenizer and chat template and turns that
socket into OpenAI-compatible HTTP (port 8000, model ``kimi-k3-neuron``), guarded by
``K3_API_KEY`` (the recipe: "Set K3_API_KEY even on a trusted network") and allowed
replies as long as the context (``K3_MAX_TOKENS``; its default of 512 refuses longer
requests and cuts replies, reasoning included).  The model
card's command (``sparkinfer --tp 3 --ctx-len --jdba-band``, port 9000, a directory
as ``--model``) does not exist: :func:`explain_card_command` tells a person who
copied it what to use instead.

:class:`SparkInferCluster` starts rank 0, then the workers over SSH, then the
bridge; follows rank 0's log phases and the bridge's ``/readyz`` (older bridges have
none: then ``/healthz`` plus a connect to the serve port on rank 0); watches every
rank (a dead worker is noticed at once through its ssh connection, not at the
next request as rank 0 would); and restarts all ranks together.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import httpx

from k3desk.core.chat.client import ChatEndpoint
from k3desk.core.chat.dialects import Limits
from k3desk.core.cluster.bridge_env import require_bridge_env
from k3desk.core.cluster.group import (
    EventCallback,
    GroupPolicy,
    GroupSupervisor,
    LaunchFailure,
    stop_remote_processes,
)
from k3desk.core.cluster.nodes import Cluster, ClusterError, Node, is_ipv4_literal
from k3desk.core.cluster.recipe import (
    DEFAULT_PROFILE,
    LAUNCHER_MAX_CTX,
    PROFILES,
    RecipeProfile,
    engine_refusals,
    profile_names,
)
from k3desk.core.cluster.ssh import (
    RemoteProcess,
    SshClient,
    classify_ssh_failure,
    remote_command,
)
from k3desk.core.hardware.nvidia import launch_env
from k3desk.core.hardware.profile import GpuInfo, HardwareProfile
from k3desk.core.paths import AppPaths
from k3desk.core.progress import CancelToken
from k3desk.core.safepaths import file_name_problem
from k3desk.core.secrets import SecretStore

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier
    from k3desk.core.cluster.probe import NodeReport

BINARY = "kimi_k3_dist_generate"
MODEL_NAME = "kimi-k3-neuron"
COORD_PORT = 29500
SERVE_PORT = 29600
BRIDGE_PORT = 8000
TARGET_EXPERTS = 896
TARGET_EXPERT_WIDTH = 1536
TARGET_SHARDS = 9
TARGET_REPO = "vcruz305/Kimi-K3-GGUF"
GEOMETRY_ERROR = "GGUF MoE geometry is not the Neuron 896x1536 recipe target"
API_KEY_ENV = "K3_API_KEY"  # the bridge's bearer key (api-server/server.py)

# The recipe's HTTP bridge beside rank 0: ``api-server/run-api.sh`` reads its settings
# from the environment (see :func:`bridge_env`) and execs ``server.py``.  Placeholders
# (also for ``--bridge-cmd``): {python} {workdir} {recipe} {engine} {host} {port} {model}
# {ctx} {tokenizer} {template}.
DEFAULT_BRIDGE = ("bash", "{recipe}/api-server/run-api.sh")
RECIPE_DIRNAME = "kimi-k3-neuron-tp3-dgxspark-recipe"  # the recipe's clone, in rank 0's workdir
# The recipe's README, step 1: shards and chat template in $K3_HOME/model (from
# vcruz305/Kimi-K3-GGUF), the tokenizer in $K3_HOME/tokenizer, fetched from
# moonshotai/Kimi-K3 (the model card's download does not bring it).
TOKENIZER_DIRNAME = "tokenizer"  # beside the model folder, as $K3_HOME/tokenizer
CHAT_TEMPLATE_NAME = "k3_chat_template.jinja"  # in the model folder
TOKENIZER_REPO = "moonshotai/Kimi-K3"
TOKENIZER_FILES = (
    "config.json",
    "generation_config.json",
    "tokenization_kimi.py",
    "tiktoken.model",
    "tokenizer_config.json",
)


def tokenizer_command(folder: str) -> str:
    """The recipe's command that fetches the bridge's tokenizer into ``folder``."""
    include = " ".join(f'--include "{f}"' for f in TOKENIZER_FILES)
    return f"hf download {TOKENIZER_REPO} --local-dir {folder} {include}"


def bridge_key_name(cluster: str) -> str:
    """The keyring entry of a cluster's bridge key."""
    return f"sparkinfer-bridge:{cluster}"


def bridge_key(secrets: SecretStore, cluster: str) -> tuple[str, bool]:
    """The bridge key of ``cluster`` from the keyring (made and saved on first use), and
    whether it is new (to be shown once)."""
    import secrets as random

    name = bridge_key_name(cluster)
    key = secrets.get(name)
    if key:
        return key, False
    key = random.token_urlsafe(32)
    secrets.set(name, key, what="bridge key")
    return key, True


# Steps 6 and 7 of the model card's launch procedure, as printed there.
CARD_COMMAND = (
    "sparkinfer --model ./Kimi-K3-UD-IQ1_S --tp 3 --rank 0 --listen --ctx-len 8192 --jdba-band\n"
    "sparkinfer --model ./Kimi-K3-UD-IQ1_S --tp 3 --rank 1 --coord <rank0-host>:9000 --jdba-band"
)


@dataclass(frozen=True)
class SparkInferConfig:
    cluster: Cluster
    model_file: str = "Kimi-K3-UD-IQ1_S-00001-of-00009.gguf"  # shard 1, in each node's model_path
    max_ctx: int = LAUNCHER_MAX_CTX
    profile: str = DEFAULT_PROFILE  # one of recipe.PROFILES
    spec_draft: int | None = None  # overrides the profile's K; 0 = no drafting
    env: Mapping[str, str] = field(default_factory=dict)  # over the profile's environment
    api_key: str = ""  # the bridge's K3_API_KEY ("" = an open bridge)
    coord_port: int = COORD_PORT
    serve_port: int = SERVE_PORT  # rank 0's line-protocol socket (bound to 127.0.0.1)
    bridge_port: int = BRIDGE_PORT
    bridge_host: str = ""  # "" = rank 0's address
    bridge_argv: tuple[str, ...] = DEFAULT_BRIDGE
    model_name: str = MODEL_NAME
    recipe_dir: str = ""  # on rank 0; "" = <rank 0 workdir>/kimi-k3-neuron-tp3-dgxspark-recipe
    tokenizer_dir: str = ""  # on rank 0; "" = <rank 0 model folder>/tokenizer
    chat_template: str = ""  # on rank 0; "" = <rank 0 model folder>/k3_chat_template.jinja
    connect_timeout: float = 180.0  # workers reaching rank 0
    load_timeout: float = 3600.0  # the recipe reports ~5m45s per rank
    ready_timeout: float = 120.0  # serve socket and bridge

    @property
    def world(self) -> int:
        return len(self.cluster.nodes)

    @property
    def recipe_profile(self) -> RecipeProfile:
        try:
            return PROFILES[self.profile]
        except KeyError:
            raise ClusterError(
                f"Unknown SparkInfer profile {self.profile!r}.",
                f"The recipe's profiles: {profile_names()}.",
            ) from None

    @property
    def rank_env(self) -> dict[str, str]:
        """Every rank's environment: the GPU order, the profile's, then ``env``."""
        return launch_env({**self.recipe_profile.env, **self.env})

    def library_path(self, node: Node) -> str:
        """The folder of the node's binary, which k3_cluster.sh puts before
        LD_LIBRARY_PATH (its dist/ holds libsparkinfer_runtime.so and libsparkinfer_moe.so)."""
        binary = node.sparkinfer_bin
        return str(PurePosixPath(binary).parent) if binary.startswith("/") else ""

    def model_path(self, node: Node) -> str:
        if not node.model_path:
            return self.model_file
        return str(PurePosixPath(node.model_path) / self.model_file)

    @property
    def rank0(self) -> Node:
        return self.cluster.nodes[0]

    @property
    def url(self) -> str:
        return f"http://{self.bridge_host or self.rank0.engine_address}:{self.bridge_port}"

    @property
    def recipe_path(self) -> str:
        if self.recipe_dir:
            return self.recipe_dir
        workdir = self.rank0.workdir
        return str(PurePosixPath(workdir) / RECIPE_DIRNAME) if workdir else RECIPE_DIRNAME

    @property
    def tokenizer_path(self) -> str:
        """The model's native tokenizer folder on rank 0 ('' when not known): by default
        ``tokenizer`` beside the model folder, as the recipe's $K3_HOME/tokenizer."""
        if self.tokenizer_dir:
            return self.tokenizer_dir
        folder = self.rank0.model_path.rstrip("/")
        return str(PurePosixPath(folder).parent / TOKENIZER_DIRNAME) if folder else ""

    @property
    def chat_template_path(self) -> str:
        """The recipe's chat template on rank 0 ('' when not known), by default in the
        model folder, where the download of the shards puts it."""
        if self.chat_template:
            return self.chat_template
        folder = self.rank0.model_path
        return str(PurePosixPath(folder) / CHAT_TEMPLATE_NAME) if folder else ""

    @property
    def bridge_paths(self) -> tuple[str, ...]:
        """What the bridge reads on rank 0 (the tokenizer folder, the chat template), for the
        probe to look for; empty when rank 0 has no model folder and none were given."""
        return tuple(p for p in (self.tokenizer_path, self.chat_template_path) if p)

    @property
    def bridge_needs_tokenizer(self) -> bool:
        """Whether the bridge command is the recipe's (which exits without them)."""
        return any(
            "run-api.sh" in a or "{tokenizer}" in a or "{template}" in a for a in self.bridge_argv
        )


def rank_argv(config: SparkInferConfig, rank: int) -> list[str]:
    """The verified command line of ``rank`` (0 = coordinator)."""
    node = config.cluster.nodes[rank]
    coord = f"{config.rank0.engine_address}:{config.coord_port}"
    argv = [node.sparkinfer_bin or BINARY, "--rank", str(rank), "--world", str(config.world)]
    argv += ["--listen", coord] if rank == 0 else ["--coord", coord]
    argv += ["--model", config.model_path(node), "--max-ctx", str(config.max_ctx)]
    if rank == 0:
        argv += ["--serve", f"127.0.0.1:{config.serve_port}"]
    # the same drafter flags on every rank: workers need K to arm the rollback ring
    return argv + config.recipe_profile.args(config.spec_draft)


def bridge_argv(config: SparkInferConfig) -> list[str]:
    node = config.rank0
    values = {
        "python": node.python,
        "workdir": node.workdir or ".",
        "recipe": config.recipe_path,
        "engine": f"127.0.0.1:{config.serve_port}",
        "host": config.bridge_host or node.engine_address,
        "port": str(config.bridge_port),
        "model": config.model_name,
        "ctx": str(config.max_ctx),
        "tokenizer": config.tokenizer_path,
        "template": config.chat_template_path,
    }
    return [a.format(**values) for a in config.bridge_argv]


def reply_caps(max_ctx: int) -> tuple[int, int]:
    """(K3_MAX_TOKENS, K3_DEFAULT_MAX_TOKENS) for a context of ``max_ctx`` tokens.

    The bridge refuses a request that asks for more than K3_MAX_TOKENS and one whose
    prompt plus completion exceeds K3_MAX_CONTEXT_TOKENS (``validate_request`` in
    api-server/server.py), so the cap is the context itself; the default for a request
    that names no limit leaves half the context to the prompt (a default of the whole
    context would refuse every such request).
    """
    return max_ctx, max(1, max_ctx // 2)


def bridge_env(config: SparkInferConfig) -> dict[str, str]:
    """What ``api-server/run-api.sh`` reads (it refuses to start without the first two);
    K3_API_KEY travels apart (:func:`bridge_secrets`)."""
    cap, default = reply_caps(config.max_ctx)
    env = {
        "K3_TOKENIZER_DIR": config.tokenizer_path,
        "K3_CHAT_TEMPLATE": config.chat_template_path,
        "K3_API_HOST": config.bridge_host or config.rank0.engine_address,
        "K3_API_PORT": str(config.bridge_port),
        "K3_SERVE_HOST": "127.0.0.1",
        "K3_SERVE_PORT": str(config.serve_port),
        "K3_MODEL_NAME": config.model_name,
        "K3_MAX_CONTEXT_TOKENS": str(config.max_ctx),
        "K3_MAX_TOKENS": str(cap),
        "K3_DEFAULT_MAX_TOKENS": str(default),
    }
    return launch_env({k: v for k, v in env.items() if v})


def bridge_secrets(config: SparkInferConfig) -> dict[str, str]:
    """The bridge's key, sent to rank 0 on the ssh connection's stdin, never on a command line."""
    return {API_KEY_ENV: config.api_key} if config.api_key else {}


def describe_launch(config: SparkInferConfig, *, keyed: bool = True) -> list[tuple[str, str]]:
    """(node, command) for every process, in start order, as a person would type them.

    The bridge's key is masked; with ``keyed`` it is shown (masked) even before it is
    known, as :class:`SparkInferCluster` gets one from the keyring when it starts.
    """
    if keyed and not config.api_key:
        config = replace(config, api_key="(made at start)")
    out = []
    for rank, node in enumerate(config.cluster.nodes):
        command = remote_command(
            rank_argv(config, rank), config.rank_env, library_path=config.library_path(node)
        )
        out.append((node.label, command))
    bridge = remote_command(
        bridge_argv(config), bridge_env(config), secrets=list(bridge_secrets(config))
    )
    out.append((config.rank0.label, bridge))
    return out


# ------------------------------------------------------------------ the card's command

_CARD_FIXES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), text)
    for p, text in (
        (
            r"(^|\s)sparkinfer(\s|$)",
            f"There is no `sparkinfer` program: the binary is `{BINARY}` (built from "
            "gittensor-ai-lab/sparkinfer-k3 v0.2.2 with the recipe's patch chain, "
            "-DSPARKINFER_TP=ON and NCCL).",
        ),
        (
            r"--tp\b",
            "`--tp N` does not exist: give `--world 3` (or 4) and a `--rank R` on each node.",
        ),
        (r"--ctx-len\b", "`--ctx-len` does not exist: the flag is `--max-ctx N`."),
        (
            r"--jdba-band\b",
            "`--jdba-band` does not exist: the closest setting is the environment variable "
            "SPARKINFER_K3_DIST_HEAD_BAND=1 on every rank.",
        ),
        (
            r":9000\b",
            "Nothing listens on port 9000: workers connect with `--coord IP:29500` (the "
            "coordinator port), the serve socket is 29600 (a line protocol, not HTTP), and "
            "the OpenAI-compatible HTTP comes from the bridge on port 8000.",
        ),
        (
            r"--listen(\s+--|\s*$)",
            "`--listen` needs an address: `--listen <rank-0 IPv4>:29500` (IPv4 literals only).",
        ),
        (
            r"--model\s+\S*Kimi-K3-UD-IQ1_S/?(\s|$)",
            "`--model` takes the first shard file, not the folder: "
            "`--model /path/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf`.",
        ),
    )
)


def explain_card_command(command: str = CARD_COMMAND) -> str:
    """What is wrong with a command copied from the model card, and the verified one."""
    lines = ["The model card's SparkInfer command does not match the program:"]
    found = [text for rx, text in _CARD_FIXES if rx.search(command)]
    if not found:
        lines = ["That command has none of the model card's known mistakes."]
    lines += [f"  - {t}" for t in found]
    profile = PROFILES[DEFAULT_PROFILE]
    env = " ".join(f"{k}={v}" for k, v in profile.env.items())
    flags = " ".join(profile.args())
    shard = "/k3/model/Kimi-K3-UD-IQ1_S-00001-of-00009.gguf"
    cap, default = reply_caps(LAUNCHER_MAX_CTX)
    lines += [
        "",
        "The verified command line, as the recipe's scripts/k3_cluster.sh starts it (one "
        "process per node, rank 0 first, each with the same environment):",
        f"  every rank:  {env} LD_LIBRARY_PATH=<dist>",
        f"  rank 0:  {BINARY} --rank 0 --world 3 --listen 10.0.0.11:29500 --model {shard} "
        f"--max-ctx {LAUNCHER_MAX_CTX} --serve 127.0.0.1:29600 {flags}",
        f"  rank 1:  {BINARY} --rank 1 --world 3 --coord 10.0.0.11:29500 --model {shard} "
        f"--max-ctx {LAUNCHER_MAX_CTX} {flags}",
        "  rank 2:  the same with --rank 2",
        "  then the recipe's HTTP bridge beside rank 0 (port 8000, model kimi-k3-neuron):",
        "           K3_TOKENIZER_DIR=/k3/tokenizer "
        f"K3_CHAT_TEMPLATE=/k3/model/{CHAT_TEMPLATE_NAME} K3_SERVE_PORT=29600 "
        f"K3_MAX_CONTEXT_TOKENS={LAUNCHER_MAX_CTX} K3_MAX_TOKENS={cap} "
        f"K3_DEFAULT_MAX_TOKENS={default} K3_API_KEY=<a long random secret> "
        "api-server/run-api.sh",
        f"  (the chat template comes with the shards from {TARGET_REPO}; the tokenizer "
        f"does not: `{tokenizer_command('/k3/tokenizer')}`).",
        "Every node needs its own complete copy of the 9 shards at the same path.  "
        "`--spec-draft K` (2..16) must be on every rank, with SPARKINFER_K3_PREFILL_CHUNK "
        "(64 when unset) >= K.",
        "`k3desk cluster serve NAME --engine sparkinfer` runs all of this for you.",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ refusals


@dataclass(frozen=True)
class SparkInferCheck:
    refusals: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.refusals

    def raise_if_refused(self) -> None:
        if self.refusals:
            raise ClusterError(
                "SparkInfer cannot run this: " + " ".join(self.refusals),
                "Use llama.cpp (`k3desk cluster serve NAME --engine rpc`, or one machine) "
                "for other tiers and hardware.",
            )


def is_gb10(gpu: GpuInfo) -> bool:
    return gpu.compute_capability == (12, 1) or "GB10" in gpu.name.upper()


def check_tier(tier: Tier) -> str:
    """Why SparkInfer cannot load ``tier`` ('' when it can)."""
    geometry = (tier.shard_count, tier.experts_kept, tier.expert_feed_forward_length)
    if geometry == (TARGET_SHARDS, TARGET_EXPERTS, TARGET_EXPERT_WIDTH) and (
        "sparkinfer" in tier.engines
    ):
        return ""
    return (
        f"SparkInfer loads only the pruned 9-shard {TARGET_REPO} tier (UD-IQ1_S, "
        f"{TARGET_EXPERTS} experts of width {TARGET_EXPERT_WIDTH}); tier {tier.id!r} has "
        f"{tier.shard_count} shards and {tier.experts_kept} experts of width "
        f"{tier.expert_feed_forward_length}, which it refuses with '{GEOMETRY_ERROR}'."
    )


def check_sparkinfer(
    config: SparkInferConfig,
    *,
    tier: Tier | None = None,
    profiles: Mapping[str, HardwareProfile | None] | None = None,
    reports: Sequence[NodeReport] = (),
) -> SparkInferCheck:
    """Everything k3desk can tell before launching (``profiles`` by node label)."""
    refusals: list[str] = []
    warnings: list[str] = []
    nodes = config.cluster.nodes
    world = len(nodes)
    if world not in (3, 4):
        refusals.append(
            f"SparkInfer runs on 3 nodes (TP3) or 4 (TP4); cluster {config.cluster.name!r} "
            f"has {world}."
        )
    elif world == 4:
        warnings.append(
            "TP4 is experimental in the recipe: TP3 on GB10 is the qualified setup, its "
            "K=8/P8 profile is qualified for TP3 only, and the recipe says not to quote a "
            "TP4 speed (the card's 7.90 tok/s is unverified)."
        )
    if tier is not None:
        why = check_tier(tier)
        if why:
            refusals.append(why)
    named = file_name_problem(config.model_file)  # joined to every node's model folder
    if named:
        refusals.append(
            f"--model must be shard 1's file name in each node's model folder, not "
            f"{config.model_file!r}: {named}."
        )
    elif not config.model_file.endswith(".gguf"):
        refusals.append(
            f"--model must be the first shard file (…-00001-of-00009.gguf), not "
            f"{config.model_file!r}."
        )
    for node in nodes:
        addr = node.engine_address
        if not is_ipv4_literal(addr):
            kind = "an IPv6 address" if ":" in addr else "a host name"
            refusals.append(
                f"Node {node.label}: SparkInfer takes IPv4 literals only for --listen/--coord, "
                f"and {addr!r} is {kind}; set address=<its IPv4 address> for this node."
            )
    if config.profile not in PROFILES:
        refusals.append(
            f"There is no SparkInfer profile {config.profile!r}; the recipe's are "
            f"{profile_names()}."
        )
    elif world:
        refusals += engine_refusals(rank_argv(config, 0), config.rank_env)
    if config.bridge_needs_tokenizer and world:
        missing = [
            what
            for what, value in (
                ("tokenizer folder (K3_TOKENIZER_DIR)", config.tokenizer_path),
                ("chat template (K3_CHAT_TEMPLATE)", config.chat_template_path),
            )
            if not value
        ]
        if missing:
            refusals.append(
                f"The recipe's HTTP bridge (api-server/run-api.sh) needs the model's "
                f"{' and its '.join(missing)}, and rank 0 ({config.rank0.label}) has no model "
                f"folder to find them in: set model=FOLDER for that node (the recipe keeps "
                f"{CHAT_TEMPLATE_NAME} with the shards and {TOKENIZER_DIRNAME}/ beside that "
                "folder) or give --tokenizer-dir and --chat-template."
            )
        else:
            bad, unchecked = _bridge_files(config, reports)
            refusals += bad
            warnings += unchecked
    for node in nodes:
        profile = (profiles or {}).get(node.label)
        if profile is None:
            warnings.append(f"Node {node.label}: hardware not probed; GB10 is assumed.")
            continue
        gpus = profile.gpus
        if any(is_gb10(g) for g in gpus):
            continue
        blackwell = [g for g in gpus if g.architecture == "Blackwell"]
        if blackwell:
            warnings.append(
                f"Node {node.label} has {blackwell[0].name} (sm_{blackwell[0].sm}): Blackwell, "
                "but the recipe qualifies TP3 on GB10 (sm_121) only; expect to build and tune "
                "it yourself."
            )
            continue
        have = ", ".join(f"{g.name} ({g.architecture}, sm_{g.sm})" for g in gpus) or (
            "no NVIDIA GPU"
        )
        refusals.append(
            f"Node {node.label} has {have}: SparkInfer's recipe runs on GB10 / DGX Spark "
            "(Blackwell, sm_121). The card's 'all Blackwell chips (H200, ...)' is wrong: H200 "
            "is Hopper (sm_90)."
        )
    for rep in reports:
        copy = rep.copy
        if copy is None:
            continue
        if copy.expert_count is not None and (
            copy.expert_count,
            copy.expert_feed_forward_length,
        ) != (TARGET_EXPERTS, TARGET_EXPERT_WIDTH):
            refusals.append(
                f"Node {rep.node.label}: the model in {copy.folder} has {copy.expert_count} "
                f"experts of width {copy.expert_feed_forward_length}; SparkInfer refuses it "
                f"('{GEOMETRY_ERROR}')."
            )
        elif not copy.complete:
            refusals.append(
                f"Node {rep.node.label} has no complete copy of the model ({copy.summary()}); "
                "every rank loads its own copy from the same path."
            )
    return SparkInferCheck(tuple(refusals), tuple(warnings))


_BRIDGE_FILES = (
    # what, the kind it must be, where to set it
    ("tokenizer folder (K3_TOKENIZER_DIR)", "dir", "Tokenizer folder / --tokenizer-dir"),
    ("chat template (K3_CHAT_TEMPLATE)", "file", "Chat template / --chat-template"),
)


def _what_is_there(found: str, wanted: str) -> str:
    """Why ``found`` (a probe's ``paths`` value) is not the ``wanted`` kind, in words."""
    if wanted == "file" and found.endswith("dir"):
        return "it is a folder, not a file"
    if wanted == "dir" and found.endswith("file"):
        return "it is a file, not a folder"
    return {
        "missing": "there is nothing there",
        "empty dir": "it is empty",
        "unreadable dir": "it cannot be read",
        "unreadable file": "it cannot be read",
    }.get(found, "it is neither a file nor a folder")


def _fetch_hint(kind: str, path: str, folder: str) -> str:
    """How the recipe gets the bridge's tokenizer folder (``kind`` "dir") or chat template."""
    if kind == "dir":
        return (
            f"the model card's download does not bring the tokenizer: the recipe fetches it "
            f"from {TOKENIZER_REPO} on rank 0 with `{tokenizer_command(path)}`"
        )
    return (
        f"it comes with the shards from {TARGET_REPO} (`hf download {TARGET_REPO} "
        f'--local-dir {folder} --include "{CHAT_TEMPLATE_NAME}"`)'
    )


def _bridge_files(
    config: SparkInferConfig, reports: Sequence[NodeReport]
) -> tuple[list[str], list[str]]:
    """Refusals for a tokenizer folder or chat template the probe found missing on rank 0,
    and warnings for those it did not look for (chosen after it ran)."""
    rank0 = config.rank0
    rep = next((r for r in reports if r.node == rank0 and r.ok), None)
    if rep is None:  # not probed, or unreachable (refused for that already)
        return [], []
    refusals: list[str] = []
    warnings: list[str] = []
    folder = rank0.model_path or "the folder that holds the shards"
    for (what, kind, setting), path in zip(
        _BRIDGE_FILES, (config.tokenizer_path, config.chat_template_path), strict=True
    ):
        found = rep.paths.get(path)
        if found is None:
            warnings.append(
                f"Rank 0 ({rank0.label}): the last probe did not look for the "
                f"{what.split(' (')[0]} {path}; probe again to check it is there."
            )
        elif found != kind:
            refusals.append(
                f"Rank 0 ({rank0.label}) has no {what} at {path}: "
                f"{_what_is_there(found, kind)}. The recipe's HTTP bridge "
                f"(api-server/run-api.sh) exits without it; {_fetch_hint(kind, path, folder)}, "
                f"or set where it is ({setting}), then probe again."
            )
    return refusals, warnings


# ------------------------------------------------------------------ supervision


@dataclass(frozen=True)
class ServeStats:
    """One ``[k3-dist][serve]`` line of rank 0."""

    prompt_tokens: int
    generated_tokens: int
    prefill_s: float
    decode_s: float

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0


_SERVE_RE = re.compile(
    r"\[k3-dist\]\[serve\] prompt_tokens=(\d+) generated_tokens=(\d+) "
    r"prefill_s=([\d.]+) decode_s=([\d.]+)"
)
_SHARD_RE = re.compile(r"\[gguf\] shard (\d+)/(\d+) mapped")
_PHASES = (
    ("listening", re.compile(r"\[rank0\] listening .*waiting for (\d+) workers")),
    ("nccl", re.compile(r"NCCL ready")),
    ("loaded0", re.compile(r"\[k3-dist\] rank 0 loaded ok")),
    ("complete", re.compile(r"rank0 bootstrap\+load complete")),
    ("serving", re.compile(r"\[rank0\] serve mode listening on")),
)
PHASE_TEXT = (
    "starting rank 0",
    "rank 0 waiting for workers",
    "workers connected (NCCL ready), loading weights",
    "rank 0 loaded",
    "every rank loaded",
    "serve socket open",
    "bridge ready",
)
StatsCallback = Callable[[ServeStats], None]


class SparkInferCluster(GroupSupervisor):
    kind = "SparkInfer cluster"

    def __init__(
        self,
        config: SparkInferConfig,
        paths: AppPaths,
        known_hosts: Path,
        *,
        policy: GroupPolicy | None = None,
        on_event: EventCallback | None = None,
        on_stats: StatsCallback | None = None,
        connect_timeout: int = 10,
        secrets: SecretStore | None = None,
    ) -> None:
        """With ``secrets``, a config without an ``api_key`` gets the cluster's bridge key
        from there (made and kept on first use) when it starts, off the caller's thread:
        a keyring may block on an unlock prompt."""
        super().__init__(policy=policy, on_event=on_event)
        self.config = config
        self._secrets = secrets
        self.new_key = False  # the key was made for this start (show it once)
        self.paths = paths
        self.known_hosts = known_hosts
        self._connect_timeout = connect_timeout
        self._on_stats = on_stats
        self._procs: list[RemoteProcess] = []
        self._bridge: RemoteProcess | None = None
        self._flags: set[str] = set()
        self._flag_cond = threading.Condition()
        self._shards = (0, 0)
        self.stats: list[ServeStats] = []

    @property
    def ranks(self) -> list[RemoteProcess]:
        with self._lock:
            return list(self._procs)

    def wait_stats(self, count: int, timeout: float) -> ServeStats | None:
        """The latest serve line once at least ``count`` were seen (rank 0 logs it last)."""
        deadline = time.monotonic() + timeout
        while len(self.stats) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.stats[-1] if len(self.stats) >= count else None

    @property
    def bridge(self) -> RemoteProcess | None:
        with self._lock:
            return self._bridge

    # ------------------------------------------------------------ launch
    def _log_path(self, attempt: int, what: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        d = self.paths.logs_dir / "cluster" / self.config.cluster.name
        return d / f"sparkinfer-{stamp}-a{attempt}-{what}.log"

    def _client(self, node: Node) -> SshClient:
        return SshClient(node, self.known_hosts, connect_timeout=self._connect_timeout)

    def _start(self, rank: int, attempt: int) -> RemoteProcess:
        cfg = self.config
        node = cfg.cluster.nodes[rank]
        proc = RemoteProcess(
            self._client(node),
            rank_argv(cfg, rank),
            name=f"rank {rank}",
            env=cfg.rank_env,
            library_path=cfg.library_path(node),
            cwd=node.workdir,
            log_path=self._log_path(attempt, f"rank{rank}"),
            on_line=self._rank0_line if rank == 0 else None,
            on_exit=self._member_exit,
            tie_to_thread=True,
        )
        with self._lock:
            self._procs.append(proc)
        return proc.start()

    def _launch(self, attempt: int, cancel: CancelToken) -> ChatEndpoint:
        if self._secrets is not None and not self.config.api_key:
            key, self.new_key = bridge_key(self._secrets, self.config.cluster.name)
            self.config = replace(self.config, api_key=key)
        cfg = self.config
        total = len(PHASE_TEXT)
        with self._flag_cond:
            self._flags = set()
        self._shards = (0, 0)
        self._phase(PHASE_TEXT[0], 0, total, cfg.rank0.label)
        if attempt == 1:  # before minutes of loading: can the recipe's bridge work there?
            require_bridge_env(
                self._client(cfg.rank0),
                bridge_argv=bridge_argv(cfg),
                recipe_dir=cfg.recipe_path,
                env=bridge_env(cfg),
                where=f"rank 0 ({cfg.rank0.label})",
                cancel=cancel,
            )
        rank0 = self._start(0, attempt)
        self._started(rank0, cancel)
        self._await("listening", 60.0, cancel)
        self._phase(PHASE_TEXT[1], 1, total, f"{cfg.world - 1} workers to connect")
        workers = [self._start(r, attempt) for r in range(1, cfg.world)]
        for w in workers:
            self._started(w, cancel)
        self._await("nccl", cfg.connect_timeout, cancel)
        self._phase(PHASE_TEXT[2], 2, total)
        self._await("loaded0", cfg.load_timeout, cancel)
        self._phase(PHASE_TEXT[3], 3, total)
        self._await("complete", cfg.load_timeout, cancel)
        self._phase(PHASE_TEXT[4], 4, total)
        self._await("serving", cfg.ready_timeout, cancel)
        self._phase(PHASE_TEXT[5], 5, total, f"127.0.0.1:{cfg.serve_port} on {cfg.rank0.label}")
        bridge = RemoteProcess(
            self._client(cfg.rank0),
            bridge_argv(cfg),
            name="bridge",
            env=bridge_env(cfg),
            secret_env=bridge_secrets(cfg),
            cwd=cfg.rank0.workdir,
            log_path=self._log_path(attempt, "bridge"),
            on_exit=self._member_exit,
            tie_to_thread=True,
        )
        with self._lock:
            self._bridge = bridge
        bridge.start()
        self._started(bridge, cancel)
        how = self._await_bridge(cfg.url, cfg.ready_timeout, cancel)
        self._phase(PHASE_TEXT[6], 7, total, f"{cfg.url} ({how})")
        # the bridge does not say its context; k3desk set it (K3_MAX_CONTEXT_TOKENS)
        told = Limits(context=cfg.max_ctx or None, source="K3_MAX_CONTEXT_TOKENS as launched")
        return ChatEndpoint(
            cfg.url, cfg.api_key or None, cfg.model_name, "sparkinfer-bridge", told
        )

    def _started(self, proc: RemoteProcess, cancel: CancelToken) -> None:
        deadline = time.monotonic() + self._connect_timeout + 20
        while proc.remote_pid is None:
            if proc.ended:
                raise self._failure()
            self._check_running(cancel)
            if time.monotonic() > deadline:
                raise LaunchFailure(f"{proc.name} on {proc.node.label} did not start in time")
            time.sleep(0.02)

    def _await(self, flag: str, timeout: float, cancel: CancelToken) -> None:
        deadline = time.monotonic() + timeout
        with self._flag_cond:
            while flag not in self._flags:
                if self._fault.is_set() or self._stop.is_set() or cancel.cancelled:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._flag_cond.wait(min(left, 0.1))
            if flag in self._flags:
                return
        if self._fault.is_set():
            raise self._failure()
        self._check_running(cancel)
        text = dict(zip((p for p, _ in _PHASES), PHASE_TEXT[1:], strict=False)).get(flag, flag)
        raise LaunchFailure(
            f"rank 0 did not reach '{text}' within {timeout:.0f} s",
            f"See the rank logs under {self.paths.logs_dir / 'cluster' / self.config.cluster.name}",
        )

    def _serve_port_open(self) -> bool:
        """Whether rank 0's serve socket accepts a connection (it binds 127.0.0.1 there)."""
        node = self.config.rank0
        probe = (
            "import socket; socket.create_connection(('127.0.0.1', "
            f"{int(self.config.serve_port)}), 3).close()"
        )
        try:
            result = self._client(node).run(
                remote_command([node.python, "-c", probe]), timeout=self._connect_timeout + 10
            )
        except ClusterError:
            return False
        return result.returncode == 0

    def _await_bridge(self, url: str, timeout: float, cancel: CancelToken) -> str:
        """Wait until the bridge can answer; how that was told, for the progress line.

        ``/readyz`` says so where the bridge has it.  Older bridges answer it with 404:
        then ready means ``/healthz`` answers and rank 0's serve port accepts.
        """
        deadline = time.monotonic() + timeout
        last = "no answer"
        legacy = False
        with httpx.Client(timeout=3.0) as http:
            while True:
                if self._fault.is_set():
                    raise self._failure()
                self._check_running(cancel)
                try:
                    if not legacy:
                        r = http.get(f"{url}/readyz")
                        if r.status_code == 200:
                            return "/readyz"
                        legacy = r.status_code == 404
                        last = f"/readyz: HTTP {r.status_code}"
                    if legacy:
                        h = http.get(f"{url}/healthz")
                        last = f"no /readyz; /healthz: HTTP {h.status_code}"
                        if h.status_code == 200:
                            if self._serve_port_open():
                                return "no /readyz: /healthz and the serve port answer"
                            last = (
                                f"no /readyz; /healthz answers but 127.0.0.1:"
                                f"{self.config.serve_port} on {self.config.rank0.label} "
                                "does not accept"
                            )
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                if time.monotonic() > deadline:
                    raise LaunchFailure(
                        f"the bridge at {url} did not report ready within {timeout:.0f} s ({last})"
                    )
                self._sleep(0.5 if legacy else 0.1, cancel)

    def _failure(self) -> LaunchFailure:
        """Why the launch failed, from the members that ended (fatal when a restart can't help)."""
        ended = [p for p in self.ranks + ([self.bridge] if self.bridge else []) if p.ended]
        for p in ended:
            text = "\n".join(p.tail(40))
            where = f"{p.name} on {p.node.label}"
            if GEOMETRY_ERROR in text:
                return LaunchFailure(
                    f"SparkInfer refused the model on {p.node.label}: {GEOMETRY_ERROR}",
                    f"Only the pruned 9-shard {TARGET_REPO} tier loads in SparkInfer; "
                    "run other tiers with llama.cpp (--engine rpc, or one machine).",
                    fatal=True,
                )
            m = re.search(r"unknown arg: ?(\S+)", text)
            if m:
                return LaunchFailure(
                    f"{where}: this SparkInfer build does not accept '{m.group(1)}' (unknown arg)",
                    "k3desk uses the command line of sparkinfer-k3 v0.2.2 with the recipe's "
                    "patches; rebuild it from that source.",
                    fatal=True,
                )
            if p.exit_status == 127 or p.missing_folder:
                return LaunchFailure(
                    f"{where}: {p.describe_exit()}",
                    f"Install {BINARY} on {p.node.label} or set sparkinfer=PATH for that node."
                    if p.exit_status == 127
                    else "Fix workdir= for that node.",
                    fatal=True,
                )
            if p.exit_status == 2 and p is self.bridge:
                last = p.tail(1)[0] if p.tail(1) else ""
                return LaunchFailure(
                    f"the recipe's HTTP bridge on {p.node.label} refused to start: {last}",
                    f"It needs the model's tokenizer folder and {CHAT_TEMPLATE_NAME} on "
                    f"{p.node.label} (k3desk passed {self.config.tokenizer_path or '(none)'} "
                    f"and {self.config.chat_template_path or '(none)'}; the recipe fetches "
                    f"the tokenizer from {TOKENIZER_REPO}), and the recipe's api-server in "
                    f"{self.config.recipe_path}.",
                    fatal=True,
                )
            if p.exit_status == 2:
                last = p.tail(1)[0] if p.tail(1) else ""
                return LaunchFailure(f"{where} rejected its arguments: {last}", fatal=True)
            if p.ssh_returncode == 255 and p.remote_pid is None:
                err = classify_ssh_failure(p.node, "\n".join(p.tail(5)), p.client.known_hosts)
                return LaunchFailure(err.message, err.hint)
        if ended:
            p = ended[0]
            last = p.tail(1)[0] if p.tail(1) else ""
            return LaunchFailure(f"{p.name} on {p.node.label} {p.describe_exit()}: {last}")
        with self._lock:
            reason = self._fault_reason
        return LaunchFailure(reason or "a member ended during the launch")

    # ------------------------------------------------------------ watching
    def _rank0_line(self, proc: RemoteProcess, line: str) -> None:
        for flag, rx in _PHASES:
            if rx.search(line):
                with self._flag_cond:
                    self._flags.add(flag)
                    self._flag_cond.notify_all()
        m = _SHARD_RE.search(line)
        if m:
            i, n = int(m.group(1)), int(m.group(2))
            self._shards = (i, n)
            self._phase(PHASE_TEXT[2], 2, len(PHASE_TEXT), f"rank 0: shard {i}/{n} mapped")
            return
        m = _SERVE_RE.search(line)
        if m:
            stats = ServeStats(
                int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4))
            )
            self.stats.append(stats)
            if self._on_stats is not None:
                with contextlib.suppress(Exception):
                    self._on_stats(stats)
            return
        if "prefill failed" in line:
            # rank 0 only finds out at a request; the ssh watch usually knew first
            self.fault(f"rank 0 reported: {line.strip()}")

    def _member_exit(self, proc: RemoteProcess) -> None:
        if proc.stopping:
            return
        last = proc.tail(1)
        tail = f" ({last[0]})" if last else ""
        self.fault(f"{proc.name} on {proc.node.label} {proc.describe_exit()}{tail}")

    def _teardown(self) -> None:
        with self._lock:
            procs = list(self._procs)
            bridge = self._bridge
            self._procs = []
            self._bridge = None
        stop_remote_processes(([bridge] if bridge else []) + procs, self.policy.stop_grace)
