"""This CPU's kernel check: the factor it finds, where it is used, and where it is not.

The check times the engine's own kernels (the real ``llama-bench`` and
``llama-quantize`` of the test engine) and scales the shipped kernel costs so that
the speed model's prediction of the same runs meets them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.errors import Cancelled, EngineError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.k3arch import TINY_K3
from k3desk.core.planning import kernels as kernel_costs
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.progress import CancelToken, Progress
from k3desk.core.tuning.applied import LaunchTuning
from k3desk.core.tuning.calibration import CalibrationStore, SpeedRecord
from k3desk.core.tuning.cpuprobe import (
    PROBE_FILE,
    PROBE_TYPES,
    CpuProbe,
    CpuProbeStore,
    ProbeRun,
    factors,
    file_identity,
    parse_bench,
    predicted,
    probe_tools,
    run_cpu_probe,
    solve_factor,
)
from k3desk.core.tuning.identity import machine_key, model_key

# a probe model small enough for a test: widths llama-quantize's Q8_0 (blocks of 32) takes
SMALL = replace(TINY_K3, n_layer=4, mla_every=4)


def test_a_scale_moves_each_kernel_by_its_own_tests_factor() -> None:
    k = kernel_costs.load()
    scale = kernel_costs.KernelScale({"tg": {1: 2.0, 3: 4.0}, "pp": {1: 0.5}})
    s = k.scaled(scale)
    base, _ = k.cost("Q8_0", 1)
    c, _ = s.cost("Q8_0", 1)
    assert c.tg_ns == pytest.approx(2 * base.tg_ns)
    assert c.pp_ns == pytest.approx(0.5 * base.pp_ns)
    # between two counts measured, linear in the threads; beyond them, the nearest
    assert scale.at("tg", 2) == pytest.approx(3.0)
    assert scale.at("tg", 64) == pytest.approx(4.0)
    assert scale.at("pp", 8) == pytest.approx(0.5)
    assert s.node_seconds("tg", 1) == pytest.approx(2 * k.node_seconds("tg", 1))
    assert s.kda_seconds("pp", 1, 4096) == pytest.approx(0.5 * k.kda_seconds("pp", 1, 4096))
    # a routed expert of few tokens runs the matrix-vector kernel (decoding's factor),
    # of 8 and more the tiled one (the prompts' factor)
    few, many = kernel_costs.TILED_MIN_TOKENS - 1, kernel_costs.TILED_MIN_TOKENS
    assert s.routed_cost("IQ1_S", few) == pytest.approx(2 * (k.routed_cost("IQ1_S", few) or 0))
    assert s.routed_cost("IQ1_S", many) == pytest.approx(0.5 * (k.routed_cost("IQ1_S", many) or 0))
    assert "timed" not in s.source
    assert k.scaled(None) is k


def test_the_factor_found_is_the_one_that_makes_the_prediction_meet_the_run(
    here: HardwareProfile, layout: ModelLayout
) -> None:
    """Runs that took 2.5x (decoding) and 0.4x (prompts) the costs' time give back
    those factors, each test's from its own runs."""
    k = kernel_costs.load()
    truth = kernel_costs.KernelScale({"tg": {1: 2.5}, "pp": {1: 0.4}})
    pp, tg = predicted(here, layout, 1, k.scaled(truth))
    f_pp, f_tg = factors(here, layout, 1, pp, tg, k)
    assert f_tg == pytest.approx(2.5, rel=0.01)
    assert f_pp == pytest.approx(0.4, rel=0.01)
    plain_pp, plain_tg = predicted(here, layout, 1, k)
    assert tg < plain_tg / 2
    assert pp > plain_pp * 2


