"""A plan written for an engine kept in the background reads back as the same plan, and
a kept launch of another keeper is not taken for this one."""

from __future__ import annotations

import json
import os

from k3desk.core.app.kept_launch import KeptLaunch, read_kept_launch, remember_kept_launch
from k3desk.core.paths import default_paths
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.planning.plan_json import plan_from_dict


def test_a_plan_reads_back_from_its_json(machine, twin_layout) -> None:  # type: ignore[no-untyped-def]
    for hw in ("epyc9554p-1.5TB-cpu", "8xH100-2TB"):
        plan = make_plan(machine(hw), twin_layout("grearl-iq1s"), PlanOptions(ctx=16384))
        back = plan_from_dict(json.loads(json.dumps(plan.to_dict(), default=str)))
        assert back == plan


def test_the_kept_launch_is_read_only_for_its_keeper(machine, twin_layout) -> None:  # type: ignore[no-untyped-def]
    paths = default_paths()
    plan = make_plan(machine("8xH100-2TB"), twin_layout("grearl-iq1s"), PlanOptions(ctx=8192))
    launch = KeptLaunch(
        os.getpid(), "/opt/llama-server", plan.server_args, "K3", "/m.gguf", "", plan
    )
    remember_kept_launch(paths, launch)
    assert read_kept_launch(paths, os.getpid()) == launch
    assert read_kept_launch(paths, os.getpid() + 1) is None
    (paths.state / "run" / "kept-launch.json").write_text("{not json")
    assert read_kept_launch(paths, os.getpid()) is None  # set aside, no traceback
