"""Predicted decode and prompt speed (tokens per second) of a launch plan.

Stated from first principles: what one token costs on each device, added up
(the layers run one after the other, so the devices take turns):

    t_token = sum over devices of t_device + hand-overs + disk reads

**On the CPU** (``RAM``), every matrix the token multiplies is read and decoded.
Reading is bound by the RAM bandwidth, decoding by the cores; a kernel takes
the longer of the two (a roofline per type), and every graph node costs the
threads one start and barrier:

    t_RAM = sum over types t of max(W_t * c_t / threads, B_t / bandwidth)
            + nodes_RAM * node_s(threads)

``W_t``/``B_t`` are the weights/bytes of type ``t`` the token touches (of the
routed experts only ``n_expert_used`` of ``n_expert``), ``c_t`` the measured ns
per weight per thread of llama.cpp's own kernel for that type at that thread
count (measured on one thread and on every core: a second thread sharing a
physical core does less than the first), ``node_s`` the
measured overhead of one graph node, and ``nodes`` llama.cpp's own node count
for the layers placed there (``kernels.py``, ``resources/kernels.json``, written
by ``bench/kernel_costs.py``; on a machine whose kernels were timed, scaled to its
speed: ``PlanOptions.kernel_scale``, ``k3desk/core/tuning/cpuprobe.py``).
Attention over the KV cache (MLA) and the KDA state update are costed the same
way: their multiply-adds at F16's cost, their bytes through the bandwidth.

**On a GPU**, decoding is cheap next to reading (its ALUs outrun its memory by
far), so the weights stream at a share of the peak bandwidth, and every node
costs a kernel launch:

    t_GPU = B_GPU / (bandwidth * GPU_STREAM_SHARE) + nodes_GPU * GPU_NODE_S

The GPU constants are stated, not measured: no GPU machine was available to
measure them on; the card speeds (``bench/predict_speed.py``) are their only check.

**Prompts** (CPU only) run every matrix over a batch of tokens: per token,
``W_t * p_t(n) / threads`` with ``p_t(n)`` the cost per weight per token at the
``n`` tokens that matrix multiplies.  For the layers' own matrices ``n`` is the
batch, and ``p_t`` comes from the two measured points (``Kernels.batch_ns``).  A
routed expert multiplies only the tokens routed to it, n ~ Binomial(batch,
k / experts), and llama.cpp's MUL_MAT_ID runs an expert of fewer than 8 tokens
through the matrix-vector kernel one token at a time (the tiled kernel takes
over from 8); its cost per token is the measured routed-expert curve
(``Kernels.routed_ns``: ``E[n c(n)] / E[n]``).  Decoding multiplies each of a
token's experts by the same matrix-vector kernel as a dense matrix
(``ggml_compute_forward_mul_mat_id_one_chunk`` calls the type's ``vec_dot`` per
row), so it keeps the dense one-token cost, measured on far more weights and
repetitions than the routed curve's one-token point.  The weights are read once per batch
(every expert some token of the batch routes to), and the graph's nodes once
per batch.  A plan with a GPU gets no prompt
prediction (``prompt_tps`` 0): llama.cpp then moves the experts' batches to the
GPU, bound by the PCIe link and GPU kernels nothing here has measured.

**Streaming** (the weights exceed the page cache, ``plan.py``'s ``stream`` verdict):
what the page cache misses is read from the disk by page faults.  The rules below are
what ``bench/stream_real.py`` measured on a real-bytes rehearsal (UD-IQ1_S's shapes
and types, 12 layers, a 42.1 GB file, on a 24 GiB, 2-core machine whose disk
k3desk measured at 0.8-1.4 GB/s with O_DIRECT; 2026-12-04, three cold and three
warm runs between 17:31 and 18:14 UTC, with other work keeping the load average at
5-13):

- *The read unit is the kernel's read-around, not the expert.*  A fault on an
  mmap'd page that is not cached reads ``ra_pages`` around it (mm/filemap.c,
  ``do_sync_mmap_readahead``: "mmap read-around"), and llama.cpp's
  ``posix_fadvise(POSIX_FADV_SEQUENTIAL)`` on every model file (``llama_mmap::impl``,
  src/llama-mmap.cpp, b11434) doubles the file's window to twice the device's
  ``read_ahead_kb``.  A routed expert's slice of one matrix is contiguous (1.07 MB
  for UD-IQ1_S, 4.6 MB for Q3_K_S), so a missed slice costs
  ``max(slice, window x miss)`` bytes: the window's pages that are not cached.  The
  rehearsal's disk (``read_ahead_kb`` 8192: 16 MiB windows) read 5.3-6.0 GB per
  token in the six runs where the missed slices alone were 0.51 GB; this rule says
  6.5-6.9 (the runs: 0.80-0.92 of it).
- *Faults add to the compute, below the disk's rate.*  A fault blocks its thread
  and the graph's barrier waits for it, so the disk's time adds to the CPU's.  The
  bytes read over the decode time less the predicted CPU time came to 0.35, 0.47,
  0.59 and 0.87 of the O_DIRECT rate measured before each of the first four runs:
  ``STREAM_RATE_SHARE`` is 0.55, about their median (fitted to those runs; the same
  file decoded at 9.0-16.0 s per token across the six, the machine's other work
  moving it by a quarter either way).  The fifth and sixth runs, not fitted, decoded
  within 8 % of the prediction.
- *The weights every token reads stay cached first* (``plan.py``'s
  ``stream_misses``): the rehearsal's 9 GB of attention, shared and output weights
  fitted, and no decoded token read them again (the disk bytes per token are the
  experts' alone).
- *Loading reads the whole file, warm or cold* (``plan.py``'s ``load_seconds``): a
  file larger than the cache is evicted by its own ``MAP_POPULATE`` before it is
  reused (the warm run read 43.1 GB with 20.5 GiB of the file cached at its start),
  then the first decode step reads its experts (the cold load read 55.5 GB).

``bound`` is the physical upper limit: bytes touched / peak bandwidth, nothing
else.  ``steps`` says how the prediction gets from the bound to its figure.
The low/high range is ``RANGE_CPU`` for the share of the time on the CPU (the
tolerance ``bench/speed_vs_measured.py`` checks on real runs) and
``RANGE_GPU`` for the rest (never checked against a run).  Decode speed is
predicted at ``depth`` tokens of context (4,096 or the context size if
smaller): the MLA cache read grows with depth, the KDA state does not.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from k3desk.core.gguf.model import K3HParams, ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.k3arch import is_expert_tensor, layer_of
from k3desk.core.planning import kernels as kernel_costs
from k3desk.core.planning.memory import (
    is_mla_layer,
    kv_type_bytes,
    recurrent_state_layer_bytes,
)
from k3desk.core.planning.model import LayerPlacement, SpeedPrediction
from k3desk.core.units import GB, fmt_tps, fmt_tps3

# ----------------------------------------------------------------- GPU (stated)
# Share of the published peak bandwidth batch-1 matrix-vector kernels stream at.
# Not measured (no GPU machine): copy kernels reach about 90 % of the peak on HBM
# parts; kernels that decode quantized blocks while they read, somewhat less.
GPU_STREAM_SHARE = 0.75
# Per graph node on a GPU: a kernel launch and the smallest kernel's run, a few
# microseconds each on current drivers.  K3's ~150 nodes per layer make this the
# largest term of an all-GPU plan (14,000 nodes per token on the real model).
GPU_NODE_S = 3e-6
# A hand-over between two GPUs (copy the activations, synchronise) and a GPU <->
# CPU round trip (two small copies over PCIe, a stream synchronisation, the CPU
# threads waking up): tens of microseconds each.
GPU_HOP_S = 30e-6
SPLIT_S = 50e-6
# Graph nodes of a MoE layer that run where its experts are when that is not where
# the rest of the layer is (--n-cpu-moe): the three mul_mat_id on the expert weights
# and the activation between them.  ggml's scheduler puts a node without weights on
# the GPU when the GPU supports it (ggml_backend_sched's expand passes), so the
# routing, the weighting and the sum of the k experts stay with the layer.
EXPERT_NODES = 4

# Streaming (see the module docstring).  Page faults read a window at a time per
# thread and wait for it: below the rate the disk measures with large O_DIRECT reads
# (bench/stream_real.py, 2026-12-04: 0.35-0.87 of it in four runs, 0.53 the median).
STREAM_RATE_SHARE = 0.55
# The read-around window of a file llama.cpp maps: twice the device's read_ahead_kb
# (POSIX_FADV_SEQUENTIAL, src/llama-mmap.cpp), Linux's default being 128 KiB
# (VM_READAHEAD_PAGES); a machine's own is in sysfs (disk_rate.read_around_bytes).
DEFAULT_READ_AROUND = 2 * 128 * 1024

# Ranges (see the module docstring).
RANGE_CPU = 0.25
RANGE_GPU = 0.5

# Bandwidths used when a profile has none (documented guesses, marked as such).
FALLBACK_GPU_BPS = 0.5e12
FALLBACK_RAM_BPS = 50e9
# A bandwidth from a table or an estimate is a theoretical peak; STREAM-type reads
# reach about 80 % of it on server and desktop DDR (a measured one is used as is).
RAM_PEAK_SHARE = 0.8
DEFAULT_DEPTH = 4096
DEFAULT_PROMPT = 512


@dataclass
class _Work:
    """What one device does for one token."""

    weights: dict[str, float] = field(default_factory=dict)  # type -> weights multiplied
    nbytes: dict[str, float] = field(default_factory=dict)  # type -> bytes read
    nodes: float = 0.0
    extra_bytes: float = 0.0  # KV cache, KDA state
    extra_macs: float = 0.0  # attention multiply-adds over the KV cache (F16's cost)
    kda_layers: int = 0  # KDA layers whose own operations run here

    def add(self, type_name: str, weights: float, nbytes: float) -> None:
        self.weights[type_name] = self.weights.get(type_name, 0.0) + weights
        self.nbytes[type_name] = self.nbytes.get(type_name, 0.0) + nbytes

    @property
    def total_bytes(self) -> float:
        return sum(self.nbytes.values()) + self.extra_bytes


@dataclass(frozen=True)
class _Tensors:
    """Per layer: {type: (weights, bytes)} of the non-expert and of the expert tensors."""

    other: list[dict[str, tuple[int, int]]]
    experts: list[dict[str, tuple[int, int]]]
    output: dict[str, tuple[int, int]]
    # routed-expert matrices per layer (gate, up, down: 3): each expert's slice of
    # one is contiguous in the file, the unit a page fault reads around
    expert_mats: list[int] = field(default_factory=list)


def _add(d: dict[str, tuple[int, int]], type_name: str, weights: int, nbytes: int) -> None:
    w, b = d.get(type_name, (0, 0))
    d[type_name] = (w + weights, b + nbytes)


def _tensors(layout: ModelLayout) -> _Tensors:
    n = len(layout.layers)
    other: list[dict[str, tuple[int, int]]] = [{} for _ in range(n)]
    experts: list[dict[str, tuple[int, int]]] = [{} for _ in range(n)]
    output: dict[str, tuple[int, int]] = {}
    mats = [0] * n
    if not layout.tensors:
        # per-layer totals only: count them as Q8_0-like bytes (1.0625 B per weight)
        for layer in layout.layers:
            other[layer.index]["Q8_0"] = (round(layer.other_bytes / 1.0625), layer.other_bytes)
            experts[layer.index]["Q8_0"] = (
                round(layer.expert_bytes / 1.0625),
                layer.expert_bytes,
            )
        out = layout.global_bytes - layout.token_embd_bytes
        output["Q8_0"] = (round(out / 1.0625), out)
        return _Tensors(other, experts, output, [3] * n)
    for t in layout.tensors:
        weights = math.prod(t.shape)
        i = layer_of(t.name)
        if i is None or i >= n:
            if t.name.startswith("token_embd"):
                continue  # one row per token: negligible
            _add(output, t.type_name.upper(), weights, t.nbytes)
        elif is_expert_tensor(t.name):
            _add(experts[i], t.type_name.upper(), weights, t.nbytes)
            mats[i] += 1
        else:
            _add(other[i], t.type_name.upper(), weights, t.nbytes)
    return _Tensors(other, experts, output, mats)


def _on_gpu(device: str) -> bool:
    return device.startswith("CUDA")


def device_bandwidth(hw: HardwareProfile, device: str) -> tuple[float, str]:
    """Peak bandwidth of ``device`` ("CUDA3", "RAM") and a note when it is a guess."""
    if device.startswith("CUDA"):
        pos = int(device[4:])
        g = hw.gpus[pos]
        if g.bandwidth.bytes_per_s > 0:
            return g.bandwidth.bytes_per_s, ""
        if g.unified_memory and hw.memory.bandwidth.bytes_per_s > 0:
            return hw.memory.bandwidth.bytes_per_s, ""
        return (
            FALLBACK_GPU_BPS,
            f"{device} bandwidth unknown: assumed {FALLBACK_GPU_BPS / GB:.0f} GB/s",
        )
    if hw.memory.bandwidth.bytes_per_s > 0:
        return hw.memory.bandwidth.bytes_per_s, ""
    return FALLBACK_RAM_BPS, f"RAM bandwidth unknown: assumed {FALLBACK_RAM_BPS / GB:.0f} GB/s"


def ram_stream_bandwidth(hw: HardwareProfile) -> float:
    """What the CPU's kernels read RAM at: a measured figure as it is, a peak x 0.8."""
    bw, _ = device_bandwidth(hw, "RAM")
    if hw.memory.bandwidth.source == "measured":
        return bw
    return bw * RAM_PEAK_SHARE


