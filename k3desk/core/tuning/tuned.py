"""The launch settings ``k3desk tune`` found fastest, kept per machine and model.

``tuned-launch.json`` in the state folder (private, written atomically) maps a
machine and a model to the settings of the fastest measured variant; the next
launch of that model on that machine plans with them (:func:`apply_tuned`) and
says so.  Settings the person sets themselves win over the tuned ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import PlanOptions
from k3desk.core.private import write_private
from k3desk.core.tuning.identity import is_this_machine, machine_key, model_key, model_label

TUNED_FILE = "tuned-launch.json"
SCHEMA = 1
DEFAULT_UBATCH = 512  # llama.cpp's -ub


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
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self._set_aside(str(exc))
            return {}
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            self._set_aside("not a tuned-settings file of this version")
            return {}
        machines = data.get("machines")
        if not isinstance(machines, dict):
            self._set_aside("no machines")
            return {}
        return machines

    def _set_aside(self, why: str) -> None:
        bad = self.path.with_name(f"{self.path.name}.damaged-{int(time.time())}")
        with contextlib.suppress(OSError):
            os.replace(self.path, bad)
        self.note = f"{self.path} was damaged ({why}); kept it as {bad.name}"

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
        return choice if _valid(choice) else None

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


def _valid(c: TunedChoice) -> bool:
    for v in (c.threads, c.threads_batch, c.batch, c.ubatch, c.n_cpu_moe):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            return False
    if c.batch is not None and c.ubatch is not None and c.batch < c.ubatch:
        return False
    return isinstance(c.label, str) and isinstance(c.gain_over_plan, int | float)


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
