"""Use-case "plan a shard set for hardware H", and what every shell shows of a launch plan.

``k3desk plan`` and the Engine page's plan view render a :class:`PlanView`: the
verdict in the same words as the tiers table, the speed range, how many expert layers
stay on the CPU, memory per device, and the layer map as runs of layers per device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import SpeedRange, plan_label
from k3desk.core.catalog.model import Tier
from k3desk.core.engines.launch import plan_model, suspicious_note
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import inspect_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.tuning.applied import LaunchTuning

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


@dataclass(frozen=True)
class LayerSpan:
    """Layers ``first..last`` on ``devices`` (consecutive GPUs merge into one span)."""

    first: int
    last: int
    devices: tuple[str, ...]

    def layers_text(self) -> str:
        return f"{self.first}" if self.first == self.last else f"{self.first}-{self.last}"

    def devices_text(self) -> str:
        devs = self.devices
        if len(devs) == 1:
            return devs[0]
        if all(d.startswith("CUDA") for d in devs):
            nums = [int(d[4:]) for d in devs]
            if nums == list(range(nums[0], nums[-1] + 1)):
                return f"CUDA{nums[0]}..{nums[-1]}"
        return ",".join(devs)

    def text(self) -> str:
        """'1-27 CUDA0..7'."""
        return f"{self.layers_text()} {self.devices_text()}"


@dataclass(frozen=True)
class MemoryRow:
    """One device of a plan (bytes)."""

    device: str  # "CUDA0", ..., "RAM"
    budget: int
    weights: int
    kv_cache: int
    recurrent_state: int
    compute: int
    other: int
    used: int
    free: int  # negative when the device is over its budget

    @property
    def cache_and_state(self) -> int:
        """KV cache and KDA state together (the Engine page's "KV cache" column)."""
        return self.kv_cache + self.recurrent_state


@dataclass(frozen=True)
class PlanView:
    """A launch plan as every shell shows it."""

    plan: LaunchPlan
    label: str  # the verdict in words (as the tiers table says it)
    speed: SpeedRange
    expert_layers_on_cpu: int
    expert_layers_on_gpu: int
    memory: tuple[MemoryRow, ...]
    attention: tuple[LayerSpan, ...]  # attention, norms and shared experts
    experts: tuple[LayerSpan, ...]  # routed experts (layers that have them)
    dense_layers: tuple[int, ...]
    per_device: tuple[LayerSpan, ...]  # layers per device, one span per run

    @property
    def layers(self) -> int:
        return len(self.plan.layers)

    def experts_text(self) -> str:
        """'45 of 92 expert layers keep their experts in RAM (--n-cpu-moe 46)'."""
        total = self.expert_layers_on_cpu + self.expert_layers_on_gpu
        text = f"{self.expert_layers_on_cpu} of {total} expert layers keep their experts in RAM"
        if self.plan.n_cpu_moe:
            text += f" (--n-cpu-moe {self.plan.n_cpu_moe})"
        return text


def plan_view(plan: LaunchPlan) -> PlanView:
    """What every shell shows of ``plan``."""
    layers = plan.layers
    s = plan.speed
    memory = tuple(
        MemoryRow(
            d.device,
            d.capacity,
            d.weights,
            d.kv_cache,
            d.recurrent_state,
            d.compute,
            d.other,
            d.used,
            d.headroom,
        )
        for d in plan.devices
    )
    non_expert = [(p.index, p.non_expert_device) for p in layers]
    experts = [(p.index, p.expert_device) for p in layers if p.expert_device != "none"]
    return PlanView(
        plan=plan,
        label=plan_label(plan),
        speed=SpeedRange(s.expected_tps, s.low_tps, s.high_tps, s.bottleneck),
        expert_layers_on_cpu=sum(1 for p in layers if p.expert_device == "RAM"),
        expert_layers_on_gpu=sum(1 for p in layers if p.expert_device.startswith("CUDA")),
        memory=memory,
        attention=_merged(non_expert),
        experts=_merged(experts),
        dense_layers=tuple(p.index for p in layers if p.ffn == "dense"),
        per_device=tuple(LayerSpan(a, b, (dev,)) for a, b, dev in _runs(non_expert)),
    )


def _runs(items: Sequence[tuple[int, str]]) -> list[tuple[int, int, str]]:
    """Consecutive layers on the same device, as (first, last, device)."""
    runs: list[tuple[int, int, str]] = []
    for index, device in items:
        if runs and runs[-1][2] == device and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index, device)
        else:
            runs.append((index, index, device))
    return runs