def default_threads(hw: HardwareProfile) -> int:
    """llama.cpp's default ``-t``: the physical cores (``common_cpu_get_num_math``,
    common/common.cpp b11434; hyper-threads are not counted)."""
    return max(1, hw.cpu.physical_cores)


def _layer_nodes(k: kernel_costs.Kernels, hp: K3HParams, index: int, moe: bool) -> float:
    attn = k.nodes("mla") if is_mla_layer(hp, index) else k.nodes("kda")
    if not moe:
        return attn + k.nodes("dense")
    return attn + k.nodes("moe") + k.nodes("moe_per_used") * hp.expert_used_count


def _kda_state(hp: K3HParams) -> int:
    return hp.head_count * hp.kda_head_dim * hp.kda_head_dim


def _attention_work(hp: K3HParams, index: int, depth: float, kv_type: str) -> tuple[float, float]:
    """(bytes, multiply-adds) of one token's attention / KDA update in layer ``index``."""
    if is_mla_layer(hp, index):
        row = hp.kv_lora_rank + hp.rope_dimension_count
        # absorbed MLA (kimi-k3.cpp): every head dots the shared [kv_lora + rope] key
        # row and accumulates the [kv_lora] value row of every cached token
        macs = hp.head_count * (row + hp.kv_lora_rank) * depth
        return row * kv_type_bytes(kv_type) * depth, macs
    # KDA: the state is read and written; its operations are timed as measured
    # (Kernels.kda_seconds), not counted here
    return 2 * recurrent_state_layer_bytes(hp, index), 0.0


