"""Did the kernel's out-of-memory killer end a process?  Read the kernel's own traces.

A SIGKILL k3desk did not send is often the OOM killer, but not always: a person's
``kill -9``, a container runtime or a service manager send it too.  Only the kernel
knows, and it leaves traces that :class:`OomWatch` reads where they are readable:

* the kernel log (``/dev/kmsg``; root or CAP_SYSLOG), whose OOM report names the
  killed process: ``Out of memory: Killed process 4242 (llama-server) ...``;
* the ``oom_kill`` counter of the memory cgroup k3desk and the engine run in:
  cgroup v2 ``memory.events`` or cgroup v1 ``memory.oom_control`` (Linux 4.13+);
* the system-wide ``oom_kill`` counter in ``/proc/vmstat`` (Linux 4.13+).

:meth:`OomWatch.begin` notes the counters and the end of the kernel log before a
launch; :meth:`OomWatch.evidence` says after the exit what, if anything, shows
that the OOM killer ended the process.  The roots of ``/sys`` and ``/proc`` and the
kernel log's path are parameters, so tests hand it a fake tree.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")
_OOM_KILL_TASK = re.compile(r"oom-kill:.*\bpid=(\d+)\b")
_MAX_KERNEL_LOG = 4 * 1024 * 1024  # bytes of new kernel log read after an exit, at most


@dataclass
class OomSnapshot:
    """What :meth:`OomWatch.begin` saw before a launch."""

    cgroup: int | None = None  # oom_kill of the memory cgroup
    cgroup_file: Path | None = None  # the file it was read from
    system: int | None = None  # /proc/vmstat oom_kill
    kernel_log: int | None = field(default=None, repr=False)  # fd at the log's end

    def close(self) -> None:
        fd, self.kernel_log = self.kernel_log, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class OomWatch:
    """Reads the OOM killer's traces (see the module docstring)."""

    def __init__(
        self,
        sys_root: Path = Path("/sys"),
        proc_root: Path = Path("/proc"),
        kernel_log: Path | None = Path("/dev/kmsg"),
    ) -> None:
        self.sys_root = sys_root
        self.proc_root = proc_root
        self.kernel_log = kernel_log

    # ------------------------------------------------------------ public
    def begin(self) -> OomSnapshot:
        """The counters now, and a position at the end of the kernel log (when readable).

        Call before the launch; the engine inherits k3desk's cgroup.  Close the
        snapshot (or pass it to :meth:`evidence`, which closes it) when done.
        """
        path = self.cgroup_events_file()
        return OomSnapshot(
            cgroup=_read_counter(path) if path is not None else None,
            cgroup_file=path,
            system=_read_counter(self.proc_root / "vmstat"),
            kernel_log=self._open_kernel_log(),
        )

    def evidence(self, before: OomSnapshot, pid: int) -> str:
        """What shows that the OOM killer ended ``pid`` since ``before`` ("" = nothing does).

        The kernel log naming ``pid`` is the strongest sign, then the cgroup's counter,
        then the system's.  What rules it out: a readable cgroup counter that did not
        move (the kernel counts there every OOM kill of a process in the cgroup), the
        system counter not moving when the cgroup's cannot be read, or a kernel log
        naming the processes the OOM killer ended without this one.
        """
        try:
            vmstat = self.proc_root / "vmstat"
            cgroup_after = _read_counter(before.cgroup_file) if before.cgroup_file else None
            system_after = _read_counter(vmstat)
            cgroup_known = before.cgroup is not None and cgroup_after is not None
            system_known = before.system is not None and system_after is not None
            if cgroup_known:
                if not _rose(before.cgroup, cgroup_after):
                    return ""
            elif system_known and not _rose(before.system, system_after):
                return ""
            ours, others = self._kernel_report(before, pid)
            if ours:
                return f"the kernel log says: {ours}"
            if others:
                return ""
            if cgroup_known:
                return (
                    f"the oom_kill counter of its memory cgroup ({before.cgroup_file}) went "
                    f"from {before.cgroup} to {cgroup_after} while it ran"
                )
            if system_known:
                return (
                    f"the system's oom_kill counter ({vmstat}) went from {before.system} to "
                    f"{system_after} while it ran"
                )
            return ""
        finally:
            before.close()

    def cgroup_events_file(self) -> Path | None:
        """The file holding this process's memory cgroup ``oom_kill`` counter, if any."""
        try:
            lines = (self.proc_root / "self" / "cgroup").read_text().splitlines()
        except OSError:
            return None
        mount = self.sys_root / "fs" / "cgroup"
        candidates: list[Path] = []
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            controllers, rel = parts[1], parts[2].strip().lstrip("/")
            if controllers == "":  # cgroup v2: 0::/path
                candidates += [mount / rel / "memory.events", mount / "memory.events"]
            elif "memory" in controllers.split(","):  # cgroup v1: N:memory:/path
                base = mount / controllers
                candidates += [base / rel / "memory.oom_control", base / "memory.oom_control"]
        for path in candidates:
            if _read_counter(path) is not None:
                return path
        return None

    # ------------------------------------------------------------ internals
    def _open_kernel_log(self) -> int | None:
        if self.kernel_log is None:
            return None
        try:
            fd = os.open(self.kernel_log, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # not there, or not allowed (dmesg_restrict without CAP_SYSLOG)
            return None
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            os.close(fd)
            return None
        return fd

    def _kernel_report(self, before: OomSnapshot, pid: int) -> tuple[str, int]:
        """(the kernel's OOM line naming ``pid``, how many other processes it reports
        killed), logged since ``before``; ("", 0) when the log cannot be read."""
        fd = before.kernel_log
        if fd is None:
            return "", 0
        chunks: list[bytes] = []
        size = 0
        while size < _MAX_KERNEL_LOG:
            try:
                data = os.read(fd, 65536)  # /dev/kmsg: one record per read
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten while we were away: go on
                continue
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
            size += len(data)
        ours = ""
        others: set[int] = set()
        for raw in b"".join(chunks).decode("utf-8", "replace").splitlines():
            if not raw or raw[0].isspace():  # a record's KEY=value continuation
                continue
            # "<prio>,<seq>,<usec>,<flags>;message" (/dev/kmsg) or a plain line
            head, sep, rest = raw.partition(";")
            message = (rest if sep and " " not in head else raw).strip()
            killed = _KILLED.search(message)
            m = killed or _OOM_KILL_TASK.search(message)
            if m is None:
                continue
            if int(m.group(1)) != pid:
                others.add(int(m.group(1)))
            elif killed or not ours:  # "Killed process ..." reads better than "oom-kill:..."
                ours = message if len(message) <= 160 else message[:157] + "..."
        return ours, len(others)


def _rose(before: int | None, after: int | None) -> bool:
    return before is not None and after is not None and after > before


def _read_counter(path: Path) -> int | None:
    """The ``oom_kill N`` line of a ``memory.events``, ``memory.oom_control`` or ``vmstat``."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None
