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

from collections.abc import Sequence
from dataclasses import dataclass, replace

from k3desk.core.errors import PlanError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import GpuInfo, HardwareProfile
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
)
from k3desk.core.planning.model import (
    DeviceMemory,
    LaunchPlan,
    LayerPlacement,
    PlanOptions,
    VerdictKind,
)
from k3desk.core.planning.repack import NO_REPACK_FLAGS, repack_bytes
from k3desk.core.planning.speed import predict_speed
from k3desk.core.units import fmt_bytes, fmt_duration, fmt_tps

DEFAULT_UBATCH = 512  # llama.cpp's -ub (common/common.h: n_ubatch)


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


def make_plan(hw: HardwareProfile, layout: ModelLayout, opts: PlanOptions) -> LaunchPlan:
    """Plan ``layout`` on ``hw`` with ``opts`` (see the module docstring)."""
    opts = with_disk_rate(hw, opts)
    ctx, ctx_note = plan_ctx(layout, opts)
    _check_options(layout, opts)
    hp = layout.hparams
    layers = layout.layers
    n = len(layers)
    kv = [kv_cache_layer_bytes(hp, i, ctx, opts.kv_type) for i in range(n)]
    state = [recurrent_state_layer_bytes(hp, i, opts.parallel) for i in range(n)]
    output_bytes = layout.global_bytes - layout.token_embd_bytes
    logits = 4 * opts.ubatch * hp.vocab_size
    want_mmproj = opts.mmproj is not None or (opts.mmproj_bytes or 0) > 0
    mmproj = 0
    if want_mmproj:
        mmproj = (opts.mmproj_bytes or MMPROJ_DEFAULT_BYTES) + MMPROJ_COMPUTE_BYTES

    pool = ram_budget(hw, opts)
    unified = [g for g in hw.gpus if g.unified_memory]
    gpu_compute = compute_buffer_bytes(hp, ctx, ubatch=opts.ubatch, flash_attn=opts.flash_attn)
    cpu_compute = compute_buffer_bytes(
        hp, ctx, ubatch=opts.ubatch, flash_attn=opts.flash_attn, with_output=True
    )
    gpus: list[_Gpu] = []
    for pos, g in enumerate(hw.gpus):
        fixed = CUDA_RUNTIME_BYTES + gpu_compute
        if g.unified_memory:
            # one pool: what the CPU side needs at least comes off the GPU's share
            share = pool // max(len(unified), 1)
            cap = share - (layout.token_embd_bytes + cpu_compute) // max(len(unified), 1)
        else:
            cap = g.vram_free - opts.gpu_margin
        gpus.append(_Gpu(pos, g, max(cap, 0), fixed))
    usable = [g for g in gpus if g.capacity > g.fixed]

    # the AttnRes stack a GPU needs for the last layer it runs (the output: all of it)
    stack = [attn_res_stack_bytes(hp, layer.index, ubatch=opts.ubatch, ctx=ctx) for layer in layers]
    stack_out = attn_res_stack_bytes(hp, n - 1, ubatch=opts.ubatch, ctx=ctx)
    moe_starts = sorted({0} | {layer.index + 1 for layer in layers if layer.ffn == "moe"})
    if opts.n_cpu_moe is not None:
        moe_starts = [min(opts.n_cpu_moe, n)]

    def place(reserve_mmproj: bool) -> _Placement | None:
        if not usable:
            return None
        caps = [
            g.capacity - g.fixed - (mmproj if reserve_mmproj and k == 0 else 0)
            for k, g in enumerate(usable)
        ]
        caps = [max(c, 0) for c in caps]
        out_item = output_bytes + logits
        for cut in moe_starts:
            items = [
                layer.other_bytes
                + (layer.expert_bytes if layer.ffn == "moe" and layer.index >= cut else 0)
                + kv[layer.index]
                + state[layer.index]
                for layer in layers
            ]
            assign = _balanced([*items, out_item], caps, [*stack, stack_out])
            if assign is not None:
                return _Placement(cut, 0, assign, reserve_mmproj)
        if opts.n_cpu_moe is not None and opts.n_cpu_moe < n:
            raise PlanError(
                f"With --n-cpu-moe {opts.n_cpu_moe} the layers of {layout.first_part} do not "
                f"fit the GPUs ({_fmt_free(usable)} usable after the margin).",
                f"Use a larger --n-cpu-moe (up to {n}) or leave it out to let k3desk choose.",
            )
        for first in range(1, n + 1):  # fewer layers on the GPUs, every expert in RAM
            items = [layers[i].other_bytes + kv[i] + state[i] for i in range(first, n)]
            assign = _balanced([*items, out_item], caps, [*stack[first:], stack_out])
            if assign is not None:
                return _Placement(n, first, assign, reserve_mmproj)
        return None

    plain = place(False)
    chosen = plain
    if want_mmproj and plain is not None and opts.mmproj_on_cpu is not True:
        try:
            with_mm = place(True)
        except PlanError:  # a forced --n-cpu-moe leaves no room for the projector
            with_mm = None
        forced = opts.mmproj_on_cpu is False
        same = (
            with_mm is not None
            and with_mm.n_cpu_moe == plain.n_cpu_moe
            and with_mm.first_gpu_layer == plain.first_gpu_layer
        )
        if with_mm is not None and (same or forced or bool(unified)):
            chosen = with_mm
    return _build(
        hw,
        layout,
        replace(opts, ctx=ctx),
        chosen,
        usable,
        pool,
        kv,
        state,
        mmproj,
        gpu_compute,
        cpu_compute,
        ctx_note,
    )