@dataclass(frozen=True)
class _Costed:
    seconds: float
    compute_s: float  # kernel time beyond what the bandwidth alone needs
    bandwidth_s: float
    nodes_s: float
    notes: tuple[str, ...]


def _cpu_time(
    work: _Work,
    k: kernel_costs.Kernels,
    threads: int,
    bw: float,
    test: str,
    kda_state: int,
    batch: float = 1.0,
) -> _Costed:
    """CPU time per token; ``batch`` > 1: the bytes are read once per batch."""
    notes: list[str] = []
    compute = bandwidth = total = 0.0
    for type_name, weights in work.weights.items():
        cost, note = k.cost(type_name, threads)
        if note:
            notes.append(note)
        ns = cost.tg_ns if test == "tg" else cost.pp_ns
        c = weights * ns * 1e-9 / threads
        b = work.nbytes.get(type_name, 0.0) / bw / batch
        total += max(c, b)
        bandwidth += b
        compute += max(c - b, 0.0)
    f16, _ = k.cost("F16", threads)
    ns = f16.tg_ns if test == "tg" else f16.pp_ns
    c = work.extra_macs * ns * 1e-9 / threads
    b = work.extra_bytes / bw
    total += max(c, b)
    bandwidth += b
    compute += max(c - b, 0.0)
    scale = 1.0 if test == "tg" else _pp_node_scale(k, batch)
    nodes = work.nodes * k.node_seconds(test, threads) * scale
    layers = work.kda_layers * k.kda_seconds(test, threads, kda_state)
    total += layers
    compute += layers
    return _Costed(total + nodes, compute, bandwidth, nodes, tuple(dict.fromkeys(notes)))


