"""The launch plan: where every layer of Kimi-K3 goes, and the llama-server argv for it.

:func:`make_plan` is a pure function of (hardware, model layout, options).

How it places the model
-----------------------
llama.cpp with ``-ngl 99`` puts every layer's attention, norms, router, shared
expert and latent projections on the GPUs, split by ``-ts`` (layers per GPU,
the output layer counted as one more), and ``--n-cpu-moe N`` keeps the routed
experts of layers ``0..N-1`` in RAM (``blk.0`` is dense, so ``N = 1`` moves
nothing).  The non-expert weights are read in full for every token and the
experts only 16/896 at a time, so GPU memory is spent on non-expert weights
first, then on as many expert layers as fit:

1. For ``N = 0, 2, 3, ..., n_layer`` (smallest first), pack the layers in order
   onto the GPUs, each GPU up to its free memory minus ``gpu_margin``, the CUDA
   runtime and its compute buffer; the first ``N`` that packs is the plan.
   A contiguous first-fit packing in order is feasible whenever any contiguous
   split is, so more VRAM can never raise ``N``.
2. If even ``N = n_layer`` does not pack (the non-expert weights alone exceed the
   GPUs), offload only the last ``L`` layers (``-ngl L``) with every expert in RAM.
3. Whatever is not on a GPU lives in RAM: mmap'd weights in the page cache plus
   KV, state and compute buffers (and the weights ggml-cpu repacks, repack.py),
   which are anonymous memory.  The RAM budget is the available memory (capped by
   the cgroup limit) minus ``ram_margin``.  If the mmap'd weights do not fit,
   llama.cpp still runs, reading what the page cache misses from disk for every
   token ("stream"; the plan adds --no-repack so repacked copies do not take the
   cache); only when the anonymous memory itself does not fit is there no usable
   plan ("no-fit").

Unified memory (GB10 / DGX Spark): the GPU's memory *is* system RAM, so the GPU
and the page cache share one budget.

The projector (``--mmproj``) goes to GPU 0 unless that would push one more
expert layer into RAM; then it stays on the CPU (``--no-mmproj-offload``),
which slows image encoding only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

from k3desk.core.errors import PlanError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import GpuInfo, HardwareProfile
from k3desk.core.planning import kernels as kernel_costs
from k3desk.core.planning.argv import (
    ALL_LAYERS,
    NO_REPACK,
    Offload,
    has,
    server_args,
)
from k3desk.core.planning.memory import (
    CUDA_RUNTIME_BYTES,
    MMPROJ_COMPUTE_BYTES,
    MMPROJ_DEFAULT_BYTES,
    attn_res_stack_bytes,
    compute_buffer_bytes,
    kv_bytes_per_token,
    kv_cache_layer_bytes,
    kv_type_bytes,
    recurrent_state_layer_bytes,
    slot_context,
)
from k3desk.core.planning.model import (
    DeviceMemory,
    LaunchPlan,
    LayerPlacement,
    PlanOptions,
    SpeedPrediction,
    VerdictKind,
)
from k3desk.core.planning.repack import repack_bytes
from k3desk.core.planning.speed import DEFAULT_READ_AROUND, STREAM_RATE_SHARE, predict_speed
from k3desk.core.units import fmt_bytes, fmt_duration, fmt_tps


@dataclass(frozen=True)
class _Gpu:
    pos: int  # position in hw.gpus = CUDA device number
    info: GpuInfo
    capacity: int  # budget after the margin
    fixed: int  # runtime + compute buffer (without logits)


@dataclass(frozen=True)
class _Placement:
    n_cpu_moe: int
    first_gpu_layer: int  # layers >= this are on GPUs (n_layer + 1 = none)
    assign: tuple[int, ...]  # GPU position per offloaded item (layers..., output)
    mmproj_on_gpu: bool


def ram_budget(hw: HardwareProfile, opts: PlanOptions) -> int:
    """RAM the plan may fill: available memory, capped by the cgroup, minus the margin."""
    mem = hw.memory
    avail = mem.available
    if mem.cgroup_limit is not None:
        avail = min(avail, mem.cgroup_limit)
    return max(0, avail - opts.ram_margin)


def stream_misses(cache: int, dense: int, experts: int) -> tuple[float, float]:
    """(expert miss, dense miss): the shares of the mmap'd RAM-side reads per token that
    the page cache cannot hold, with ``cache`` bytes of it left for ``dense`` bytes read
    for every token and ``experts`` bytes of routed experts read a few at a time.

    The weights every token reads are the hottest pages, so the cache holds them first
    and the experts get what is left; when not even those fit, every expert read and
    the rest of theirs miss.  More cache never means more misses.
    """
    cache = max(0, cache)
    if cache >= dense:
        held = min(1.0, (cache - dense) / experts) if experts > 0 else 1.0
        return 1.0 - held, 0.0
    return (1.0 if experts > 0 else 0.0), 1.0 - cache / max(dense, 1)


def load_seconds(layout: ModelLayout, disk_read_bps: float, token_s: float = 0.0) -> float:
    """Seconds llama-server takes to get ready, at most: it maps every part with
    ``MAP_POPULATE`` (``llama_mmap::impl`` in ``src/llama-mmap.cpp``, prefetch on from
    ``llama_model_loader::init_mappings``; no lazy ranges unless a tensor exceeds 4 GiB),
    which reads each file in full whatever fits in RAM, and then decodes two tokens even
    with ``--no-warmup`` (``common_context_can_seq_rm`` in ``common/common.cpp``, called
    by ``tools/server/server-context.cpp``'s ``load_model``): ``token_s``, one decode
    step.  Files already in the page cache load faster."""
    return layout.total_file_bytes / max(disk_read_bps, 1.0) + max(token_s, 0.0)


def _read_around(opts: PlanOptions) -> int:
    return opts.read_around_bytes if opts.read_around_bytes is not None else DEFAULT_READ_AROUND


def plan_ctx(layout: ModelLayout, opts: PlanOptions) -> tuple[int, str]:
    """The context size a plan uses, and a note when the default had to be capped.

    A size asked for (``opts.ctx``) is used as given and refused when the model was
    not trained for it; without one, ``opts.default_ctx`` is capped at the model's
    trained context length.
    """
    trained = layout.hparams.context_length
    where = layout.first_part if layout.parts else "the model"
    asked = opts.ctx is not None
    ctx = opts.ctx if opts.ctx is not None else opts.default_ctx
    if ctx <= 0:
        raise PlanError(f"The context size must be a positive number of tokens (got {ctx}).")
    if ctx <= trained or trained <= 0:
        return ctx, ""
    if asked:
        raise PlanError(
            f"The context size {ctx} exceeds what {where} supports ({trained} tokens).",
            f"Use --ctx {trained} or less.",
        )
    name = layout.first_part.name if layout.parts else "the model"
    return trained, (
        f"Context: {trained} tokens, the most {name} was trained for (the default, {ctx}, is more)."
    )


def _resolved_ctx(opts: PlanOptions) -> int:
    """The context size of options :func:`make_plan` has resolved with :func:`plan_ctx`."""
    return opts.ctx if opts.ctx is not None else opts.default_ctx


def _check_options(layout: ModelLayout, opts: PlanOptions) -> None:
    where = layout.first_part if layout.parts else "the model"
    if opts.parallel < 1:
        raise PlanError(f"--parallel must be at least 1 (got {opts.parallel}).")
    if opts.ubatch < 1:
        raise PlanError(f"The micro-batch size must be at least 1 (got {opts.ubatch}).")
    counts = (("thread count", opts.threads), ("prompt thread count", opts.threads_batch))
    for name, value in counts:
        if value is not None and value < 1:
            raise PlanError(f"The {name} must be at least 1 (got {value}).")
    if opts.batch is not None and opts.batch < opts.ubatch:
        raise PlanError(
            f"The batch size ({opts.batch}) must be at least the micro-batch ({opts.ubatch})."
        )
    if opts.n_cpu_moe is not None and opts.n_cpu_moe < 0:
        raise PlanError(f"--n-cpu-moe must not be negative (got {opts.n_cpu_moe}).")
    if opts.gpu_margin < 0 or opts.ram_margin < 0:
        raise PlanError("Memory margins must not be negative.")
    kv_type_bytes(opts.kv_type)
    if not layout.layers:
        raise PlanError(f"{where} has no layers to place.")


def _pack(
    items: Sequence[int], caps: Sequence[int], peaks: Sequence[int] = ()
) -> tuple[int, ...] | None:
    """Contiguous first-fit of ``items`` (in order) into bins ``caps`` (in order).

    ``peaks`` (one per item, never falling along the order): memory a bin needs once
    more, for the largest peak among its items, such as the AttnRes stack of the last
    layer a GPU runs.
    """
    assign: list[int] = []
    b = 0
    room = caps[0] if caps else 0
    peak = 0
    for i, size in enumerate(items):
        p = peaks[i] if i < len(peaks) else 0
        while b < len(caps) and size + max(0, p - peak) > room:
            b += 1
            room = caps[b] if b < len(caps) else 0
            peak = 0
        if b >= len(caps):
            return None
        assign.append(b)
        room -= size + max(0, p - peak)
        peak = max(peak, p)
    return tuple(assign)


def _balanced(
    items: Sequence[int], caps: Sequence[int], peaks: Sequence[int] = ()
) -> tuple[int, ...] | None:
    """A contiguous packing that fills every bin to about the same share of its capacity.

    Like llama.cpp's default split (layers in proportion to free memory), but
    computed: the smallest fill ratio at which the in-order packing still fits,
    found by bisection.  The headroom is then spread over all GPUs instead of
    being left on the last ones.
    """
    full = _pack(items, caps, peaks)
    if full is None:
        return None
    lo, hi = 0.0, 1.0
    best = full
    for _ in range(40):
        mid = (lo + hi) / 2
        trial = _pack(items, [int(c * mid) for c in caps], peaks)
        if trial is None:
            lo = mid
        else:
            hi, best = mid, trial
    return best


def _fmt_free(gpus: Sequence[_Gpu]) -> str:
    return " + ".join(fmt_bytes(g.capacity) for g in gpus) or "no GPU"


def _fmt_ranges(indices: Sequence[int]) -> str:
    if not indices:
        return "none"
    out: list[str] = []
    start = prev = indices[0]
    for i in indices[1:]:
        if i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = i
    out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(out)


def with_disk_rate(hw: HardwareProfile, opts: PlanOptions) -> PlanOptions:
    """``opts`` with the disk's read rate from ``hw`` (its models folder's disk, measured
    or from the kind of device) unless the options already carry one that says where it
    came from; without either, the assumed rate stays and the notes say "assumed"."""
    if opts.disk_read_note or hw.disk is None:
        return opts
    rate = hw.disk.read_rate
    if rate.bytes_per_s <= 0 or rate.source == "unknown":
        return opts
    note = f"{rate.bytes_per_s / 1e9:.1f} GB/s, {rate.source}"
    note += f": {rate.note}" if rate.note else ""
    return replace(opts, disk_read_bps=rate.bytes_per_s, disk_read_note=note)


@dataclass(frozen=True)
class _Sizes:
    """What each layer and the output need on the device that runs them, for one context."""

    kv: list[int]  # KV cache per layer
    state: list[int]  # recurrent (KDA) state per layer
    stack: list[int]  # the AttnRes stack a GPU needs when this is its last layer
    stack_out: int  # ... when it runs the output (all of it)
    output_bytes: int  # the output layer's weights
    logits: int
    mmproj: int  # the projector with its compute buffer (0: no projector)


def _sizes(layout: ModelLayout, opts: PlanOptions, ctx: int) -> _Sizes:
    hp = layout.hparams
    layers = layout.layers
    n = len(layers)
    mmproj = 0
    if opts.mmproj is not None or (opts.mmproj_bytes or 0) > 0:
        mmproj = (opts.mmproj_bytes or MMPROJ_DEFAULT_BYTES) + MMPROJ_COMPUTE_BYTES
    return _Sizes(
        # with several slots the engine's total context is rounded (slot_context)
        kv=[
            kv_cache_layer_bytes(hp, i, slot_context(ctx, opts.parallel)[0], opts.kv_type)
            for i in range(n)
        ],
        state=[recurrent_state_layer_bytes(hp, i, opts.parallel) for i in range(n)],
        stack=[attn_res_stack_bytes(hp, x.index, ubatch=opts.ubatch, ctx=ctx) for x in layers],
        stack_out=attn_res_stack_bytes(hp, n - 1, ubatch=opts.ubatch, ctx=ctx),
        output_bytes=layout.global_bytes - layout.token_embd_bytes,
        logits=4 * opts.ubatch * hp.vocab_size,
        mmproj=mmproj,
    )


def _gpus(
    hw: HardwareProfile, layout: ModelLayout, opts: PlanOptions, pool: int, ctx: int
) -> list[_Gpu]:
    """Every GPU with its budget: free memory less the margin, or on unified memory its
    share of the one RAM pool less what the CPU side needs at least."""
    hp = layout.hparams
    unified = [g for g in hw.gpus if g.unified_memory]
    gpu_compute = compute_buffer_bytes(hp, ctx, ubatch=opts.ubatch, flash_attn=opts.flash_attn)
    cpu_compute = compute_buffer_bytes(
        hp, ctx, ubatch=opts.ubatch, flash_attn=opts.flash_attn, with_output=True
    )
    gpus: list[_Gpu] = []
    for pos, g in enumerate(hw.gpus):
        fixed = CUDA_RUNTIME_BYTES + gpu_compute
        if g.unified_memory:
            share = pool // max(len(unified), 1)
            cap = share - (layout.token_embd_bytes + cpu_compute) // max(len(unified), 1)
        else:
            cap = g.vram_free - opts.gpu_margin
        gpus.append(_Gpu(pos, g, max(cap, 0), fixed))
    return gpus


def _place(
    layout: ModelLayout,
    opts: PlanOptions,
    sizes: _Sizes,
    usable: list[_Gpu],
    reserve_mmproj: bool,
) -> _Placement | None:
    """Steps 1 and 2 of the module docstring (None: no GPU has room for even one layer)."""
    if not usable:
        return None
    layers = layout.layers
    n = len(layers)
    caps = [
        max(g.capacity - g.fixed - (sizes.mmproj if reserve_mmproj and k == 0 else 0), 0)
        for k, g in enumerate(usable)
    ]
    out_item = sizes.output_bytes + sizes.logits
    moe_starts = sorted({0} | {layer.index + 1 for layer in layers if layer.ffn == "moe"})
    if opts.n_cpu_moe is not None:
        moe_starts = [min(opts.n_cpu_moe, n)]
    for cut in moe_starts:
        items = [
            layer.other_bytes
            + (layer.expert_bytes if layer.ffn == "moe" and layer.index >= cut else 0)
            + sizes.kv[layer.index]
            + sizes.state[layer.index]
            for layer in layers
        ]
        assign = _balanced([*items, out_item], caps, [*sizes.stack, sizes.stack_out])
        if assign is not None:
            return _Placement(cut, 0, assign, reserve_mmproj)
    if opts.n_cpu_moe is not None and opts.n_cpu_moe < n:
        raise PlanError(
            f"With --n-cpu-moe {opts.n_cpu_moe} the layers of {layout.first_part} do not "
            f"fit the GPUs ({_fmt_free(usable)} usable after the margin).",
            f"Use a larger --n-cpu-moe (up to {n}) or leave it out to let k3desk choose.",
        )
    for first in range(1, n + 1):  # fewer layers on the GPUs, every expert in RAM
        items = [layers[i].other_bytes + sizes.kv[i] + sizes.state[i] for i in range(first, n)]
        assign = _balanced([*items, out_item], caps, [*sizes.stack[first:], sizes.stack_out])
        if assign is not None:
            return _Placement(n, first, assign, reserve_mmproj)
    return None


def _choose_placement(
    layout: ModelLayout, opts: PlanOptions, sizes: _Sizes, usable: list[_Gpu], unified: bool
) -> _Placement | None:
    """The placement, with the projector on GPU 0 when that costs no expert layer (or
    when asked, or on unified memory, where both sides share one pool)."""
    plain = _place(layout, opts, sizes, usable, False)
    if not sizes.mmproj or plain is None or opts.mmproj_on_cpu is True:
        return plain
    try:
        with_mm = _place(layout, opts, sizes, usable, True)
    except PlanError:  # a forced --n-cpu-moe leaves no room for the projector
        return plain
    if with_mm is None:
        return plain
    same = with_mm.n_cpu_moe == plain.n_cpu_moe and with_mm.first_gpu_layer == plain.first_gpu_layer
    return with_mm if (same or opts.mmproj_on_cpu is False or unified) else plain


def make_plan(hw: HardwareProfile, layout: ModelLayout, opts: PlanOptions) -> LaunchPlan:
    """Plan ``layout`` on ``hw`` with ``opts`` (see the module docstring)."""
    opts = with_disk_rate(hw, opts)
    ctx, ctx_note = plan_ctx(layout, opts)
    _check_options(layout, opts)
    sizes = _sizes(layout, opts, ctx)
    pool = ram_budget(hw, opts)
    usable = [g for g in _gpus(hw, layout, opts, pool, ctx) if g.capacity > g.fixed]
    unified = any(g.unified_memory for g in hw.gpus)
    chosen = _choose_placement(layout, opts, sizes, usable, unified)
    return _build(hw, layout, replace(opts, ctx=ctx), chosen, usable, pool, sizes, ctx_note)


@dataclass
class _Map:
    """Where each layer went, and what that puts on each device."""

    placements: list[LayerPlacement]
    gpu_w: dict[int, int]  # by GPU position: weights
    gpu_kv: dict[int, int]
    gpu_state: dict[int, int]
    gpu_layers: dict[int, int]  # layers it runs (the output counted as one)
    gpu_last: dict[int, int]  # the last layer it runs (its AttnRes stack)
    ram_last: int = -1
    output_device: str = "RAM"
    ram_w: int = 0  # the token embedding
    ram_kv: int = 0
    ram_state: int = 0
    ram_expert: int = 0
    ram_dense: int = 0


def _layer_map(
    layout: ModelLayout, pl: _Placement | None, usable: list[_Gpu], sizes: _Sizes
) -> _Map:
    def zeros() -> dict[int, int]:
        return {g.pos: 0 for g in usable}

    m = _Map([], zeros(), zeros(), zeros(), zeros(), {}, ram_w=layout.token_embd_bytes)
    for layer in layout.layers:
        i = layer.index
        if pl is not None and i >= pl.first_gpu_layer:
            pos = usable[pl.assign[i - pl.first_gpu_layer]].pos
            home = f"CUDA{pos}"
            m.gpu_w[pos] += layer.other_bytes
            m.gpu_kv[pos] += sizes.kv[i]
            m.gpu_state[pos] += sizes.state[i]
            m.gpu_layers[pos] += 1
            m.gpu_last[pos] = i
        else:
            home = "RAM"
            m.ram_last = i
            m.ram_dense += layer.other_bytes
            m.ram_kv += sizes.kv[i]
            m.ram_state += sizes.state[i]
        if layer.ffn != "moe" or layer.expert_bytes == 0:
            exp_dev = "none"
        elif pl is not None and i >= pl.n_cpu_moe and home != "RAM":
            exp_dev = home
            m.gpu_w[usable[pl.assign[i - pl.first_gpu_layer]].pos] += layer.expert_bytes
        else:
            exp_dev = "RAM"
            m.ram_expert += layer.expert_bytes
        m.placements.append(
            LayerPlacement(
                i, layer.attention, layer.ffn, home, exp_dev, layer.other_bytes, layer.expert_bytes
            )
        )
    n = len(layout.layers)
    if pl is not None:
        pos = usable[pl.assign[-1]].pos
        m.output_device = f"CUDA{pos}"
        m.gpu_w[pos] += sizes.output_bytes
        m.gpu_layers[pos] += 1
        m.gpu_last[pos] = n - 1  # the final res_mix reads the whole stack
    else:
        m.ram_dense += sizes.output_bytes
        m.ram_last = n - 1
    return m


def _devices(
    layout: ModelLayout,
    opts: PlanOptions,
    pl: _Placement | None,
    usable: list[_Gpu],
    m: _Map,
    sizes: _Sizes,
    pool: int,
) -> tuple[list[DeviceMemory], DeviceMemory]:
    """The memory of every GPU the plan uses, then of RAM (also the last of the list)."""
    hp = layout.hparams
    ctx = _resolved_ctx(opts)
    devices: list[DeviceMemory] = []
    unified_used = 0
    for g in usable if pl is not None else ():
        stack = m.gpu_last.get(g.pos)
        mem = DeviceMemory(
            device=f"CUDA{g.pos}",
            capacity=g.capacity,
            weights=m.gpu_w[g.pos],
            kv_cache=m.gpu_kv[g.pos],
            recurrent_state=m.gpu_state[g.pos],
            compute=g.fixed
            + (sizes.logits if m.output_device == f"CUDA{g.pos}" else 0)
            + (
                attn_res_stack_bytes(hp, stack, ubatch=opts.ubatch, ctx=ctx)
                if stack is not None
                else 0
            ),
            other=sizes.mmproj if (pl is not None and pl.mmproj_on_gpu and g is usable[0]) else 0,
        )
        devices.append(mem)
        if g.info.unified_memory:
            unified_used += mem.used
    mmproj_on_gpu = pl is not None and pl.mmproj_on_gpu
    ram_compute = compute_buffer_bytes(
        hp,
        ctx,
        ubatch=opts.ubatch,
        flash_attn=opts.flash_attn,
        with_output=pl is None,
        experts_here=pl is None or m.ram_expert > 0,
        last_layer=m.ram_last if m.ram_last >= 0 else None,
    )
    ram = DeviceMemory(
        device="RAM",
        capacity=max(0, pool - unified_used) if unified_used else pool,
        weights=m.ram_w + m.ram_dense + m.ram_expert,
        kv_cache=m.ram_kv,
        recurrent_state=m.ram_state,
        compute=ram_compute,
        other=sizes.mmproj if (sizes.mmproj and not mmproj_on_gpu) else 0,
    )
    devices.append(ram)
    return devices, ram


@dataclass(frozen=True)
class _Fit:
    """The verdict and the RAM figures behind it."""

    verdict: VerdictKind
    need: int  # RAM for the whole model to stay resident
    anon: int  # anonymous memory: buffers, and repacked weights unless --no-repack
    shortfall: int
    stream_bytes: int  # mmap'd weights the page cache cannot hold
    miss: float  # share of expert reads that miss the page cache
    dense_miss: float
    no_repack: bool
    repack: int  # bytes ggml-cpu would repack


def _fit(
    hw: HardwareProfile,
    layout: ModelLayout,
    opts: PlanOptions,
    placements: list[LayerPlacement],
    ram: DeviceMemory,
    ram_expert: int,
    output_device: str,
) -> _Fit:
    """RAM holds two kinds of memory.  The weights are mmap'd: page cache, which the
    kernel evicts and pages in again from the shards as tokens need them, so they may
    exceed RAM (llama.cpp then reads from disk).  Buffers (KV cache, state, compute,
    projector) and weights ggml-cpu repacks (repack.py) are anonymous memory: when they
    do not fit, the load fails."""
    ram_cap = ram.capacity
    anon = ram.kv_cache + ram.recurrent_state + ram.compute + ram.other
    resident_short = max(0, ram.used - ram_cap)  # RAM missing for the whole model to stay
    repack = repack_bytes(
        hw,
        layout,
        (p.index for p in placements if p.expert_device == "RAM"),
        (p.index for p in placements if p.non_expert_device == "RAM"),
        output_device == "RAM",
    )
    # Repacked copies replace the file's pages of the same weights, so they cost nothing
    # while the model stays resident; when it does not, they take from the page cache
    # the streaming needs and may not be allocatable at all.
    no_repack = has(opts.extra_args, NO_REPACK) or (repack > 0 and resident_short > 0)
    anon_total = anon + (0 if no_repack else repack)
    verdict: VerdictKind
    if anon_total > ram_cap:
        return _Fit("no-fit", ram.used, anon_total, anon_total - ram_cap, 0, 0.0, 0.0,
                    no_repack, repack)  # fmt: skip
    if resident_short > 0:
        cache = ram_cap - anon_total
        miss, dense_miss = stream_misses(cache, ram.weights - ram_expert, ram_expert)
        return _Fit("stream", ram.used, anon_total, resident_short, ram.weights - cache, miss,
                    dense_miss, no_repack, repack)  # fmt: skip
    if output_device == "RAM":  # nothing on a GPU
        verdict = "cpu"
    elif any(p.expert_device == "RAM" or p.non_expert_device == "RAM" for p in placements):
        verdict = "hybrid"
    else:
        verdict = "gpu"
    return _Fit(verdict, ram.used, anon_total, 0, 0, 0.0, 0.0, no_repack, repack)


def _offload(
    hw: HardwareProfile, pl: _Placement | None, n: int, m: _Map, usable: list[_Gpu]
) -> Offload:
    """The placement as llama-server's options: -ngl, --n-cpu-moe, -ts, the projector."""
    if pl is None:
        # an engine without a GPU backend takes no GPU flags
        return Offload(gpu_layers=0 if hw.gpus else None)
    ngl = n + 1 - pl.first_gpu_layer
    split: tuple[int, ...] = ()
    if len(usable) > 1:  # -ts covers every CUDA device in order; unusable ones get 0
        split = tuple(m.gpu_layers.get(p, 0) for p in range(len(hw.gpus)))
    return Offload(ALL_LAYERS if ngl >= n + 1 else ngl, pl.n_cpu_moe, split, pl.mmproj_on_gpu)