def test_a_types_own_factor_is_found_with_the_general_one_in(
    tmp_path: Path, here: HardwareProfile
) -> None:
    """An F16 model that decodes in 0.7x and prompts in 0.5x the F16 costs' time, on a
    machine whose other costs take 1.2x / 0.9x, gives back 0.7 and 0.5 for F16, and
    the types not timed keep the general factor."""
    from k3desk.core.engines.canary import write_k3_gguf

    layout = validate_shard_set(write_k3_gguf(tmp_path / "f16", "f16", shape=SMALL)[0])
    k = kernel_costs.load()
    general = {"tg": {1: 1.2}, "pp": {1: 0.9}}
    own = {"F16": {"tg": {1: 0.7}, "pp": {1: 0.5}}}
    truth = kernel_costs.KernelScale(general, types=own)
    pp, tg = predicted(here, layout, 1, k.scaled(truth))
    base = k.scaled(kernel_costs.KernelScale(general))
    f_pp, f_tg = factors(here, layout, 1, pp, tg, base, "F16")
    assert f_tg == pytest.approx(0.7, rel=0.01)
    assert f_pp == pytest.approx(0.5, rel=0.01)
    assert truth.type_at("BF16", "tg", 1) == pytest.approx(0.7)  # F16's family
    # each k-quant is its own: Q4_K's timing says nothing of Q3_K's (measured apart)
    q4k = kernel_costs.KernelScale(general, types={"Q4_K": own["F16"]})
    assert q4k.type_at("Q4_K", "pp", 1) == pytest.approx(0.5)
    assert q4k.type_at("Q3_K", "pp", 1) == pytest.approx(0.9)


def test_a_speed_out_of_the_predictions_reach_takes_the_end_of_the_range() -> None:
    assert solve_factor(50.0, lambda f: 100.0 / f) == pytest.approx(2.0, rel=1e-6)
    # faster than any factor predicts (RAM bandwidth binds from f = 5/6 down): the
    # kernels are no slower than there, and no faster than the costs say
    assert solve_factor(500.0, lambda f: min(100.0 / f, 120.0)) == pytest.approx(5 / 6, rel=1e-6)
    assert solve_factor(500.0, lambda f: min(100.0 / f, 50.0)) == 1.0
    # slower than any factor predicts: the top of the range
    assert solve_factor(1.0, lambda f: 100.0 / f) == pytest.approx(16.0, rel=1e-6)


def test_llama_bench_output_that_is_not_speeds_gets_one_sentence() -> None:
    row = {"n_prompt": 64, "n_gen": 0, "avg_ts": 40.0, "samples_ts": [39.0, 41.0]}
    tg = {"n_prompt": 0, "n_gen": 32, "avg_ts": 15.0, "samples_ts": [15.0]}
    assert parse_bench(json.dumps([row, tg])) == (40.0, 15.0)
    for text in ("", "Segmentation fault", json.dumps([row]), json.dumps([{**tg, "avg_ts": 0}])):
        with pytest.raises(EngineError) as exc:
            parse_bench(text if text else "{}")
        assert "llama-bench printed" in exc.value.message
    with pytest.raises(EngineError):
        parse_bench(json.dumps([row, {**tg, "samples_ts": [float("nan")]}]))


def _probe(hw: HardwareProfile, engine: str, when: float = 1_790_000_000.0) -> CpuProbe:
    run = ProbeRun(1, 40.0, 15.0, prompt_factor=0.5, decode_factor=0.5, spread=0.02)
    return CpuProbe(machine_key(hw), engine, kernel_costs.load().source, when, 20e9, (run,))