def _pp_node_scale(k: kernel_costs.Kernels, batch: float) -> float:
    """The pp node overhead was measured per token of a batch of ``k.pp_tokens``; a
    node's start and barrier are paid once per batch, so per token they scale as
    ``pp_tokens / batch``."""
    return k.pp_tokens / max(batch, 1.0)


@dataclass
class _Placed:
    """Who does what for one token: each device's work, the order the token visits the
    devices in, and the RAM-side bytes a page-cache miss sends to the disk."""

    work: dict[str, _Work]
    sequence: list[str]
    ram_expert_touched: float = 0.0
    ram_expert_slices: float = 0.0  # contiguous expert slices those bytes are in
    ram_dense_touched: float = 0.0  # mmap'd weights in RAM every token reads

    def dev(self, name: str) -> _Work:
        return self.work.setdefault(name, _Work())


def _place_work(
    k: kernel_costs.Kernels,
    hp: K3HParams,
    tensors: _Tensors,
    layers: Sequence[LayerPlacement],
    output_device: str,
    depth: float,
    kv_type: str,
) -> _Placed:
    """Add up each device's share of one token, layer by layer."""
    frac = hp.expert_used_count / max(hp.expert_count, 1)
    placed = _Placed(work={}, sequence=["RAM"])  # the input embedding is looked up on the CPU
    placed.dev("RAM").nodes += k.nodes("global")
    for p in layers:
        _place_layer(placed, k, hp, tensors, p, frac, depth, kv_type)
    out = placed.dev(output_device)
    for t, (wt, b) in tensors.output.items():
        out.add(t, wt, b)
        if output_device == "RAM":
            placed.ram_dense_touched += b
    placed.sequence.append(output_device)
    return placed