def _merged(items: Sequence[tuple[int, str]]) -> tuple[LayerSpan, ...]:
    """Runs, with consecutive GPU runs merged into one span over a device range."""
    merged: list[tuple[int, int, list[str]]] = []
    for a, b, dev in _runs(items):
        gpu = dev.startswith("CUDA")
        if merged and gpu and merged[-1][2][-1].startswith("CUDA") and merged[-1][1] == a - 1:
            merged[-1] = (merged[-1][0], b, [*merged[-1][2], dev])
        else:
            merged.append((a, b, [dev]))
    return tuple(LayerSpan(a, b, tuple(d)) for a, b, d in merged)


@dataclass(frozen=True)
class PlanRequest:
    """A shard set to plan, and for which machine."""

    shard: Path  # part 1 (or any part) of the set
    hardware_file: Path | None = None  # plan for the machine in this file, not this one
    ctx: int | None = None  # asked for (checked against the model); None = the default
    mmproj: Path | None = None
    n_cpu_moe: int | None = None  # insisted on; None = the smallest that fits
    measure_bandwidth: bool = True  # this machine's RAM bandwidth: measured, else estimated
    # where this machine's free disk is measured (None: the set's folder); a plan made
    # before a download measures the folder the download goes to
    disk_path: Path | None = None


@dataclass(frozen=True)
class ShardSetPlan:
    layout: ModelLayout
    hardware: HardwareProfile
    subject: Subject
    tier: Tier | None  # the catalog tier the set is, if any
    view: PlanView
    # what llama.cpp b11434 would refuse in files that are whole (planned all the same:
    # an engine built from another checkout may load them, and the engine decides)
    suspicious: tuple[str, ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """The suspicious findings as every shell shows them (as a launch's notes)."""
        return tuple(suspicious_note(f) for f in self.suspicious)

    @property
    def plan(self) -> LaunchPlan:
        return self.view.plan

    @property
    def model_name(self) -> str:
        """The tier, or the model's own name, or part 1's file name."""
        if self.tier is not None:
            return f"{self.tier.publisher} {self.tier.name}"
        return self.layout.name or self.layout.first_part.name


def plan_shard_set(services: Services, request: PlanRequest) -> ShardSetPlan:
    """Check the shard set from its headers, then plan it for the machine asked for.

    On this machine, the plan uses what ``k3desk tune`` kept for the model (a note says
    so) and its speed carries what this machine's runs measured (``core/tuning``).

    The set is checked first, so a broken set is reported before any hardware is
    detected; this machine's free disk is measured where the shards are.  A set that
    llama.cpp b11434 refuses although its files are whole is planned all the same, with
    the findings in :attr:`ShardSetPlan.suspicious`.
    """
    tiers = services.catalog_tiers()
    report = inspect_shard_set(request.shard, tiers=tiers)
    layout = report.layout
    if request.hardware_file is not None:
        hw = services.load_hardware(request.hardware_file)
        subject = Subject.hardware_file(request.hardware_file, hw)
    else:
        hw = services.detect_hardware(
            request.disk_path or layout.first_part.parent,
            measure_bandwidth=request.measure_bandwidth,
        )
        subject = Subject.this_machine(hw)
    opts = PlanOptions(ctx=request.ctx, mmproj=request.mmproj, n_cpu_moe=request.n_cpu_moe)
    if request.hardware_file is None:
        opts = services.with_disk_rate(opts, layout.first_part)
    tuning = LaunchTuning.at(services.paths.state)
    opts, tuned_note = tuning.settings(hw, layout, opts)
    plan, tier = plan_model(hw, layout, opts, tiers)
    plan = tuning.calibrate(hw, layout, plan)
    if tuned_note:
        plan = replace(plan, notes=(tuned_note, *plan.notes))
    return ShardSetPlan(layout, hw, subject, tier, plan_view(plan), report.suspicious)
