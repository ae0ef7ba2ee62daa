"""The speed model as stated: bytes, bandwidth, measured kernel costs, graph overhead.

These check what follows from the model's physics on plans a user would see, not
timings of this machine (``bench/speed_vs_measured.py`` compares with real runs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.catalog.loader import Catalog
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import Bandwidth, HardwareProfile
from k3desk.core.planning import kernels
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.planning.speed import explain, predict_speed, speed_lines
from k3desk.core.resources import resources_dir

Machine = Callable[[str], HardwareProfile]
Layout = Callable[[str], ModelLayout]


def many_h200(machine: Machine, n: int) -> HardwareProfile:
    """``n`` H200s (141 GB, 4.8 TB/s each) in one box: room for any tier on the GPUs."""
    one = machine("1xH200-141GB")
    gpu = one.gpus[0]
    gpus = tuple(replace(gpu, index=i, uuid=f"GPU-{i}") for i in range(n))
    memory = replace(one.memory, total=4 * 1024**4, available=4 * 1024**4)
    return replace(one, gpus=gpus, memory=memory)


def test_iq4_xs_costs_a_gpu_what_its_bytes_cost(machine: Machine, estimated: Layout) -> None:
    # the old factor of x5 per IQ4_XS byte made 6block's tier 3x slower than GrEarl's on
    # an all-GPU machine; a GPU decodes while it streams, so bytes decide
    hw = many_h200(machine, 8)
    six = make_plan(hw, estimated("6block-iq1s-xs"), PlanOptions(ctx=8192))
    grearl = make_plan(hw, estimated("grearl-iq1s"), PlanOptions(ctx=8192))
    assert six.verdict == grearl.verdict == "gpu"
    ratio = six.speed.expected_tps / grearl.speed.expected_tps
    bound_ratio = six.speed.upper_bound_tps / grearl.speed.upper_bound_tps
    assert 0.8 * bound_ratio < ratio < 1.25 * bound_ratio
    assert ratio > 0.75  # nowhere near a third


def test_the_steps_lead_from_the_bound_to_the_figure(machine: Machine, estimated: Layout) -> None:
    for name, tier in (("epyc9554p-1.5TB-cpu", "atomicchat-iq1s"), ("8xH100-2TB", "grearl-iq1s")):
        s = make_plan(machine(name), estimated(tier), PlanOptions(ctx=8192)).speed
        assert s.steps[0][0].endswith("(the bound)")
        assert 1.0 / s.steps[0][1] == pytest.approx(s.upper_bound_tps, rel=1e-6)
        assert 1.0 / sum(sec for _, sec in s.steps) == pytest.approx(s.expected_tps, rel=1e-6)
        lines = explain(s)
        assert len(lines) == len(s.steps)
        assert lines[-1].endswith(f"{s.expected_tps:.3g} tok/s")
        text = "\n".join(speed_lines(s))
        assert "physical bound" in text
        assert "from the bound to the figure" in text


def test_a_cpu_plan_gets_faster_with_threads_until_memory_binds(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("epyc9554p-1.5TB-cpu")
    layout = estimated("atomicchat-iq1s")
    speeds = [make_plan(hw, layout, PlanOptions(threads=t)).speed for t in (4, 8, 32, 64)]
    decode = [s.expected_tps for s in speeds]
    prompt = [s.prompt_tps for s in speeds]
    assert decode == sorted(decode)
    assert prompt == sorted(prompt)
    assert decode[1] < 2 * decode[0]  # never better than linear
    # with every core the RAM bandwidth bounds the weights that decode cheaply
    assert all(s.expected_tps <= s.upper_bound_tps for s in speeds)
    assert all(s.threads == t for s, t in zip(speeds, (4, 8, 32, 64), strict=True))
    assert make_plan(hw, layout, PlanOptions()).speed.threads == hw.cpu.physical_cores


def test_a_plan_with_a_gpu_predicts_no_prompt_speed(machine: Machine, estimated: Layout) -> None:
    gpu = make_plan(machine("8xH100-2TB"), estimated("grearl-iq1s"), PlanOptions()).speed
    cpu = make_plan(machine("epyc9554p-1.5TB-cpu"), estimated("grearl-iq1s"), PlanOptions()).speed
    assert gpu.prompt_tps == 0
    assert gpu.prompt_tokens == 0
    assert cpu.prompt_tps > cpu.expected_tps  # a batch reuses what it reads


def test_decoding_slows_with_context_depth_on_mla_layers_only(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("epyc9554p-1.5TB-cpu")
    layout = estimated("grearl-iq1s")
    plan = make_plan(hw, layout, PlanOptions(ctx=65536))
    kwargs = {"ctx": 65536, "threads": 64}
    shallow = predict_speed(hw, layout, plan.layers, plan.output_device, depth=0, **kwargs)
    deep = predict_speed(hw, layout, plan.layers, plan.output_device, depth=65536, **kwargs)
    assert deep.expected_tps < shallow.expected_tps
    assert deep.bytes_per_token["RAM"] > shallow.bytes_per_token["RAM"]


def test_every_type_a_tier_uses_has_a_cost(twin_catalog: Catalog) -> None:
    k = kernels.load()
    used = {t.upper() for tier in twin_catalog.tiers for t in tier.tensor_types.values()}
    used |= {o.type.upper() for tier in twin_catalog.tiers for o in tier.tensor_overrides}
    for name in sorted(used):
        cost, note = k.cost(name)
        assert cost.tg_ns > 0, name
        assert cost.pp_ns > 0, name
        if name in k.types or name == "F32":
            assert note == "", name
        else:
            assert "not measured" in note, name
    # the shipped file says where its figures come from
    assert "bench/kernel_costs.py" in k.source
    assert k.graph_nodes["kda"] > k.graph_nodes["mla"] > 0


def test_every_expert_type_a_tier_uses_has_a_routed_expert_cost(twin_catalog: Catalog) -> None:
    """The shipped measurements hold a MUL_MAT_ID curve for every routed-expert type of
    the catalog (its own, or a measured type's with the same kernels), one and two
    threads, falling at llama.cpp's switch to the tiled kernel where the type has one."""
    k = kernels.load()
    experts = {t.tensor_types["experts"].upper() for t in twin_catalog.tiers}
    overrides = [o for t in twin_catalog.tiers for o in t.tensor_overrides]
    experts |= {o.type.upper() for o in overrides if "exps" in o.pattern}
    assert {"IQ1_S", "Q3_K", "Q8_0"} <= experts
    assert set(k.routed) == {1, 2}
    for name in sorted(experts):
        for threads in (1, 2):
            costs = [k.routed_cost(name, n, threads) for n in (1, 4, 7, 8, 64)]
            assert all(c is not None and c > 0 for c in costs), (name, threads, costs)
    # the tiled kernel takes over at 8 tokens: cheaper per token than one token at a time
    for name in ("IQ1_S", "Q3_K"):
        assert k.routed_cost(name, 64) < 0.7 * k.routed_cost(name, 4)  # type: ignore[operator]


def test_node_overhead_beyond_the_measured_threads_is_extrapolated() -> None:
    k = kernels.Kernels("test", {"Q8_0": kernels.TypeCost(0.1, 0.03)},
                        {"tg": {1: 1e-6, 2: 2e-6, 4: 3e-6}}, {})  # fmt: skip
    assert k.node_seconds("tg", 1) == 1e-6
    assert k.node_seconds("tg", 3) == 2e-6  # between measured counts: the one below
    assert k.node_seconds("tg", 8) == pytest.approx(5e-6)  # +0.5 us per thread from 2 to 4
    assert k.node_seconds("pp", 8) == 0.0
    # one thread has no barrier (ggml_barrier returns at once): what two threads add
    # is a two-thread barrier, which grows in proportion to the threads passing it
    two_core = kernels.Kernels("test", {"Q8_0": kernels.TypeCost(0.1, 0.03)},
                               {"tg": {1: 1e-6, 2: 2e-6}}, {})  # fmt: skip
    assert two_core.node_seconds("tg", 8) == pytest.approx(1e-6 + 1e-6 * 8 / 2)


def test_a_damaged_kernels_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "kernels.json"
    bad.write_text(json.dumps({"types": {"Q8_0": {"tg_ns": "fast"}}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"kernels\.json is malformed"):
        kernels.load(bad)
    shipped = json.loads((resources_dir() / kernels.KERNELS_FILE).read_text(encoding="utf-8"))
    # the shipped figures say how loaded the machine was, or that nobody knows
    k = kernels.load()
    assert "load average" in k.source
    if not shipped["load_average"]:
        assert "not recorded" in shipped["load_average_note"]
        assert "load average not recorded" in k.source


def test_faster_measured_ram_helps_only_what_reads_bind(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("epyc9554p-1.5TB-cpu")
    layout = estimated("atomicchat-q3ks")
    slow = replace(hw, memory=replace(hw.memory, bandwidth=Bandwidth(50e9, "measured")))
    fast = replace(hw, memory=replace(hw.memory, bandwidth=Bandwidth(500e9, "measured")))
    one_thread = PlanOptions(threads=1)
    a = make_plan(slow, layout, one_thread).speed.expected_tps
    b = make_plan(fast, layout, one_thread).speed.expected_tps
    assert b == pytest.approx(a, rel=0.05)  # one thread: its kernels bind, not the RAM
    many = PlanOptions(threads=64)
    c = make_plan(slow, layout, many).speed.expected_tps
    d = make_plan(fast, layout, many).speed.expected_tps
    assert d > 1.5 * c


def test_type_costs_follow_the_thread_count_they_were_measured_at() -> None:
    """A thread that shares its core does less work: the cost per weight per thread
    measured with every core is used from that many threads on."""
    k = kernels.parse(
        {
            "types": {
                "Q8_0": {"tg_ns": 0.1, "pp_ns": 0.04},
                "IQ1_S": {"tg_ns": 0.2, "pp_ns": 0.05},
            },
            "types_at_2_threads": {"Q8_0": {"tg_ns": 0.13, "pp_ns": 0.05}},
            "node_s": {"tg": {"1": 1e-6}},
            "graph_nodes": {"kda": 90.0},
        }
    )
    assert k.cost("Q8_0", 1)[0].tg_ns == 0.1
    assert k.cost("Q8_0", 2)[0].tg_ns == 0.13
    assert k.cost("Q8_0", 16)[0].tg_ns == 0.13  # beyond what was measured: the widest
    assert k.cost("IQ1_S", 2)[0].tg_ns == 0.2  # not measured wider: the one-thread cost
    assert k.cost("Q4_0", 2)[1] == "Q4_0 costed as IQ1_S (not measured)"


def test_a_matrix_multiplied_by_few_tokens_costs_more_per_token() -> None:
    """Between the two measured points (one token, a pp batch) the cost per token falls
    as the blocks read once are shared by more tokens: a prompt's routed expert, which
    sees a few tokens, costs more per token than a dense matrix that sees them all."""
    k = kernels.Kernels("test", {"IQ1_S": kernels.TypeCost(0.13, 0.04)}, {}, {}, pp_tokens=64)
    assert k.batch_ns("IQ1_S", 1) == pytest.approx(0.13)
    assert k.batch_ns("IQ1_S", 64) == pytest.approx(0.04)
    assert k.batch_ns("IQ1_S", 1) > k.batch_ns("IQ1_S", 4) > k.batch_ns("IQ1_S", 16) > 0.04
    assert k.batch_ns("IQ1_S", 512) < 0.04


def _routed_kernels() -> kernels.Kernels:
    """Costs shaped like llama.cpp's MUL_MAT_ID: the matrix-vector cost up to 7 tokens
    per expert, the tiled kernel's falling cost from 8 on."""
    return kernels.parse(
        {
            "types": {
                "IQ1_S": {"tg_ns": 0.13, "pp_ns": 0.04},
                "Q3_K": {"tg_ns": 0.06, "pp_ns": 0.035},
                "Q2_K": {"tg_ns": 0.045, "pp_ns": 0.07},
                "Q8_0": {"tg_ns": 0.09, "pp_ns": 0.045},
            },
            "node_s": {"tg": {"1": 1e-6}, "pp": {"1": 1e-7}},
            "graph_nodes": {"kda": 90.0},
            "routed_ns": {
                "1": {
                    "IQ1_S": {"1": 0.14, "4": 0.13, "7": 0.13, "8": 0.07, "64": 0.045},
                    "Q3_K": {"1": 0.07, "7": 0.06, "8": 0.05, "64": 0.03},
                }
            },
        }
    )


def test_a_routed_expert_with_few_tokens_pays_the_matrix_vector_cost() -> None:
    """Below 8 tokens an expert is multiplied one token at a time; the cost per token
    then drops where llama.cpp's tiled kernel takes over, and keeps falling with
    more tokens (beyond the last point measured, along a + b / n)."""
    k = _routed_kernels()
    assert k.routed_cost("IQ1_S", 1) == pytest.approx(0.14)
    assert k.routed_cost("IQ1_S", 2) == pytest.approx(0.14 - 0.01 / 3)
    assert k.routed_cost("IQ1_S", 7) == pytest.approx(0.13)
    assert k.routed_cost("IQ1_S", 8) == pytest.approx(0.07)
    assert 0.045 > k.routed_cost("IQ1_S", 512) > 0.0  # type: ignore[operator]
    assert k.routed_cost("IQ1_M", 8) is None  # no curve, no similar type measured
    # Q2_K follows Q3_K's curve, scaled by the two types' own costs
    assert k.routed_cost("Q2_K", 1) == pytest.approx(0.07 * 0.045 / 0.06)
    assert k.routed_cost("Q2_K", 64) == pytest.approx(0.03 * 0.07 / 0.035)


def test_an_f16_expert_borrows_the_matrix_vector_ratio_at_any_token_count() -> None:
    """A routed F16 (BF16, F32) expert stays on the matrix-vector kernel at every
    token count (MUL_MAT_ID has no tinyBLAS path), so a borrowed curve is scaled by
    the matrix-vector costs only: a dense F16 prompt's cheap tiled GEMM must not make
    its routed experts look cheap (the +67 % prompt error on an F16 model)."""
    data = {
        "types": {
            "Q8_0": {"tg_ns": 0.09, "pp_ns": 0.045},
            "F16": {"tg_ns": 0.12, "pp_ns": 0.02},  # tinyBLAS: far below its vec_dot
        },
        "node_s": {"tg": {"1": 1e-6}, "pp": {"1": 1e-7}},
        "graph_nodes": {"kda": 90.0},
        "routed_ns": {"1": {"Q8_0": {"1": 0.1, "8": 0.09, "64": 0.06}}},
    }
    k = kernels.parse(data)
    for n in (1, 8, 64):
        q8 = k.routed_cost("Q8_0", n)
        assert q8 is not None
        assert k.routed_cost("F16", n) == pytest.approx(q8 * 0.12 / 0.09)
    # BF16 follows F16 where F16 has a curve of its own, else Q8_0's
    assert k.routed_cost("BF16", 64) == pytest.approx(0.06 * 0.12 / 0.09)
    data["routed_ns"]["1"]["F16"] = {"1": 0.2, "64": 0.15}  # type: ignore[index]
    k = kernels.parse(data)
    assert k.routed_cost("F16", 64) == pytest.approx(0.15)
    assert k.routed_cost("BF16", 64) == pytest.approx(0.15)  # BF16 costed as F16 (SIMILAR)


def test_a_batch_spread_over_many_experts_costs_more_per_token() -> None:
    """Per token, a prompt's experts cost E[n c(n)] / E[n] for n ~ Binomial(batch,
    k / experts): 128 tokens over 8 of 64 experts give each about 16 (the tiled
    kernel); over 8 of 512 about 2 (the matrix-vector one)."""
    k = _routed_kernels()
    few = k.routed_ns("IQ1_S", 128, 8 / 512)
    many = k.routed_ns("IQ1_S", 128, 8 / 64)
    assert few is not None
    assert many is not None
    assert few == pytest.approx(0.14, rel=0.05)  # nearly all of them below 8 tokens
    assert 0.055 < many < 0.08
    assert k.routed_ns("IQ1_S", 64, 1.0) == pytest.approx(0.045)  # every expert: all 64
    assert k.routed_ns("IQ1_S", 1, 8 / 64) == pytest.approx(0.14)  # decoding: one token


def test_the_prediction_follows_the_measured_routed_expert_cost(
    machine: Machine, estimated: Layout
) -> None:
    """On the same machine and model, routed experts measured dearer make the prompt
    prediction slower; decoding keeps the dense one-token cost (the same vec_dot kernel)."""
    hw = machine("epyc9554p-1.5TB-cpu")
    layout = estimated("atomicchat-iq1s")
    base = kernels.load()
    plan = make_plan(hw, layout, PlanOptions(ctx=4096))

    def speeds(factor: float) -> tuple[float, float]:
        curve = {n: factor * base.batch_ns("IQ1_S", n) for n in (1, 4, 8, 64, 512)}
        k = replace(base, routed={1: {"IQ1_S": curve}})
        s = predict_speed(
            hw, layout, plan.layers, plan.output_device, ctx=4096, kernels=k, prompt_tokens=512
        )
        return s.prompt_tps, s.expected_tps

    cheap, dear = speeds(0.5), speeds(2.0)
    assert dear[0] < 0.8 * cheap[0]
    assert dear[1] == cheap[1]


@pytest.mark.parametrize("hardware", ["epyc9554p-1.5TB-cpu", "8xH100-2TB", "512GB-ddr5-96GB-vram"])
def test_every_tier_gets_a_range_around_its_figure_below_the_bound(
    machine: Machine, twin_catalog: Catalog, estimated: Layout, hardware: str
) -> None:
    hw = machine(hardware)
    for tier in twin_catalog.tiers:
        layout = estimated(tier.id)
        plan = make_plan(hw, layout, PlanOptions(ctx=8192))
        for miss in (0.0, 0.5):
            s = predict_speed(
                hw, layout, plan.layers, plan.output_device, ctx=8192, stream_miss=miss
            )
            assert 0 < s.low_tps <= s.expected_tps <= s.high_tps <= s.upper_bound_tps, tier.id
            assert s.bottleneck != "nothing placed"
            assert sum(s.bytes_per_token.values()) > 0


def test_faster_gpus_or_a_faster_disk_never_slow_a_plan(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("8xH100-2TB")
    layout = estimated("grearl-iq1s")
    plan = make_plan(hw, layout, PlanOptions(ctx=8192, n_cpu_moe=40))
    gpus = tuple(
        replace(g, bandwidth=Bandwidth(2 * g.bandwidth.bytes_per_s, "override")) for g in hw.gpus
    )
    fast_gpus = replace(hw, gpus=gpus)

    def speed(profile: HardwareProfile, disk: float) -> float:
        return predict_speed(
            profile,
            layout,
            plan.layers,
            plan.output_device,
            ctx=8192,
            stream_miss=0.3,
            disk_read_bps=disk,
        ).expected_tps

    base = speed(hw, 1e9)
    assert speed(fast_gpus, 1e9) > base
    assert speed(hw, 4e9) > base
    assert speed(fast_gpus, 4e9) > max(speed(fast_gpus, 1e9), speed(hw, 4e9))


def test_every_layer_whose_experts_stay_in_ram_costs_two_hand_overs(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("8xH100-2TB")
    layout = estimated("grearl-iq1s")

    def handovers(n_cpu_moe: int) -> tuple[int, int, float]:
        s = make_plan(hw, layout, PlanOptions(ctx=8192, n_cpu_moe=n_cpu_moe)).speed
        (label, seconds), *_ = (step for step in s.steps if step[0].startswith("hand-overs"))
        gpu_gpu, gpu_cpu = (int(n) for n in re.findall(r"\d+", label))
        return gpu_gpu, gpu_cpu, seconds

    # all on the GPUs: they take turns, and the input embedding is looked up on the CPU
    assert handovers(0)[:2] == (len(hw.gpus) - 1, 1)
    few, many = handovers(10), handovers(40)
    assert few[0] == many[0] == len(hw.gpus) - 1
    assert many[1] - few[1] == 2 * 30  # to the experts in RAM and back, per layer
    assert many[2] > few[2]
