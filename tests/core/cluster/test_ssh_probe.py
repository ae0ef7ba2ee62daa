"""Probing nodes through a real sshd: hardware, engines, the model copy, failures."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from k3desk.core.cluster.nodes import Cluster, ClusterError, ClusterStore
from k3desk.core.cluster.probe import ShardSetSpec, probe_cluster, probe_node
from k3desk.core.cluster.ssh import RemoteProcess, SshClient, SshError
from k3desk.core.paths import default_paths
from tests.fixtures.sshd import SshServer


def known_hosts() -> Path:
    return ClusterStore(default_paths()).known_hosts


def test_run_a_command_and_learn_the_host_key(sshd: SshServer) -> None:
    node = sshd.node("plain")
    kh = known_hosts()
    assert not kh.exists()
    out = SshClient(node, kh).run("echo hello; echo oops >&2; exit 3")
    assert (out.returncode, out.text, out.error_text) == (3, "hello\n", "oops")
    # accept-new wrote the node's key into k3desk's own file
    host_key = (sshd.root / "host_ed25519.pub").read_text().split()[1]
    assert kh.read_text().split()[1:] == ["ssh-ed25519", host_key]


def test_a_wrong_key_is_refused_with_a_clear_message(sshd: SshServer, tmp_path: Path) -> None:
    import subprocess

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    node = sshd.node("wrongkey", identity=str(other))
    with pytest.raises(SshError) as err:
        SshClient(node, known_hosts()).run("true")
    assert "refused the SSH login" in err.value.message
    assert "never a password" in err.value.hint


def test_nothing_listening_is_reported(sshd: SshServer) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = sshd.node("closed", port=port)
    with pytest.raises(SshError, match="connection refused"):
        SshClient(node, known_hosts(), connect_timeout=3).run("true")


def test_changed_host_key_is_refused(sshd: SshServer) -> None:
    node = sshd.node("hk")
    kh = known_hosts()
    kh.parent.mkdir(parents=True, exist_ok=True)
    # a different key recorded for this host:port = a man in the middle, or a reinstall
    kh.write_text(
        f"[127.0.0.1]:{sshd.port} ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ\n"
    )
    with pytest.raises(SshError, match="does not match"):
        SshClient(node, kh).run("true")


def test_remote_process_streams_reports_pid_and_stops(sshd: SshServer, tmp_path: Path) -> None:
    node = sshd.node("rp")
    lines: list[str] = []
    ended: list[str] = []
    proc = RemoteProcess(
        SshClient(node, known_hosts()),
        ["sh", "-c", 'echo "started in $(pwd) with $K3_X"; exec sleep 60'],
        name="sleeper",
        env={"K3_X": "42"},
        cwd=node.workdir,
        log_path=tmp_path / "sleeper.log",
        on_line=lambda p, line: lines.append(line),
        on_exit=lambda p: ended.append(p.describe_exit()),
    ).start()
    pid = proc.wait_started(15)
    assert proc.wait_for_line(r"started in", 15)
    assert lines == [f"started in {node.workdir} with 42"]
    os.kill(pid, 0)  # the program runs on the "node" (this machine)
    t0 = time.monotonic()
    proc.stop()
    assert time.monotonic() - t0 < 5
    assert ended
    assert "killed by SIGTERM" in ended[0]
    assert not _pid_alive(pid, 2.5)  # the node-side wrapper ended it
    assert "started in" in (tmp_path / "sleeper.log").read_text()


def test_remote_death_is_noticed_at_once(sshd: SshServer) -> None:
    node = sshd.node("rd")
    ended: list[float] = []
    proc = RemoteProcess(
        SshClient(node, known_hosts()),
        ["sleep", "60"],
        name="victim",
        cwd=node.workdir,
        on_exit=lambda p: ended.append(time.monotonic()),
    ).start()
    pid = proc.wait_started(15)
    t0 = time.monotonic()
    os.kill(pid, 9)
    assert proc.wait(5)
    assert ended
    assert ended[0] - t0 < 2
    assert proc.describe_exit() == "killed by SIGKILL (exit 137)"


def test_a_lost_connection_ends_the_remote_program(sshd: SshServer) -> None:
    node = sshd.node("lost")
    proc = RemoteProcess(
        SshClient(node, known_hosts()), ["sleep", "60"], name="orphan", cwd=node.workdir
    ).start()
    pid = proc.wait_started(15)
    assert proc.local_pid is not None
    os.kill(proc.local_pid, 9)  # the local ssh client dies (k3desk killed, laptop asleep ...)
    assert proc.wait(5)
    assert "ssh" in proc.describe_exit()
    assert not _pid_alive(pid, 3)  # the node-side wrapper saw its stdin close


def test_tied_processes_end_with_the_thread_that_started_them(sshd: SshServer) -> None:
    import threading

    node = sshd.node("tied")
    holder: list[RemoteProcess] = []

    def starter() -> None:
        holder.append(
            RemoteProcess(
                SshClient(node, known_hosts()),
                ["sleep", "60"],
                name="tied",
                cwd=node.workdir,
                tie_to_thread=True,
            ).start()
        )
        holder[0].wait_started(15)

    t = threading.Thread(target=starter)
    t.start()
    t.join()
    pid = holder[0].remote_pid
    assert pid is not None
    assert holder[0].wait(5)  # the kernel killed ssh when its thread ended ...
    assert not _pid_alive(pid, 3)  # ... and the program on the node went with it


def test_a_missing_program_is_named(sshd: SshServer) -> None:
    node = sshd.node("nf")
    proc = RemoteProcess(
        SshClient(node, known_hosts()),
        ["/nonexistent/kimi_k3_dist_generate"],
        name="x",
        cwd=node.workdir,
    ).start()
    assert proc.wait(15)
    assert "was not found on the node" in proc.describe_exit()


def _pid_alive(pid: int, within: float) -> bool:
    """True if ``pid`` still exists after ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.05)
    return True