def _place_layer(
    placed: _Placed,
    k: kernel_costs.Kernels,
    hp: K3HParams,
    tensors: _Tensors,
    p: LayerPlacement,
    frac: float,
    depth: float,
    kv_type: str,
) -> None:
    """One layer: its own tensors and attention where it runs, the used share of its
    experts where they are (with the expert nodes, and two more hand-overs, when that
    is elsewhere)."""
    home = placed.dev(p.non_expert_device)
    for t, (wt, b) in tensors.other[p.index].items():
        home.add(t, wt, b)
        if p.non_expert_device == "RAM":
            placed.ram_dense_touched += b
    kv_b, macs = _attention_work(hp, p.index, depth, kv_type)
    home.extra_bytes += kv_b
    home.extra_macs += macs
    home.kda_layers += 0 if is_mla_layer(hp, p.index) else 1
    moe = p.ffn == "moe"
    nodes = _layer_nodes(k, hp, p.index, moe)
    placed.sequence.append(p.non_expert_device)
    if moe and tensors.experts[p.index]:
        where = placed.dev(p.expert_device)
        for t, (wt, b) in tensors.experts[p.index].items():
            where.add(t, wt * frac, b * frac)
        if p.expert_device == "RAM":
            placed.ram_expert_touched += sum(b for _, b in tensors.experts[p.index].values()) * frac
            placed.ram_expert_slices += tensors.expert_mats[p.index] * hp.expert_used_count
        if p.expert_device != p.non_expert_device:
            moved = min(EXPERT_NODES, nodes)
            where.nodes += moved
            nodes -= moved
            placed.sequence.append(p.expert_device)
            placed.sequence.append(p.non_expert_device)
    home.nodes += nodes


@dataclass
class _DeviceTimes:
    """Seconds per token on the devices, before hand-overs and disk reads."""

    bound_s: float = 0.0  # every device's bytes at its peak bandwidth
    gpu_s: float = 0.0
    gpu_stream: float = 0.0  # the GPUs' reads beyond the peak's time
    gpu_nodes: float = 0.0  # the GPUs' kernel launches
    cpu: _Costed | None = None
    notes: list[str] = field(default_factory=list)


def _device_times(
    hw: HardwareProfile,
    work: dict[str, _Work],
    k: kernel_costs.Kernels,
    threads: int,
    hp: K3HParams,
) -> _DeviceTimes:
    """Each device's time: a GPU streams at ``GPU_STREAM_SHARE`` of its peak plus a
    launch per node, the CPU as ``_cpu_time`` costs it."""
    times = _DeviceTimes()
    for device, w in work.items():
        bw, note = device_bandwidth(hw, device)
        if note:
            times.notes.append(note)
        times.bound_s += w.total_bytes / bw
        if _on_gpu(device):
            stream = w.total_bytes / (bw * GPU_STREAM_SHARE)
            nodes = w.nodes * GPU_NODE_S
            times.gpu_stream += stream - w.total_bytes / bw
            times.gpu_nodes += nodes
            times.gpu_s += stream + nodes
        else:
            times.cpu = _cpu_time(w, k, threads, ram_stream_bandwidth(hw), "tg", _kda_state(hp))
            times.notes.extend(times.cpu.notes)
    return times


def _device_steps(
    hw: HardwareProfile, work: dict[str, _Work], times: _DeviceTimes, threads: int
) -> list[tuple[str, float]]:
    """The steps from the bound to the devices' time (``SpeedPrediction.steps``)."""
    steps: list[tuple[str, float]] = [
        ("reading the weights at the peak bandwidth (the bound)", times.bound_s)
    ]
    cpu = times.cpu
    if cpu is not None:
        ram_bytes = work["RAM"].total_bytes
        peak, _ = device_bandwidth(hw, "RAM")
        below_peak = cpu.bandwidth_s - ram_bytes / peak
        if below_peak > 0:
            steps.append(("CPU reads below the peak (measured or 80 % of it)", below_peak))
        if cpu.compute_s > 0:
            label = f"CPU kernels decoding the weights on {threads} thread(s)"
            steps.append((label, cpu.compute_s))
        if cpu.nodes_s > 0:
            steps.append(
                (f"CPU graph overhead ({work['RAM'].nodes:,.0f} nodes per token)", cpu.nodes_s)
            )
    if times.gpu_stream > 0:
        steps.append((f"GPU reads at {GPU_STREAM_SHARE:.0%} of the peak", times.gpu_stream))
    if times.gpu_nodes > 0:
        n_gpu_nodes = sum(w.nodes for dv, w in work.items() if _on_gpu(dv))
        steps.append((f"GPU kernel launches ({n_gpu_nodes:,.0f} nodes per token)", times.gpu_nodes))
    return steps


def _handovers(sequence: Sequence[str]) -> tuple[int, int]:
    """(GPU-GPU hops, GPU-CPU splits) of a token visiting the devices in ``sequence``."""
    hops = splits = 0
    for here, there in itertools.pairwise(sequence):
        if here == there:
            continue
        if "RAM" in (here, there):
            splits += 1
        else:
            hops += 1
    return hops, splits


@dataclass(frozen=True)
class DiskReads:
    """What a streaming token reads from disk (the module docstring's rules)."""

    expert_bytes: float  # read around the missed expert slices
    dense_bytes: float  # the every-token weights the cache cannot hold
    faults: float  # expert slices missed: one read-around each
    window: float  # bytes one such fault reads (the window's pages not cached)
    seconds: float

    @property
    def total(self) -> float:
        return self.expert_bytes + self.dense_bytes