def _build(
    hw: HardwareProfile,
    layout: ModelLayout,
    opts: PlanOptions,
    pl: _Placement | None,
    usable: list[_Gpu],
    pool: int,
    kv: list[int],
    state: list[int],
    mmproj: int,
    gpu_compute: int,
    cpu_compute: int,
    ctx_note: str,
) -> LaunchPlan:
    hp = layout.hparams
    ctx = _resolved_ctx(opts)
    layers = layout.layers
    n = len(layers)
    output_bytes = layout.global_bytes - layout.token_embd_bytes
    logits = 4 * opts.ubatch * hp.vocab_size
    on_gpu = pl is not None

    def dev(k: int) -> str:
        return f"CUDA{usable[k].pos}"

    # ------------------------------------------------------------ per-layer map
    placements: list[LayerPlacement] = []
    gpu_w = {g.pos: 0 for g in usable}
    gpu_kv = {g.pos: 0 for g in usable}
    gpu_state = {g.pos: 0 for g in usable}
    gpu_layers = {g.pos: 0 for g in usable}
    gpu_last: dict[int, int] = {}  # the last layer each GPU runs (its AttnRes stack)
    ram_last = -1
    output_device = "RAM"
    ram_w = layout.token_embd_bytes
    ram_kv = ram_state = 0
    ram_expert = 0
    ram_dense = 0
    for layer in layers:
        i = layer.index
        if pl is not None and i >= pl.first_gpu_layer:
            k = pl.assign[i - pl.first_gpu_layer]
            home = dev(k)
            pos = usable[k].pos
            gpu_w[pos] += layer.other_bytes
            gpu_kv[pos] += kv[i]
            gpu_state[pos] += state[i]
            gpu_layers[pos] += 1
            gpu_last[pos] = i
        else:
            home = "RAM"
            ram_last = i
            ram_dense += layer.other_bytes
            ram_kv += kv[i]
            ram_state += state[i]
        if layer.ffn != "moe" or layer.expert_bytes == 0:
            exp_dev = "none"
        elif pl is not None and i >= pl.n_cpu_moe and home != "RAM":
            exp_dev = home
            gpu_w[usable[pl.assign[i - pl.first_gpu_layer]].pos] += layer.expert_bytes
        else:
            exp_dev = "RAM"
            ram_expert += layer.expert_bytes
        placements.append(
            LayerPlacement(
                i, layer.attention, layer.ffn, home, exp_dev, layer.other_bytes, layer.expert_bytes
            )
        )
    if pl is not None:
        k = pl.assign[-1]
        output_device = dev(k)
        gpu_w[usable[k].pos] += output_bytes
        gpu_layers[usable[k].pos] += 1
        gpu_last[usable[k].pos] = n - 1  # the final res_mix reads the whole stack
    else:
        ram_dense += output_bytes
        ram_last = n - 1

    # ------------------------------------------------------------ devices
    devices: list[DeviceMemory] = []
    unified_used = 0
    for g in usable:
        if pl is None:
            break
        holds_output = output_device == f"CUDA{g.pos}"
        other = mmproj if (pl.mmproj_on_gpu and g is usable[0]) else 0
        mem = DeviceMemory(
            device=f"CUDA{g.pos}",
            capacity=g.capacity,
            weights=gpu_w[g.pos],
            kv_cache=gpu_kv[g.pos],
            recurrent_state=gpu_state[g.pos],
            compute=g.fixed
            + (logits if holds_output else 0)
            + (
                attn_res_stack_bytes(hp, gpu_last[g.pos], ubatch=opts.ubatch, ctx=ctx)
                if g.pos in gpu_last
                else 0
            ),
            other=other,
        )
        devices.append(mem)
        if g.info.unified_memory:
            unified_used += mem.used
    mmproj_on_gpu = pl is not None and pl.mmproj_on_gpu
    ram_other = mmproj if (mmproj and not mmproj_on_gpu) else 0
    ram_compute = compute_buffer_bytes(
        hp,
        ctx,
        ubatch=opts.ubatch,
        flash_attn=opts.flash_attn,
        with_output=pl is None,
        experts_here=pl is None or ram_expert > 0,
        last_layer=ram_last if ram_last >= 0 else None,
    )
    ram_cap = max(0, pool - unified_used) if unified_used else pool
    ram = DeviceMemory(
        device="RAM",
        capacity=ram_cap,
        weights=ram_w + ram_dense + ram_expert,
        kv_cache=ram_kv,
        recurrent_state=ram_state,
        compute=ram_compute,
        other=ram_other,
    )
    devices.append(ram)

    # ------------------------------------------------------------ verdict
    # RAM holds two kinds of memory.  The weights are mmap'd: page cache, which the
    # kernel evicts and pages in again from the shards as tokens need them, so they
    # may exceed RAM (llama.cpp then reads from disk).  Buffers (KV cache, state,
    # compute, projector) and weights ggml-cpu repacks (repack.py) are anonymous
    # memory: when they do not fit, the load fails.
    need = ram.used
    anon = ram.kv_cache + ram.recurrent_state + ram.compute + ram.other
    mapped = ram.weights
    resident_short = max(0, need - ram_cap)  # RAM missing for the whole model to stay
    repack = repack_bytes(
        hw,
        layout,
        (p.index for p in placements if p.expert_device == "RAM"),
        (p.index for p in placements if p.non_expert_device == "RAM"),
        output_device == "RAM",
    )
    asked_no_repack = any(a in NO_REPACK_FLAGS for a in opts.extra_args)
    # Repacked copies replace the file's pages of the same weights, so they cost nothing
    # while the model stays resident; when it does not, they take from the page cache
    # the streaming needs and may not be allocatable at all.
    no_repack = asked_no_repack or (repack > 0 and resident_short > 0)
    anon_total = anon + (0 if no_repack else repack)
    stream_bytes = 0
    miss = dense_miss = 0.0
    moe_on_gpu = [p.index for p in placements if p.expert_device.startswith("CUDA")]
    moe_in_ram = [p.index for p in placements if p.expert_device == "RAM"]
    dense_in_ram = [p.index for p in placements if p.non_expert_device == "RAM"]
    verdict: VerdictKind
    shortfall = resident_short
    if anon_total > ram_cap:
        verdict = "no-fit"
        shortfall = anon_total - ram_cap
    elif resident_short == 0:
        if not on_gpu:
            verdict = "cpu"
        elif not moe_in_ram and not dense_in_ram:
            verdict = "gpu"
        else:
            verdict = "hybrid"
    else:
        verdict = "stream"
        miss, dense_miss = stream_misses(ram_cap - anon_total, mapped - ram_expert, ram_expert)
        stream_bytes = mapped - (ram_cap - anon_total)
    if verdict != "no-fit":
        shortfall = resident_short

    n_cpu_moe = pl.n_cpu_moe if pl is not None else n
    ngl = (n + 1 - pl.first_gpu_layer) if pl is not None else 0
    tensor_split = tuple(gpu_layers[g.pos] for g in usable) if (pl and len(usable) > 1) else ()

    speed = predict_speed(
        hw,
        layout,
        placements,
        output_device,
        ctx=ctx,
        kv_type=opts.kv_type,
        depth=opts.speed_depth,
        stream_miss=miss,
        dense_miss=dense_miss,
        disk_read_bps=opts.disk_read_bps,
        threads=opts.threads,
        threads_batch=opts.threads_batch,
        ubatch=opts.ubatch,
    )

    token_s = 1.0 / speed.expected_tps if speed.expected_tps > 0 else 0.0
    load_s = load_seconds(layout, opts.disk_read_bps, token_s)
    args = _server_args(layout, opts, pl, n, ngl, tensor_split, usable, hw, mmproj_on_gpu)
    if no_repack and not asked_no_repack:
        args.append("--no-repack")
    reason, notes = _explain(
        hw,
        layout,
        opts,
        verdict,
        pl,
        placements,
        devices,
        ram,
        need,
        anon_total,
        shortfall,
        stream_bytes,
        moe_on_gpu,
        moe_in_ram,
        dense_in_ram,
        mmproj,
        mmproj_on_gpu,
        speed.expected_tps,
        no_repack,
        repack,
        load_s,
    )
    if ctx_note:
        notes.insert(0, ctx_note)
    return LaunchPlan(
        verdict=verdict,
        reason=reason,
        n_cpu_moe=n_cpu_moe if on_gpu else 0,
        n_gpu_layers=ngl,
        server_args=tuple(args),
        devices=tuple(devices),
        layers=tuple(placements),
        speed=speed,
        ctx=ctx,
        model_bytes=layout.total_tensor_bytes,
        shortfall=shortfall,
        notes=tuple(notes),
        tensor_split=tensor_split,
        mmproj_on_gpu=mmproj_on_gpu,
        output_device=output_device,
        stream_bytes=stream_bytes,
        ctx_note=ctx_note,
        no_repack=no_repack,
        repack_bytes=repack,
        anon_bytes=anon_total,
        load_seconds=load_s,
    )