def _build(
    hw: HardwareProfile,
    layout: ModelLayout,
    opts: PlanOptions,
    pl: _Placement | None,
    usable: list[_Gpu],
    pool: int,
    sizes: _Sizes,
    ctx_note: str,
) -> LaunchPlan:
    ctx = _resolved_ctx(opts)
    n = len(layout.layers)
    m = _layer_map(layout, pl, usable, sizes)
    devices, ram = _devices(layout, opts, pl, usable, m, sizes, pool)
    fit = _fit(hw, layout, opts, m.placements, ram, m.ram_expert, m.output_device)
    speed_at = partial(
        predict_speed,
        hw,
        layout,
        m.placements,
        m.output_device,
        ctx=ctx,
        kv_type=opts.kv_type,
        depth=opts.speed_depth,
        read_around=_read_around(opts),
        threads=opts.threads,
        threads_batch=opts.threads_batch,
        ubatch=opts.ubatch,
        kernels=kernel_costs.load().scaled(opts.kernel_scale) if opts.kernel_scale else None,
    )
    speed = speed_at(
        stream_miss=fit.miss, dense_miss=fit.dense_miss, disk_read_bps=opts.disk_read_bps
    )
    token_s = 1.0 / speed.expected_tps if speed.expected_tps > 0 else 0.0
    load_s = load_seconds(layout, opts.disk_read_bps, token_s)
    model = str(layout.first_part) if layout.parts else "model.gguf"
    offload = _offload(hw, pl, n, m, usable)
    facts = _Facts(hw, layout, opts, pl, m.placements, devices, ram, fit, sizes.mmproj)
    reason, notes = _explain(facts, speed.expected_tps, load_s)
    if fit.verdict == "stream":
        notes.append(_stream_needs(speed_at, fit, opts, speed, ram.weights - m.ram_expert))
    if ctx_note:
        notes.insert(0, ctx_note)
    return LaunchPlan(
        verdict=fit.verdict,
        reason=reason,
        n_cpu_moe=pl.n_cpu_moe if pl is not None else 0,
        n_gpu_layers=(n + 1 - pl.first_gpu_layer) if pl is not None else 0,
        server_args=server_args(model, opts, offload, no_repack=fit.no_repack),
        devices=tuple(devices),
        layers=tuple(m.placements),
        speed=speed,
        ctx=ctx,
        model_bytes=layout.total_tensor_bytes,
        shortfall=fit.shortfall,
        notes=tuple(notes),
        tensor_split=offload.tensor_split and tuple(m.gpu_layers[g.pos] for g in usable),
        mmproj_on_gpu=pl is not None and pl.mmproj_on_gpu,
        output_device=m.output_device,
        stream_bytes=fit.stream_bytes,
        ctx_note=ctx_note,
        no_repack=fit.no_repack,
        repack_bytes=fit.repack,
        anon_bytes=fit.anon,
        load_seconds=load_s,
    )


