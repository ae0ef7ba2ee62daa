"""Launch plans on the shipped hardware files, for twins of the published tiers."""

from __future__ import annotations

import shlex
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from k3desk.core.catalog.loader import Catalog
from k3desk.core.errors import PlanError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.planning.plan import make_plan, ram_budget
from k3desk.core.planning.recommend import options_for
from k3desk.core.units import GiB, fmt_bytes
from k3desk.devtools.tinyk3 import TinyModel

Machine = Callable[[str], HardwareProfile]
Layout = Callable[[str], ModelLayout]


def with_vram(hw: HardwareProfile, factor: float) -> HardwareProfile:
    gpus = tuple(
        replace(g, vram_free=int(g.vram_free * factor), vram_total=int(g.vram_total * factor))
        for g in hw.gpus
    )
    return replace(hw, gpus=gpus)


def arg(plan: LaunchPlan, flag: str) -> str | None:
    args = list(plan.server_args)
    return args[args.index(flag) + 1] if flag in args else None


def llama_cpp_devices(ts: list[int], n_layer: int, ngl: int) -> list[int | None]:
    """Which CUDA device llama.cpp gives layers 0..n_layer (the last = output) for -ts/-ngl.

    Mirrors llama_model::load_tensors: cumulative float splits, upper_bound on
    (il - i_gpu_start) / act_gpu_layers; None = CPU.
    """
    start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    total = np.float32(sum(ts))
    splits = [float(np.float32(c) / total) for c in np.cumsum(ts)]
    out: list[int | None] = []
    for il in range(n_layer + 1):
        if il < start:
            out.append(None)
        else:
            out.append(bisect_right(splits, float(np.float32(il - start) / np.float32(act))))
    return out


def check_consistent(plan: LaunchPlan, layout: ModelLayout, hw: HardwareProfile) -> None:
    """Budgets hold, the argv says what the layer map says."""
    n = len(layout.layers)
    for d in plan.devices:
        if d.device != "RAM":
            assert d.used <= d.capacity, d
    ngl = arg(plan, "-ngl")
    # without a GPU there are no GPU flags; with one, -ngl says how many layers go there
    assert (ngl is not None) == bool(hw.gpus), plan.server_args
    ngl = ngl or "0"
    ncm = arg(plan, "--n-cpu-moe")
    for p in plan.layers:
        if p.expert_device == "none":
            continue
        in_ram = p.non_expert_device == "RAM" or (ncm is not None and p.index < int(ncm))
        assert (p.expert_device == "RAM") == in_ram, p
    ts = arg(plan, "-ts")
    if ts is not None:
        counts = [int(x) for x in ts.split(",")]
        assert len(counts) == len(hw.gpus)
        devs = llama_cpp_devices(counts, n, 99 if ngl == "99" else int(ngl))
        for p in plan.layers:
            want = None if p.non_expert_device == "RAM" else int(p.non_expert_device[4:])
            assert devs[p.index] == want, p
        assert devs[n] == int(plan.output_device[4:])
    # the memory table adds up to the model
    weights = sum(d.weights for d in plan.devices)
    assert weights == layout.total_tensor_bytes


COMMON = ["-c", "-ctk", "-ctv", "-fa", "--parallel", "--temp", "--top-p"]


def test_common_arguments_follow_the_cards(machine: Machine, twin_layout: Layout) -> None:
    layout = twin_layout("grearl-iq1s")
    plan = make_plan(machine("epyc9554p-1.5TB-cpu"), layout, PlanOptions(ctx=16384))
    a = plan.server_args
    assert a[:2] == ("-m", str(layout.first_part))
    assert [arg(plan, f) for f in COMMON] == ["16384", "f16", "f16", "on", "1", "1.0", "0.95"]
    assert "--jinja" in a
    assert "--no-warmup" in a
    assert shlex.split(shlex.join(plan.argv()))[1:] == list(a)


