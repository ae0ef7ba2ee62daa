"""Failures this machine cannot produce with the real engine (GPU OOM, SIGILL, the AMX
assertion, the OOM killer), from a stand-in that prints the real messages and dies the
real way, and the recovery policy's answer to each."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from k3desk.core.engines.loadprogress import LoadProgressParser, bytes_loaded
from k3desk.core.engines.oom import OomWatch
from k3desk.core.engines.supervisor import (
    Event,
    LaunchSpec,
    RestartPolicy,
    State,
    Supervisor,
    bump_n_cpu_moe,
)
from k3desk.core.errors import EngineError
from k3desk.core.paths import default_paths

FAST = RestartPolicy(backoff_initial=0.05, backoff_max=0.2, stop_grace=3.0)


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    started: list[Supervisor] = []

    def make(
        exe: Path,
        *args: str,
        policy: RestartPolicy = FAST,
        oom_watch: OomWatch | None = None,
        **kw: object,
    ) -> Supervisor:
        events: list[Event] = []
        spec = LaunchSpec(exe, ("-m", str(tmp_path / "model.gguf"), *args), **kw)  # type: ignore[arg-type]
        sup = Supervisor(
            spec, default_paths(), policy=policy, on_event=events.append, oom_watch=oom_watch
        )
        sup.events = events  # type: ignore[attr-defined]
        started.append(sup)
        sup.start()
        return sup

    yield make
    for sup in started:
        sup.stop()


def test_gpu_oom_is_replanned_with_more_expert_layers_in_ram(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor]
) -> None:
    exe = fake_engine("gpu_oom", FAKE_OOM_BELOW="6")
    sup = supervise(exe, "-ngl", "99", "--n-cpu-moe", "2", n_layers=20)
    ep = sup.wait_ready(30)
    hist = sup.history
    assert [a.crash.kind if a.crash else None for a in hist] == ["gpu_oom", "gpu_oom", None]
    assert "--n-cpu-moe 2 -> 4" in hist[0].action
    assert "--n-cpu-moe 4 -> 6" in hist[1].action
    assert "more layers kept in RAM" in hist[0].action
    assert hist[2].argv[hist[2].argv.index("--n-cpu-moe") + 1] == "6"
    assert hist[0].crash is not None
    assert hist[0].crash.summary.startswith("GPU 0 (CUDA0) ran out of memory")
    assert httpx.get(f"{ep.url}/v1/models", headers=ep.headers, timeout=5).status_code == 200


def test_replans_are_not_counted_as_repeated_failures_but_are_bounded(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor]
) -> None:
    step1 = RestartPolicy(max_failures=2, cpu_moe_step=1, backoff_initial=0.1)
    sup = supervise(fake_engine("gpu_oom", FAKE_OOM_BELOW="7"), "--n-cpu-moe", "2", policy=step1)
    sup.wait_ready(30)
    assert len(sup.history) == 6  # 2 -> 3 -> 4 -> 5 -> 6 -> 7: five re-plans, then ready
    # each re-plan waits the first back-off: a changed command is no repeated failure
    assert [a.action.rpartition("; ")[2] for a in sup.history[:-1]] == ["restarting in 0.1 s"] * 5

    capped = RestartPolicy(max_replans=3, backoff_initial=0.01)
    sup2 = supervise(fake_engine("gpu_oom"), "--n-cpu-moe", "2", policy=capped)  # never fits
    with pytest.raises(EngineError, match="ran out of memory"):
        sup2.wait_ready(30)
    assert len(sup2.history) == 4
    assert sup2.history[-1].action == "gave up: 3 re-plans did not help"


def test_gpu_oom_with_every_expert_in_ram_gives_up(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor]
) -> None:
    sup = supervise(fake_engine("gpu_oom"), "-ngl", "99", "--n-cpu-moe", "6", n_layers=6)
    with pytest.raises(EngineError, match=r"GPU 0 \(CUDA0\) ran out of memory") as err:
        sup.wait_ready(30)
    assert "smaller context" in str(err.value)  # the fix
    assert len(sup.history) == 1
    assert sup.history[0].action == "gave up: no plan with less GPU memory is left"


def test_illegal_instruction_is_not_retried_and_says_rebuild(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor]
) -> None:
    sup = supervise(fake_engine("sigill"))
    with pytest.raises(EngineError) as err:
        sup.wait_ready(30)
    msg = str(err.value)
    assert "built for another CPU" in msg
    assert "SIGILL" in msg
    assert "k3desk engine install" in msg
    assert len(sup.history) == 1
    assert sup.history[0].returncode == -signal.SIGILL
    finals = [e for e in sup.events if e.state is State.CRASHED]  # type: ignore[attr-defined]
    assert len(finals) == 1
    assert finals[0].final


def test_amx_assertion_is_retried_with_no_repack(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor]
) -> None:
    sup = supervise(fake_engine("amx"), "-c", "4096")
    sup.wait_ready(30)
    first, second = sup.history
    assert first.crash is not None
    assert first.crash.kind == "amx_repack_assert"
    assert first.returncode == -signal.SIGABRT
    assert "--no-repack" in first.action
    assert "--no-repack" in second.argv
    assert second.crash is None


def test_oom_killer_restarts_are_bounded(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor], tmp_path: Path
) -> None:
    # a fake /sys + /proc whose memory cgroup counts the kills the stand-in "suffers"
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/k3desk.scope\n")
    events = tmp_path / "sys/fs/cgroup/k3desk.scope/memory.events"
    events.parent.mkdir(parents=True)
    events.write_text("oom 0\noom_kill 0\n")
    watch = OomWatch(tmp_path / "sys", tmp_path / "proc", None)
    exe = fake_engine("oom_killer", FAKE_OOM_EVENTS=str(events))
    policy = RestartPolicy(max_failures=3, backoff_initial=0.1, backoff_factor=2.0)
    t0 = time.monotonic()
    sup = supervise(exe, policy=policy, oom_watch=watch)
    with pytest.raises(EngineError, match="after 3 attempts") as err:
        sup.wait_ready(30)
    assert "out-of-memory killer ended the engine (the oom_kill counter" in str(err.value)
    hist = sup.history
    assert len(hist) == 3
    assert all(a.crash is not None and a.crash.kind == "oom_killed" for a in hist)
    assert hist[0].action.endswith("restarting in 0.1 s")
    assert hist[1].action.endswith("restarting in 0.2 s")  # the back-off grows
    # the first restart changes what matters: the repacked weights go (--no-repack)
    assert hist[0].action.startswith("added --no-repack (the out-of-memory killer ended it)")
    assert "--no-repack" not in hist[0].argv
    assert all("--no-repack" in a.argv for a in hist[1:])
    assert hist[2].action == "gave up: 3 failed attempts in a row"
    assert time.monotonic() - t0 >= 0.3
    states = [e.state for e in sup.events]  # type: ignore[attr-defined]
    assert states.count(State.STARTING) == 3
    assert sup.wait_stopped(1)
    assert sup.state is State.CRASHED


def test_a_port_taken_while_the_engine_restarts_is_refused_naming_who_holds_it(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor]
) -> None:
    """The --port given was free at the start; the engine is killed, and during the
    back-off another program takes the port.  The restart starts nothing there: the
    message names the program that holds the port, as at the start."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = RestartPolicy(backoff_initial=1.0, backoff_max=1.0, stop_grace=3.0)
    sup = supervise(fake_engine("serve"), policy=policy, port=port)
    sup.wait_ready(30)
    first = sup.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while "restarting in" not in (sup.history[0].action or ""):
        assert time.monotonic() < deadline, sup.history[0].action
        time.sleep(0.01)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(EngineError, match=f"Port {port} on 127.0.0.1 is already in use by "):
            sup.wait_ready(30)
    first_try, restart = sup.history
    assert first_try.pid == first
    assert restart.pid == 0  # the restart ran nothing
    assert restart.crash is not None
    assert f"(pid {os.getpid()})" in restart.crash.summary


