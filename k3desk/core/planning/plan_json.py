"""A launch plan read back from its JSON form (:meth:`LaunchPlan.to_dict`), for an engine
kept running in the background: the next start shows the plan it was launched with."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from k3desk.core.planning.model import DeviceMemory, LaunchPlan, LayerPlacement, SpeedPrediction


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def plan_from_dict(d: dict[str, Any]) -> LaunchPlan:
    """The plan ``d`` describes (raises KeyError, TypeError or ValueError when it is not one)."""
    speed = _known(SpeedPrediction, d["speed"])
    speed["steps"] = tuple((str(what), float(s)) for what, s in speed.get("steps", ()))
    speed["bytes_per_token"] = {str(k): int(v) for k, v in speed["bytes_per_token"].items()}
    plan = _known(LaunchPlan, d)
    plan["devices"] = tuple(DeviceMemory(**_known(DeviceMemory, x)) for x in d["devices"])
    plan["layers"] = tuple(LayerPlacement(**_known(LayerPlacement, x)) for x in d["layers"])
    plan["speed"] = SpeedPrediction(**speed)
    for name in ("server_args", "notes", "tensor_split"):
        if name in plan:
            plan[name] = tuple(plan[name])
    return LaunchPlan(**plan)
