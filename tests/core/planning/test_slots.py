"""Several requests at once (--parallel N): the plan counts each slot's memory and says each
request's share of the context (the engine's own slot sizes are checked against this rule in
tests/core/engines/test_local_api.py)."""

from __future__ import annotations

from dataclasses import replace

from k3desk.core.planning.memory import recurrent_state_bytes, slot_context
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.units import MiB
from tests.core.planning.conftest import Layout, Machine


def ram_of(plan: LaunchPlan) -> int:
    return sum(d.used for d in plan.devices)


def test_each_slot_adds_its_own_kda_state_and_the_rounded_context_of_the_engine(
    machine: Machine, estimated: Layout
) -> None:
    layout = estimated("grearl-iq1s")
    hw = machine("epyc9554p-1.5TB-cpu")
    one = make_plan(hw, layout, PlanOptions(ctx=16384))
    four = make_plan(hw, layout, PlanOptions(ctx=16384, parallel=4))
    per_request = recurrent_state_bytes(layout.hparams, 1)
    assert 400 * MiB < per_request < 480 * MiB  # K3's fixed KDA state per sequence
    kv_one = sum(d.kv_cache for d in one.devices)
    kv_four = sum(d.kv_cache for d in four.devices)
    assert kv_four == kv_one  # 16384 divides into 4 slots of 4096: no rounding
    assert ram_of(four) - ram_of(one) == 3 * per_request
    assert "--parallel" not in " ".join(n for n in one.notes if "at once" in n)
    (note,) = [n for n in four.notes if "requests at once" in n]
    assert "each has 4096 tokens of context of the 16384" in note
    assert "more requests wait their turn" in note
    assert four.server_args[four.server_args.index("--parallel") + 1] == "4"


def test_a_context_that_does_not_divide_is_rounded_as_the_engine_rounds_it(
    machine: Machine, estimated: Layout
) -> None:
    layout = estimated("grearl-iq1s")
    hw = machine("epyc9554p-1.5TB-cpu")
    base = PlanOptions(ctx=10000)
    three = make_plan(hw, layout, replace(base, parallel=3))
    assert slot_context(10000, 3) == (10752, 3584)
    bigger = make_plan(hw, layout, PlanOptions(ctx=10752))
    assert sum(d.kv_cache for d in three.devices) == sum(d.kv_cache for d in bigger.devices)