def disk_reads(
    expert_touched: float,
    expert_slices: float,
    dense_touched: float,
    stream_miss: float,
    dense_miss: float,
    disk_read_bps: float,
    read_around: float = DEFAULT_READ_AROUND,
) -> DiskReads:
    """Bytes and seconds read from disk per token.  ``expert_slices`` slices of
    ``expert_touched`` bytes in all, each missing the page cache with probability
    ``stream_miss``: a miss reads the slice or the read-around window's pages that are
    not cached (the window x the miss), whichever is more; the every-token weights'
    misses (``dense_miss``) are read as they are.  Both come through the decode's page
    faults, at ``STREAM_RATE_SHARE`` of ``disk_read_bps``."""
    miss = min(max(stream_miss, 0.0), 1.0)
    slice_bytes = expert_touched / expert_slices if expert_slices > 0 else 0.0
    window = max(slice_bytes, max(read_around, 0.0) * miss)
    faults = expert_slices * miss
    expert = faults * window
    dense = dense_touched * min(max(dense_miss, 0.0), 1.0)
    rate = max(disk_read_bps, 1.0)
    seconds = (expert + dense) / (rate * STREAM_RATE_SHARE)
    return DiskReads(expert, dense, faults, window, seconds)


def _disk_reads(
    placed: _Placed, stream_miss: float, dense_miss: float, disk_read_bps: float,
    read_around: float,
) -> DiskReads:  # fmt: skip
    """The page cache's misses (plan.py's stream_misses) for ``placed``."""
    return disk_reads(
        placed.ram_expert_touched,
        placed.ram_expert_slices,
        placed.ram_dense_touched,
        stream_miss,
        dense_miss,
        disk_read_bps,
        read_around,
    )


def _disk_step(r: DiskReads) -> str:
    """'experts read from disk (6.5 GB per token: 451 expert faults of 13.7 MiB read
    around each)'."""
    parts = []
    if r.expert_bytes > 0:
        parts.append(
            f"{r.faults:,.0f} expert faults of {r.window / 2**20:.1f} MiB read around each"
        )
    if r.dense_bytes > 0:
        parts.append(f"{r.dense_bytes / GB:.1f} GB of every-token weights")
    what = "weights" if r.dense_bytes > 0 else "experts"
    return f"{what} read from disk ({r.total / GB:.1f} GB per token: {'; '.join(parts)})"


def _tps_range(
    bound_s: float, expected_s: float, gpu_side_s: float, disk_s: float | None
) -> tuple[float, float, float, float]:
    """(bound, expected, low, high) tok/s from the seconds per token; the range is
    ``RANGE_CPU`` for the CPU's share of the time and ``RANGE_GPU`` for the rest.
    ``disk_s``: the disk reads' time when some are made (None: none)."""
    bound = 1.0 / bound_s if bound_s > 0 else 0.0
    expected = min(1.0 / expected_s, bound) if expected_s > 0 else 0.0
    gpu_share = gpu_side_s / expected_s if expected_s > 0 else 0.0
    r = RANGE_CPU * (1.0 - gpu_share) + RANGE_GPU * gpu_share
    low = expected / (1.0 + r)
    high = min(expected * (1.0 + r), bound)
    if disk_s is not None:
        # the fault path's rate moves with the machine's other work (0.35-0.87 of the
        # O_DIRECT rate in bench/stream_real.py's four runs): the low end counts the
        # disk's time twice
        low = 1.0 / (expected_s + disk_s) if expected_s > 0 else 0.0
    return bound, expected, low, high


def _shares(
    times: _DeviceTimes,
    handover_s: float,
    disk_bytes: float,
    disk_read_bps: float,
    disk_s: float,
) -> dict[str, float]:
    """What the time per token goes to, by cause (the bottleneck is the largest)."""
    cpu = times.cpu
    return {
        "RAM bandwidth (CPU)": cpu.bandwidth_s if cpu else 0.0,
        "CPU kernels (decoding quantized weights)": cpu.compute_s if cpu else 0.0,
        "CPU graph overhead (thread start and barrier per node)": cpu.nodes_s if cpu else 0.0,
        "GPU memory bandwidth": times.gpu_s - times.gpu_nodes,
        "GPU kernel launches": times.gpu_nodes,
        "GPU-CPU hand-overs": handover_s,
        f"disk reads ({disk_bytes / GB:.1f} GB of weights per token at "
        f"{disk_read_bps / GB:.1f} GB/s)": disk_s,
    }


def _bottleneck(shares: dict[str, float], expected_s: float, notes: list[str]) -> str:
    """The largest share of the time per token, and the notes on guessed bandwidths."""
    top = max(shares, key=lambda key: shares[key])
    if expected_s > 0 and shares[top] > 0:
        bottleneck = f"{top}: {shares[top] / expected_s:.0%} of the time per token"
    else:
        bottleneck = "nothing placed"
    notes = list(dict.fromkeys(notes))
    if notes:
        bottleneck += " (" + "; ".join(notes) + ")"
    return bottleneck


