"""The launch settings ``k3desk tune`` found fastest, kept per machine and model.

``tuned-launch.json`` in the state folder (private, written atomically) maps a
machine and a model to the settings of the fastest measured variant; the next
launch of that model on that machine plans with them (:func:`apply_tuned`) and
says so.  Settings the person sets themselves win over the tuned ones.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.localfiles import check_dict, check_float, check_text, check_when, load_checked
from k3desk.core.planning.argv import DEFAULT_UBATCH
from k3desk.core.planning.model import PlanOptions
from k3desk.core.private import write_private
from k3desk.core.tuning.identity import is_this_machine, machine_key, model_key, model_label

TUNED_FILE = "tuned-launch.json"
SCHEMA = 1


@dataclass(frozen=True)
class TunedChoice:
    threads: int | None
    threads_batch: int | None
    batch: int | None
    ubatch: int | None
    n_cpu_moe: int | None
    mmproj_on_cpu: bool | None
    label: str  # e.g. "-t 2 -ub 256"
    gain_over_plan: float  # fraction: 0.12 = 12 % less time for the test request
    when: float
    model_label: str = ""

    def describe(self) -> str:
        day = time.strftime("%Y-%m-%d", time.localtime(self.when))
        gain = (
            f", {self.gain_over_plan:.0%} faster than the plan's default"
            if self.gain_over_plan > 0.005
            else ""
        )
        return (
            f"Using the launch settings `k3desk tune` measured fastest on this machine "
            f"on {day}: {self.label or 'the plan as it is'}{gain}."
        )


class TunedStore:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / TUNED_FILE
        self.note = ""

    def _read(self) -> dict[str, dict[str, dict[str, object]]]:
        machines, note = load_checked(self.path, _parse, what="file of tuned settings")
        if note:
            self.note = note
        return machines or {}

    def get(self, hw: HardwareProfile, layout: ModelLayout) -> TunedChoice | None:
        if not is_this_machine(hw):
            return None
        entry = self._read().get(machine_key(hw), {}).get(model_key(layout))
        if not isinstance(entry, dict):
            return None
        names = {f.name for f in fields(TunedChoice)}
        if set(entry) != names:
            return None
        try:
            choice = TunedChoice(**entry)  # type: ignore[arg-type]
        except TypeError:
            return None
        return choice if _valid(choice, hw.cpu.logical_cores) else None

    def put(self, hw: HardwareProfile, layout: ModelLayout, choice: TunedChoice) -> None:
        machines = self._read()
        per = machines.setdefault(machine_key(hw), {})
        per[model_key(layout)] = asdict(replace(choice, model_label=model_label(layout)))
        write_private(
            self.path, json.dumps({"schema": SCHEMA, "machines": machines}, indent=1) + "\n"
        )

    def forget(self, hw: HardwareProfile, layout: ModelLayout) -> bool:
        machines = self._read()
        per = machines.get(machine_key(hw), {})
        if per.pop(model_key(layout), None) is None:
            return False
        write_private(
            self.path, json.dumps({"schema": SCHEMA, "machines": machines}, indent=1) + "\n"
        )
        return True


def _parse(data: Any) -> dict[str, dict[str, dict[str, object]]]:
    d = check_dict(data, "the file")
    if d.get("schema") != SCHEMA:
        raise ValueError("not a tuned-settings file of this version")
    machines = check_dict(d.get("machines"), "machines")
    for per in machines.values():
        check_dict(per, "a machine's entry")
    return machines


def _valid(c: TunedChoice, cpu_threads: int) -> bool:
    """Types and ranges: a thread count this machine has (``-t 100000`` is not a
    setting anything measured here), batch sizes llama.cpp takes, a real time."""
    limits = (
        (c.threads, max(1, cpu_threads)),
        (c.threads_batch, max(1, cpu_threads)),
        (c.batch, 1 << 20),
        (c.ubatch, 1 << 20),
        (c.n_cpu_moe, 4096),
    )
    for v, hi in limits:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi):
            if v == 0 and hi == 4096:  # --n-cpu-moe 0: every expert on the GPU
                continue
            return False
    if c.batch is not None and c.ubatch is not None and c.batch < c.ubatch:
        return False
    if not isinstance(c.mmproj_on_cpu, bool | None):  # the file's JSON, not the type hint
        return False  # type: ignore[unreachable]
    try:
        check_when(c.when)
        check_text(c.label, "label", 512)
        check_text(c.model_label, "model_label", 1024)
        check_float(c.gain_over_plan, "gain_over_plan", -100.0, 1.0)
    except ValueError:
        return False
    return True


def user_set(options: PlanOptions) -> bool:
    """Whether the person already chose any of the settings a tune would set."""
    return (
        options.threads is not None
        or options.threads_batch is not None
        or options.batch is not None
        or options.ubatch != DEFAULT_UBATCH
        or options.n_cpu_moe is not None
        or options.mmproj_on_cpu is not None
    )


def with_choice(options: PlanOptions, c: TunedChoice) -> PlanOptions:
    return replace(
        options,
        threads=c.threads,
        threads_batch=c.threads_batch,
        batch=c.batch,
        ubatch=c.ubatch if c.ubatch is not None else options.ubatch,
        n_cpu_moe=c.n_cpu_moe if c.n_cpu_moe is not None else options.n_cpu_moe,
        mmproj_on_cpu=(
            c.mmproj_on_cpu
            if c.mmproj_on_cpu is not None and options.mmproj is not None
            else options.mmproj_on_cpu
        ),
    )


def apply_tuned(
    store: TunedStore | None, hw: HardwareProfile, layout: ModelLayout, options: PlanOptions
) -> tuple[PlanOptions, str]:
    """``options`` with the tuned settings for this machine and model, and the note
    to show ("" when nothing was applied)."""
    if store is None or user_set(options):
        return options, ""
    choice = store.get(hw, layout)
    if choice is None:
        return options, ""
    return with_choice(options, choice), choice.describe()