def test_a_check_is_used_on_its_machine_with_its_engine_and_nowhere_else(
    tmp_path: Path, here: HardwareProfile, layout: ModelLayout
) -> None:
    bench = tmp_path / "bin" / "llama-bench"
    bench.parent.mkdir()
    bench.write_bytes(b"\x7fELF build 1")
    store = CpuProbeStore(tmp_path / "state")
    store.put(_probe(here, file_identity(bench)))
    assert store.get(here) is not None
    # the plans here predict twice as fast with a CPU that takes half the costs' time
    tuning = LaunchTuning.at(tmp_path / "state")
    opts, note = tuning.settings(here, layout, PlanOptions(ctx=512))
    assert opts.kernel_scale is not None
    assert "own kernel timings" in note
    plain = make_plan(here, layout, PlanOptions(ctx=512)).speed
    scaled = make_plan(here, layout, opts).speed
    assert scaled.expected_tps > 1.5 * plain.expected_tps
    # another machine's profile, a hardware file, other costs: not used
    assert store.get(replace(here, hostname="other")) is None
    assert store.get(replace(here, source="file")) is None
    other_costs = replace(kernel_costs.load(), source="measured elsewhere")
    assert store.get(here, other_costs) is None
    # the engine rebuilt (another file where it was): the check is stale
    bench.write_bytes(b"\x7fELF build 22")
    assert store.get(here) is None
    opts, note = tuning.settings(here, layout, PlanOptions(ctx=512))
    assert opts.kernel_scale is None
    assert note == ""


def test_runs_predicted_before_the_check_do_not_correct_predictions_made_with_it(
    tmp_path: Path, here: HardwareProfile, layout: ModelLayout
) -> None:
    bench = tmp_path / "llama-bench"
    bench.write_bytes(b"build")
    state = tmp_path / "state"
    old = SpeedRecord(1_780_000_000.0, machine_key(here), model_key(layout), "m", "cpu", 8,
                      10.0, 0.0, 20.0, 0.0, 64, 0)  # fmt: skip
    CalibrationStore(state).add(old)
    tuning = LaunchTuning.at(state)
    plan = make_plan(here, layout, PlanOptions(ctx=512))
    assert tuning.calibrate(here, layout, plan).speed.calibration  # before any check: used
    CpuProbeStore(state).put(_probe(here, file_identity(bench), when=1_790_000_000.0))
    assert not tuning.calibrate(here, layout, plan).speed.calibration
    newer = replace(old, when=1_795_000_000.0)
    CalibrationStore(state).add(newer)
    assert tuning.calibrate(here, layout, plan).speed.calibration


