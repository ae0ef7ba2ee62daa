"""The Cluster page's node table: one row per node, from its probe report."""

from __future__ import annotations

from k3desk.core.app.presenters import Cell, Tone
from k3desk.core.cluster.nodes import Node
from k3desk.core.cluster.probe import NodeReport
from k3desk.core.units import fmt_bytes

NODE_COLUMNS = ("Node", "SSH", "GPUs", "Memory", "Free disk", "Model copy")


def gpu_text(rep: NodeReport) -> str:
    """The node's GPUs, short: "GB10 (sm_121)", "8x H100 80GB HBM3 (sm_90)", "none (...)"."""
    hw = rep.hardware
    if hw is None:
        return ""
    if not hw.gpus:
        return f"none ({hw.gpu_note})" if hw.gpu_note else "none"
    names: dict[str, int] = {}
    for g in hw.gpus:
        key = f"{g.name.removeprefix('NVIDIA ')} (sm_{g.sm})"
        names[key] = names.get(key, 0) + 1
    return ", ".join(f"{n}x {k}" if n > 1 else k for k, n in names.items())


def gpu_detail(rep: NodeReport) -> str:
    hw = rep.hardware
    if hw is None or not hw.gpus:
        return gpu_text(rep)
    return "\n".join(
        f"GPU {g.index}: {g.name}, {g.architecture or 'unknown architecture'} (sm_{g.sm}), "
        + ("memory unified with RAM" if g.unified_memory else f"{fmt_bytes(g.vram_total)} VRAM")
        for g in hw.gpus
    )


def memory_text(rep: NodeReport) -> str:
    """ "119.7 GiB unified, 115.0 free" / "2.0 TiB RAM, 1.9 free; 640.0 GiB VRAM"."""
    hw = rep.hardware
    if hw is None:
        return ""
    mem = hw.memory
    unified = hw.has_unified_memory
    vram = hw.total_vram
    free = fmt_bytes(mem.available).split()[0]
    text = f"{fmt_bytes(mem.usable_total)} {'unified' if unified else 'RAM'}, {free} free"
    if vram:
        text += f"; {fmt_bytes(vram)} VRAM"
    return text


def disk_text(rep: NodeReport) -> str:
    hw = rep.hardware
    if hw is None or hw.disk is None:
        return ""
    return fmt_bytes(hw.disk.free)


def ssh_text(node: Node) -> str:
    return f"{node.destination}:{node.port}" if node.port != 22 else node.destination


def node_cells(node: Node, rep: NodeReport | None, stale_tier: bool) -> tuple[Cell, ...]:
    """The row of ``node`` (:data:`NODE_COLUMNS`): not probed, unreachable, or what the
    probe found.  ``stale_tier``: the last probe checked the copy of another tier than
    the one chosen now."""
    head = (Cell(node.label), Cell(ssh_text(node)))
    if rep is None:
        return (*head, Cell("—"), Cell("—"), Cell("—"), Cell("not probed"))
    if not rep.ok:
        first = rep.error.splitlines()[0] if rep.error else "probe failed"
        return (
            *head,
            Cell("unreachable", tone="danger"),
            Cell("—"),
            Cell("—"),
            Cell(first, rep.error, "danger"),
        )
    copy = rep.copy
    if copy is not None:
        copy_text = copy.summary()
    elif stale_tier:
        copy_text = "probe again to check this tier"
    else:
        copy_text = "not checked"
    gpus = gpu_text(rep)
    disk = disk_text(rep)
    where = rep.hardware.disk if rep.hardware is not None else None
    copy_tone: Tone | None = None if copy is None else "ok" if copy.complete else "danger"
    return (
        *head,
        Cell(
            gpus,
            "\n".join(x for x in (gpu_detail(rep), rep.note) if x),
            "warn" if gpus.startswith("none") else None,
        ),
        Cell(memory_text(rep)),
        Cell(disk, f"{disk} free at {where.probed_path}" if where is not None else disk),
        Cell(
            copy_text,
            "\n".join([copy_text, *(copy.problems if copy is not None else ())]),
            copy_tone,
        ),
    )