def _per_token(tps: float) -> str:
    """'14 s per token' (below one token a second), else 'about 3.2 tok/s'."""
    if 0 < tps < 1:
        return f"{1 / tps:.1f} s per token"
    return f"{fmt_tps(tps)} tok/s"


def _stream_needs(
    speed_at: Callable[..., SpeedPrediction],
    fit: _Fit,
    opts: PlanOptions,
    now: SpeedPrediction,
    dense: int,
) -> str:
    """What streaming costs per token, the disk rate behind it, and what a faster disk
    or more RAM would give (the rules: speed.py's module docstring); ``dense``: the
    mmap'd bytes in RAM every token reads."""
    rate = opts.disk_read_bps
    disk_s = sum(s for label, s in now.steps if "read from disk" in label)
    disk_b = now.bytes_per_token.get("disk", 0)
    faster = speed_at(stream_miss=fit.miss, dense_miss=fit.dense_miss, disk_read_bps=2 * rate)
    held = speed_at(stream_miss=fit.miss, dense_miss=0.0, disk_read_bps=rate)
    resident = speed_at(stream_miss=0.0, dense_miss=0.0, disk_read_bps=rate)
    note = opts.disk_read_note
    how = (
        "measured" if "measured" in note else "its kind's figure" if "table" in note else "assumed"
    )
    text = (
        f"Streaming costs about {_per_token(now.expected_tps)}"
        f"{f', {disk_s:.1f} s of it reading {disk_b / 1e9:.1f} GB from disk' if disk_s else ''}"
        f" by page faults, at about {STREAM_RATE_SHARE:.0%} of the disk's "
        f"{rate / 1e9:.1f} GB/s ({how}).  A disk twice as fast: "
        f"{_per_token(faster.expected_tps)}."
    )
    if fit.dense_miss > 0:
        text += (
            f" {fmt_bytes(round(dense * fit.dense_miss))} more free RAM would keep the weights "
            f"every token reads cached: {_per_token(held.expected_tps)}."
        )
    return text + (
        f" {fmt_bytes(fit.shortfall)} more free RAM (the whole model resident): "
        f"{_per_token(resident.expected_tps)}."
    )