def _server_args(
    layout: ModelLayout,
    opts: PlanOptions,
    pl: _Placement | None,
    n: int,
    ngl: int,
    tensor_split: tuple[int, ...],
    usable: list[_Gpu],
    hw: HardwareProfile,
    mmproj_on_gpu: bool,
) -> list[str]:
    model = str(layout.first_part) if layout.parts else "model.gguf"
    args = ["-m", model]
    if pl is None:
        if hw.gpus:  # an engine without a GPU backend takes no GPU flags
            args += ["-ngl", "0"]
    else:
        args += ["-ngl", "99" if ngl >= n + 1 else str(ngl)]
        if pl.n_cpu_moe > 0:
            args += ["--n-cpu-moe", str(pl.n_cpu_moe)]
        if tensor_split:
            # -ts covers every CUDA device in order; unusable ones get 0
            by_pos = {g.pos: c for g, c in zip(usable, tensor_split, strict=True)}
            args += ["-ts", ",".join(str(by_pos.get(p, 0)) for p in range(len(hw.gpus)))]
    ctx = _resolved_ctx(opts)
    args += ["-c", str(ctx), "-ctk", opts.kv_type, "-ctv", opts.kv_type]
    args += ["-fa", "on" if opts.flash_attn else "off", "--jinja"]
    if opts.no_warmup:
        args.append("--no-warmup")
    args += ["--parallel", str(opts.parallel)]
    # the prompt and decode counters calibration reads (k3desk.core.tuning.metrics)
    args.append("--metrics")
    if opts.threads is not None:
        args += ["-t", str(opts.threads)]
    if opts.threads_batch is not None:
        args += ["-tb", str(opts.threads_batch)]
    if opts.batch is not None:
        args += ["-b", str(opts.batch)]
    if opts.ubatch != DEFAULT_UBATCH:
        args += ["-ub", str(opts.ubatch)]
    args += ["--temp", repr(float(opts.temperature)), "--top-p", repr(float(opts.top_p))]
    if opts.mmproj is not None:
        args += ["--mmproj", str(opts.mmproj)]
        if pl is not None and not mmproj_on_gpu:
            args.append("--no-mmproj-offload")
    args += list(opts.extra_args)
    return args