def test_a_free_port_taken_before_the_engine_binds_it_is_not_a_failure(
    fake_engine: Callable[..., Path],
    supervise: Callable[..., Supervisor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """k3desk picks a free port; before the engine binds it another program (or another
    engine started the same moment) takes it.  That is not the engine failing: with no
    restart left to spend (``max_failures=1``), the engine still starts, on another free
    port, and the taken one is named in the history."""
    import k3desk.core.engines.supervisor as supervisor_module

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real = supervisor_module.free_port
        picks = iter([taken, taken])
        monkeypatch.setattr(supervisor_module, "free_port", lambda: next(picks, None) or real())
        policy = RestartPolicy(max_failures=1, backoff_initial=0.05, backoff_max=0.2)
        sup = supervise(fake_engine("serve"), policy=policy)
        ep = sup.wait_ready(30)
    first, second = sup.history
    assert first.pid == 0  # nothing was started on the taken port
    assert first.crash is not None
    assert first.crash.kind == "port_in_use"
    assert f"port {taken} was taken" in (first.action or "")
    assert second.port != taken
    assert ep.url.endswith(f":{second.port}")
    assert httpx.get(f"{ep.url}/v1/models", headers=ep.headers, timeout=5).status_code == 200


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_period(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor]
) -> None:
    sup = supervise(fake_engine("ignore_term"))
    sup.wait_ready(30)
    t0 = time.monotonic()
    sup.stop(grace=0.5)
    took = time.monotonic() - t0
    assert 0.5 <= took < 5
    assert sup.state is State.STOPPED
    assert sup.history[-1].returncode == -signal.SIGKILL


def test_an_engine_that_prints_its_command_line_never_shows_the_key(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor], tmp_path: Path
) -> None:
    """A wrapper script (or a fork's start-up banner) that echoes its arguments puts the
    key into the engine's output: the log file and the lines k3desk shows say ``***``."""
    real = fake_engine("serve")
    wrapper = tmp_path / "wrapped" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "starting {real} $*"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    sup = supervise(wrapper)
    ep = sup.wait_ready(30)
    log = sup.log_file
    assert log is not None
    text = log.read_text()
    echoed = [line for line in text.splitlines() if line.startswith("starting ")]
    assert echoed, text
    assert "--api-key ***" in echoed[0]
    assert ep.api_key not in text
    shown = [line for line in sup.tail() if line.startswith("starting ")]
    assert shown
    assert "--api-key ***" in shown[0]
    assert all(ep.api_key not in line for line in sup.tail())


