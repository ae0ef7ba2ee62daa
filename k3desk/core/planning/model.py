"""Inputs and outputs of planning: a launch plan for llama-server and its reasons."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from k3desk.core.planning.kernels import KernelScale

VerdictKind = Literal["gpu", "hybrid", "cpu", "stream", "no-fit"]

# the context size used when none is asked for (capped at the model's trained length)
DEFAULT_CTX = 8192


@dataclass(frozen=True)
class PlanOptions:
    # context size in tokens.  None: not asked for; the plan uses ``default_ctx``, capped
    # at the model's trained context length (and says so in its notes).  A size asked for
    # that the model was not trained for is refused.
    ctx: int | None = None
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
    # --- additions (all optional) ---
    # projector size in bytes when known (the CLI stats the file); None = estimate
    mmproj_bytes: int | None = None
    ubatch: int = 512  # llama.cpp's default -ub: sizes the compute buffers
    # sustained read rate of the disk holding the shards, for "stream" plans
    disk_read_bps: float = 3.5e9
    # where that rate comes from ("0.9 GB/s, measured: ..."); "" = the assumption above
    disk_read_note: str = ""
    # bytes a page fault on a model file reads around the missed page: twice the
    # device's read_ahead_kb (llama.cpp's POSIX_FADV_SEQUENTIAL); None = Linux's
    # default (speed.DEFAULT_READ_AROUND).  hardware.disk_rate.read_around_bytes
    read_around_bytes: int | None = None
    # the --n-cpu-moe a model card runs with (None = every expert layer in RAM,
    # the common recipe) and who says so, for the comparison note
    reference_n_cpu_moe: int | None = None
    reference_label: str = ""
    # context depth the speed is predicted at (None = min(ctx, 4096))
    speed_depth: int | None = None
    # a --n-cpu-moe the person insists on (None = the smallest that fits)
    n_cpu_moe: int | None = None
    # the context size when ``ctx`` is None (e.g. the app's setting), before the cap
    default_ctx: int = DEFAULT_CTX
    # -t (None: llama.cpp's default, the physical cores) and -b (None: its 2048);
    # -ub is ``ubatch`` above, passed on when it is not llama.cpp's 512
    threads: int | None = None
    batch: int | None = None
    threads_batch: int | None = None  # -tb: threads for prompts (None: as -t)
    # this machine's CPU against the one the kernel costs were measured on
    # (k3desk.core.tuning.cpuprobe); None: the costs as shipped
    kernel_scale: KernelScale | None = None


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
    depth: int = 0  # tokens of context the prediction assumes
    # prompt processing tok/s for a ``prompt_tokens`` prompt (0: not predicted, e.g.
    # with a GPU in the plan)
    prompt_tps: float = 0.0
    prompt_tokens: int = 0
    threads: int = 0  # the -t the prediction assumes
    # how the prediction gets from the bound to its figure: (what, seconds per token)
    steps: tuple[tuple[str, float], ...] = ()
    # this machine's own runs (k3desk.core.tuning.calibration): the prediction with
    # their correction, and what they say ("measured here: ..."); 0 / "" without runs
    calibrated_tps: float = 0.0
    calibrated_prompt_tps: float = 0.0
    calibration: str = ""


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
    shortfall: int = 0  # bytes missing when verdict is "no-fit" (or RAM missing for "stream")
    notes: tuple[str, ...] = field(default_factory=tuple)
    # --- additions (all optional) ---
    tensor_split: tuple[int, ...] = ()  # -ts: layers (output counted as one) per GPU
    mmproj_on_gpu: bool = False
    output_device: str = "RAM"  # where output.weight (and the logits) live
    stream_bytes: int = 0  # RAM-side expert bytes that do not fit the page cache
    # the note (also in ``notes``) when the default context was capped at the model's
    # trained context length; "" when it was not
    ctx_note: str = ""
    # --no-repack is in the arguments (asked for, or chosen: see plan.py's verdict)
    no_repack: bool = False
    # weights ggml-cpu would repack into anonymous memory (planning/repack.py)
    repack_bytes: int = 0
    # RAM the engine allocates (buffers, and repacked weights unless no_repack); what is
    # left of the budget is page cache for the mmap'd weights
    anon_bytes: int = 0
    # the most seconds the engine takes to load (it reads every shard once)
    load_seconds: float = 0.0

    def argv(self, executable: str = "llama-server") -> list[str]:
        return [executable, *self.server_args]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (paths as strings); device headroom included."""
        d = asdict(self)
        d["server_args"] = list(self.server_args)
        for dev, mem in zip(d["devices"], self.devices, strict=True):
            dev["used"] = mem.used
            dev["headroom"] = mem.headroom
        return d