@dataclass(frozen=True)
class _Facts:
    """A finished placement, for the words that explain it."""

    hw: HardwareProfile
    layout: ModelLayout
    opts: PlanOptions
    pl: _Placement | None
    placements: list[LayerPlacement]
    devices: list[DeviceMemory]
    ram: DeviceMemory
    fit: _Fit
    mmproj: int

    @property
    def gpus(self) -> list[DeviceMemory]:
        return [d for d in self.devices if d.device != "RAM"]

    @property
    def ram_expert(self) -> int:
        return sum(p.expert_bytes for p in self.placements if p.expert_device == "RAM")

    @property
    def moe_on_gpu(self) -> list[int]:
        return [p.index for p in self.placements if p.expert_device.startswith("CUDA")]

    @property
    def dense_in_ram(self) -> list[int]:
        return [p.index for p in self.placements if p.non_expert_device == "RAM"]

    @property
    def mmproj_on_gpu(self) -> bool:
        return self.pl is not None and self.pl.mmproj_on_gpu


def _explain(f: _Facts, tps: float, load_s: float) -> tuple[str, list[str]]:
    return _reason(f, tps), [*_placement_notes(f), *_memory_notes(f, load_s)]


def _reason(f: _Facts, tps: float) -> str:
    """The verdict in one sentence."""
    hw, opts, ram, fit = f.hw, f.opts, f.ram, f.fit
    if fit.verdict == "gpu":
        if any(g.unified_memory for g in hw.gpus):
            left = f"{fmt_bytes(opts.ram_margin)} of RAM left for the system"
        else:
            left = f"{fmt_bytes(opts.gpu_margin)} left free on each"
        return (
            f"Everything fits on the {len(f.gpus)} GPU(s): "
            f"{fmt_bytes(sum(d.used for d in f.gpus))} of "
            f"{fmt_bytes(sum(d.capacity for d in f.gpus))} usable, {left}."
        )
    if fit.verdict == "hybrid":
        dense_in_ram = f.dense_in_ram
        if dense_in_ram:
            on_gpus = [p.index for p in f.placements if p.index not in dense_in_ram]
            return (
                f"The GPUs hold only layers {_fmt_ranges(on_gpus)} without their experts; "
                f"layers {_fmt_ranges(dense_in_ram)} and every expert "
                f"({fmt_bytes(f.ram_expert)}) run from RAM."
            )
        moe_in_ram = [p.index for p in f.placements if p.expert_device == "RAM"]
        n_cpu_moe = f.pl.n_cpu_moe if f.pl else len(f.layout.layers)
        return (
            f"The GPUs hold every layer's attention and shared weights and the experts of "
            f"{len(f.moe_on_gpu)} layers; the experts of {len(moe_in_ram)} layers "
            f"({fmt_bytes(f.ram_expert)}) stay in RAM (--n-cpu-moe {n_cpu_moe})."
        )
    if fit.verdict == "cpu":
        why = "no GPU was found" if not hw.gpus else "no GPU has room for even one layer"
        return (
            f"Runs on the CPU ({why}): the model and its buffers need {fmt_bytes(fit.need)} "
            f"of the {fmt_bytes(ram.capacity)} RAM available."
        )
    if fit.verdict == "stream":
        cache = max(0, ram.capacity - fit.anon)
        return (
            f"Streams from disk: the model's weights in RAM ({fmt_bytes(ram.weights)}) miss "
            f"the {fmt_bytes(cache)} of page cache left by {fmt_bytes(fit.stream_bytes)}; "
            "llama.cpp keeps them mmap'd and reads what a token needs from the shards "
            f"(about {fmt_tps(tps)} tok/s)."
        )
    buffers = ram.kv_cache + ram.recurrent_state + ram.compute + ram.other
    return (
        "Does not fit: the buffers llama.cpp allocates (KV cache, compute"
        f"{', repacked weights' if fit.anon > buffers else ''}) "
        f"need {fmt_bytes(fit.anon)} of RAM, only {fmt_bytes(ram.capacity)} is available "
        f"after keeping {fmt_bytes(opts.ram_margin)} free for the system."
    )