def test_projector_refused_by_the_engine(
    fake_engine: Callable[..., Path], supervise: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = supervise(fake_engine("bad_projector"), "--mmproj", str(tmp_path / "mmproj.gguf"))
    with pytest.raises(EngineError, match="vision projector"):
        sup.wait_ready(30)
    assert sup.last_crash is not None
    assert sup.last_crash.kind == "unsupported_projector"


def test_missing_executable(tmp_path: Path, supervise: Callable[..., Supervisor]) -> None:
    sup = supervise(tmp_path / "no-such-llama-server")
    with pytest.raises(EngineError, match="could not be started"):
        sup.wait_ready(10)


def test_load_timeout(fake_engine: Callable[..., Path], tmp_path: Path) -> None:
    exe = tmp_path / "slow-server"
    exe.write_text("#!/bin/sh\necho 'load_tensors: loading model tensors'\nexec sleep 60\n")
    exe.chmod(0o755)
    sup = Supervisor(LaunchSpec(exe, (), ready_timeout=0.5), default_paths(), policy=FAST)
    sup.start()
    try:
        with pytest.raises(EngineError, match="did not become ready within"):
            sup.wait_ready(20)
    finally:
        sup.stop()
    assert sup.history[0].returncode is not None  # it was stopped, not left running


def test_ready_timeout_scales_with_model_size() -> None:
    small = LaunchSpec(Path("x"), (), model_bytes=1_000_000)
    big = LaunchSpec(Path("x"), (), model_bytes=1_200 * 10**9)
    assert small.timeout() < 61
    assert big.timeout() > 60 * 60  # a 1.2 TB load gets over an hour
    assert LaunchSpec(Path("x"), (), ready_timeout=5).timeout() == 5


def test_bump_n_cpu_moe() -> None:
    args, why = bump_n_cpu_moe(["-m", "x", "--n-cpu-moe", "10"], n_layers=93) or ((), "")
    assert args == ("-m", "x", "--n-cpu-moe", "20")
    assert "10 -> 20" in why
    added = bump_n_cpu_moe(["-m", "x", "-ngl", "99"], n_layers=93)
    assert added is not None
    assert added[0][-2:] == ("--n-cpu-moe", "10")
    assert bump_n_cpu_moe(["-ncmoe", "90"], n_layers=93) == (
        ("-ncmoe", "93"),
        "re-planned after GPU out-of-memory: --n-cpu-moe 90 -> 93 "
        "(expert weights of 3 more layers kept in RAM)",
    )
    assert bump_n_cpu_moe(["--n-cpu-moe", "93"], n_layers=93) is None
    assert bump_n_cpu_moe(["--cpu-moe"]) is None
    unknown = bump_n_cpu_moe(["--n-cpu-moe=3"])
    assert unknown is not None
    assert unknown[0] == ("--n-cpu-moe", "7")


def test_load_progress_from_log_phases_dots_and_bytes() -> None:
    p = LoadProgressParser()
    assert p.feed_line(
        "0.00.004.176 I srv    load_model: loading model '/m/K3-00001-of-00009.gguf'"
    )
    assert (p.percent, p.phase) == (3, "opening the model")
    assert not p.feed_line("0.00.004.200 I some unrelated line")
    assert p.feed_line("0.00.018.311 I load_tensors: loading model tensors, this can take a while")
    assert p.feed_dots(50)
    assert p.percent == 12 + (78 - 12) * 50 // 100
    assert not p.feed_bytes(10 * 2**30, 330 * 2**30)  # behind the dots: no step back
    assert p.feed_bytes(300 * 2**30, 330 * 2**30)
    assert "300.0 GiB of 330.0 GiB" in p.phase
    assert p.feed_line("0.05.020.030 I llama_context: constructing llama_context")
    assert p.feed_line("0.05.040.000 I srv  llama_server: model loaded")
    assert p.percent == 97
    assert not p.feed_line("0.00.004.176 I srv    load_model: loading model 'x'")  # monotonic


def test_bytes_loaded_of_a_live_and_a_dead_process() -> None:
    assert bytes_loaded(os.getpid()) > 10 * 2**20
    assert bytes_loaded(2**22 + 12345) == 0  # no such process
