"""The tuner: a bounded set of variants, chosen with the model, decided by measurement."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.engines.launch import prepare_launch
from k3desk.core.errors import EngineError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.planning.estimate import estimate_layout
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.tuning.applied import LaunchTuning
from k3desk.core.tuning.calibration import arg_int
from k3desk.core.tuning.tune import (
    Measurement,
    TuneRequest,
    Variant,
    budget,
    candidates,
    save,
    tune,
)
from k3desk.core.tuning.tuned import TunedStore, apply_tuned
from k3desk.devtools.tinyk3 import TinyModel

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def two_cores(hardware_file: Callable[[str], Path]) -> HardwareProfile:
    """This kind of machine: two cores, no GPU, detected here."""
    hw = HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))
    cpu = replace(hw.cpu, logical_cores=2, physical_cores=2, usable_cores=2)
    return replace(hw, cpu=cpu, source="detected", hostname="desk")


@pytest.fixture
def tiny(tiny_k3_single: TinyModel) -> ModelLayout:
    return validate_shard_set(tiny_k3_single.first_part)


class StandIn:
    """A deterministic measurement that disagrees with the model: one thread decodes
    fastest (as on a busy machine), and a micro-batch of 256 is best for prompts."""

    def __init__(self, fail: Callable[[Variant], bool] = lambda _v: False) -> None:
        self.calls: list[tuple[Variant, tuple[str, ...]]] = []
        self.fail = fail

    def __call__(self, v: Variant, plan: LaunchPlan) -> Measurement:
        self.calls.append((v, plan.server_args))
        if self.fail(v):
            return Measurement(error="llama-server exited with code 1")
        args = plan.server_args
        t = arg_int(args, "-t") or 2
        tb = arg_int(args, "-tb") or t
        ub = arg_int(args, "-ub") or 512
        decode = 30.0 if t == 1 else 20.0
        prompt = 200.0 / (1 + abs(math.log2(ub / 256))) * (1.2 if tb == 2 else 1.0)
        return Measurement(prompt, decode, 1.0)


def test_the_tuner_keeps_what_it_measured_fastest(
    two_cores: HardwareProfile, tiny: ModelLayout
) -> None:
    req = TuneRequest(tiny, two_cores, PlanOptions(ctx=512), prompt_tokens=128, decode_tokens=32)
    measure = StandIn()
    r = tune(req, measure)
    # the model predicts two threads faster; the measurement says one, and wins
    assert r.plan_default.candidate.plan.speed.threads == 2
    assert r.best.candidate.variant.threads == 1
    measured = [t for t in r.trials if t.measured.ok and not t.candidate.variant.engine_defaults]
    assert r.seconds(r.best) == min(r.seconds(t) for t in measured)
    gain = r.gain_over(r.plan_default)
    assert gain is not None
    assert gain > 0
    text = "\n".join(r.summary())
    assert "Fastest: -t 1" in text
    assert "Over the plan's default" in text
    assert "less time" in text
    assert "Over llama.cpp's own defaults" in text
    # llama.cpp's defaults: the model and the context, nothing of k3desk's plan
    eng = r.engine_default
    assert eng is not None
    assert eng.candidate.plan.server_args[-2:] == ("-c", "512")
    assert "--metrics" not in eng.candidate.plan.server_args


def test_it_measures_a_tenth_of_the_grid_and_the_sweep_measures_all(
    two_cores: HardwareProfile, tiny: ModelLayout
) -> None:
    req = TuneRequest(tiny, two_cores, PlanOptions(ctx=512))
    n = len(candidates(req))
    # 2 x 2 thread counts x the 7 of the 15 batch pairs that cut a 512-token prompt
    # differently (every -b >= 512 with the same -ub is one; -ub >= 512 is one)
    assert n == 28
    quick = StandIn()
    tune(req, quick)
    assert len(quick.calls) == budget(n) <= max(3, n // 10)
    sweep = StandIn()
    full = tune(replace(req, exhaustive=True), sweep)
    assert len(sweep.calls) == n + 1  # and llama.cpp's defaults
    assert len({args for _, args in sweep.calls}) == n + 1
    # the stand-in's best of everything: one thread, -ub 256, -tb 2
    best = full.best.candidate.variant
    assert (best.threads, best.ubatch, best.threads_batch) == (1, 256, 2)


def test_batch_sizes_the_test_prompt_cannot_tell_apart_are_measured_once(
    two_cores: HardwareProfile, tiny: ModelLayout
) -> None:
    def cuts(prompt: int) -> set[tuple[int, int]]:
        req = TuneRequest(tiny, two_cores, PlanOptions(ctx=4096), prompt_tokens=prompt)
        out = []
        for c in candidates(req):
            if c.variant.threads is None and c.variant.threads_batch is None:
                b = min(c.variant.batch or 2048, prompt)
                out.append((b, min(c.variant.ubatch or 512, b)))
        assert len(out) == len(set(out))  # no two measure the same cut
        return set(out)

    assert cuts(128) == {(128, 128), (128, 64)}
    assert len(cuts(2048)) > len(cuts(512)) > len(cuts(128))


def test_variants_that_fail_are_skipped_and_all_failing_is_an_error(
    two_cores: HardwareProfile, tiny: ModelLayout
) -> None:
    req = TuneRequest(tiny, two_cores, PlanOptions(ctx=512))
    r = tune(req, StandIn(fail=lambda v: v.threads == 1))
    assert r.best.candidate.variant.threads is None  # the default thread count
    assert any(t.measured.error for t in r.trials)
    with pytest.raises(EngineError, match="No launch variant could be measured"):
        tune(req, StandIn(fail=lambda _v: True))


def test_on_a_gpu_machine_the_split_and_the_projector_are_varied(
    hardware_file: Callable[[str], Path], twin_catalog: object
) -> None:
    hw = HardwareProfile.from_json_file(hardware_file("512GB-ddr5-96GB-vram"))
    layout = estimate_layout(twin_catalog.get("grearl-iq1s"))  # type: ignore[attr-defined]
    req = TuneRequest(layout, hw, PlanOptions(ctx=8192, mmproj=Path("/m/mmproj.gguf"),
                                             mmproj_bytes=900 * 1024**2))  # fmt: skip
    cands = candidates(req)
    base = cands[0].plan
    moe = {c.variant.n_cpu_moe for c in cands}
    step = max(1, len(layout.moe_layers) // 10)
    assert min(base.n_cpu_moe + step, len(layout.moe_layers)) in moe
    assert {c.variant.mmproj_on_cpu for c in cands} >= {None, base.mmproj_on_gpu}
    for c in cands:  # every candidate fits: nothing beyond a GPU's budget
        assert all(d.headroom >= 0 for d in c.plan.devices if d.device != "RAM")
    assert base.n_cpu_moe - step not in moe  # fewer expert layers in RAM does not fit


def test_the_choice_is_kept_and_the_next_launch_uses_it(
    two_cores: HardwareProfile,
    tiny: ModelLayout,
    tiny_k3_single: TinyModel,
    llama_server: Path,
) -> None:
    paths = default_paths().ensure()
    r = tune(TuneRequest(tiny, two_cores, PlanOptions(ctx=512)), StandIn())
    store = TunedStore(paths.state)
    choice = save(r, store, when=1_700_000_000.0)
    assert choice.threads == 1
    options, note = apply_tuned(store, two_cores, tiny, PlanOptions(ctx=512))
    assert options.threads == 1
    assert "measured fastest" in note
    # what the person sets wins
    assert apply_tuned(store, two_cores, tiny, PlanOptions(ctx=512, threads=2))[1] == ""
    # another machine, or a hardware file, does not get it
    assert apply_tuned(store, replace(two_cores, hostname="x"), tiny, PlanOptions())[1] == ""
    prepared = prepare_launch(
        tiny_k3_single.first_part,
        mmproj=None,
        hardware=two_cores,
        options=PlanOptions(ctx=512),
        paths=paths,
        engine=llama_server,
        tuned=LaunchTuning.at(paths.state).settings,
    )
    assert arg_int(prepared.plan.server_args, "-t") == 1
    assert any("k3desk tune" in n for n in prepared.notes)
    untuned = prepare_launch(
        tiny_k3_single.first_part,
        mmproj=None,
        hardware=two_cores,
        options=PlanOptions(ctx=512),
        paths=paths,
        engine=llama_server,
    )
    assert arg_int(untuned.plan.server_args, "-t") is None


def test_a_choice_measured_before_a_gpu_change_is_not_used_after_it(
    two_cores: HardwareProfile, tiny: ModelLayout, hardware_file: Callable[[str], Path]
) -> None:
    """Settings measured on the CPU say nothing once a GPU is in the box (or another one
    replaces it): the same host, CPU and RAM with other GPUs is another machine."""
    store = TunedStore(default_paths().ensure().state)
    save(tune(TuneRequest(tiny, two_cores, PlanOptions(ctx=512)), StandIn()), store, when=1.7e9)
    assert apply_tuned(store, two_cores, tiny, PlanOptions())[0].threads == 1
    gpu = HardwareProfile.from_json_file(hardware_file("1xRTX5090-256GB")).gpus[0]
    with_gpu = replace(two_cores, gpus=(gpu,))
    assert apply_tuned(store, with_gpu, tiny, PlanOptions()) == (PlanOptions(), "")
    bigger = replace(gpu, vram_total=gpu.vram_total * 2)
    save(tune(TuneRequest(tiny, with_gpu, PlanOptions(ctx=512)), StandIn()), store, when=1.7e9)
    assert apply_tuned(store, with_gpu, tiny, PlanOptions())[1] != ""
    assert apply_tuned(store, replace(two_cores, gpus=(bigger,)), tiny, PlanOptions())[1] == ""


def test_a_damaged_tuned_file_launches_untuned(
    two_cores: HardwareProfile, tiny: ModelLayout
) -> None:
    store = TunedStore(default_paths().ensure().state)
    store.path.write_text("{not json", encoding="utf-8")
    assert apply_tuned(store, two_cores, tiny, PlanOptions()) == (PlanOptions(), "")
    assert "damaged" in store.note
    assert list(store.path.parent.glob("tuned-launch.json.damaged-*"))


def _k3desk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.mark.engine
def test_tune_a_real_model_with_the_real_server_then_launch_with_it(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    shard = str(tiny_k3_single.first_part)
    engine = ("--engine", str(llama_server))
    out = _k3desk("tune", shard, *engine, "--ctx", "512", "--prompt-tokens", "32",
                  "--answer-tokens", "8")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "Measured " in text
    assert "variants in" in text
    assert "Fastest: " in text
    assert "tok/s" in text
    assert "Over the plan's default" in text
    assert "Over llama.cpp's own defaults" in text
    assert "Saved: the next launch of this model on this machine uses" in text
    plan = _k3desk("plan", shard, "--ctx", "512")
    assert plan.returncode == 0, plan.stderr
    assert "measured fastest on this machine" in plan.stdout
    gone = _k3desk("tune", shard, "--forget")
    assert gone.returncode == 0
    assert "Forgot" in gone.stdout
    assert "measured fastest" not in _k3desk("plan", shard, "--ctx", "512").stdout


def test_the_summary_says_so_when_llama_cpp_s_defaults_measured_faster(
    two_cores: HardwareProfile, tiny: ModelLayout
) -> None:
    """A gain is never shown as a negative 'less time': when llama.cpp's own defaults
    ran the test request faster than every variant, the summary says 'more time'."""
    inner = StandIn()

    def measure(v: Variant, plan: LaunchPlan) -> Measurement:
        if v.engine_defaults:
            return Measurement(500.0, 100.0, 1.0)
        return inner(v, plan)

    req = TuneRequest(tiny, two_cores, PlanOptions(ctx=512), prompt_tokens=128, decode_tokens=32)
    text = "\n".join(tune(req, measure).summary())
    line = next(x for x in text.splitlines() if x.startswith("Over llama.cpp's own defaults"))
    assert "more time (llama.cpp's own defaults measured faster this run)" in line
    assert "less time" not in line
    assert "-" not in line.split(":")[-1]  # no negative percentage