def _placement_notes(f: _Facts) -> list[str]:
    """The comparison with the usual recipe, the layers, the KV cache, the projector."""
    opts, pl, n = f.opts, f.pl, len(f.layout.layers)
    notes: list[str] = []
    moe_on_gpu = f.moe_on_gpu
    if pl is not None and moe_on_gpu:  # the usual recipe: every expert layer in RAM
        ref = opts.reference_n_cpu_moe if opts.reference_n_cpu_moe is not None else n
        ref_ram = {p.index for p in f.placements if p.ffn == "moe" and p.index < ref}
        moved = [
            p for p in f.placements if p.index in ref_ram and p.expert_device.startswith("CUDA")
        ]
        if moved:
            who = opts.reference_label or "The usual recipe"
            notes.append(
                f"{who} runs with --n-cpu-moe {ref}; this plan keeps {len(moe_on_gpu)} expert "
                f"layers on the GPUs, moving {len(moved)} layers "
                f"({fmt_bytes(sum(p.expert_bytes for p in moved))}) off the CPU."
            )
    if pl is not None and pl.first_gpu_layer > 0:
        notes.append(
            "The GPUs cannot hold every layer's non-expert weights: "
            f"-ngl {n + 1 - pl.first_gpu_layer} offloads the last layers only; "
            "the rest run on the CPU."
        )
    total, per_slot = slot_context(_resolved_ctx(opts), opts.parallel)
    state = sum(d.recurrent_state for d in f.devices)
    notes.append(
        f"KV cache: {fmt_bytes(sum(d.kv_cache for d in f.devices))} for "
        f"{total} tokens "
        f"({kv_bytes_per_token(f.layout.hparams, opts.kv_type)} bytes per token, MLA layers "
        f"only); KDA state: {fmt_bytes(state)}."
    )
    if opts.parallel > 1:
        notes.append(
            f"{opts.parallel} requests at once (--parallel {opts.parallel}): each has "
            f"{per_slot} tokens of context of the {total}, and its own "
            f"{fmt_bytes(state // opts.parallel)} of KDA state; more requests wait their turn."
        )
    if f.mmproj and f.mmproj_on_gpu:
        notes.append(
            f"The projector ({fmt_bytes(f.mmproj)} with its buffer) goes on {f.gpus[0].device}."
        )
    elif f.mmproj and pl is not None:
        notes.append(
            f"The projector ({fmt_bytes(f.mmproj)} with its buffer) stays in RAM "
            "(--no-mmproj-offload) so it does not push an expert layer off the GPUs; "
            "images encode more slowly."
        )
    return notes


