"""Planning across nodes: a memory budget per node and one verdict for the cluster.

SparkInfer splits the model over its ranks (tensor parallel) and every rank
needs its own copy on disk; llama.cpp RPC spreads layers over the workers in
proportion to their free memory and only the machine running llama-server
needs the files.  The per-rank figure for SparkInfer is calibrated on the
recipe's report (~113 GiB per rank for the 330 GB tier on TP3 at 8K context),
which k3desk has not measured itself; the plan says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from k3desk.core.cluster.probe import NodeReport
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.units import GiB, fmt_bytes

Verdict = Literal["fits", "tight", "no-fit", "unknown"]

# The recipe: ~113 GiB per rank, TP3, 8K context, 330,167,807,328-byte model.
RECIPE_MODEL_BYTES = 330_167_807_328
RECIPE_RANK_BYTES = 113 * GiB
RECIPE_CTX = 8192
RANK_OVERHEAD = RECIPE_RANK_BYTES - RECIPE_MODEL_BYTES // 3  # ~10.5 GiB beyond the shard
# K3's MLA cache: 24 MLA layers x (512 latent + 64 rope) x f16, per token
KV_BYTES_PER_TOKEN = 24 * (512 + 64) * 2
UNIFIED_MARGIN = 4 * GiB  # OS and services on a unified-memory node
GPU_MARGIN = 1 * GiB  # per discrete GPU (llama.cpp's --fit leaves the same)
RAM_MARGIN = 4 * GiB  # OS on a CPU-only RPC worker
RPC_OVERHEAD = 2 * GiB  # KV cache and compute buffers spread over the devices (estimate)
TIGHT_FRACTION = 0.03  # headroom under 3 % of capacity is "tight"


@dataclass(frozen=True)
class NodeBudget:
    node: str
    role: str
    memory_kind: str  # "unified memory (GB10)", "GPU memory (2 GPUs)", "RAM", "unknown"
    capacity: int | None  # bytes this node can give the model (after margins); None: unknown
    need: int  # bytes the plan puts on it
    disk: str  # what the node's disk has or needs, in words
    disk_ok: bool | None
    notes: tuple[str, ...] = ()

    @property
    def headroom(self) -> int:
        return (self.capacity or 0) - self.need

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.need <= self.capacity


@dataclass(frozen=True)
class ClusterPlan:
    engine: Literal["sparkinfer", "rpc"]
    verdict: Verdict
    reason: str
    model_bytes: int
    nodes: tuple[NodeBudget, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def render(self) -> str:
        lines = [f"{self.engine}: {self.verdict} — {self.reason}"]
        for b in self.nodes:
            cap = fmt_bytes(b.capacity) if b.capacity is not None else "unknown"
            lines.append(
                f"  {b.node:<20} {b.role:<26} needs {fmt_bytes(b.need):>10} of {cap:>10} "
                f"({b.memory_kind}); disk: {b.disk}"
            )
            lines += [f"      {n}" for n in b.notes]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def memory_capacity(profile: HardwareProfile | None, *, cpu_ok: bool) -> tuple[int | None, str]:
    """(bytes the model may use, what memory that is) for one node; None when not probed."""
    if profile is None:
        return None, "unknown (not probed)"
    gpus = profile.gpus
    unified = [g for g in gpus if g.unified_memory]
    if unified:
        cap = max(0, profile.memory.usable_total - UNIFIED_MARGIN)
        return cap, f"unified memory ({unified[0].name.removeprefix('NVIDIA ')})"
    if gpus:
        cap = sum(max(0, g.vram_total - GPU_MARGIN) for g in gpus)
        return cap, f"GPU memory ({len(gpus)} GPU{'s' if len(gpus) > 1 else ''})"
    if cpu_ok:
        avail = min(profile.memory.available, profile.memory.usable_total)
        return max(0, avail - RAM_MARGIN), "RAM"
    return 0, "no GPU"


def sparkinfer_rank_bytes(model_bytes: int, world: int, ctx: int = RECIPE_CTX) -> int:
    """Memory one rank needs: its share of the weights plus replicated state and buffers."""
    return model_bytes // world + RANK_OVERHEAD + (ctx - RECIPE_CTX) * KV_BYTES_PER_TOKEN


def _verdict(budgets: Sequence[NodeBudget]) -> tuple[Verdict, str]:
    unknown = [b for b in budgets if b.fits is None]
    short = [b for b in budgets if b.fits is False]
    if short:
        worst = min(short, key=lambda b: b.headroom)
        return "no-fit", (
            f"{worst.node} is {fmt_bytes(-worst.headroom)} short "
            f"({fmt_bytes(worst.need)} needed, {fmt_bytes(worst.capacity or 0)} usable)"
        )
    if unknown:
        return "unknown", f"no hardware figures for {', '.join(b.node for b in unknown)}"
    tight = [b for b in budgets if b.headroom < TIGHT_FRACTION * (b.capacity or 0)]
    if tight:
        return "tight", (
            f"fits, with little room on {', '.join(b.node for b in tight)} "
            f"({fmt_bytes(min(b.headroom for b in tight))} spare)"
        )
    return (
        "fits",
        f"every node has room (least spare: {fmt_bytes(min(b.headroom for b in budgets))})",
    )


def _disk(report: NodeReport | None, model_bytes: int, needs_copy: bool) -> tuple[str, bool | None]:
    if not needs_copy:
        return "no copy needed (layers arrive over the network)", True
    if report is None:
        return "not probed", None
    if report.copy is not None and report.copy.complete:
        return f"complete copy in {report.copy.folder}", True
    hw = report.hardware
    free = hw.disk.free if hw is not None and hw.disk is not None else None
    have = report.copy.summary() if report.copy is not None else "copy not checked"
    if free is None:
        return f"{have}; free space unknown", None
    ok = free >= model_bytes
    room = "enough" if ok else "not enough"
    return f"{have}; {fmt_bytes(free)} free, {room} for {fmt_bytes(model_bytes)}", ok


def plan_sparkinfer(
    reports: Sequence[NodeReport], model_bytes: int, ctx: int = RECIPE_CTX
) -> ClusterPlan:
    world = len(reports)
    need = sparkinfer_rank_bytes(model_bytes, max(world, 1), ctx)
    budgets = []
    for rank, rep in enumerate(reports):
        cap, kind = memory_capacity(rep.hardware, cpu_ok=False)
        disk, disk_ok = _disk(rep, model_bytes, needs_copy=True)
        notes = () if rep.ok else (f"probe failed: {_first_line(rep.error)}",)
        role = "rank 0 (coordinator, bridge)" if rank == 0 else f"rank {rank} (worker)"
        budgets.append(NodeBudget(rep.node.label, role, kind, cap, need, disk, disk_ok, notes))
    verdict, reason = _verdict(budgets)
    if verdict in ("fits", "tight") and any(b.disk_ok is False for b in budgets):
        verdict, reason = "no-fit", "a node has neither a complete copy nor room for one"
    notes = (
        f"Per-rank need = 1/{world} of {fmt_bytes(model_bytes)} + "
        f"{fmt_bytes(RANK_OVERHEAD)} replicated state and buffers, calibrated on the recipe's "
        f"~113 GiB per rank (TP3, {RECIPE_CTX} context); not measured by k3desk.",
    )
    return ClusterPlan("sparkinfer", verdict, reason, model_bytes, tuple(budgets), notes)


def plan_rpc(
    reports: Sequence[NodeReport],
    model_bytes: int,
    *,
    local: HardwareProfile | None = None,
    local_label: str = "this machine",
) -> ClusterPlan:
    """Layers spread in proportion to each device's usable memory (llama.cpp's default)."""
    total_need = model_bytes + RPC_OVERHEAD
    entries: list[tuple[str, str, int | None, str, NodeReport | None, bool]] = []
    for worker in reports:
        cap, kind = memory_capacity(worker.hardware, cpu_ok=True)
        entries.append((worker.node.label, "RPC worker", cap, kind, worker, False))
    local_gpus = [g for g in local.gpus if not g.unified_memory] if local is not None else []
    if local is not None and local_gpus:
        cap, kind = memory_capacity(local, cpu_ok=False)
        entries.append((local_label, "llama-server (main)", cap, kind, None, True))
    usable = sum(e[2] or 0 for e in entries)
    budgets = []
    for label, role, cap, kind, rep, is_local in entries:
        share = total_need * (cap or 0) // usable if usable > 0 else 0
        disk_ok: bool | None
        if is_local:
            disk, disk_ok = "holds the model files", True
        else:
            disk, disk_ok = _disk(rep, model_bytes, needs_copy=False)
        notes: tuple[str, ...] = ()
        if rep is not None and not rep.ok:
            notes = (f"probe failed: {_first_line(rep.error)}",)
        elif rep is not None and not any(
            b in rep.engines for b in ("rpc-server", "ggml-rpc-server", rep.node.rpc_server_bin)
        ):
            notes = ("no rpc-server / ggml-rpc-server found on this node (rpc=PATH to set one)",)
        budgets.append(NodeBudget(label, role, kind, cap, share, disk, disk_ok, notes))
    if usable <= 0 and budgets:
        verdict: Verdict = "unknown"
        reason = "no node reported usable memory"
    elif usable < total_need:
        verdict = "no-fit"
        reason = (
            f"the nodes offer {fmt_bytes(usable)} together, the model needs "
            f"{fmt_bytes(total_need)} ({fmt_bytes(total_need - usable)} short)"
        )
    else:
        verdict, reason = _verdict(budgets)
    notes_all = (
        "llama.cpp splits layers over the RPC devices in proportion to their free memory; "
        "each decoded token crosses the network once per device boundary, so expect the "
        "network, not the memory, to bound the speed.",
    )
    return ClusterPlan("rpc", verdict, reason, model_bytes, tuple(budgets), notes_all)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no reason given"
