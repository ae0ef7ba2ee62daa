"""Probe reports as :func:`~k3desk.core.cluster.probe.probe_cluster` returns them, for nodes
that do not exist here (GB10 DGX Sparks, an H200 server): a stand-in at the core API boundary."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from k3desk.core.cluster.nodes import Node
from k3desk.core.cluster.probe import CopyCheck, FileCheck, NodeReport
from k3desk.core.cluster.sparkinfer import CHAT_TEMPLATE_NAME, TOKENIZER_DIRNAME
from k3desk.core.hardware.profile import HardwareProfile
from tests.core.cluster.twin import RECIPE_NAMES

HARDWARE = Path(__file__).resolve().parents[3] / "resources" / "hardware"
SHARD_BYTES = 330_167_807_328 // 9


def profile(name: str) -> HardwareProfile:
    """A shipped hardware file, e.g. ``3xGB10-node`` or ``1xH200-141GB``."""
    return HardwareProfile.from_json_file(HARDWARE / f"{name}.json")


def recipe_copy(
    folder: str, *, complete: bool = True, expert_feed_forward_length: int = 1536
) -> CopyCheck:
    files = tuple(
        FileCheck(n, present=complete or i < 5, size=SHARD_BYTES, ok=complete or i < 5)
        for i, n in enumerate(RECIPE_NAMES)
    )
    problems = () if complete else tuple(f"{f.name} is missing" for f in files if not f.present)
    return CopyCheck(
        folder=folder,
        complete=complete,
        files=files,
        total_bytes=sum(f.size for f in files if f.present),
        problems=problems,
        architecture="kimi-k3",
        expert_count=896,
        expert_feed_forward_length=expert_feed_forward_length,
    )


def report(
    node: Node, hardware: str | None = "3xGB10-node", *, complete: bool = True, error: str = ""
) -> NodeReport:
    """A probe report for ``node``: the hardware file's profile and a copy of the recipe tier,
    with the chat template in the model folder and the tokenizer folder beside it (as the
    recipe lays them out, and as the app's probe reports them for rank 0)."""
    if error:
        return NodeReport(node, False, error=error)
    hw = profile(hardware) if hardware else None
    folder = node.model_path or "/models/k3"
    paths = (
        {
            str(PurePosixPath(folder).parent / TOKENIZER_DIRNAME): "dir",
            f"{folder}/{CHAT_TEMPLATE_NAME}": "file",
        }
        if node.model_path
        else {}
    )
    return NodeReport(
        node,
        True,
        hardware=hw,
        method="python",
        engines={node.sparkinfer_bin: f"/usr/local/bin/{Path(node.sparkinfer_bin).name}"},
        copy=recipe_copy(folder, complete=complete),
        python="3.12.3",
        paths=paths,
    )
