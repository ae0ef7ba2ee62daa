"""Predicted decode speed (tokens per second) of a launch plan.

Decoding one token with batch size 1 reads, on each device, every weight of the
layers placed there except the routed experts, of which only ``n_expert_used``
of ``n_expert`` are touched, plus the KV cache of MLA layers and the KDA
state.  Layers run one after the other, so the times on the devices add up:

    bound    = sum over devices of  bytes_touched(device) / bandwidth(device)
    expected = sum over devices of  cost_weighted_bytes(device) / (bandwidth * efficiency)
               + hops * hop_time + bytes_from_disk / disk_bandwidth

``bound`` is a physical upper limit (no real kernel streams at peak).  The
expected figure uses a handful of factors, each with a physical meaning, fitted
once by hand against the five llama.cpp decode speeds the seed cards publish
(``bench/predict_speed.py`` prints the table, the error of each, and the fit):

* ``GPU_EFFICIENCY``: the share of a GPU's peak bandwidth batch-1 matrix-vector
  kernels reach on quantized weights;
* ``RAM_EFFICIENCY``: the same for CPU threads reading system RAM;
* ``TYPE_COST``: relative cost on a GPU of decoding one byte of a type,
  compared with Q8_0 / K-quants.  The one type factor the data can fit is
  IQ4_XS (and its sibling IQ4_NL): 6block's same-machine pair runs at 11.5 tok/s
  with Q8_0 non-expert weights and 6.8 with IQ4_XS ones, although IQ4_XS reads
  half the bytes.  IQ1_S is the routed-expert type of every anchor, so its cost
  is absorbed by the efficiencies; other types stay at 1 rather than guess;
* ``CPU_LAYER_S``: fixed time per layer whose attention and shared weights run
  on the CPU (CPU-only or partial ``-ngl``): the many small graph nodes of a
  layer each start and synchronise dozens of threads.  Fitted on the one
  CPU-only anchor; AtomicChat's Q3_K_S on the same machine (not used in the
  fit) checks it;
* ``GPU_HOP_S`` / ``SPLIT_S`` (fixed, not fitted): time per hand-over between two
  GPUs, and per round trip between a GPU and the CPU (each MoE layer whose
  experts stay in RAM costs one: copy the activations, synchronise, copy back).

The low/high range is the calibration's spread (every anchor within
``RANGE`` of its prediction), never above the physical bound.  Speeds are
predicted at ``depth`` tokens of context (4,096 or the context size if
smaller): the MLA cache read grows with depth, the KDA state does not.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.k3arch import is_expert_tensor, layer_of
from k3desk.core.planning.memory import kv_cache_layer_bytes, recurrent_state_layer_bytes
from k3desk.core.planning.model import LayerPlacement, SpeedPrediction
from k3desk.core.units import GB

# ----------------------------------------------------------------- calibration
# Fitted once with ``bench/predict_speed.py --fit`` (log least squares over the
# five anchors; worst error 13 %, the unused sixth anchor 14 %).
GPU_EFFICIENCY = 0.35
RAM_EFFICIENCY = 0.45
# GPU-side cost per byte relative to Q8_0 / K-quants.  Only IQ4_XS/IQ4_NL have
# evidence (6block's pair); other types stay at 1 rather than guess.
TYPE_COST: dict[str, float] = {"IQ4_XS": 5.0, "IQ4_NL": 5.0}
# Per layer whose attention and shared weights run on the CPU: thread start-up
# and barriers of its ~40 graph nodes on dozens of threads, and the KDA update.
CPU_LAYER_S = 3e-3
# Fixed, not fitted: a hand-over between two GPUs, and a GPU <-> CPU round trip.
GPU_HOP_S = 50e-6
SPLIT_S = 50e-6
RANGE = 0.35

# Bandwidths used when a profile has none (documented guesses, marked as such).
FALLBACK_GPU_BPS = 0.5e12
FALLBACK_RAM_BPS = 50e9
DEFAULT_DEPTH = 4096


@dataclass(frozen=True)
class _LayerCost:
    other_raw: int
    other_weighted: float
    expert_raw: int
    expert_weighted: float


def _weighted_layers(layout: ModelLayout) -> tuple[list[_LayerCost], int, float]:
    """Per-layer raw and cost-weighted bytes, and the output layer's."""
    n = len(layout.layers)
    if not layout.tensors:
        costs = [
            _LayerCost(
                layer.other_bytes,
                float(layer.other_bytes),
                layer.expert_bytes,
                float(layer.expert_bytes),
            )
            for layer in layout.layers
        ]
        out = layout.global_bytes - layout.token_embd_bytes
        return costs, out, float(out)
    o_raw = [0] * n
    o_w = [0.0] * n
    e_raw = [0] * n
    e_w = [0.0] * n
    out_raw = 0
    out_w = 0.0
    for t in layout.tensors:
        c = TYPE_COST.get(t.type_name.upper(), 1.0)
        i = layer_of(t.name)
        if i is None or i >= n:
            if t.name.startswith("token_embd"):
                continue  # one row per token: negligible
            out_raw += t.nbytes
            out_w += t.nbytes * c
        elif is_expert_tensor(t.name):
            e_raw[i] += t.nbytes
            e_w[i] += t.nbytes * c
        else:
            o_raw[i] += t.nbytes
            o_w[i] += t.nbytes * c
    costs = [_LayerCost(o_raw[i], o_w[i], e_raw[i], e_w[i]) for i in range(n)]
    return costs, out_raw, out_w


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


