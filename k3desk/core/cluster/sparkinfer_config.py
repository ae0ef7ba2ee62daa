"""SparkInfer's launch configuration: every rank's and the bridge's command line and
environment, as the recipe runs them (see :mod:`k3desk.core.cluster.sparkinfer`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from k3desk.core.cluster.nodes import Cluster, ClusterError, Node
from k3desk.core.cluster.recipe import (
    DEFAULT_PROFILE,
    LAUNCHER_MAX_CTX,
    PROFILES,
    RecipeProfile,
    profile_names,
)
from k3desk.core.cluster.ssh import remote_command
from k3desk.core.hardware.nvidia import launch_env
from k3desk.core.secrets import SecretStore

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
    while key.startswith("-"):  # pasted after --key, a leading dash reads as an option
        key = random.token_urlsafe(32)
    secrets.set(name, key, what="bridge key")
    return key, True


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
        """What every rank's environment shares: the GPU order, the profile's, then ``env``
        (each rank's own GPU comes first: :meth:`rank_env_of`)."""
        return launch_env({**self.recipe_profile.env, **self.env})

    def rank_env_of(self, rank: int) -> dict[str, str]:
        """The environment of ``rank``: its GPU (``CUDA_VISIBLE_DEVICES``, k3_cluster.sh:132),
        then what every rank shares (``env`` may still name another GPU)."""
        gpu = {"CUDA_VISIBLE_DEVICES": rank_gpu(self, rank)}
        return launch_env({**gpu, **self.recipe_profile.env, **self.env})

    def library_path(self, node: Node) -> str:
        """The folder of the node's binary, which k3_cluster.sh puts before LD_LIBRARY_PATH
        (line 131: its dist/ holds libsparkinfer_runtime.so and libsparkinfer_moe.so, lines
        74-75).  '' for a bare program name: the launch finds its folder on the node
        (:mod:`k3desk.core.cluster.sparkinfer_dist`), a dry run shows :data:`BIN_DIR_EXPR`."""
        binary = node.sparkinfer_bin or BINARY
        return str(PurePosixPath(binary).parent) if "/" in binary else ""

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


# What a shell on the node makes of a bare program name's folder (for a dry run's text).
BIN_DIR_EXPR = '"$(dirname -- "$(readlink -f -- "$(command -v -- {binary})")")"'


def rank_gpu(config: SparkInferConfig, rank: int) -> str:
    """The GPU ``rank`` runs on (its ``CUDA_VISIBLE_DEVICES``), as k3_cluster.sh chooses it.

    The launcher (``role_gpu``, lines 84-91; ``start``, 214-217): one rank per machine runs
    on GPU 0 (``MODE=remote`` starts every peer with GPU 0, and ``GPU_COORDINATOR``
    defaults to 0); on one PC (``MODE=local``, ``COORDINATOR_FABRIC=127.0.0.1``) the
    coordinator, compute-a, -b and -c take GPUs 0, 1, 2, 3.  Here the ranks that share an
    engine address share a machine and take 0, 1, 2, ... in rank order; a node's ``gpu=``
    chooses for itself (the launcher's ``GPU_COORDINATOR`` / ``GPU_COMPUTE_A`` ...).
    """
    nodes = config.cluster.nodes
    node = nodes[rank]
    if node.gpu:
        return node.gpu
    same = [i for i, n in enumerate(nodes) if n.engine_address == node.engine_address]
    return str(same.index(rank))


def rank_argv(config: SparkInferConfig, rank: int) -> list[str]:
    """The verified command line of ``rank`` (0 = coordinator).

    Rank 0 listens on its own engine address, where k3_cluster.sh listens on
    ``0.0.0.0:29500`` (``LISTEN``, line 47; ``--listen "$LISTEN"``, line 140).  The
    workers connect to ``$COORDINATOR_FABRIC:<port>`` either way (line 142, and here the
    same address), so they find it; but the bootstrap port (the NCCL id handed out, then
    weights loaded on command) is not offered on every other network the machine is on,
    the management or public one included.  The recipe itself asks for "a private fabric
    address for cluster coordination, not a management gateway" (README, Prerequisites).
    """
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


RECIPE_DEFAULT_MAX_TOKENS = 512  # api-server/run-api.sh:30, server.py:46


def reply_caps(max_ctx: int) -> tuple[int, int]:
    """(K3_MAX_TOKENS, K3_DEFAULT_MAX_TOKENS) for a context of ``max_ctx`` tokens.

    The bridge refuses a request that asks for more than K3_MAX_TOKENS and one whose
    prompt plus completion exceeds K3_MAX_CONTEXT_TOKENS (``validate_request`` in
    api-server/server.py, lines 345-349 and 363-365), so the cap is the context itself.

    A request that names no limit gets K3_DEFAULT_MAX_TOKENS (server.py:343-344), which
    counts against the context before a token is generated: the recipe's 512
    (run-api.sh:30) with its 4096 context (README step 5, line 201) takes prompts up to
    3,584 tokens.  So the default stays the recipe's 512 (less than half of a smaller
    context), and only a request that asks gets more (k3desk's own chat always asks).
    """
    return max_ctx, max(1, min(RECIPE_DEFAULT_MAX_TOKENS, max_ctx // 2))


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
        library = config.library_path(node)
        command = remote_command(
            rank_argv(config, rank), config.rank_env_of(rank), library_path=library
        )
        if not library:  # a bare name: its folder, found by the node's shell
            where = BIN_DIR_EXPR.format(binary=shlex.quote(node.sparkinfer_bin or BINARY))
            command = f"LD_LIBRARY_PATH={where}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} {command}"
        out.append((node.label, command))
    bridge = remote_command(
        bridge_argv(config), bridge_env(config), secrets=list(bridge_secrets(config))
    )
    out.append((config.rank0.label, bridge))
    return out