def predict_speed(
    hw: HardwareProfile,
    layout: ModelLayout,
    layers: Sequence[LayerPlacement],
    output_device: str,
    *,
    ctx: int,
    kv_type: str = "f16",
    depth: int | None = None,
    stream_miss: float = 0.0,
    disk_read_bps: float = 3.5e9,
    threads: int | None = None,
    dense_miss: float = 0.0,
    read_around: float = DEFAULT_READ_AROUND,
    threads_batch: int | None = None,
    ubatch: int = 512,
    prompt_tokens: int = DEFAULT_PROMPT,
    kernels: kernel_costs.Kernels | None = None,
) -> SpeedPrediction:
    """Decode (and, on the CPU, prompt) speed of ``layers`` placed as given.

    ``stream_miss`` is the share of the RAM-resident experts' reads that miss the
    page cache and come from disk (0 when everything fits), ``dense_miss`` the same for
    the RAM-side weights every token reads (attention, shared experts, the output):
    above 0 only when even those do not fit the page cache; ``read_around`` is the
    bytes a page fault reads around a missed page (:data:`DEFAULT_READ_AROUND`).  ``threads`` is
    llama-server's ``-t`` (None: its default, :func:`default_threads`),
    ``threads_batch`` its ``-tb`` for prompts (None: as ``-t``).
    """
    k = kernels or kernel_costs.load()
    hp = layout.hparams
    n_threads = threads if threads and threads > 0 else default_threads(hw)
    n_batch_threads = threads_batch if threads_batch and threads_batch > 0 else n_threads
    d = min(ctx, DEFAULT_DEPTH) if depth is None else max(0, min(depth, ctx))
    tensors = _tensors(layout)
    placed = _place_work(k, hp, tensors, layers, output_device, d, kv_type)
    work = placed.work

    times = _device_times(hw, work, k, n_threads, hp)
    steps = _device_steps(hw, work, times, n_threads)
    cpu_s = times.cpu.seconds if times.cpu else 0.0
    hops, splits = _handovers(placed.sequence)
    handover_s = hops * GPU_HOP_S + splits * SPLIT_S if times.gpu_s > 0 else 0.0
    if handover_s > 0:
        steps.append((f"hand-overs ({hops} GPU-GPU, {splits} GPU-CPU)", handover_s))
    expected_s = cpu_s + times.gpu_s + handover_s

    reads = _disk_reads(placed, stream_miss, dense_miss, disk_read_bps, read_around)
    disk_bytes, disk_s = reads.total, reads.seconds
    if disk_s > 0:
        steps.append((_disk_step(reads), disk_s))
    bound_s = times.bound_s + disk_s
    expected_s += disk_s

    bound, expected, low, high = _tps_range(
        bound_s, expected_s, times.gpu_s + handover_s, disk_s if disk_bytes > 0 else None
    )

    prompt = 0.0
    if not any(_on_gpu(dv) for dv in work) and "RAM" in work:
        prompt = _prompt_tps(hw, layout, tensors, layers, k, n_batch_threads, ubatch, prompt_tokens)

    shares = _shares(times, handover_s, disk_bytes, disk_read_bps, disk_s)
    return SpeedPrediction(
        upper_bound_tps=bound,
        expected_tps=expected,
        low_tps=low,
        high_tps=high,
        bytes_per_token={key: round(w.total_bytes) for key, w in work.items()}
        | ({"disk": round(disk_bytes)} if disk_bytes > 0 else {}),
        bottleneck=_bottleneck(shares, expected_s, times.notes),
        depth=d,
        prompt_tps=prompt,
        prompt_tokens=prompt_tokens if prompt > 0 else 0,
        threads=n_threads,
        steps=tuple((label, s) for label, s in steps),
    )


def _routed_scale(
    k: kernel_costs.Kernels, t: str, batch: float, frac: float, threads: int, test: str
) -> float | None:
    """A routed expert's measured cost per weight per token (``Kernels.routed_ns``)
    relative to the type's dense cost for ``test``, which ``_cpu_time`` applies; None
    where no routed-expert curve was measured."""
    ns = k.routed_ns(t, batch, frac, threads)
    cost, _ = k.cost(t, threads)
    dense = cost.tg_ns if test == "tg" else cost.pp_ns
    return ns / dense if ns is not None and dense > 0 else None


