"""What k3desk can tell before a SparkInfer launch: refusals and warnings per node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from k3desk.core.cluster.nodes import ClusterError, is_ipv4_literal
from k3desk.core.cluster.recipe import (
    PROFILES,
    engine_refusals,
    profile_names,
)
from k3desk.core.cluster.sparkinfer_config import (
    CHAT_TEMPLATE_NAME,
    GEOMETRY_ERROR,
    TARGET_EXPERT_WIDTH,
    TARGET_EXPERTS,
    TARGET_REPO,
    TARGET_SHARDS,
    TOKENIZER_DIRNAME,
    TOKENIZER_REPO,
    SparkInferConfig,
    rank_argv,
    rank_gpu,
    tokenizer_command,
)
from k3desk.core.hardware.profile import GpuInfo, HardwareProfile
from k3desk.core.safepaths import file_name_problem

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier
    from k3desk.core.cluster.probe import NodeReport


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
    _check_world(config, refusals, warnings)
    if tier is not None:
        why = check_tier(tier)
        if why:
            refusals.append(why)
    refusals += _model_file_refusals(config)
    refusals += _address_refusals(config)
    if config.profile not in PROFILES:
        refusals.append(
            f"There is no SparkInfer profile {config.profile!r}; the recipe's are "
            f"{profile_names()}."
        )
    elif config.cluster.nodes:
        refusals += engine_refusals(rank_argv(config, 0), config.rank_env)
    if config.bridge_needs_tokenizer and config.cluster.nodes:
        _check_bridge(config, reports, refusals, warnings)
    _check_hardware(config, profiles or {}, refusals, warnings)
    refusals += _copy_refusals(reports)
    return SparkInferCheck(tuple(refusals), tuple(warnings))


def _check_world(config: SparkInferConfig, refusals: list[str], warnings: list[str]) -> None:
    """TP3 or TP4, nothing else; TP4 is not the qualified setup."""
    world = len(config.cluster.nodes)
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


def _model_file_refusals(config: SparkInferConfig) -> list[str]:
    named = file_name_problem(config.model_file)  # joined to every node's model folder
    if named:
        return [
            f"--model must be shard 1's file name in each node's model folder, not "
            f"{config.model_file!r}: {named}."
        ]
    if not config.model_file.endswith(".gguf"):
        return [
            f"--model must be the first shard file (…-00001-of-00009.gguf), not "
            f"{config.model_file!r}."
        ]
    return []


def _address_refusals(config: SparkInferConfig) -> list[str]:
    refusals = []
    for node in config.cluster.nodes:
        addr = node.engine_address
        if not is_ipv4_literal(addr):
            kind = "an IPv6 address" if ":" in addr else "a host name"
            refusals.append(
                f"Node {node.label}: SparkInfer takes IPv4 literals only for --listen/--coord, "
                f"and {addr!r} is {kind}; set address=<its IPv4 address> for this node."
            )
    return refusals


def _check_bridge(
    config: SparkInferConfig,
    reports: Sequence[NodeReport],
    refusals: list[str],
    warnings: list[str],
) -> None:
    """The HTTP bridge's tokenizer folder and chat template: given, and there."""
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


def _check_hardware(
    config: SparkInferConfig,
    profiles: Mapping[str, HardwareProfile | None],
    refusals: list[str],
    warnings: list[str],
) -> None:
    """Every node's GPUs: GB10 qualified, another Blackwell warned about, the rest
    refused; and each rank's GPU index within its machine's GPUs."""
    nodes = config.cluster.nodes
    for node in nodes:
        profile = profiles.get(node.label)
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
    for rank, node in enumerate(nodes):
        profile = profiles.get(node.label)
        gpu = rank_gpu(config, rank)
        if profile is not None and profile.gpus and gpu.isdigit() and int(gpu) >= len(profile.gpus):
            refusals.append(
                f"Rank {rank} ({node.label}) would run on GPU {gpu} (CUDA_VISIBLE_DEVICES), "
                f"and that machine has {len(profile.gpus)}: ranks that share an address share "
                "a machine and take GPUs 0, 1, 2, ... in turn; set gpu= for the node."
            )


def _copy_refusals(reports: Sequence[NodeReport]) -> list[str]:
    """Each node's copy of the model: the pruned geometry, complete."""
    refusals = []
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
    return refusals


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