def test_8xh100_holds_a_540_gib_tier_entirely_on_the_gpus(
    machine: Machine, twin_layout: Layout, twin_catalog: Catalog
) -> None:
    hw = machine("8xH100-2TB")
    layout = twin_layout("6block-iq1s-xs")
    opts = options_for(twin_catalog.get("6block-iq1s-xs"), PlanOptions())
    plan = make_plan(hw, layout, opts)
    assert plan.verdict == "gpu"
    assert plan.n_cpu_moe == 0
    assert arg(plan, "--n-cpu-moe") is None
    assert arg(plan, "-ngl") == "99"
    assert sum(plan.tensor_split) == 94
    assert len(plan.tensor_split) == 8
    check_consistent(plan, layout, hw)
    note = next(n for n in plan.notes if "--n-cpu-moe 93" in n)
    assert note.startswith("The 6block card runs with --n-cpu-moe 93; this plan keeps 92 expert")
    assert "moving 92 layers" in note


def test_8xh100_keeps_as_many_expert_layers_on_gpus_as_fit(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("8xH100-2TB")
    layout = estimated("atomicchat-iq1m")  # 643 GiB: more than the GPUs hold
    plan = make_plan(hw, layout, PlanOptions())
    assert plan.verdict == "hybrid"
    n = plan.n_cpu_moe
    assert 2 <= n < 93
    check_consistent(plan, layout, hw)
    # one more expert layer on the GPUs does not fit within the 1 GiB margin
    fewer = n - 1 if n > 2 else 0
    with pytest.raises(PlanError, match=rf"--n-cpu-moe {fewer} the layers of .* do not fit"):
        make_plan(hw, layout, PlanOptions(n_cpu_moe=fewer))
    gpus = [d for d in plan.devices if d.device != "RAM"]
    # the margin is real: every GPU keeps at least 1 GiB free, none is over
    for d in gpus:
        assert d.capacity == hw.gpus[int(d.device[4:])].vram_free - GiB
        assert d.headroom >= 0
    kept = sum(1 for p in plan.layers if p.expert_device.startswith("CUDA"))
    assert kept == 93 - n
    assert f"keeps {kept} expert layers on the GPUs, moving {kept} layers" in " ".join(plan.notes)


def test_more_vram_never_means_more_expert_layers_in_ram(
    machine: Machine, estimated: Layout
) -> None:
    base = machine("8xH100-2TB")
    for tier_id in ("6block-iq1s-xs", "atomicchat-iq2xxs"):
        layout = estimated(tier_id)
        previous: LaunchPlan | None = None
        for factor in (0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.2, 1.5):
            plan = make_plan(with_vram(base, factor), layout, PlanOptions())
            check_consistent(plan, layout, with_vram(base, factor))
            if previous is not None:
                assert plan.n_cpu_moe <= previous.n_cpu_moe, (tier_id, factor)
                assert plan.n_gpu_layers >= previous.n_gpu_layers, (tier_id, factor)
            previous = plan
        assert previous is not None
        assert previous.n_cpu_moe == 0


def test_tiny_gpus_offload_only_the_last_layers(machine: Machine, estimated: Layout) -> None:
    hw = with_vram(machine("8xH100-2TB"), 0.05)  # 4 GiB cards
    layout = estimated("grearl-iq1s")
    plan = make_plan(hw, layout, PlanOptions())
    assert 0 < plan.n_gpu_layers < 94
    assert arg(plan, "-ngl") == str(plan.n_gpu_layers)
    assert arg(plan, "--n-cpu-moe") == "93"
    on_cpu = [p.index for p in plan.layers if p.non_expert_device == "RAM"]
    assert on_cpu == list(range(len(on_cpu)))  # llama.cpp offloads from the end
    check_consistent(plan, layout, hw)


def test_rtx5090_with_256_gb_streams_the_experts_that_do_not_fit(
    machine: Machine, twin_layout: Layout
) -> None:
    hw = machine("1xRTX5090-256GB")
    layout = twin_layout("grearl-iq1s")
    plan = make_plan(hw, layout, PlanOptions())
    assert plan.verdict == "stream"
    ram = plan.devices[-1]
    assert ram.device == "RAM"
    assert plan.shortfall == ram.used - ram.capacity > 200 * GiB
    assert plan.stream_bytes > 0
    assert f"{plan.speed.expected_tps:.2g} tok/s" in plan.reason
    assert plan.speed.bytes_per_token["disk"] > 0
    assert "-ts" not in plan.server_args
    check_consistent(plan, layout, hw)


def test_gb10_budgets_gpu_and_page_cache_from_one_pool(
    machine: Machine, twin_layout: Layout
) -> None:
    hw = machine("3xGB10-node")
    layout = twin_layout("vcruz305-ud-iq1s")
    plan = make_plan(hw, layout, PlanOptions())
    assert plan.verdict == "stream"
    gpu, ram = plan.devices
    pool = ram_budget(hw, PlanOptions())
    assert gpu.used <= gpu.capacity <= pool
    assert ram.capacity == pool - gpu.used
    assert any("Unified memory" in n for n in plan.notes)
    check_consistent(plan, layout, hw)


def test_cpu_only_server_runs_everything_from_ram(machine: Machine, twin_layout: Layout) -> None:
    hw = machine("epyc9554p-1.5TB-cpu")
    layout = twin_layout("grearl-iq1s")
    plan = make_plan(hw, layout, PlanOptions())
    assert plan.verdict == "cpu"
    assert "-ngl" not in plan.server_args  # no GPU flags without a GPU
    # resident: repacking costs no page cache, so it is kept
    assert "--no-repack" not in plan.server_args
    assert "--n-cpu-moe" not in plan.server_args
    assert "-ts" not in plan.server_args
    assert [d.device for d in plan.devices] == ["RAM"]
    assert plan.devices[0].used < plan.devices[0].capacity
    assert all(p.non_expert_device == "RAM" for p in plan.layers)
    check_consistent(plan, layout, hw)


def test_a_cgroup_limit_shrinks_the_ram_budget(machine: Machine, estimated: Layout) -> None:
    hw = machine("epyc9554p-1.5TB-cpu")
    limited = replace(hw, memory=replace(hw.memory, cgroup_limit=256 * GiB))
    plan = make_plan(limited, estimated("grearl-iq1s"), PlanOptions())
    assert plan.verdict == "stream"
    assert plan.devices[-1].capacity == 248 * GiB
    assert any("cgroup limit of 256.0 GiB" in n for n in plan.notes)


def test_a_laptop_streams_the_real_model_without_repacking_and_says_what_it_costs(
    machine: Machine, twin_layout: Layout
) -> None:
    hw = machine("no-gpu-laptop-32GB")
    layout = twin_layout("grearl-iq1s")
    plan = make_plan(hw, layout, PlanOptions())
    # llama.cpp runs it from mmap (the weights are page cache): it streams, not "no-fit"
    assert plan.verdict == "stream"
    assert plan.shortfall > 400 * GiB
    budget = ram_budget(hw, PlanOptions())
    assert plan.shortfall == plan.devices[-1].used - budget
    # GrEarl's Q4_K/IQ4_NL weights would be repacked into ~28 GiB of anonymous memory
    # (ggml-cpu repack.cpp), more than the laptop has: the plan passes --no-repack
    assert 25 * GiB < plan.repack_bytes < 31 * GiB
    assert plan.no_repack
    assert "--no-repack" in plan.server_args
    assert plan.anon_bytes < budget
    assert any(n.startswith("--no-repack: ggml-cpu would copy") for n in plan.notes)
    assert "-ngl" not in plan.server_args
    assert "--mlock" not in plan.server_args
    assert "--no-mmap" not in plan.server_args
    assert plan.reason.startswith("Streams from disk")
    # every shard is read once at load (MAP_POPULATE): 528 GiB at the assumed 3.5 GB/s
    per_token = 1 / plan.speed.expected_tps  # and one decode step (common_context_can_seq_rm)
    assert plan.load_seconds == pytest.approx(layout.total_file_bytes / 3.5e9 + per_token)
    # and the pages that miss come from disk for every token: well under 1 tok/s
    assert plan.speed.expected_tps < 0.2
    assert plan.speed.bytes_per_token["disk"] > 5 * GiB


def test_only_buffers_that_cannot_be_allocated_make_a_model_not_fit(
    machine: Machine, twin_layout: Layout
) -> None:
    hw = machine("no-gpu-laptop-32GB")
    tight = replace(hw, memory=replace(hw.memory, cgroup_limit=9 * GiB))
    plan = make_plan(tight, twin_layout("grearl-iq1s"), PlanOptions())
    assert plan.verdict == "no-fit"
    budget = ram_budget(tight, PlanOptions())
    assert plan.shortfall == plan.anon_bytes - budget
    assert "the buffers llama.cpp allocates" in plan.reason
    assert f"only {fmt_bytes(budget)} is available after keeping 8.0 GiB free" in plan.reason


@pytest.mark.parametrize("tier", ["grearl-iq1s", "vcruz305-ud-iq1s"])
def test_more_memory_is_never_predicted_slower_for_the_same_file(
    machine: Machine, twin_layout: Layout, tier: str
) -> None:
    """Across the shipped hardware files: a machine with more memory (as much RAM and as
    much VRAM, more of one) is never predicted slower for the same file; and one machine
    given more RAM is never predicted slower either.  (A GPU is not memory alone: a
    CPU-only server with more RAM may still be slower than a smaller one with GPUs.)"""
    from k3desk.core.resources import resources_dir

    layout = twin_layout(tier)
    names = sorted(p.stem for p in (resources_dir() / "hardware").glob("*.json"))
    plans = {}
    for name in names:
        hw = machine(name)
        vram = sum(g.vram_free for g in hw.gpus if not g.unified_memory)
        plans[name] = (hw.memory.available, vram, make_plan(hw, layout, PlanOptions()))
    compared = 0
    for a, (ram_a, vram_a, plan_a) in plans.items():
        for b, (ram_b, vram_b, plan_b) in plans.items():
            if ram_a >= ram_b and vram_a >= vram_b and (ram_a, vram_a) != (ram_b, vram_b):
                compared += 1
                assert plan_a.speed.expected_tps >= plan_b.speed.expected_tps, (
                    a, plan_a.verdict, plan_a.speed.expected_tps,
                    b, plan_b.verdict, plan_b.speed.expected_tps,
                )  # fmt: skip
    assert compared >= 8
    hw = machine("no-gpu-laptop-32GB")
    last = 0.0
    for gib in (16, 24, 32, 64, 128, 256, 512, 1024):
        more = replace(hw, memory=replace(hw.memory, available=gib * GiB, total=gib * GiB))
        tps = make_plan(more, layout, PlanOptions()).speed.expected_tps
        assert tps >= last, (gib, tps, last)
        last = tps


def test_projector_goes_to_the_gpu_only_when_it_costs_no_expert_layer(
    machine: Machine, estimated: Layout, tmp_path: Path
) -> None:
    mmproj = tmp_path / "mmproj-F16.gguf"
    roomy = make_plan(
        machine("8xH100-2TB"),
        estimated("6block-iq1s-xs"),
        PlanOptions(mmproj=mmproj, mmproj_bytes=GiB),
    )
    assert roomy.mmproj_on_gpu
    assert arg(roomy, "--mmproj") == str(mmproj)
    assert "--no-mmproj-offload" not in roomy.server_args
    assert roomy.devices[0].other > GiB

    hw = machine("512GB-ddr5-96GB-vram")
    layout = estimated("grearl-iq1s")
    without = make_plan(hw, layout, PlanOptions())
    tight = make_plan(hw, layout, PlanOptions(mmproj=mmproj, mmproj_bytes=GiB))
    assert tight.n_cpu_moe == without.n_cpu_moe  # the projector never costs an expert layer
    if not tight.mmproj_on_gpu:
        assert "--no-mmproj-offload" in tight.server_args
        assert tight.devices[-1].other > GiB
    forced = make_plan(hw, layout, PlanOptions(mmproj=mmproj, mmproj_bytes=GiB, mmproj_on_cpu=True))
    assert "--no-mmproj-offload" in forced.server_args
    assert not forced.mmproj_on_gpu


def test_kv_cache_lands_with_its_layer_and_grows_with_ctx(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("8xH100-2TB")
    layout = estimated("grearl-iq1s")
    small = make_plan(hw, layout, PlanOptions(ctx=8192))
    big = make_plan(hw, layout, PlanOptions(ctx=131072))
    assert sum(d.kv_cache for d in big.devices) == 16 * sum(d.kv_cache for d in small.devices)
    mla_devices = {p.non_expert_device for p in small.layers if p.attention == "mla"}
    for d in small.devices:
        assert (d.kv_cache > 0) == (d.device in mla_devices)


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (PlanOptions(ctx=0), "context size must be a positive"),
        (PlanOptions(ctx=2_000_000), "exceeds what .* supports"),
        (PlanOptions(parallel=0), "--parallel must be at least 1"),
        (PlanOptions(kv_type="q3"), "Unknown KV cache type"),
        (PlanOptions(n_cpu_moe=-1), "must not be negative"),
    ],
)
def test_bad_options_are_refused_clearly(
    machine: Machine, estimated: Layout, opts: PlanOptions, message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        make_plan(machine("8xH100-2TB"), estimated("grearl-iq1s"), opts)


def test_card_setting_can_be_forced_and_keeps_every_expert_in_ram(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("8xH100-2TB")
    layout = estimated("6block-iq1s-xs")
    plan = make_plan(hw, layout, PlanOptions(n_cpu_moe=93))
    assert plan.verdict == "hybrid"
    assert arg(plan, "--n-cpu-moe") == "93"
    assert all(p.expert_device in ("RAM", "none") for p in plan.layers)
    check_consistent(plan, layout, hw)


def test_the_tiny_test_model_plans_like_the_real_one(machine: Machine, tiny_k3: TinyModel) -> None:
    layout = validate_shard_set(tiny_k3.parts[0])
    laptop = make_plan(machine("no-gpu-laptop-32GB"), layout, PlanOptions(ctx=1024))
    assert laptop.verdict == "cpu"
    assert "-ngl" not in laptop.server_args
    gb10 = make_plan(machine("3xGB10-node"), layout, PlanOptions(ctx=1024))
    assert gb10.verdict == "gpu"
    assert "of RAM left for the system" in gb10.reason
    with pytest.raises(PlanError, match=r"8192 exceeds what .*00001-of-00003\.gguf supports"):
        make_plan(machine("no-gpu-laptop-32GB"), layout, PlanOptions(ctx=8192))


def test_without_a_context_size_the_default_is_capped_at_what_the_model_was_trained_for(
    machine: Machine, tiny_k3: TinyModel
) -> None:
    hw = machine("no-gpu-laptop-32GB")
    layout = validate_shard_set(tiny_k3.parts[0])
    assert layout.hparams.context_length == 4096  # less than the default 8192
    plan = make_plan(hw, layout, PlanOptions())
    assert plan.ctx == 4096
    assert arg(plan, "-c") == "4096"
    assert plan.ctx_note == (
        f"Context: 4096 tokens, the most {layout.first_part.name} was trained for "
        "(the default, 8192, is more)."
    )
    assert plan.notes[0] == plan.ctx_note  # said first, where a person reads it
    assert any("for 4096 tokens" in n for n in plan.notes)  # the KV cache is sized for it
    # the app's own default (its settings) is capped the same way
    setting = make_plan(hw, layout, PlanOptions(default_ctx=32768))
    assert setting.ctx == 4096
    assert "(the default, 32768, is more)" in setting.ctx_note
    # a default the model was trained for is used as it is, without a note
    fits = make_plan(hw, layout, PlanOptions(default_ctx=2048))
    assert (fits.ctx, fits.ctx_note, arg(fits, "-c")) == (2048, "", "2048")
    assert not any(n.startswith("Context:") for n in fits.notes)
    # a size asked for is never changed behind the person's back: refused with the limit
    with pytest.raises(PlanError, match=r"exceeds what .* supports \(4096 tokens\)") as err:
        make_plan(hw, layout, PlanOptions(ctx=8192))
    assert err.value.hint == "Use --ctx 4096 or less."
    assert make_plan(hw, layout, PlanOptions(ctx=4096)).ctx_note == ""


def test_a_real_tier_plans_the_default_context_unchanged(
    machine: Machine, estimated: Layout
) -> None:
    layout = estimated("grearl-iq1s")
    assert layout.hparams.context_length > 8192
    plan = make_plan(machine("8xH100-2TB"), layout, PlanOptions())
    assert plan.ctx == 8192
    assert arg(plan, "-c") == "8192"
    assert plan.ctx_note == ""