def _prompt_tps(
    hw: HardwareProfile,
    layout: ModelLayout,
    tensors: _Tensors,
    layers: Sequence[LayerPlacement],
    k: kernel_costs.Kernels,
    threads: int,
    ubatch: int,
    prompt_tokens: int,
) -> float:
    """Prompt tok/s of a CPU-only plan for a ``prompt_tokens`` prompt from an empty context."""
    hp = layout.hparams
    batch = float(max(1, min(ubatch, prompt_tokens)))
    frac = hp.expert_used_count / max(hp.expert_count, 1)
    # share of a layer's experts some token of the batch routes to
    touched = 1.0 - (1.0 - frac) ** batch
    # tokens each touched expert multiplies: the batch's k-per-token routings spread
    # over the experts touched (few: an expert's matrix is then dearer per token)
    per_expert = batch * frac / touched if touched > 0 else batch

    def scaled(t: str, tokens: float) -> float:
        # the matrix-matrix cost at this many tokens, relative to the measured pp_ns
        pp = k.cost(t, threads)[0].pp_ns
        return k.batch_ns(t, tokens, threads) / pp if pp > 0 else 1.0

    routed: dict[str, float] = {}

    def expert_scale(t: str) -> float:
        # a routed expert's cost per token at the tokens the batch routes to it: the
        # measured MUL_MAT_ID curve where there is one, else the two-point estimate
        if t not in routed:
            scale = _routed_scale(k, t, batch, frac, threads, "pp")
            routed[t] = scale if scale is not None else scaled(t, per_expert)
        return routed[t]

    w = _Work(nodes=k.nodes("global"))
    for p in layers:
        for t, (wt, b) in tensors.other[p.index].items():
            w.add(t, wt * scaled(t, batch), b)
        for t, (wt, b) in tensors.experts[p.index].items():
            # multiplied for k experts per token, read once per batch where touched
            w.weights[t] = w.weights.get(t, 0.0) + wt * frac * expert_scale(t)
            w.nbytes[t] = w.nbytes.get(t, 0.0) + b * touched
        _, macs = _attention_work(hp, p.index, prompt_tokens / 2, "f16")
        w.extra_macs += macs
        w.kda_layers += 0 if is_mla_layer(hp, p.index) else 1
        w.nodes += _layer_nodes(k, hp, p.index, p.ffn == "moe")
    for t, (wt, b) in tensors.output.items():
        # llama.cpp computes the logits of the batch's last token only
        w.add(t, wt / batch, b)
    cost = _cpu_time(w, k, threads, ram_stream_bandwidth(hw), "pp", _kda_state(hp), batch)
    return 1.0 / cost.seconds if cost.seconds > 0 else 0.0


def explain(s: SpeedPrediction) -> list[str]:
    """How the prediction gets from the bound to its figure, one line per step."""
    if not s.steps:
        return []
    lines = []
    total = 0.0
    for label, seconds in s.steps:
        total += seconds
        lines.append(f"{label}: +{seconds * 1e3:.1f} ms -> {fmt_tps3(1.0 / total)} tok/s")
    return lines


def _threads_text(s: SpeedPrediction) -> str:
    return f"{s.threads} thread{'s' if s.threads != 1 else ''}" if s.threads else ""


def speed_lines(s: SpeedPrediction) -> list[str]:
    """What ``k3desk plan`` shows of a prediction: the figure, the prompt speed, this
    machine's measurements, and the steps from the bound."""
    head = (
        f"Speed: about {fmt_tps(s.expected_tps)} tok/s decode (range {fmt_tps(s.low_tps)}-"
        f"{fmt_tps(s.high_tps)}, physical bound {fmt_tps(s.upper_bound_tps)}) at {s.depth} "
        "tokens of context"
    )
    if s.threads:
        head += f", {_threads_text(s)}"
    lines = [head]
    if s.prompt_tps > 0:
        lines.append(f"  prompt: about {fmt_tps(s.prompt_tps)} tok/s for {s.prompt_tokens} tokens")
    if s.calibration:
        lines.append(f"  {s.calibration}")
    lines.append(f"  bottleneck: {s.bottleneck}")
    steps = explain(s)
    if steps:
        lines.append("  from the bound to the figure:")
        lines += [f"    {line}" for line in steps]
    return lines


def predicted_text(s: SpeedPrediction) -> str:
    """One line: 'Predicted: about 12 tok/s decode, 40 tok/s prompt (2 threads)'."""
    text = f"Predicted: about {fmt_tps(s.expected_tps)} tok/s decode"
    if s.prompt_tps > 0:
        text += f", {fmt_tps(s.prompt_tps)} tok/s prompt"
    if s.threads:
        text += f" ({_threads_text(s)})"
    return text


def summary_lines(s: SpeedPrediction) -> list[str]:
    """The Engine page's few lines: the prediction and its range, what this machine
    measured (when it did), and the bottleneck."""
    lines = [f"{predicted_text(s)}; range {fmt_tps(s.low_tps)}-{fmt_tps(s.high_tps)} tok/s decode."]
    if s.calibration:
        lines.append(s.calibration[0].upper() + s.calibration[1:] + ".")
    lines.append(f"Bottleneck: {s.bottleneck}.")
    return lines
