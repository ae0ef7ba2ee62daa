"""Inputs and outputs of planning: a launch plan for llama-server and its reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

VerdictKind = Literal["gpu", "hybrid", "cpu", "stream", "no-fit"]


@dataclass(frozen=True)
class PlanOptions:
    ctx: int = 8192
    mmproj: Path | None = None
    mmproj_on_cpu: bool | None = None  # None = decide from the budget
    kv_type: str = "f16"  # -ctk/-ctv
    flash_attn: bool = True
    parallel: int = 1
    # free memory to leave on each GPU (bytes); llama.cpp's --fit leaves 1 GiB
    gpu_margin: int = 1024**3
    # RAM to leave for the OS and the app (bytes)
    ram_margin: int = 8 * 1024**3
    temperature: float = 1.0
    top_p: float = 0.95
    no_warmup: bool = True
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "CUDA0", ..., or "RAM"
    capacity: int  # budget the plan may use (after margins)
    weights: int
    kv_cache: int
    recurrent_state: int
    compute: int
    other: int = 0  # mmproj, ...

    @property
    def used(self) -> int:
        return self.weights + self.kv_cache + self.recurrent_state + self.compute + self.other

    @property
    def headroom(self) -> int:
        return self.capacity - self.used


@dataclass(frozen=True)
class LayerPlacement:
    index: int
    attention: str  # "kda" / "mla"
    ffn: str  # "dense" / "moe"
    non_expert_device: str  # where attention, norms, shared expert live
    expert_device: str  # where the routed experts live ("RAM" when in --n-cpu-moe)
    non_expert_bytes: int
    expert_bytes: int


@dataclass(frozen=True)
class SpeedPrediction:
    upper_bound_tps: float  # physical bound from bytes touched per token / bandwidth
    expected_tps: float  # calibrated expectation
    low_tps: float
    high_tps: float
    bytes_per_token: dict[str, int]  # device -> bytes read per decoded token
    bottleneck: str  # e.g. "CPU RAM bandwidth (expert layers 0-92 on CPU)"


@dataclass(frozen=True)
class LaunchPlan:
    verdict: VerdictKind
    reason: str  # one sentence a person reads first
    n_cpu_moe: int  # expert layers kept in RAM
    n_gpu_layers: int
    # Arguments for llama-server after the executable, without --host/--port/--api-key
    # (the supervisor adds those).
    server_args: tuple[str, ...]
    devices: tuple[DeviceMemory, ...]
    layers: tuple[LayerPlacement, ...]
    speed: SpeedPrediction
    ctx: int
    model_bytes: int
    shortfall: int = 0  # bytes missing when verdict is "no-fit"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def argv(self, executable: str = "llama-server") -> list[str]:
        return [executable, *self.server_args]
