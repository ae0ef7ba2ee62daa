"""Recovery that recovers: every restart changes the command or waits for a reason, a
"re-plan" that changes nothing is not one, and what is printed after a restart is true."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import psutil
import pytest

from k3desk.core.engines.crash import CrashReport
from k3desk.core.engines.supervisor import LaunchSpec, RestartPolicy, Supervisor
from k3desk.core.errors import EngineError
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel
from tests.conftest import REPO
from tests.hostile.conftest import bounded, k3desk_env, no_traceback, run_k3desk
from tests.processes import LineReader

FAST = RestartPolicy(backoff_initial=0.05, backoff_max=0.2, stop_grace=3.0)


def test_a_replan_that_gives_the_same_command_is_not_a_replan(
    fake_engine: Callable[..., Path], tmp_path: Path
) -> None:
    def same(crash: CrashReport, args: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
        return args, "re-planned after GPU out-of-memory: --n-cpu-moe 0 -> 1"

    spec = LaunchSpec(fake_engine("gpu_oom"), ("-m", str(tmp_path / "m.gguf"), "-c", "512"))
    with Supervisor(spec, default_paths(), policy=FAST, replan=same) as sup:
        sup.start()
        run = bounded(lambda: sup.wait_ready(60), 60)
    assert isinstance(run.error, EngineError)
    assert "ran out of memory" in run.error.message
    assert len(sup.history) == 1
    assert sup.history[0].action == (
        "gave up: re-planning left the command unchanged, so it would fail again"
    )


def test_serve_on_a_cpu_plan_does_not_rerun_the_same_failing_command(
    fake_engine: Callable[..., Path],
    tiny_k3: TinyModel,
    hardware_file: Callable[[str], Path],
) -> None:
    shard = tiny_k3.first_part
    exe = fake_engine("gpu_oom", FAKE_OOM_MODEL=str(shard))  # its probe canary still loads
    t0 = time.monotonic()
    r = run_k3desk(
        "serve",
        shard,
        "--engine",
        exe,
        "--hardware",
        hardware_file("no-gpu-laptop-32GB"),
        timeout=120,
    )
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 1, out + err
    no_traceback(r.stderr)
    attempts = re.findall(r"^attempt (\d+): starting", out, re.MULTILINE)
    assert attempts == ["1"], out
    assert "--n-cpu-moe 0 -> 1" not in out
    assert "gave up: no plan with less GPU memory is left" in out
    assert "ran out of memory" in err
    assert time.monotonic() - t0 < 60


def test_serve_after_a_restart_prints_the_new_engine_and_its_own_start(
    fake_engine: Callable[..., Path],
    tiny_k3_single: TinyModel,
    hardware_file: Callable[[str], Path],
) -> None:
    argv = ["serve", str(tiny_k3_single.first_part), "--engine", str(fake_engine("serve"))]
    argv += ["--hardware", str(hardware_file("no-gpu-laptop-32GB"))]
    with subprocess.Popen(
        [sys.executable, "-m", "k3desk", *argv],
        cwd=REPO,
        # a serve that stops talking is made to show where each of its threads waits
        env=k3desk_env(PYTHONFAULTHANDLER="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        out = LineReader(proc.stdout)

        def stuck(why: str) -> NoReturn:
            proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:  # stuck even for that: its words still count
                proc.kill()
            pytest.fail(f"serve {why}:\n{out.text(5)}")

        def until(pattern: str) -> re.Match[str]:
            m = out.until(pattern, 60)
            if m is None:
                stuck(f"printed no line matching {pattern!r}")
            return m

        try:
            first = int(until(r"Engine pid: (\d+)").group(1))
            time.sleep(1.0)  # a moment of uptime that the next start must not count
            os.kill(first, signal.SIGKILL)
            again = until(r"Ready again in ([\d.]+) s \(attempt 2\)")
            second = int(until(r"Engine pid: (\d+)").group(1))
            assert second not in (0, first)
            assert "fake_llama_server.py" in " ".join(psutil.Process(second).cmdline())
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:  # shown, not left to hang the suite
                    stuck("did not end within 30 s of SIGTERM")
    assert float(again.group(1)) < 5.0  # its own start, not the time since serve began


def test_a_stop_signal_handled_inside_a_finalizer_still_stops_serve(
    fake_engine: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM handled while a finalizer runs in serve's main thread (a ``__del__``, such
    as that of the engine's Popen a restart dropped) stops serve cleanly all the same:
    an exception raised by the handler there is only printed as "ignored", and serve went
    on until a second signal."""
    from k3desk.cli.serve import _foreground

    in_finalizer = threading.Event()

    class Dropped:
        def __del__(self) -> None:
            in_finalizer.set()
            time.sleep(1.0)  # the signal is handled while this runs

    class Serving(Supervisor):
        dropped: Dropped | None = None

        def wait_stopped(self, timeout: float | None = None) -> bool:
            if self.endpoint is not None and not in_finalizer.is_set():
                self.dropped = Dropped()
                self.dropped = None  # its finalizer runs here, in the main thread
            return super().wait_stopped(timeout)

    spec = LaunchSpec(fake_engine("serve"), ("-m", str(tmp_path / "m.gguf"), "-c", "512"))
    sup = Serving(spec, default_paths(), policy=FAST)

    def term() -> None:
        if in_finalizer.wait(60):
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=term, daemon=True).start()
    ended = threading.Timer(30, sup.stop)  # where the signal is lost: serve ends on this
    ended.start()
    try:
        t0 = time.monotonic()
        code = _foreground(sup)
    except EngineError as e:
        pytest.fail(f"serve went on after SIGTERM until its engine was stopped: {e.message}")
    finally:
        ended.cancel()
        sup.stop()
    err = capsys.readouterr().err
    assert code == 0
    assert "Stopping ..." in err
    assert "Stopped." in err
    assert time.monotonic() - t0 < 20
    assert [a.number for a in sup.history] == [1]
    assert not psutil.pid_exists(sup.history[0].pid)  # the engine was stopped with it
