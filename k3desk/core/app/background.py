"""Use-case "keep the engine when the app closes": a loaded model outlives the window, and
the next start takes it up again instead of loading it anew (for a 300 GB model that is
minutes saved), or offers the last model one click away with its load time.

The engine stays the child of the k3desk process that started it (it dies with its
parent: PR_SET_PDEATHSIG, see :mod:`k3desk.core.engines.supervisor`).  Kept in the
background, that process goes on without a window and leaves a private record
(``state/run/background-engine.json``, 0600: it holds the API key) of what it keeps.
The next start trusts the record only after the same checks a launch makes before it
hands out an endpoint (:func:`ownership_problem`: the recorded llama-server is the
recorded keeper's child, it holds the listening socket, nothing else listens there,
and it takes the recorded key); stopping it asks the keeper to stop (SIGTERM), which
stops the engine as any app exit does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from k3desk.core.engines.identity import alive_pid, ownership_problem
from k3desk.core.engines.ports import LOOPBACK
from k3desk.core.engines.supervisor import Endpoint
from k3desk.core.localfiles import (
    FUTURE_SLACK,
    check_dict,
    check_float,
    check_pid,
    check_port,
    check_text,
    load_checked,
)
from k3desk.core.paths import AppPaths
from k3desk.core.planning.model import PlanOptions
from k3desk.core.private import write_private
from k3desk.core.units import fmt_duration

RECORD = "background-engine.json"
ADDRESS = re.compile(r"http://\d{1,3}(\.\d{1,3}){3}:\d{1,5}")
LAST_MODEL_KEY = "last_model"  # Settings.recent: the model launched last, for "Relaunch"


@dataclass(frozen=True)
class BackgroundEngine:
    """An engine kept running by a k3desk process without a window."""

    keeper_pid: int  # the k3desk process it is a child of
    pid: int  # llama-server
    port: int
    api_key: str
    model_name: str
    since: float  # when it was kept
    # where the person's tools reach it: the keeper's front at the local API's address
    # ("": the engine's own, a launch with a port of its own)
    address: str = ""

    def endpoint(self) -> Endpoint:
        return Endpoint(LOOPBACK, self.port, self.api_key, self.pid, 0)

    def describe(self) -> str:
        when = time.strftime("%H:%M", time.localtime(self.since))
        return (
            f"{self.model_name or 'llama-server'} kept running in the background since "
            f"{when} (process {self.pid}, port {self.port})"
        )


def record_path(paths: AppPaths) -> Path:
    return paths.state / "run" / RECORD


def keep(paths: AppPaths, engine: BackgroundEngine) -> None:
    """Record ``engine`` as kept (private file; written again after a restart)."""
    write_private(record_path(paths), json.dumps(asdict(engine), indent=2) + "\n")


def _parse(data: Any) -> BackgroundEngine:
    d = check_dict(data, "the record")
    return BackgroundEngine(
        keeper_pid=check_pid(d["keeper_pid"], "keeper_pid"),
        pid=check_pid(d["pid"], "pid"),
        port=check_port(d["port"]),
        api_key=check_text(d["api_key"], "api_key", 512),
        model_name=check_text(d.get("model_name", ""), "model_name"),
        since=check_float(d.get("since", 0.0), "since", 0.0, time.time() + FUTURE_SLACK),
        address=_address(d.get("address", "")),
    )


def _address(value: Any) -> str:
    """A local API address as a keeper writes it (``http://IPv4:port``), or ""."""
    text = check_text(value, "address", 64)
    if text and not ADDRESS.fullmatch(text):
        raise ValueError(f"address must be http://host:port, not {text[:64]!r}")
    return text


def read_record(paths: AppPaths) -> tuple[BackgroundEngine | None, str]:
    """The engine recorded as kept (not yet checked) and "" -- or (None, what was wrong
    with the record: a damaged one is set aside, never trusted, never waited on)."""
    return load_checked(record_path(paths), _parse, what="keep-running record", limit=64 * 1024)


def kept(paths: AppPaths) -> BackgroundEngine | None:
    """The engine recorded as kept, if the record can be read (not yet checked)."""
    return read_record(paths)[0]


def forget(paths: AppPaths, keeper_pid: int | None = None) -> None:
    """Remove the record (only if it is ``keeper_pid``'s, when given)."""
    if keeper_pid is not None:
        rec = kept(paths)
        if rec is not None and rec.keeper_pid != keeper_pid:
            return
    with contextlib.suppress(OSError):
        record_path(paths).unlink()


def problem(engine: BackgroundEngine) -> str:
    """Why ``engine`` cannot be taken up ("" when it is verifiably ours and serving)."""
    if not alive_pid(engine.keeper_pid):
        return f"the k3desk process that kept it ({engine.keeper_pid}) has ended"
    try:
        parent = psutil.Process(engine.pid).ppid()
    except psutil.Error:
        return f"llama-server (process {engine.pid}) is no longer running"
    if parent != engine.keeper_pid:
        return f"process {engine.pid} is not the engine k3desk kept (its parent is {parent})"
    return ownership_problem(engine.pid, engine.port, engine.api_key)


def take_up(paths: AppPaths) -> tuple[BackgroundEngine | None, str]:
    """The kept engine and "" when it passes every check; (None, why) otherwise (a stale
    record is removed)."""
    rec, note = read_record(paths)
    if rec is None:
        return None, note
    why = problem(rec)
    if why:
        if not alive_pid(rec.keeper_pid) or not alive_pid(rec.pid):
            forget(paths)
        return None, why
    return rec, ""


def stop(paths: AppPaths, engine: BackgroundEngine, timeout: float = 30.0) -> bool:
    """Ask the keeper to stop the engine and exit; True once llama-server is gone.

    Only a keeper that is still the engine's parent is signalled (a recycled process
    id gets nothing)."""
    try:
        is_parent = psutil.Process(engine.pid).ppid() == engine.keeper_pid
    except psutil.Error:
        forget(paths, engine.keeper_pid)
        return True
    if is_parent:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(engine.keeper_pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive_pid(engine.pid):
            forget(paths, engine.keeper_pid)
            return True
        time.sleep(0.1)
    return False


# ------------------------------------------------------------------ last model
@dataclass(frozen=True)
class LastModel:
    """The model launched last on this machine (kept in ``Settings.recent``)."""

    shard: str
    mmproj: str = ""
    name: str = ""
    model_bytes: int = 0
    ready_s: float | None = None  # how long it took to be ready, measured

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> LastModel | None:
        if not isinstance(data, dict) or not isinstance(data.get("shard"), str):
            return None
        ready = data.get("ready_s")
        try:
            return cls(
                shard=str(data["shard"]),
                mmproj=str(data.get("mmproj") or ""),
                name=str(data.get("name") or ""),
                model_bytes=int(data.get("model_bytes") or 0),
                ready_s=(
                    float(ready)
                    if isinstance(ready, (int, float)) and 0 < ready < 7 * 86400
                    else None
                ),
            )
        except (TypeError, ValueError, OverflowError):
            return None

    def available(self) -> bool:
        return Path(self.shard).is_file()

    def load_seconds(self) -> float | None:
        """How long loading it takes: as measured last time, else its size read at the
        disk rate the planner assumes (:class:`PlanOptions`)."""
        if self.ready_s is not None and self.ready_s > 0:
            return self.ready_s
        if self.model_bytes > 0:
            return self.model_bytes / PlanOptions().disk_read_bps
        return None

    def load_text(self) -> str:
        """'loads in about 2 min (as last time)', or '' when nothing is known."""
        s = self.load_seconds()
        if s is None:
            return ""
        how = "as last time" if self.ready_s else "reading it from disk"
        return f"loads in about {fmt_duration(s)} ({how})"