def _write_set(folder: Path, names: list[str], expert_ff: int = 1536) -> list[Path]:
    from tests.core.cluster.twin import write_recipe_twin

    return write_recipe_twin(folder, names, expert_feed_forward_length=expert_ff)


def test_probe_reads_hardware_engines_and_the_copy(sshd: SshServer) -> None:
    spec = ShardSetSpec(
        names=tuple(f"K3-Test-{i:05d}-of-00003.gguf" for i in range(1, 4)),
        expert_count=896,
        expert_feed_forward_length=1536,
    )
    good = sshd.node("good", python="/usr/bin/python3", k3desk="k3desk-not-installed")
    _write_set(Path(good.model_path), list(spec.names))
    report = probe_node(good, known_hosts(), spec=spec)
    assert report.ok, report.error
    assert report.method == "python"
    assert report.note == "k3desk-not-installed is not installed on the node"
    hw = report.hardware
    assert hw is not None
    assert hw.memory.total > 0
    assert hw.cpu.logical_cores >= 1
    assert hw.disk is not None
    assert hw.disk.probed_path == good.model_path
    assert report.copy is not None
    assert report.copy.complete, report.copy
    assert report.copy.expert_count == 896
    assert report.copy.expert_feed_forward_length == 1536
    assert report.copy.geometry_matches(spec) is True


def test_probe_uses_k3desk_doctor_and_validate_when_installed(sshd: SshServer) -> None:
    from k3desk.devtools.tinyk3 import write_tiny_k3

    repo = Path(__file__).resolve().parents[3]
    k3 = f"env PYTHONPATH={repo} {sys.executable} -m k3desk"
    node = sshd.node("withk3", k3desk=k3)
    tiny = write_tiny_k3(node.model_path, shards=3)
    spec = ShardSetSpec(names=tuple(p.name for p in tiny.parts))
    report = probe_node(node, known_hosts(), spec=spec)
    assert report.ok, report.error
    assert report.method == "k3desk doctor", report.note
    assert report.hardware is not None
    assert report.hardware.memory.total > 0
    assert report.copy is not None
    assert report.copy.complete, report.copy.problems
    assert report.copy.validated_by_k3desk
    # a header-only twin passes the header check but not k3desk's full validation
    twin = sshd.node("withk3-twin", k3desk=k3)
    names = [f"K3-Test-{i:05d}-of-00003.gguf" for i in range(1, 4)]
    _write_set(Path(twin.model_path), names)
    rep = probe_node(twin, known_hosts(), spec=ShardSetSpec(names=tuple(names)))
    assert rep.copy is not None
    assert not rep.copy.complete
    assert rep.copy.problems[-1].startswith("k3desk validate on the node: ")


