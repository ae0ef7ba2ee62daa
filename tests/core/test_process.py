"""The one owner of child processes: real processes, real signals, a parent killed with -9."""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from k3desk.core.process import has_pdeathsig, pump, run, spawn
from tests.processes import gone_within as gone

REPO = Path(__file__).resolve().parents[2]


def wait_for_lines(path: Path, n: int, within: float = 20.0) -> list[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().split()
            if len(lines) >= n:
                return lines
        time.sleep(0.05)
    raise AssertionError(f"{path} did not get {n} lines")


def test_stop_sends_term_then_kill_to_the_whole_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # a leader that ignores SIGTERM, and a grandchild it started
    script = f"trap '' TERM; sleep 300 & echo $! > {pids}; echo $$ >> {pids}; wait"
    child = spawn(["sh", "-c", script], stdout=subprocess.DEVNULL)
    grandchild, leader = map(int, wait_for_lines(pids, 2))
    t0 = time.monotonic()
    rc = child.stop(0.5)
    took = time.monotonic() - t0
    assert rc == -signal.SIGKILL  # TERM was ignored, KILL ended it
    assert 0.4 < took < 5
    assert gone(leader, 2)
    assert gone(grandchild, 2)
    assert child.stop(0.5) == rc  # idempotent
    assert not child.signal_group(signal.SIGTERM)  # the group is released, never signalled


def test_a_child_that_honours_term_gets_its_grace(tmp_path: Path) -> None:
    child = spawn(["sleep", "300"], stdout=subprocess.DEVNULL)
    t0 = time.monotonic()
    assert child.stop(10.0) == -signal.SIGTERM
    assert time.monotonic() - t0 < 5


def test_ctrl_c_in_the_terminal_does_not_reach_the_child() -> None:
    child = spawn(["sleep", "300"], stdout=subprocess.DEVNULL)
    try:
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
        assert os.getsid(child.pid) == child.pid
    finally:
        child.stop(1.0)


def test_pump_splits_lines_and_hands_over_a_partial_tail() -> None:
    child = spawn(
        [sys.executable, "-c", "import sys; sys.stdout.write('a\\r\\nb\\n...'); sys.stdout.flush()"]
    )
    lines: list[str] = []
    chunks: list[bytes] = []
    partials: list[bytes] = []

    def partial(data: bytes) -> bool:
        partials.append(data)
        return data == b"..."

    assert child.stdout is not None
    pump(child.stdout, lines.append, on_chunk=chunks.append, on_partial=partial)
    child.stop(1.0)
    assert lines == ["a", "b"]
    assert b"".join(chunks) == b"a\r\nb\n..."
    assert partials[-1] == b"..."


PARENT = textwrap.dedent(
    """
    import sys, time
    from k3desk.core.process import spawn
    child = spawn(["sh", "-c", sys.argv[2]], guard_group=sys.argv[1] == "guard")
    print(child.pid, flush=True)
    time.sleep(300)
    """
)


@pytest.mark.parametrize("guard", ["guard", "plain"])
def test_a_parent_killed_with_sigkill_leaves_nothing(tmp_path: Path, guard: str) -> None:
    """PDEATHSIG takes the direct child; the watchdog takes the rest of its group."""
    if guard == "plain" and not has_pdeathsig():
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; echo $$ >> {pids}; wait"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, guard, script],
        stdout=subprocess.DEVNULL,
        cwd=REPO,
        start_new_session=True,
    )
    started: list[int] = []
    try:
        started += map(int, wait_for_lines(pids, 2))
        grandchild, leader = started
        parent.kill()
        parent.wait()
        assert gone(leader, 5)
        if guard == "guard":
            assert gone(grandchild, 10)
    finally:
        for pid in started:  # the plain case leaves the grandchild: PDEATHSIG ends one process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


BUILD_PARENT = textwrap.dedent(
    """
    import os, sys
    from k3desk.core.engines.install import choose_build, install_engine
    from k3desk.core.hardware.profile import CpuInfo, HardwareProfile, MemoryInfo
    from k3desk.core.paths import default_paths
    cpu = CpuInfo("Xeon", 8, 4, 8, flags=frozenset({"avx2"}))
    hw = HardwareProfile(cpu, MemoryInfo(64 << 30, 60 << 30, 0), ())
    cfg = choose_build(hw, None, machine="x86_64")
    install_engine(default_paths(), cfg, command=sys.argv[1:])
    """
)


def test_a_killed_app_leaves_no_compiler_running(tmp_path: Path) -> None:
    """kill -9 of a process that runs an engine build: the build and its compiler end."""
    pidfile = tmp_path / "compiler.pid"
    env = {
        **os.environ,
        "FAKE_BUILD_MODE": "slow",
        "FAKE_BUILD_PIDFILE": str(pidfile),
        "PYTHONPATH": str(REPO),
    }
    fake = [sys.executable, str(REPO / "tests" / "fakes" / "fake_build.py"), "--target", "{target}"]
    app = subprocess.Popen(
        [sys.executable, "-c", BUILD_PARENT, *fake], env=env, start_new_session=True
    )
    try:
        compiler = int(wait_for_lines(pidfile, 1)[0])
        children = psutil.Process(app.pid).children()
        builds = [p.pid for p in children if "fake_build" in " ".join(p.cmdline())]
        assert builds, "the build runs as a child of the app"
        app.kill()
        app.wait()
        assert gone(builds[0], 5)
        assert gone(compiler, 10)
    finally:
        if app.poll() is None:
            app.kill()


