"""A SIGKILL from outside k3desk is blamed on the OOM killer only when the kernel's traces
say so: the kernel log naming the engine, its cgroup's ``oom_kill`` counter, the system's.
The readers run on a fake ``/sys`` + ``/proc`` tree and a fake kernel log."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from k3desk.core.engines.crash import classify_exit
from k3desk.core.engines.oom import OomWatch
from k3desk.core.engines.supervisor import LaunchSpec, RestartPolicy, Supervisor
from k3desk.core.errors import EngineError
from k3desk.core.paths import default_paths

PID = 4242
ONE_TRY = RestartPolicy(max_failures=1, backoff_initial=0.05, stop_grace=3.0)
NO_EVIDENCE = (
    "The engine was killed by a signal (SIGKILL) from outside k3desk; if memory was short, "
    "the operating system's out-of-memory killer is the usual cause."
)


@dataclasses.dataclass
class Tree:
    sys: Path
    proc: Path
    kmsg: Path
    events: Path  # the cgroup's counter file

    def watch(self, kernel_log: bool = True) -> OomWatch:
        return OomWatch(self.sys, self.proc, self.kmsg if kernel_log else None)

    def bump(self, path: Path | None = None) -> None:
        path = path or self.events
        lines = path.read_text().splitlines()
        path.write_text(
            "".join(
                f"oom_kill {int(x.split()[1]) + 1}\n" if x.startswith("oom_kill ") else x + "\n"
                for x in lines
            )
        )

    def log(self, line: str) -> None:
        with self.kmsg.open("a") as f:
            f.write(line + "\n")


def kernel_report(pid: int, name: str = "llama-server") -> list[str]:
    """The two lines Linux 6.x logs for one OOM kill, as /dev/kmsg records."""
    return [
        f"6,2001,81234567,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
        f"mems_allowed=0,global_oom,task_memcg=/user.slice,task={name},pid={pid},uid=1000",
        f"3,2002,81234568,-;Out of memory: Killed process {pid} ({name}) "
        "total-vm:431250412kB, anon-rss:20911404kB, file-rss:0kB, shmem-rss:0kB, UID:1000",
    ]


def make_tree(root: Path, cgroup: str) -> Tree:
    """``cgroup``: "v2" (0::/user.slice/k3desk.scope) or "v1" (a memory controller line)."""
    sys_root, proc = root / "sys", root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "vmstat").write_text("nr_free_pages 123\npgfault 99\noom_kill 7\n")
    if cgroup == "v2":
        (proc / "self" / "cgroup").write_text("0::/user.slice/k3desk.scope\n")
        events = sys_root / "fs/cgroup/user.slice/k3desk.scope/memory.events"
        events.parent.mkdir(parents=True)
        events.write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n")
    else:
        (proc / "self" / "cgroup").write_text(
            "9:pids:/docker/abc\n4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n"
        )
        events = sys_root / "fs/cgroup/memory/docker/abc/memory.oom_control"
        events.parent.mkdir(parents=True)
        events.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    kmsg = root / "kmsg"
    kmsg.write_text("6,1,100,-;Linux version 6.8.0\n")
    return Tree(sys_root, proc, kmsg, events)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return make_tree(tmp_path, "v2")


# ------------------------------------------------------------------ the readers


def test_the_kernel_log_naming_the_engine_is_the_evidence(tree: Tree) -> None:
    watch = tree.watch()
    before = watch.begin()
    for line in kernel_report(PID):
        tree.log(line)
    tree.bump()
    assert watch.evidence(before, PID) == (
        f"the kernel log says: Out of memory: Killed process {PID} (llama-server) "
        "total-vm:431250412kB, anon-rss:20911404kB, file-rss:0kB, shmem-rss:0kB, UID:1000"
    )


def test_only_what_the_kernel_logged_after_the_launch_counts(tree: Tree) -> None:
    for line in kernel_report(PID):  # an earlier process with the same pid, before the launch
        tree.log(line)
    watch = tree.watch()
    before = watch.begin()
    tree.bump()
    assert "kernel log" not in watch.evidence(before, PID)  # the counter, not the old line


@pytest.mark.parametrize("cgroup", ["v2", "v1"])
def test_the_cgroup_counter_going_up_is_the_evidence(tmp_path: Path, cgroup: str) -> None:
    tree = make_tree(tmp_path, cgroup)
    watch = tree.watch(kernel_log=False)
    assert watch.cgroup_events_file() == tree.events
    before = watch.begin()
    tree.bump()
    tree.bump(tree.proc / "vmstat")
    old = 1 if cgroup == "v2" else 0
    assert watch.evidence(before, PID) == (
        f"the oom_kill counter of its memory cgroup ({tree.events}) went from {old} to "
        f"{old + 1} while it ran"
    )


def test_the_system_counter_counts_when_the_cgroup_cannot_be_read(tree: Tree) -> None:
    tree.events.unlink()
    watch = tree.watch(kernel_log=False)
    before = watch.begin()
    tree.bump(tree.proc / "vmstat")
    assert watch.evidence(before, PID) == (
        f"the system's oom_kill counter ({tree.proc / 'vmstat'}) went from 7 to 8 while it ran"
    )


def test_a_cgroup_counter_that_did_not_move_rules_the_oom_killer_out(tree: Tree) -> None:
    watch = tree.watch()
    before = watch.begin()
    tree.bump(tree.proc / "vmstat")  # another process elsewhere on the machine
    assert watch.evidence(before, PID) == ""


def test_a_kernel_log_naming_only_other_processes_rules_it_out(tree: Tree) -> None:
    watch = tree.watch()
    before = watch.begin()
    for line in kernel_report(999, "chrome"):
        tree.log(line)
    tree.bump()
    assert watch.evidence(before, PID) == ""


def test_nothing_readable_is_no_evidence(tmp_path: Path) -> None:
    watch = OomWatch(tmp_path / "no-sys", tmp_path / "no-proc", tmp_path / "no-kmsg")
    before = watch.begin()
    assert before.cgroup is None
    assert before.system is None
    assert before.kernel_log is None
    assert watch.evidence(before, PID) == ""


# ------------------------------------------------------------------ the classification


def test_a_sigkill_is_blamed_on_the_oom_killer_only_with_evidence() -> None:
    sigkill = -int(signal.SIGKILL)
    plain = classify_exit(sigkill, ["load_tensors: ..."])
    assert plain.kind == "killed"
    assert plain.summary == NO_EVIDENCE
    assert plain.recovery == "restart"
    assert plain.describe() == NO_EVIDENCE.rstrip(".")  # "(SIGKILL)" is said once
    assert plain.fix.startswith("If memory was short, leave more RAM free")

    seen = "the kernel log says: Out of memory: Killed process 4242 (llama-server)"
    sure = classify_exit(sigkill, [], oom_evidence=seen)
    assert sure.kind == "oom_killed"
    assert sure.summary == f"The operating system's out-of-memory killer ended the engine ({seen})."
    assert sure.describe().endswith("(SIGKILL)")
    assert sure.evidence == seen
    assert sure.recovery == "restart"
    # a SIGKILL k3desk sent itself is neither
    assert classify_exit(sigkill, [], stopped_by_us=True).kind == "exited"


# ------------------------------------------------------------------ through the supervisor


def supervise_once(exe: Path, watch: OomWatch, tmp_path: Path) -> Supervisor:
    spec = LaunchSpec(exe, ("-m", str(tmp_path / "model.gguf")))
    sup = Supervisor(spec, default_paths(), policy=ONE_TRY, oom_watch=watch)
    sup.start()
    with pytest.raises(EngineError):
        sup.wait_ready(30)
    sup.stop()
    return sup


def test_the_supervisor_names_the_oom_killer_from_the_kernel_log(
    fake_engine: Callable[..., Path], tree: Tree, tmp_path: Path
) -> None:
    exe = fake_engine("oom_killer", FAKE_OOM_EVENTS=str(tree.events), FAKE_KMSG=str(tree.kmsg))
    sup = supervise_once(exe, tree.watch(), tmp_path)
    (attempt,) = sup.history
    assert attempt.returncode == -signal.SIGKILL
    assert attempt.crash is not None
    assert attempt.crash.kind == "oom_killed"
    assert (
        f"the kernel log says: Out of memory: Killed process {attempt.pid} (llama-server)"
        in attempt.crash.summary
    )


def test_the_supervisor_names_the_oom_killer_from_the_cgroup_counter(
    fake_engine: Callable[..., Path], tree: Tree, tmp_path: Path
) -> None:
    exe = fake_engine("oom_killer", FAKE_OOM_EVENTS=str(tree.events))
    sup = supervise_once(exe, tree.watch(kernel_log=False), tmp_path)
    crash = sup.history[0].crash
    assert crash is not None
    assert crash.kind == "oom_killed"
    assert f"its memory cgroup ({tree.events}) went from 1 to 2" in crash.summary


def test_without_evidence_the_supervisor_says_killed_from_outside(
    fake_engine: Callable[..., Path], tree: Tree, tmp_path: Path
) -> None:
    # the same death, but the kernel's counters did not move: not the OOM killer
    sup = supervise_once(fake_engine("oom_killer"), tree.watch(), tmp_path)
    crash = sup.history[0].crash
    assert crash is not None
    assert crash.kind == "killed"
    assert crash.summary == NO_EVIDENCE
    assert sup.last_crash is not None
    assert "out-of-memory killer ended" not in sup.last_crash.describe()
