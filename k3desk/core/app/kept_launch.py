"""What an engine kept running in the background was launched with (its command, model
and plan), beside the keep-running record (:mod:`k3desk.core.app.background`), so the
next start shows the plan and the context it runs with instead of "No launch plan yet".

The file is private and advisory: a damaged or foreign one is set aside and the engine
is still taken up, only without its plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3desk.core.localfiles import check_dict, check_pid, check_text, load_checked
from k3desk.core.private import write_private

if TYPE_CHECKING:
    from k3desk.core.paths import AppPaths
    from k3desk.core.planning.model import LaunchPlan

FILE = "kept-launch.json"
LIMIT = 1024 * 1024  # a plan lists every layer: tens of KiB for Kimi-K3


@dataclass(frozen=True)
class KeptLaunch:
    keeper_pid: int  # the keep-running record's keeper: the file is about that engine
    executable: str
    args: tuple[str, ...]
    model_name: str = ""
    shard: str = ""
    mmproj: str = ""
    plan: LaunchPlan | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "keeper_pid": self.keeper_pid,
            "executable": self.executable,
            "args": list(self.args),
            "model_name": self.model_name,
            "shard": self.shard,
            "mmproj": self.mmproj,
            "plan": self.plan.to_dict() if self.plan is not None else None,
        }


def kept_launch_path(paths: AppPaths) -> Path:
    return paths.state / "run" / FILE


def remember_kept_launch(paths: AppPaths, launch: KeptLaunch) -> None:
    write_private(kept_launch_path(paths), json.dumps(launch.to_json(), default=str) + "\n")


def _parse(data: Any) -> KeptLaunch:
    from k3desk.core.planning.plan_json import plan_from_dict

    d = check_dict(data, "the kept launch")
    args = d["args"]
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError("args is not a list of strings")
    plan = d.get("plan")
    return KeptLaunch(
        keeper_pid=check_pid(d["keeper_pid"], "keeper_pid"),
        executable=check_text(d["executable"], "executable", 4096),
        args=tuple(args),
        model_name=check_text(d.get("model_name", ""), "model_name"),
        shard=check_text(d.get("shard", ""), "shard", 4096),
        mmproj=check_text(d.get("mmproj", ""), "mmproj", 4096),
        plan=plan_from_dict(check_dict(plan, "plan")) if plan is not None else None,
    )


def read_kept_launch(paths: AppPaths, keeper_pid: int) -> KeptLaunch | None:
    """The launch of the engine ``keeper_pid`` keeps (None: none, damaged, or another's)."""
    launch, _why = load_checked(kept_launch_path(paths), _parse, what="kept launch", limit=LIMIT)
    return launch if launch is not None and launch.keeper_pid == keeper_pid else None