def _explain(
    hw: HardwareProfile,
    layout: ModelLayout,
    opts: PlanOptions,
    verdict: VerdictKind,
    pl: _Placement | None,
    placements: list[LayerPlacement],
    devices: list[DeviceMemory],
    ram: DeviceMemory,
    need: int,
    anon: int,
    shortfall: int,
    stream_bytes: int,
    moe_on_gpu: list[int],
    moe_in_ram: list[int],
    dense_in_ram: list[int],
    mmproj: int,
    mmproj_on_gpu: bool,
    tps: float,
    no_repack: bool = False,
    repack: int = 0,
    load_s: float = 0.0,
) -> tuple[str, list[str]]:
    hp = layout.hparams
    n = len(layout.layers)
    ctx = _resolved_ctx(opts)
    gpus = [d for d in devices if d.device != "RAM"]
    gpu_used = sum(d.used for d in gpus)
    gpu_cap = sum(d.capacity for d in gpus)
    ram_expert = sum(p.expert_bytes for p in placements if p.expert_device == "RAM")
    notes: list[str] = []
    if verdict == "gpu":
        if any(g.unified_memory for g in hw.gpus):
            left = f"{fmt_bytes(opts.ram_margin)} of RAM left for the system"
        else:
            left = f"{fmt_bytes(opts.gpu_margin)} left free on each"
        reason = (
            f"Everything fits on the {len(gpus)} GPU(s): {fmt_bytes(gpu_used)} of "
            f"{fmt_bytes(gpu_cap)} usable, {left}."
        )
    elif verdict == "hybrid":
        if dense_in_ram:
            on_gpus = [p.index for p in placements if p.index not in dense_in_ram]
            reason = (
                f"The GPUs hold only layers {_fmt_ranges(on_gpus)} without their experts; "
                f"layers {_fmt_ranges(dense_in_ram)} and every expert "
                f"({fmt_bytes(ram_expert)}) run from RAM."
            )
        else:
            reason = (
                f"The GPUs hold every layer's attention and shared weights and the experts of "
                f"{len(moe_on_gpu)} layers; the experts of {len(moe_in_ram)} layers "
                f"({fmt_bytes(ram_expert)}) stay in RAM (--n-cpu-moe {pl.n_cpu_moe if pl else n})."
            )
    elif verdict == "cpu":
        why = "no GPU was found" if not hw.gpus else "no GPU has room for even one layer"
        reason = (
            f"Runs on the CPU ({why}): the model and its buffers need {fmt_bytes(need)} "
            f"of the {fmt_bytes(ram.capacity)} RAM available."
        )
    elif verdict == "stream":
        cache = max(0, ram.capacity - anon)
        reason = (
            f"Streams from disk: the model's weights in RAM ({fmt_bytes(ram.weights)}) miss "
            f"the {fmt_bytes(cache)} of page cache left by {fmt_bytes(stream_bytes)}; "
            "llama.cpp keeps them mmap'd and reads what a token needs from the shards "
            f"(about {fmt_tps(tps)} tok/s)."
        )
    else:
        buffers = ram.kv_cache + ram.recurrent_state + ram.compute + ram.other
        reason = (
            "Does not fit: the buffers llama.cpp allocates (KV cache, compute"
            f"{', repacked weights' if anon > buffers else ''}) "
            f"need {fmt_bytes(anon)} of RAM, only {fmt_bytes(ram.capacity)} is available "
            f"after keeping {fmt_bytes(opts.ram_margin)} free for the system."
        )

    # comparison with the usual recipe (every expert layer in RAM)
    if pl is not None and moe_on_gpu:
        ref = opts.reference_n_cpu_moe if opts.reference_n_cpu_moe is not None else n
        ref_ram = {p.index for p in placements if p.ffn == "moe" and p.index < ref}
        moved = [p for p in placements if p.index in ref_ram and p.expert_device.startswith("CUDA")]
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
    kv_total = sum(d.kv_cache for d in devices)
    notes.append(
        f"KV cache: {fmt_bytes(kv_total)} for {ctx} tokens "
        f"({kv_bytes_per_token(hp, opts.kv_type)} bytes per token, MLA layers only); "
        f"KDA state: {fmt_bytes(sum(d.recurrent_state for d in devices))}."
    )
    if mmproj:
        if mmproj_on_gpu:
            notes.append(
                f"The projector ({fmt_bytes(mmproj)} with its buffer) goes on {gpus[0].device}."
            )
        elif pl is not None:
            notes.append(
                f"The projector ({fmt_bytes(mmproj)} with its buffer) stays in RAM "
                "(--no-mmproj-offload) so it does not push an expert layer off the GPUs; "
                "images encode more slowly."
            )
    if any(g.unified_memory for g in hw.gpus):
        notes.append("Unified memory: the GPU and the page cache share one RAM budget.")
    if verdict == "stream" and shortfall:
        notes.append(
            f"With {fmt_bytes(shortfall)} more free RAM the whole model would stay resident."
        )
    if no_repack and repack:
        why = (
            "they would not fit"
            if anon + repack > ram.capacity
            else "they would take that much from the page cache the weights stream through"
        )
        notes.append(
            f"--no-repack: ggml-cpu would copy {fmt_bytes(repack)} of weights into repacked "
            f"buffers in anonymous memory (CPU_REPACK, not mmap'd), and {why}; without "
            "repacking they stay mmap'd from the shards (matrix products run a little slower)."
        )
    if verdict == "stream":
        notes.append(
            "Streaming depends on the disk: keep the shards on a local NVMe drive "
            f"(read rate {opts.disk_read_note or f'{opts.disk_read_bps / 1e9:.1f} GB/s, assumed'})."
            " Loading reads every shard once, then decodes a test step: "
            f"up to {fmt_duration(load_s)}."
        )
    mem = hw.memory
    if mem.cgroup_limit is not None and mem.cgroup_limit < mem.available:
        notes.append(f"A cgroup limit of {fmt_bytes(mem.cgroup_limit)} caps the RAM budget.")
    return reason, notes
