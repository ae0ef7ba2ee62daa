"""The probe k3desk runs on a cluster node (sent over ssh to ``python3 -``).

Self-contained on purpose: standard library only, Python 3.8+, no k3desk
needed on the node.  It takes one JSON argument and prints one JSON object:

- ``hardware``: the node's profile in the ``k3desk doctor --json`` schema (from
  ``k3desk doctor --json`` itself when k3desk is installed there, otherwise
  read from /proc, /sys, ``nvidia-smi`` and ``statvfs``);
- ``engines``: where the engine binaries are on that node;
- ``copy``: a header check of the model's shard files (names, split numbers,
  GGUF headers, tensor data inside each file, expert geometry, total size, and
  sha256 when asked).

k3desk imports nothing from here; it reads this file's text and sends it.  For the
same reason this file cannot import ``k3desk.core.process``: the programs it starts on
the node (``nvidia-smi``, ``k3desk doctor``, ``k3desk validate``) go through
:func:`_run`, which gives them that module's guarantees on the standard library alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO

GGUF_MAGIC = b"GGUF"
# What a program's run keeps of each stream (k3desk.core.process.OUTPUT_LIMIT)
OUTPUT_LIMIT = 1 << 20


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``argv`` to its end, as ``k3desk.core.process.run`` runs a program: in a session
    of its own (stdin from /dev/null), at most :data:`OUTPUT_LIMIT` bytes of each stream
    kept (the rest read and discarded), and its whole group ended when it ends or after
    ``timeout`` seconds (then ``subprocess.TimeoutExpired``), not only the leader as
    ``subprocess.run`` would.  Raises ``OSError`` when it cannot be started."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    kept = [bytearray(), bytearray()]

    def pump(fd: int, buf: bytearray) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            room = OUTPUT_LIMIT - len(buf)
            if room > 0:
                buf += chunk[:room]

    pumps = []
    for i, stream in enumerate((proc.stdout, proc.stderr)):  # zip(strict=) is 3.10+
        if stream is not None:
            t = threading.Thread(target=pump, args=(stream.fileno(), kept[i]), daemon=True)
            pumps.append((t, stream))
            t.start()
    try:
        proc.wait(timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    _end_group(proc)
    rc = proc.wait()
    for t, stream in pumps:
        t.join(2.0)
        if not t.is_alive():  # one that left the group may hold it yet: left open then
            stream.close()
    if timed_out:
        raise subprocess.TimeoutExpired(argv, timeout)
    text = [bytes(b).decode("utf-8", "replace") for b in kept]
    return subprocess.CompletedProcess(argv, rc, text[0], text[1])


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's group, two seconds, then SIGKILL (the leader included)."""
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        end = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)

# GGUF value types -> struct format (scalars); 8 = string, 9 = array
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