def test_probe_finds_broken_copies(sshd: SshServer) -> None:
    names = [f"K3-Test-{i:05d}-of-00003.gguf" for i in range(1, 4)]
    spec = ShardSetSpec(names=tuple(names))
    missing = sshd.node("missing")
    files = _write_set(Path(missing.model_path), names)
    files[1].unlink()
    truncated = sshd.node("truncated")
    files = _write_set(Path(truncated.model_path), names)
    with files[2].open("r+b") as f:
        f.truncate(files[2].stat().st_size - 100)
    swapped = sshd.node("swapped")
    files = _write_set(Path(swapped.model_path), names)
    files[0].rename(files[0].with_suffix(".tmp"))
    files[1].rename(files[0])
    files[0].with_suffix(".tmp").rename(files[1])
    empty = sshd.node("empty", model_path="/nonexistent/k3")
    cluster = Cluster("broken", (missing, truncated, swapped, empty))
    reports = probe_cluster(cluster, known_hosts(), spec=spec)
    by = {r.node.name: r.copy for r in reports}
    assert all(c is not None and not c.complete for c in by.values())
    assert by["missing"] is not None
    assert by["missing"].problems == (f"{names[1]} is missing",)
    assert by["truncated"] is not None
    assert "is truncated" in by["truncated"].problems[0]
    assert by["swapped"] is not None
    assert "is part 2, expected part 1" in by["swapped"].problems[0]
    assert by["empty"] is not None
    assert "does not exist" in by["empty"].problems[0]


def test_probe_checks_sha256_and_total_size(sshd: SshServer) -> None:
    import hashlib

    names = [f"K3-Test-{i:05d}-of-00002.gguf" for i in range(1, 3)]
    node = sshd.node("hash")
    files = _write_set(Path(node.model_path), names)
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    total = sum(p.stat().st_size for p in files)
    spec = ShardSetSpec(names=tuple(names), total_bytes=total, sha256=digests)
    ok = probe_node(node, known_hosts(), spec=spec, check_sha256=True)
    assert ok.copy is not None
    assert ok.copy.complete
    assert ok.copy.sha256_checked
    with files[1].open("r+b") as f:  # flip one byte inside the tensor data
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 0xFF]))
    bad = probe_node(node, known_hosts(), spec=spec, check_sha256=True)
    assert bad.copy is not None
    assert not bad.copy.complete
    assert "does not match the publisher's" in bad.copy.problems[0]
    wrong_total = ShardSetSpec(names=tuple(names), total_bytes=total + 1)
    rep = probe_node(node, known_hosts(), spec=wrong_total)
    assert rep.copy is not None
    assert "add up to" in rep.copy.problems[-1]


def test_unreachable_nodes_do_not_hide_the_others(sshd: SshServer) -> None:
    good = sshd.node("up")
    down = sshd.node("down", port=1)
    reports = probe_cluster(Cluster("mixed", (good, down)), known_hosts(), connect_timeout=3)
    assert [r.ok for r in reports] == [True, False]
    assert "connection refused" in reports[1].error


def test_copies_are_checked_against_this_machines_download_record(sshd: SshServer) -> None:
    import hashlib

    from k3desk.core.hub.model import RemoteFile
    from k3desk.core.hub.state import TargetState

    names = [f"K3-Test-{i:05d}-of-00002.gguf" for i in range(1, 3)]
    local = sshd.root / "local-download"
    files = _write_set(local / "UD-IQ1_S", names)
    remote_files = tuple(
        RemoteFile(f"UD-IQ1_S/{p.name}", p.stat().st_size,
                   hashlib.sha256(p.read_bytes()).hexdigest(), "0" * 40)
        for p in files
    )  # fmt: skip
    TargetState(local).record_listing("k", "someone/K3", "c0ffee", "https://hub", remote_files)
    spec = ShardSetSpec(tuple(names)).with_download_record(local)
    assert spec.sizes == {p.name: p.stat().st_size for p in files}
    node = sshd.node("record")
    node_files = _write_set(Path(node.model_path), names)
    ok = probe_node(node, known_hosts(), spec=spec, check_sha256=True)
    assert ok.copy is not None
    assert ok.copy.complete
    assert ok.copy.sha256_checked
    with node_files[0].open("ab") as f:
        f.write(b"\0" * 8)  # a different file of the same shape
    bad = probe_node(node, known_hosts(), spec=spec, check_sha256=False)
    assert bad.copy is not None
    assert "the publisher lists" in bad.copy.problems[0]
    with pytest.raises(ClusterError, match="has no download record for"):
        ShardSetSpec(("Other-00001-of-00001.gguf",)).with_download_record(local)