def test_a_damaged_record_is_set_aside_and_the_costs_stay_as_shipped(
    tmp_path: Path, here: HardwareProfile
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    for damage in (b"\xff\xfe not json", b'{"schema": 1, "probes": [{"machine": 3}]}',
                   b'{"schema": 1, "probes": [{"runs": [{"decode_factor": 1e300}]}]}'):  # fmt: skip
        (state / PROBE_FILE).write_bytes(damage)
        store = CpuProbeStore(state)
        assert store.get(here) is None
        assert "damaged" in store.note
        assert not (state / PROBE_FILE).exists()
        assert any(p.name.startswith(PROBE_FILE + ".damaged-") for p in state.iterdir())


def test_an_engine_without_its_tools_is_named_not_traced(tmp_path: Path) -> None:
    lone = tmp_path / "llama-server"
    lone.write_text("#!/bin/sh\n")
    lone.chmod(0o755)
    with pytest.raises(EngineError) as exc:
        probe_tools(lone)
    assert f"llama-bench is not beside {lone}" in exc.value.message
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out = subprocess.run(
        [sys.executable, "-m", "k3desk", "doctor", "--check-cpu", "--no-benchmark",
         "--engine", str(lone)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert "llama-bench is not beside" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_the_real_engine_times_its_kernels_here_and_leaves_nothing_behind(
    tmp_path: Path, llama_server: Path, here: HardwareProfile
) -> None:
    work = tmp_path / "work"
    stages: list[Progress] = []
    probe = run_cpu_probe(llama_server, here, work, progress=stages.append, shape=SMALL, rounds=1)
    counts = sorted({1, here.cpu.physical_cores})
    assert [(r.type_name, r.threads) for r in probe.runs] == [
        (t, n) for t in PROBE_TYPES for n in counts
    ]
    for r in probe.runs:
        assert r.decode_tps > 0
        assert r.prompt_tps > 0
        assert 1 / 16 < r.decode_factor < 16
        assert 1 / 16 < r.prompt_factor < 16
    assert stages[-1].done == stages[-1].total
    assert list(work.iterdir()) == []
    assert probe.engine == file_identity(llama_server.parent / "llama-bench")


def test_cancel_while_the_kernels_run_stops_them_and_leaves_nothing_behind(
    tmp_path: Path, llama_server: Path, here: HardwareProfile
) -> None:
    work = tmp_path / "work"
    token = CancelToken()

    def progress(p: Progress) -> None:
        if p.stage.startswith("Timing"):
            threading.Timer(0.2, token.cancel).start()

    with pytest.raises(Cancelled):
        run_cpu_probe(
            llama_server, here, work, progress=progress, cancel=token, shape=SMALL, rounds=3
        )
    assert list(work.iterdir()) == []
    assert shutil.disk_usage(tmp_path).free > 0


def test_doctor_shows_the_kept_check_with_the_records_figures(
    tmp_path: Path, k3_home: Path
) -> None:
    """Without a check, doctor says how to make one; with one, its speeds and factors."""
    from k3desk.core.hardware.detect import detect_hardware

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    argv = [sys.executable, "-m", "k3desk", "doctor", "--no-benchmark"]
    before = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert "not timed here" in before.stdout
    assert "--check-cpu" in before.stdout
    bench = tmp_path / "llama-bench"
    bench.write_bytes(b"build")
    hw = detect_hardware(measure_bandwidth=False)
    runs = (
        ProbeRun(1, 41.25, 15.75, prompt_factor=0.8, decode_factor=0.5, spread=0.01),
        ProbeRun(2, 70.5, 25.5, prompt_factor=1.25, decode_factor=2.0, spread=0.02),
    )
    probe = CpuProbe(machine_key(hw), file_identity(bench), kernel_costs.load().source,
                     1_790_000_000.0, 20e9, runs)  # fmt: skip
    CpuProbeStore(k3_home / "state").put(probe)
    after = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    text = after.stdout
    assert f"timed here on {probe.day}" in text
    assert "decoding 15.8 tok/s (2.00x its speed), prompts 41.2 tok/s (1.25x)" in text
    assert "decoding 25.5 tok/s (0.50x its speed), prompts 70.5 tok/s (0.80x)" in text


def test_a_gpu_build_is_timed_on_the_cpu(tmp_path: Path) -> None:
    """llama-bench puts every layer on the GPU by default: the check asks for none."""
    from k3desk.core.tuning.cpuprobe import bench_once

    seen = tmp_path / "argv"
    bench = tmp_path / "llama-bench"
    rows = [
        {"n_prompt": 64, "n_gen": 0, "avg_ts": 40.0},
        {"n_prompt": 0, "n_gen": 32, "avg_ts": 9.0},
    ]
    bench.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{seen}"\necho \'{json.dumps(rows)}\'\n')
    bench.chmod(0o755)
    assert bench_once(bench, tmp_path / "m.gguf", 2, CancelToken()) == (40.0, 9.0)
    argv = seen.read_text().split("\n")
    for flag, value in (("-ngl", "0"), ("-dev", "none"), ("-nopo", "1"), ("-t", "2")):
        assert argv[argv.index(flag) + 1] == value


def test_too_little_disk_and_a_failing_tool_are_named_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk stops the check before it writes; a tool that fails is named with
    the end of what it printed, and what was written is gone."""
    from k3desk.core.tuning import cpuprobe

    work = tmp_path / "work"
    quantize = tmp_path / "llama-quantize"
    quantize.write_text("#!/bin/sh\necho 'main: failed to quantize: unknown type' >&2\nexit 1\n")
    quantize.chmod(0o755)
    real_usage = shutil.disk_usage

    def almost_full(path: object) -> object:
        return real_usage(path)._replace(free=500 * 1024**2)  # type: ignore[arg-type]

    monkeypatch.setattr(cpuprobe.shutil, "disk_usage", almost_full)
    with pytest.raises(EngineError) as full:
        cpuprobe.write_probe_models(work, quantize, threads=1, cancel=CancelToken(), shape=SMALL)
    assert "needs 2.4 GiB free" in full.value.message
    assert "500.0 MiB is free" in full.value.message
    assert list(work.iterdir()) == []
    monkeypatch.setattr(cpuprobe.shutil, "disk_usage", real_usage)
    with pytest.raises(EngineError) as failed:
        cpuprobe.write_probe_models(work, quantize, threads=1, cancel=CancelToken(), shape=SMALL)
    assert failed.value.message == (
        "llama-quantize failed (exit status 1): main: failed to quantize: unknown type"
    )
    assert list(work.iterdir()) == []


def test_an_engine_named_that_is_not_there_is_refused_not_replaced(
    tmp_path: Path, k3_home: Path
) -> None:
    """`--engine PATH` means that engine and no other: a wrong path is named, and the
    check does not go on with some other llama-server k3desk finds."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    missing = tmp_path / "nowhere" / "llama-server"
    out = subprocess.run(
        [sys.executable, "-m", "k3desk", "doctor", "--check-cpu", "--no-benchmark",
         "--engine", str(missing)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert f"There is no llama-server at {missing}" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not (k3_home / "cache" / "cpu-check").exists()  # nothing was written


KILLED_CHECK = """
import sys
from dataclasses import replace
from pathlib import Path
from k3desk.core.hardware.detect import detect_hardware
from k3desk.core.k3arch import TINY_K3
from k3desk.core.tuning.cpuprobe import run_cpu_probe
run_cpu_probe(Path(sys.argv[1]), detect_hardware(measure_bandwidth=False), Path(sys.argv[2]),
              shape=replace(TINY_K3, n_layer=4, mla_every=4), rounds=200)
"""


def test_one_check_at_a_time_and_the_next_clears_what_a_killed_one_left(
    tmp_path: Path, llama_server: Path, here: HardwareProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a check runs (another process), a second is refused and touches nothing of
    it; killed with -9, it leaves its models behind, and the next check deletes them."""
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    other = subprocess.Popen(
        [sys.executable, "-c", KILLED_CHECK, str(llama_server), str(work)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while (
            not (work / "probe-q4_k.gguf").exists() or (work / "probe-f16.gguf").stat().st_size == 0
        ):
            assert other.poll() is None, other.stderr.read() if other.stderr else ""
            assert time.monotonic() < deadline, "the other check wrote no models"
            time.sleep(0.1)
        time.sleep(0.5)  # quantized; timing now
        theirs = sorted(p.name for p in work.iterdir())
        with pytest.raises(EngineError) as busy:
            run_cpu_probe(llama_server, here, work, shape=SMALL, rounds=1)
        assert "already running" in busy.value.message
        assert sorted(p.name for p in work.iterdir()) == theirs  # not touched
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
        if other.stderr is not None:
            other.stderr.close()
    left = sorted(p.name for p in work.iterdir())
    assert "probe-q8_0.gguf" in left  # what kill -9 leaves
    # on a disk with room for the check only once they are gone
    from k3desk.core.tuning import cpuprobe

    def present() -> int:
        return sum(p.stat().st_size for p in work.glob("probe-*"))

    base, real_usage = cpuprobe.DISK_NEEDED - 1 + present(), shutil.disk_usage
    monkeypatch.setattr(
        cpuprobe.shutil,
        "disk_usage",
        lambda path: real_usage(path)._replace(free=base - present()),
    )
    probe = run_cpu_probe(llama_server, here, work, shape=SMALL, rounds=1)
    assert probe.runs
    assert list(work.iterdir()) == []