class _Reader:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("the header ends early (file truncated?)")
        return data

    def u32(self) -> int:
        return int(struct.unpack("<I", self.read(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.read(8))[0])

    def string(self) -> str:
        n = self.u64()
        if n > 1 << 24:
            raise ValueError("implausible string length in the header")
        return self.read(n).decode("utf-8", "replace")

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype in _SCALARS:
            fmt = "<" + _SCALARS[vtype]
            return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype = self.u32()
            count = self.u64()
            if etype in _SCALARS and not keep:
                self.f.seek(count * struct.calcsize("<" + _SCALARS[etype]), 1)
                return None
            items = [self.value(etype, keep) for _ in range(count)]
            return items if keep else None
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf_header(path: str, sizes: dict[str, list[int]]) -> dict[str, Any]:
    """Keys we care about plus where the tensor data ends (bytes)."""
    wanted_suffixes = (
        "general.architecture",
        "general.name",
        "general.alignment",
        "split.no",
        "split.count",
        ".expert_count",
        ".expert_feed_forward_length",
        ".block_count",
    )
    with open(path, "rb") as f:
        r = _Reader(f)
        if r.read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF file (wrong magic)")
        version = r.u32()
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        n_tensors = r.u64()
        n_kv = r.u64()
        kv: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.u32()
            keep = key.endswith(wanted_suffixes)
            val = r.value(vtype, keep)
            if keep:
                kv[key] = val
        data_needed = 0
        exps: dict[str, list[int]] = {}
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.u32()
            dims = [r.u64() for _ in range(n_dims)]
            ggml_type = r.u32()
            offset = r.u64()
            block, type_size = sizes.get(str(ggml_type), (0, 0))
            if block:
                count = 1
                for d in dims:
                    count *= d
                data_needed = max(data_needed, offset + count // block * type_size)
            if name.endswith("ffn_gate_exps.weight") and not exps:
                exps[name] = dims
        align = int(kv.get("general.alignment", 32) or 32)
        header_end = f.tell()
        data_start = (header_end + align - 1) // align * align
    return {
        "version": version,
        "tensors": n_tensors,
        "kv": kv,
        "data_end": data_start + data_needed if n_tensors else header_end,
        "expert_tensor": exps,
    }


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(8 << 20)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def check_copy(spec: dict[str, Any], folder: str, sizes: dict[str, list[int]]) -> dict[str, Any]:
    names: list[str] = spec["names"]
    files: list[dict[str, Any]] = []
    problems: list[str] = []
    total = 0
    geometry: dict[str, Any] = {}
    folder = os.path.expanduser(folder)
    if not os.path.isdir(folder):
        return {
            "folder": folder,
            "complete": False,
            "files": [],
            "total_bytes": 0,
            "problems": [f"the folder {folder} does not exist"],
            "geometry": {},
        }
    for i, name in enumerate(names):
        path = os.path.join(folder, name)
        entry: dict[str, Any] = {
            "name": name,
            "present": False,
            "size": 0,
            "ok": False,
            "problem": "",
        }
        files.append(entry)
        if not os.path.isfile(path):
            entry["problem"] = "missing"
            problems.append(f"{name} is missing")
            continue
        entry["present"] = True
        size = os.path.getsize(path)
        entry["size"] = size
        total += size
        try:
            head = read_gguf_header(path, sizes)
        except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
            entry["problem"] = f"unreadable header: {exc}"
            problems.append(f"{name}: {entry['problem']}")
            continue
        why = _part_problem(spec, names, i, head, size)
        if i == 0:
            geometry = _geometry(head)
            arch = geometry["architecture"]
            if spec.get("architecture") and arch != spec["architecture"]:
                why = why or f"has architecture {arch!r}, expected {spec['architecture']!r}"
        want_sha = (spec.get("sha256") or {}).get(name)
        if not why and want_sha and spec.get("check_sha256"):
            got = _sha256(path)
            entry["sha256"] = got
            if got != want_sha:
                why = f"sha256 {got[:16]} does not match the publisher's {want_sha[:16]}"
        if why:
            entry["problem"] = why
            problems.append(f"{name} {why}")
        else:
            entry["ok"] = True
    want_total = spec.get("total_bytes")
    present = all(e["present"] for e in files)
    if present and want_total and total != want_total:
        problems.append(f"the parts add up to {total} bytes, the publisher lists {want_total}")
    return {
        "folder": folder,
        "complete": not problems and bool(files),
        "files": files,
        "total_bytes": total,
        "problems": problems,
        "geometry": geometry,
    }


def _part_problem(
    spec: dict[str, Any], names: list[str], i: int, head: dict[str, Any], size: int
) -> str:
    """What is wrong with part ``i`` from its header and size ('' when nothing): its
    split number and count, tensor data past its end, a size the publisher does not list."""
    kv = head["kv"]
    why = ""
    if len(names) > 1:
        no = kv.get("split.no")
        if no != i:
            got = str(no + 1) if isinstance(no, int) else "not a split part"
            why = f"is part {got}, expected part {i + 1}"
        elif kv.get("split.count") != len(names):
            why = f"says the set has {kv.get('split.count')} parts, expected {len(names)}"
    if not why and head["data_end"] > size:
        need = head["data_end"]
        why = f"is truncated: its tensors need {need} bytes, the file has {size}"
    expected = (spec.get("sizes") or {}).get(names[i])
    if not why and expected is not None and size != expected:
        why = f"has {size} bytes, the publisher lists {expected}"
    return why


def _geometry(head: dict[str, Any]) -> dict[str, Any]:
    """The model's shape as the first part's header states it."""
    kv = head["kv"]
    arch = kv.get("general.architecture", "")
    return {
        "architecture": arch,
        "name": kv.get("general.name", ""),
        "expert_count": kv.get(arch + ".expert_count"),
        "expert_feed_forward_length": kv.get(arch + ".expert_feed_forward_length"),
        "block_count": kv.get(arch + ".block_count"),
        "expert_tensor": head["expert_tensor"],
    }


# ---------------------------------------------------------------- hardware


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in _read("/proc/meminfo").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = _read(path).strip()
        if text.isdigit() and int(text) < (1 << 60):
            return int(text)
    return None


def _cpu() -> dict[str, Any]:
    text = _read("/proc/cpuinfo")
    model = ""
    flags: set[str] = set()
    cores: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    phys = core = ""
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if phys or core:
                cores.add((phys, core))
            phys = core = ""
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "Model", "cpu model") and not model:
            model = value
        elif key in ("flags", "Features"):
            flags.update(value.split())
        elif key == "physical id":
            phys = value
            sockets.add(value)
        elif key == "core id":
            core = value
    logical = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = logical
    numa = (
        len([d for d in os.listdir("/sys/devices/system/node") if d.startswith("node")])
        if os.path.isdir("/sys/devices/system/node")
        else 1
    )
    return {
        "model": model or (os.uname().machine if hasattr(os, "uname") else "unknown"),
        "logical_cores": logical,
        "physical_cores": len(cores) or logical,
        "usable_cores": max(1, usable),
        "flags": sorted(flags),
        "sockets": max(1, len(sockets)),
        "numa_nodes": max(1, numa),
    }


def _gpus(ram_total: int, ram_avail: int) -> tuple[list[dict[str, Any]], str, str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found on the node (no NVIDIA driver)", ""
    fields = "index,name,memory.total,memory.free,compute_cap,uuid,driver_version"
    try:
        proc = _run([smi, "--query-gpu=" + fields, "--format=csv,noheader,nounits"], 30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}", ""
    if proc.returncode != 0:
        why = proc.stderr.strip() or proc.stdout.strip()
        return [], f"nvidia-smi failed: {why}", ""
    gpus: list[dict[str, Any]] = []
    driver = ""
    for line in proc.stdout.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 7:
            continue
        index, name, total, free, cc, uuid, driver = cols[:7]
        try:
            major, minor = (int(x) for x in cc.split(".")[:2])
        except ValueError:
            major, minor = 0, 0
        unified = not total.isdigit() or "GB10" in name or (major, minor) in ((12, 1), (11, 0))
        gpus.append(
            {
                "index": int(index) if index.isdigit() else len(gpus),
                "name": name,
                "vram_total": ram_total if unified else int(total) * 1024 * 1024,
                "vram_free": ram_avail
                if unified
                else int(free) * 1024 * 1024
                if free.isdigit()
                else 0,
                "compute_capability": [major, minor],
                "architecture": "",
                "unified_memory": unified,
                "bandwidth": {"bytes_per_s": 0.0, "source": "unknown", "note": ""},
                "uuid": uuid,
            }
        )
    return gpus, "" if gpus else "nvidia-smi lists no GPU", driver


def _disk(path: str) -> dict[str, Any] | None:
    probe = os.path.abspath(os.path.expanduser(path or "~"))
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    fs = ""
    best = ""
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mnt = parts[1].replace("\\040", " ")
            if (probe == mnt or probe.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fs = mnt, parts[2]
    return {
        "path": path or "~",
        "probed_path": probe,
        "free": st.f_bavail * st.f_frsize,
        "total": st.f_blocks * st.f_frsize,
        "filesystem": fs,
    }


def own_hardware(disk_path: str) -> dict[str, Any]:
    mem = _meminfo()
    if "MemTotal" not in mem:
        raise RuntimeError("this probe reads /proc/meminfo; the node is not Linux")
    total, avail = mem["MemTotal"], mem.get("MemAvailable", mem.get("MemFree", 0))
    gpus, note, driver = _gpus(total, avail)
    return {
        "cpu": _cpu(),
        "memory": {
            "total": total,
            "available": avail,
            "swap_total": mem.get("SwapTotal", 0),
            "cgroup_limit": _cgroup_limit(),
            "bandwidth": {
                "bytes_per_s": 0.0,
                "source": "unknown",
                "note": "not measured by the remote probe",
            },
        },
        "gpus": gpus,
        "gpu_note": note,
        "driver_version": driver,
        "cuda_driver_version": "",
        "disk": _disk(disk_path),
        "hostname": socket.gethostname(),
        "source": "detected",
        "label": "",
    }


def k3desk_hardware(cmd: list[str], disk_path: str) -> tuple[dict[str, Any] | None, str]:
    """(profile, "") from ``k3desk doctor --json``, or (None, why it was not used)."""
    if not cmd:
        return None, ""
    if shutil.which(cmd[0]) is None and not os.path.isfile(cmd[0]):
        return None, f"{cmd[0]} is not installed on the node"
    argv = [*cmd, "doctor", "--json", "--no-benchmark"]
    if disk_path:
        argv += ["--disk", os.path.expanduser(disk_path)]
    try:
        proc = _run(argv, 120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"k3desk doctor failed: {exc}"
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["no error text"])[-1]
        return None, f"k3desk doctor failed (exit {proc.returncode}): {err}"
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return None, "k3desk doctor printed no JSON"
    if not isinstance(data, dict) or "cpu" not in data:
        return None, "k3desk doctor printed an unexpected JSON object"
    return data, ""


def k3desk_validate(cmd: list[str], first: str) -> dict[str, Any] | None:
    """``k3desk validate FIRST --json`` on the node: {"ok": bool, "error": str} or None."""
    if not cmd or (shutil.which(cmd[0]) is None and not os.path.isfile(cmd[0])):
        return None
    try:
        proc = _run([*cmd, "validate", first, "--json"], 600)
        data = json.loads(proc.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    if not isinstance(data, dict) or "ok" not in data:
        return None
    return {"ok": bool(data["ok"]), "error": str(data.get("error") or "")}


def engines(cfg: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in cfg.get("binaries", []):
        expanded = os.path.expanduser(name)
        if os.sep in expanded:
            if os.path.isfile(expanded) and os.access(expanded, os.X_OK):
                found[name] = expanded
            continue
        path = shutil.which(name)
        if path:
            found[name] = path
    return found


def path_kinds(paths: list[str]) -> dict[str, str]:
    """What is at each path: "dir", "empty dir", "file", "other" or "missing"."""
    out: dict[str, str] = {}
    for path in paths:
        p = os.path.expanduser(path)
        if os.path.isdir(p):
            try:
                out[path] = "dir" if os.listdir(p) else "empty dir"
            except OSError:
                out[path] = "unreadable dir"
        elif os.path.isfile(p):
            out[path] = "file" if os.access(p, os.R_OK) else "unreadable file"
        elif os.path.lexists(p):
            out[path] = "other"
        else:
            out[path] = "missing"
    return out


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1]) if len(argv) > 1 else {}
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    disk_path = cfg.get("model_path") or ""
    hw, why = k3desk_hardware(cfg.get("k3desk") or [], disk_path)
    hw_from_k3desk = hw is not None
    out["probe"] = "k3desk doctor" if hw_from_k3desk else "python"
    if why:
        out["k3desk_note"] = why
    if hw is None:
        try:
            hw = own_hardware(disk_path)
        except (OSError, RuntimeError, ValueError) as exc:
            out["hardware_error"] = str(exc)
    out["hardware"] = hw
    out["engines"] = engines(cfg)
    if cfg.get("paths"):
        out["paths"] = path_kinds([str(p) for p in cfg["paths"]])
    spec = cfg.get("spec")
    if spec:
        copy = check_copy(spec, disk_path or ".", cfg.get("ggml_sizes") or {})
        if copy["complete"] and hw_from_k3desk:
            first = os.path.join(copy["folder"], spec["names"][0])
            verdict = k3desk_validate(cfg.get("k3desk") or [], first)
            copy["validated_by_k3desk"] = verdict is not None
            if verdict is not None and not verdict["ok"]:
                copy["complete"] = False
                copy["problems"].append(f"k3desk validate on the node: {verdict['error']}")
        out["copy"] = copy
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
