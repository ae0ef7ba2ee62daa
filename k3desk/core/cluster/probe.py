"""Probe the nodes of a cluster over SSH: hardware, engines, and the model copy.

One ssh round trip per node sends :mod:`k3desk.core.cluster.node_probe` to the
node's Python (``python3 -``).  That script uses ``k3desk doctor --json`` when
k3desk is installed on the node, else reads the hardware itself, and checks the
tier's shard files there by their GGUF headers (and sha256 on request).  Nodes
are probed in parallel; an unreachable node is a report with an error, not an
exception, so one dead machine does not hide the others.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3desk.core.cluster.nodes import Cluster, ClusterError, Node
from k3desk.core.cluster.ssh import SshClient, SshError
from k3desk.core.errors import HardwareError
from k3desk.core.gguf.ggml import BY_ID
from k3desk.core.hardware.profile import GpuInfo, HardwareProfile
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier

PROBE_SCRIPT = Path(__file__).with_name("node_probe.py")


def _ggml_sizes() -> dict[str, list[int]]:
    """The block/type sizes the node-side header check needs (k3desk.core.gguf.ggml)."""
    return {str(t.id): [t.block_size, t.type_size] for t in BY_ID.values()}


@dataclass(frozen=True)
class ShardSetSpec:
    """What a complete copy of a model looks like on a node."""

    names: tuple[str, ...]  # file names in split order
    total_bytes: int | None = None  # exact total, when published
    sizes: dict[str, int] = field(default_factory=dict)  # per-file sizes, when published
    sha256: dict[str, str] = field(default_factory=dict)  # per-file hashes, when published
    architecture: str = "kimi-k3"
    expert_count: int | None = None
    expert_feed_forward_length: int | None = None
    label: str = ""  # e.g. the tier id

    @classmethod
    def from_tier(cls, tier: Tier) -> ShardSetSpec:
        names = tuple(Path(n).name for n in tier.shard_names())
        return cls(
            names=names,
            total_bytes=tier.size_bytes if tier.size_exact else None,
            expert_count=tier.experts_kept,
            expert_feed_forward_length=tier.expert_feed_forward_length,
            label=tier.id,
        )

    @property
    def first(self) -> str:
        return self.names[0]

    def with_download_record(self, download_dir: Path) -> ShardSetSpec:
        """Per-file sizes and sha256 from this machine's download of the same files.

        ``k3desk download`` records what the Hub published (sizes, and the sha256 of
        every LFS file, pinned to one commit) in ``<dir>/.k3desk/state.json``; the
        nodes' copies are then checked against exactly that.
        """
        from k3desk.core.hub.state import TargetState

        state = TargetState(download_dir)
        if state.load_error:
            raise ClusterError(state.load_error)
        sizes: dict[str, int] = {}
        hashes: dict[str, str] = {}
        for path, rec in state.files.items():
            name = Path(path).name
            if name in self.names:
                sizes[name] = rec.size
                if rec.sha256:
                    hashes[name] = rec.sha256
        missing = [n for n in self.names if n not in sizes]
        if missing:
            raise ClusterError(
                f"{download_dir} has no download record for {', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                + ".",
                "Point it at the folder `k3desk download` wrote this tier into.",
            )
        return replace(self, sizes=sizes, sha256=hashes)

    def to_wire(self, check_sha256: bool) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "total_bytes": self.total_bytes,
            "sizes": self.sizes,
            "sha256": self.sha256,
            "architecture": self.architecture,
            "check_sha256": check_sha256,
        }


@dataclass(frozen=True)
class FileCheck:
    name: str
    present: bool
    size: int
    ok: bool
    problem: str = ""


@dataclass(frozen=True)
class CopyCheck:
    """The model copy on one node."""

    folder: str
    complete: bool  # every file present, consistent, untruncated (and hashed, if asked)
    files: tuple[FileCheck, ...]
    total_bytes: int
    problems: tuple[str, ...]
    architecture: str = ""
    expert_count: int | None = None
    expert_feed_forward_length: int | None = None
    sha256_checked: bool = False
    validated_by_k3desk: bool = False  # k3desk validate ran on the node too

    @property
    def first_part(self) -> str:
        return str(Path(self.folder) / self.files[0].name) if self.files else self.folder

    def geometry_matches(self, spec: ShardSetSpec) -> bool | None:
        """Whether the expert geometry is the one ``spec`` expects (None: not known)."""
        if spec.expert_count is None and spec.expert_feed_forward_length is None:
            return None
        if self.expert_count is None:
            return None
        return (spec.expert_count in (None, self.expert_count)) and (
            spec.expert_feed_forward_length in (None, self.expert_feed_forward_length)
        )

    def summary(self) -> str:
        if self.complete:
            how = "sha256 checked" if self.sha256_checked else "headers checked"
            if self.validated_by_k3desk:
                how += ", k3desk validate ok"
            return f"complete ({len(self.files)} files, {how})"
        if not self.files:
            return self.problems[0] if self.problems else "no files"
        missing = sum(1 for f in self.files if not f.present)
        if missing == len(self.files):
            return f"not there (no file of the set in {self.folder})"
        return f"incomplete: {'; '.join(self.problems[:3])}"


@dataclass(frozen=True)
class NodeReport:
    node: Node
    ok: bool  # reached and probed
    error: str = ""  # why not (an SshError message and hint)
    hardware: HardwareProfile | None = None
    method: str = ""  # "k3desk doctor" or "python"
    engines: dict[str, str] = field(default_factory=dict)  # binary as asked -> path found
    copy: CopyCheck | None = None
    python: str = ""
    elapsed_s: float = 0.0
    note: str = ""  # e.g. why k3desk doctor on the node was not used
    # path as asked -> what is there: "dir", "empty dir", "file", "missing", ... (see
    # node_probe.path_kinds); only the paths the probe was asked about
    paths: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "node": self.node.label,
            "host": self.node.host,
            "ok": self.ok,
            "error": self.error,
            "method": self.method,
            "engines": self.engines,
            "paths": self.paths,
            "python": self.python,
            "note": self.note,
            "elapsed_s": round(self.elapsed_s, 3),
            "hardware": self.hardware.to_dict() if self.hardware else None,
        }
        if self.copy is not None:
            c = self.copy
            d["copy"] = {
                "folder": c.folder,
                "complete": c.complete,
                "total_bytes": c.total_bytes,
                "problems": list(c.problems),
                "architecture": c.architecture,
                "expert_count": c.expert_count,
                "expert_feed_forward_length": c.expert_feed_forward_length,
                "sha256_checked": c.sha256_checked,
                "validated_by_k3desk": c.validated_by_k3desk,
                "files": [
                    {"name": f.name, "present": f.present, "size": f.size, "ok": f.ok,
                     "problem": f.problem}
                    for f in c.files
                ],
            }  # fmt: skip
        return d


def _fill_gpu_facts(profile: HardwareProfile) -> HardwareProfile:
    """Architecture names for GPUs the node-side probe left blank."""
    from k3desk.core.hardware.nvidia import architecture_for

    gpus: list[GpuInfo] = []
    for g in profile.gpus:
        if not g.architecture:
            g = replace(g, architecture=architecture_for(g.compute_capability))
        gpus.append(g)
    return replace(profile, gpus=tuple(gpus))


def _copy_from_wire(d: dict[str, Any], check_sha256: bool) -> CopyCheck:
    geometry = d.get("geometry") or {}
    files = tuple(
        FileCheck(
            name=str(f.get("name", "")),
            present=bool(f.get("present")),
            size=int(f.get("size") or 0),
            ok=bool(f.get("ok")),
            problem=str(f.get("problem", "")),
        )
        for f in d.get("files") or ()
        if isinstance(f, dict)
    )

    def opt_int(v: object) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    return CopyCheck(
        folder=str(d.get("folder", "")),
        complete=bool(d.get("complete")),
        files=files,
        total_bytes=int(d.get("total_bytes") or 0),
        problems=tuple(str(p) for p in d.get("problems") or ()),
        architecture=str(geometry.get("architecture") or ""),
        expert_count=opt_int(geometry.get("expert_count")),
        expert_feed_forward_length=opt_int(geometry.get("expert_feed_forward_length")),
        sha256_checked=check_sha256 and bool(d.get("complete")),
        validated_by_k3desk=bool(d.get("validated_by_k3desk")),
    )


def node_binaries(node: Node) -> list[str]:
    """Binaries the probe looks for on ``node``."""
    names = [node.sparkinfer_bin, "kimi_k3_dist_generate", "rpc-server", "ggml-rpc-server",
             "llama-server"]  # fmt: skip
    if node.rpc_server_bin:
        names.append(node.rpc_server_bin)
    return list(dict.fromkeys(n for n in names if n))


def probe_node(
    node: Node,
    known_hosts: Path,
    *,
    spec: ShardSetSpec | None = None,
    check_sha256: bool = False,
    connect_timeout: int = 10,
    timeout: float = 180.0,
    cancel: CancelToken | None = None,
    paths: Sequence[str] = (),
) -> NodeReport:
    """Probe one node; never raises for an unreachable or broken node (see ``error``).

    ``paths``: files or folders on the node to look for too (what is there comes back in
    :attr:`NodeReport.paths`), in the same round trip.
    """
    t0 = time.monotonic()
    client = SshClient(node, known_hosts, connect_timeout=connect_timeout)
    command = _probe_command(node, spec, check_sha256, paths)
    if check_sha256 and spec is not None and spec.sha256:
        timeout = max(timeout, 6 * 3600.0)  # hashing hundreds of GB takes a while
    try:
        result = client.run(
            command, stdin=PROBE_SCRIPT.read_bytes(), timeout=timeout, cancel=cancel
        )
    except SshError as exc:
        return NodeReport(node, False, error=str(exc), elapsed_s=time.monotonic() - t0)
    elapsed = time.monotonic() - t0
    if result.returncode != 0:
        why = _failed_probe(node, result.returncode, result.error_text)
        return NodeReport(node, False, error=why, elapsed_s=elapsed)
    try:
        data = json.loads(result.text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return NodeReport(
            node, False, error=f"the probe on {node.label} printed no result", elapsed_s=elapsed
        )
    hardware, error = _hardware_from(node, data)
    copy = None
    if isinstance(data.get("copy"), dict):
        copy = _copy_from_wire(data["copy"], check_sha256 and bool(spec and spec.sha256))
    return NodeReport(
        node=node,
        ok=hardware is not None,
        error=error,
        hardware=hardware,
        method=str(data.get("probe", "")),
        engines={str(k): str(v) for k, v in (data.get("engines") or {}).items()},
        copy=copy,
        python=str(data.get("python", "")),
        elapsed_s=elapsed,
        note=str(data.get("k3desk_note", "")),
        paths={str(k): str(v) for k, v in (data.get("paths") or {}).items()},
    )


def _probe_command(
    node: Node, spec: ShardSetSpec | None, check_sha256: bool, paths: Sequence[str]
) -> str:
    """The command that runs the probe (its script comes on stdin) with its settings."""
    config: dict[str, Any] = {
        "k3desk": shlex.split(node.k3desk) if node.k3desk else [],
        "model_path": node.model_path,
        "binaries": node_binaries(node),
    }
    if paths:
        config["paths"] = list(dict.fromkeys(p for p in paths if p))
    if spec is not None:
        config["spec"] = spec.to_wire(check_sha256)
        config["ggml_sizes"] = _ggml_sizes()
    return " ".join(shlex.quote(a) for a in (node.python, "-", json.dumps(config)))


def _failed_probe(node: Node, returncode: int, error_text: str) -> str:
    """Why the probe exited with ``returncode``, in words."""
    err = error_text.splitlines()[-1] if error_text else ""
    if returncode == 127:
        return (
            f"{node.python} is not installed on {node.label}; the probe needs Python 3.8+ "
            "there (set python= to its path)"
        )
    return f"the probe failed on {node.label} (exit {returncode}): {err}"


def _hardware_from(node: Node, data: dict[str, Any]) -> tuple[HardwareProfile | None, str]:
    """The node's hardware profile from the probe's report, or why there is none."""
    hw = data.get("hardware")
    if not isinstance(hw, dict):
        return None, str(data.get("hardware_error") or f"{node.label} reported no hardware")
    try:
        return (
            _fill_gpu_facts(
                HardwareProfile.from_dict(hw, source=f"ssh://{node.destination}:{node.port}")
            ),
            "",
        )
    except HardwareError as exc:
        return None, f"the hardware report from {node.label} is malformed: {exc.message}"


def probe_cluster(
    cluster: Cluster,
    known_hosts: Path,
    *,
    spec: ShardSetSpec | None = None,
    check_sha256: bool = False,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    connect_timeout: int = 10,
    rank0_paths: Sequence[str] = (),
) -> list[NodeReport]:
    """Probe every node in parallel; reports come back in the cluster's node order.

    ``rank0_paths``: files or folders the first node must hold (SparkInfer's bridge runs
    there and reads the tokenizer folder and the chat template); see ``NodeReport.paths``.
    """
    if not cluster.nodes:
        raise ClusterError(f"Cluster {cluster.name!r} has no nodes to probe.")
    reports: dict[int, NodeReport] = {}
    lock = threading.Lock()
    total = len(cluster.nodes)
    progress(Progress("probing nodes", 0, total, cluster.name))

    def one(i: int, node: Node) -> None:
        rep = probe_node(
            node,
            known_hosts,
            spec=spec,
            check_sha256=check_sha256,
            connect_timeout=connect_timeout,
            cancel=cancel,
            paths=rank0_paths if i == 0 else (),
        )
        with lock:
            reports[i] = rep
            done = len(reports)
        status = "ok" if rep.ok else f"failed: {rep.error.splitlines()[0]}"
        progress(Progress("probing nodes", done, total, f"{node.label}: {status}"))

    threads = [
        threading.Thread(target=one, args=(i, n), name=f"probe-{n.label}", daemon=True)
        for i, n in enumerate(cluster.nodes)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if cancel is not None:
        cancel.raise_if_cancelled()
    return [reports[i] for i in range(total)]