def _memory_notes(f: _Facts, load_s: float) -> list[str]:
    """Unified memory, streaming, repacking and the cgroup limit."""
    hw, opts, fit = f.hw, f.opts, f.fit
    notes: list[str] = []
    if any(g.unified_memory for g in hw.gpus):
        notes.append("Unified memory: the GPU and the page cache share one RAM budget.")
    if fit.no_repack and fit.repack:
        why = (
            "they would not fit"
            if fit.anon + fit.repack > f.ram.capacity
            else "they would take that much from the page cache the weights stream through"
        )
        notes.append(
            f"--no-repack: ggml-cpu would copy {fmt_bytes(fit.repack)} of weights into "
            f"repacked buffers in anonymous memory (CPU_REPACK, not mmap'd), and {why}; "
            "without repacking they stay mmap'd from the shards (matrix products run a "
            "little slower)."
        )
    if fit.verdict == "stream":
        notes.append(
            "Streaming depends on the disk: keep the shards on a local NVMe drive "
            f"(read rate {opts.disk_read_note or f'{opts.disk_read_bps / 1e9:.1f} GB/s, assumed'})."
            " Loading reads every shard once, then decodes a test step: "
            f"up to {fmt_duration(load_s)}."
        )
    mem = hw.memory
    if mem.cgroup_limit is not None and mem.cgroup_limit < mem.available:
        notes.append(f"A cgroup limit of {fmt_bytes(mem.cgroup_limit)} caps the RAM budget.")
    return notes