def test_run_collects_the_output_and_the_exit_status() -> None:
    done = run(["sh", "-c", "echo out; echo err >&2; printf '\\377'; exit 3"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n\ufffd", "err\n")
    merged = run(["sh", "-c", "echo out; echo err >&2"], timeout=30, merge_stderr=True)
    assert merged.stdout.split() == ["out", "err"]
    assert merged.stderr == ""
    with pytest.raises(FileNotFoundError):
        run(["/nonexistent/k3desk-tool", "--version"], timeout=30)


def test_a_command_past_its_time_limit_leaves_nothing_behind(tmp_path: Path) -> None:
    """A short command that hangs (an engine's --version, a git query) is stopped with
    everything it started; subprocess.run would kill the leader and leave the rest."""
    from k3desk.core.engines.probe import _run as probe_run

    pids = tmp_path / "pids"
    script = f"echo started; sleep 300 & echo $! > {pids}; wait"
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run(["sh", "-c", script], timeout=1.0)
    assert caught.value.stdout == "started\n"
    assert gone(int(wait_for_lines(pids, 1)[0]), 5)
    pids.unlink()
    # the engine probe's --version / --help / --list-devices go through it
    assert probe_run(["sh", "-c", script], 1.0) == (None, "started\n", "")
    assert gone(int(wait_for_lines(pids, 1)[0]), 5)


FLOOD = "import sys; sys.stdout.buffer.write(b'x' * 50_000_000); print('err', file=sys.stderr)"


def test_run_keeps_a_bounded_output_and_counts_the_rest() -> None:
    """Every short run holds at most OUTPUT_LIMIT bytes a stream, however much is printed."""
    from k3desk.core.process import OUTPUT_LIMIT

    done = run([sys.executable, "-c", FLOOD], timeout=60)
    assert (done.returncode, len(done.stdout), done.stderr) == (0, OUTPUT_LIMIT, "err\n")
    assert done.discarded == 50_000_000 - OUTPUT_LIMIT
    assert not done.cut_off
    cut = run([sys.executable, "-c", FLOOD], timeout=60, end_past_limit=True)
    assert cut.cut_off
    assert len(cut.stdout) == OUTPUT_LIMIT


LEAVER = """
import os, sys, time
if os.fork() == 0:
    os.setpgid(0, 0) if sys.argv[1] == "group" else os.setsid()
    if sys.argv[1] == "group":
        os.close(1); os.close(2)
    time.sleep(300)
print("done")
"""


@pytest.mark.parametrize("how", ["group", "session"])
def test_run_ends_what_a_command_left_running_and_says_so(how: str) -> None:
    """A job put in a group of its own (killpg misses it), or a daemon that left the
    session keeping the output pipe (a wait for the end of output would hang)."""
    t0 = time.monotonic()
    done = run([sys.executable, "-c", LEAVER, how], timeout=60)
    assert time.monotonic() - t0 < 10
    assert done.stdout == "done\n"
    assert len(done.left_running) == 1
    assert gone(done.left_running[0], 5)


# Where a program may be started from: the one owner, and the node probe, which runs on
# another machine with the standard library alone and has its own bounded runner (its
# test: tests/core/cluster/test_node_probe_run.py).  k3desk/devtools is not the app: the
# developers' benchmarks, which no shell or core module imports.
STARTERS = {"k3desk/core/process.py", "k3desk/core/cluster/node_probe.py"}
STARTING_CALLS = {
    ("subprocess", "run"), ("subprocess", "Popen"), ("subprocess", "call"),
    ("subprocess", "check_call"), ("subprocess", "check_output"), ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"), ("os", "system"), ("os", "popen"), ("os", "fork"),
    ("os", "posix_spawn"), ("os", "posix_spawnp"), ("os", "execv"), ("os", "execvp"),
    ("os", "execve"), ("os", "spawnv"), ("asyncio", "create_subprocess_exec"),
    ("asyncio", "create_subprocess_shell"), ("QProcess", "start"), ("QProcess", "startDetached"),
}  # fmt: skip


def starts_a_program(path: Path) -> list[str]:
    """The lines of ``path`` that call a program-starting function by its module's name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and (owner.id, node.func.attr) in STARTING_CALLS:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {owner.id}.{node.func.attr}")
    return found


def test_every_child_process_starts_through_core_process() -> None:
    """k3desk/core/process.py is the one place a child is started (own session, bounded
    output, ended with k3desk, what it left running ended): no other module of the app
    calls subprocess, os.system, fork/exec or QProcess itself."""
    found = []
    for path in sorted((REPO / "k3desk").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in STARTERS or rel.startswith("k3desk/devtools/"):
            continue
        found += starts_a_program(path)
    assert found == []
    # the check sees a start where there is one
    assert starts_a_program(REPO / "k3desk" / "core" / "process.py")