def device_efficiency(device: str) -> float:
    if device.startswith("CUDA"):
        return GPU_EFFICIENCY
    return RAM_EFFICIENCY


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
) -> SpeedPrediction:
    """Decode speed of ``layers`` placed as given (see the module docstring).

    ``stream_miss`` is the share of the RAM-resident experts' reads that miss the
    page cache and come from disk (0 when everything fits).
    """
    hp = layout.hparams
    d = min(ctx, DEFAULT_DEPTH) if depth is None else max(0, min(depth, ctx))
    costs, out_raw, out_w = _weighted_layers(layout)
    frac = hp.expert_used_count / max(hp.expert_count, 1)

    raw: dict[str, float] = {}
    weighted: dict[str, float] = {}

    def add(device: str, nbytes: float, w: float) -> None:
        raw[device] = raw.get(device, 0.0) + nbytes
        weighted[device] = weighted.get(device, 0.0) + w

    ram_expert_touched = 0.0
    sequence: list[str] = ["RAM"]  # the input embedding is looked up on the CPU
    for p in layers:
        c = costs[p.index]
        kv = kv_cache_layer_bytes(hp, p.index, d, kv_type)
        state = 2 * recurrent_state_layer_bytes(hp, p.index)  # read and write
        other_w = c.other_weighted if _on_gpu(p.non_expert_device) else c.other_raw
        add(p.non_expert_device, c.other_raw + kv + state, other_w + kv + state)
        sequence.append(p.non_expert_device)
        if p.ffn == "moe" and c.expert_raw > 0:
            exp_w = c.expert_weighted if _on_gpu(p.expert_device) else c.expert_raw
            add(p.expert_device, c.expert_raw * frac, exp_w * frac)
            if p.expert_device == "RAM":
                ram_expert_touched += c.expert_raw * frac
            sequence.append(p.expert_device)
            sequence.append(p.non_expert_device)  # shared expert and residual continue there
    add(output_device, out_raw, out_w if _on_gpu(output_device) else out_raw)
    sequence.append(output_device)

    notes: list[str] = []
    bound_s = 0.0
    expected_s = 0.0
    per_device_s: dict[str, float] = {}
    for device, nbytes in raw.items():
        bw, note = device_bandwidth(hw, device)
        if note:
            notes.append(note)
        bound_s += nbytes / bw
        t = weighted[device] / (bw * device_efficiency(device))
        per_device_s[device] = t
        expected_s += t

    hops = 0
    splits = 0
    for a, b in itertools.pairwise(sequence):
        if a == b:
            continue
        if "RAM" in (a, b):
            splits += 1
        else:
            hops += 1
    # the first RAM -> GPU hand-over of the embedding is part of every token
    expected_s += hops * GPU_HOP_S + splits * SPLIT_S
    cpu_layers = sum(1 for p in layers if p.non_expert_device == "RAM")
    cpu_layers += 1 if output_device == "RAM" else 0
    expected_s += cpu_layers * CPU_LAYER_S

    disk_bytes = ram_expert_touched * min(max(stream_miss, 0.0), 1.0)
    disk_s = disk_bytes / max(disk_read_bps, 1.0)
    bound_s += disk_s
    expected_s += disk_s

    bound = 1.0 / bound_s if bound_s > 0 else 0.0
    expected = min(1.0 / expected_s, bound) if expected_s > 0 else 0.0
    low = expected / (1.0 + RANGE)
    high = min(expected * (1.0 + RANGE), bound)
    if disk_bytes > 0:
        # page faults on scattered expert slices rarely reach the sequential rate:
        # the low end assumes half of it
        low = 1.0 / (expected_s + disk_s) if expected_s > 0 else 0.0
    shares = {
        f"disk reads ({disk_bytes / GB:.1f} GB of experts per token at "
        f"{disk_read_bps / GB:.1f} GB/s)": disk_s,
        "RAM bandwidth (CPU)": per_device_s.get("RAM", 0.0),
        "GPU memory bandwidth": sum(v for k, v in per_device_s.items() if k != "RAM"),
        "CPU per-layer overhead (threads, KDA update)": cpu_layers * CPU_LAYER_S,
        "GPU-CPU hand-overs": hops * GPU_HOP_S + splits * SPLIT_S,
    }
    what = max(shares, key=lambda k: shares[k])
    if expected_s > 0 and shares[what] > 0:
        bottleneck = f"{what}: {shares[what] / expected_s:.0%} of the time per token"
    else:
        bottleneck = "nothing placed"
    if notes:
        bottleneck += " (" + "; ".join(notes) + ")"
    return SpeedPrediction(
        upper_bound_tps=bound,
        expected_tps=expected,
        low_tps=low,
        high_tps=high,
        bytes_per_token={k: round(v) for k, v in raw.items()}
        | ({"disk": round(disk_bytes)} if disk_bytes > 0 else {}),
        bottleneck=bottleneck,
        depth=d,
    )
