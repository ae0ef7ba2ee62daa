"""Calibration from the user's own runs: measured speeds beside the predictions.

After an engine answers, what it measured (``metrics.MeasuredSpeed``) is
compared with what the speed model predicts for the same launch, prompt length
and context depth, and the pair is kept in a small private file in the app's
state folder (``speed-measured.json``, at most ``MAX_RECORDS`` pairs, written
atomically with ``private.write_private``).  Later predictions on this machine
carry a correction from it:

* for a model measured here, the median of that model's measured speeds and of
  its measured / predicted ratios ("measured here: 12.1 tok/s decode ...");
* for any other model, the median ratio of every run of the same kind of plan
  (CPU-only, all-GPU, hybrid) on this machine.

Nothing here changes the speed model itself: the correction is shown beside the
model's own figure, so either can be judged.  A damaged file is set aside (renamed,
not deleted) and calibration starts again.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path, PurePosixPath
from typing import Any

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.localfiles import check_dict, check_int, check_text, check_when, load_checked
from k3desk.core.planning.argv import THREADS, int_value
from k3desk.core.planning.model import LaunchPlan, SpeedPrediction
from k3desk.core.planning.speed import predict_speed
from k3desk.core.private import write_private
from k3desk.core.tuning.identity import is_this_machine, machine_key, model_key, model_label
from k3desk.core.tuning.metrics import MeasuredSpeed, SpeedWatcher
from k3desk.core.units import fmt_tps3

CALIBRATION_FILE = "speed-measured.json"
SCHEMA = 1
MAX_RECORDS = 200
MAX_FILE_BYTES = 1024 * 1024  # 200 records are about 80 KB
# measured / predicted beyond this either way is a damaged record, not a slow machine
MAX_RATIO = 1000.0
_lock = threading.Lock()


@dataclass(frozen=True)
class SpeedRecord:
    when: float  # time.time()
    machine: str
    model: str
    model_label: str
    kind: str  # the plan's verdict: "cpu", "gpu", "hybrid", "stream"
    threads: int
    predicted_decode: float
    predicted_prompt: float  # 0: not predicted (a plan with a GPU)
    measured_decode: float  # 0: too few tokens to say
    measured_prompt: float
    decode_tokens: int
    prompt_tokens: int


@dataclass(frozen=True)
class Correction:
    """What this machine's runs say about a prediction."""

    decode_factor: float = 1.0  # measured / predicted (median); 1.0 with no runs
    prompt_factor: float = 1.0
    runs: int = 0  # runs the factors rest on
    model_runs: int = 0  # runs of this very model
    measured_decode: float = 0.0  # median of this model's measured decode (0: none)
    measured_prompt: float = 0.0
    last: float = 0.0  # when this model was last measured (time.time())

    @property
    def known(self) -> bool:
        return self.runs > 0


@dataclass(frozen=True)
class Comparison:
    """One measured stretch of answers next to the prediction for it."""

    measured: MeasuredSpeed
    predicted_decode: float
    predicted_prompt: float
    not_kept: str = ""  # why it could not be kept (a full disk), shown with it

    @property
    def decode_error(self) -> float | None:
        if self.measured.decode_tps <= 0 or self.predicted_decode <= 0:
            return None
        return self.predicted_decode / self.measured.decode_tps - 1.0

    def text(self) -> str:
        m = self.measured
        parts = []
        if m.prompt_tps > 0:
            pred = (
                f", predicted {fmt_tps3(self.predicted_prompt)}"
                if self.predicted_prompt > 0
                else ""
            )
            parts.append(f"prompt {fmt_tps3(m.prompt_tps)} tok/s ({m.prompt_tokens} tokens{pred})")
        if m.decode_tps > 0:
            err = self.decode_error
            off = f", {err:+.0%} off" if err is not None else ""
            parts.append(
                f"decode {fmt_tps3(m.decode_tps)} tok/s ({m.decode_tokens} tokens, "
                f"predicted {fmt_tps3(self.predicted_decode)}{off})"
            )
        if not parts:
            return ""
        text = "measured: " + "; ".join(parts)
        return f"{text} (not kept: {self.not_kept})" if self.not_kept else text

    def sentence(self) -> str:
        """:meth:`text` as a sentence ('Measured: prompt ... .'); '' with nothing measured."""
        text = self.text()
        return text[0].upper() + text[1:] + "." if text else ""


class CalibrationStore:
    """The measured / predicted pairs of this state folder (all machines' records;
    each query keeps this machine's)."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = state_dir / CALIBRATION_FILE
        self._clock = clock
        self.note = ""  # set when a damaged file was set aside
        # the records last read and the file they came from (inode, mtime, size): a
        # table judging ten tiers asks ten times, the file is read once
        self._cache: tuple[tuple[int, int, int], list[SpeedRecord]] | None = None

    def records(self) -> list[SpeedRecord]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        except OSError:
            st = None
        key = (st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else None
        if key is not None and self._cache is not None and self._cache[0] == key:
            return list(self._cache[1])
        out = self._read()
        if key is not None and out:
            self._cache = (key, out)
        return list(out)

    def _read(self) -> list[SpeedRecord]:
        out, note = load_checked(
            self.path,
            _parse,
            what="file of measured speeds",
            limit=MAX_FILE_BYTES,
            clock=self._clock,
        )
        if note:
            self.note = note
        return out or []

    def add(self, record: SpeedRecord) -> None:
        _check(record)
        with _lock:
            records = [*self.records(), record][-MAX_RECORDS:]
            payload = {"schema": SCHEMA, "records": [asdict(r) for r in records]}
            write_private(self.path, json.dumps(payload, indent=1) + "\n")

    def _here(self, hw: HardwareProfile, since: float) -> list[SpeedRecord]:
        """This machine's records from ``since`` on (a run predicted before this CPU's
        kernel check was predicted from other costs: its ratio says nothing of a
        prediction made with the check)."""
        return [r for r in self.records() if r.machine == machine_key(hw) and r.when >= since]

    def correction(
        self, hw: HardwareProfile, layout: ModelLayout, kind: str, since: float = 0.0
    ) -> Correction:
        if not is_this_machine(hw):
            return Correction()
        return correction_from(self._here(hw, since), model_key(layout), kind)

    def tier_correction(
        self, hw: HardwareProfile, first_shard: str, kind: str, since: float = 0.0
    ) -> Correction:
        """The correction of a catalog tier's prediction: the runs here of a model whose
        first part has the tier's file name (the latest such model), else this
        machine's runs of the same ``kind`` of plan (of those from ``since`` on)."""
        if not is_this_machine(hw):
            return Correction()
        here = self._here(hw, since)
        name = PurePosixPath(first_shard).name
        mine = [r for r in here if r.model_label == name]
        model = max(mine, key=lambda r: r.when).model if mine else ""
        return correction_from(here, model, kind)


def arg_int(args: Sequence[str], *names: str) -> int | None:
    """The integer value of the last of ``names`` in ``args`` (None if absent or bad)."""
    value = None
    for a, b in itertools.pairwise(args):
        if a in names:
            try:
                value = int(b)
            except ValueError:
                value = None
    return value


def _parse(data: Any) -> list[SpeedRecord]:
    d = check_dict(data, "the file")
    if d.get("schema") != SCHEMA:
        raise ValueError("not a calibration file of this version")
    items = d["records"]
    if not isinstance(items, list) or len(items) > MAX_RECORDS:
        raise ValueError(f"records must be a list of at most {MAX_RECORDS}")
    names = {f.name for f in fields(SpeedRecord)}
    out = []
    for item in items:
        if not isinstance(item, dict) or set(item) != names:
            raise ValueError(f"malformed record {item!r:.80}")
        rec = SpeedRecord(**item)
        _check(rec)
        out.append(rec)
    return out


def _check(r: SpeedRecord) -> None:
    """Types and ranges of one record: a ratio of its measured and predicted speeds
    between ``1/MAX_RATIO`` and ``MAX_RATIO`` (no "here ~inf"), a time it could have
    been written, a thread count a machine has."""
    for name in ("predicted_decode", "predicted_prompt", "measured_decode", "measured_prompt"):
        v = getattr(r, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e7:
            raise ValueError(f"{name} must be a speed in tok/s, not {v!r}")
    for measured, predicted in (
        (r.measured_decode, r.predicted_decode),
        (r.measured_prompt, r.predicted_prompt),
    ):
        if (
            measured > 0
            and predicted > 0
            and not 1 / MAX_RATIO <= measured / predicted <= MAX_RATIO
        ):
            raise ValueError(
                f"a measured speed of {measured:g} against a predicted {predicted:g} tok/s "
                "is not a ratio a real run gives"
            )
    for name, max_len in (("machine", 200), ("model", 200), ("model_label", 1024), ("kind", 20)):
        check_text(getattr(r, name), name, max_len)
    check_when(r.when)
    check_int(r.threads, "threads", 0, 1 << 20)
    check_int(r.decode_tokens, "decode_tokens", 0, 1 << 40)
    check_int(r.prompt_tokens, "prompt_tokens", 0, 1 << 40)


def _ratio(measured: float, predicted: float) -> float | None:
    return measured / predicted if measured > 0 and predicted > 0 else None


def correction_from(records: Sequence[SpeedRecord], model: str, kind: str) -> Correction:
    """The correction ``records`` (of one machine) give a prediction of ``model``."""
    mine = [r for r in records if r.model == model]
    alike = [r for r in records if r.kind == kind]
    basis = [r for r in mine if r.kind == kind] or alike
    if not basis:
        return Correction()
    dec = [x for r in basis if (x := _ratio(r.measured_decode, r.predicted_decode)) is not None]
    pro = [x for r in basis if (x := _ratio(r.measured_prompt, r.predicted_prompt)) is not None]
    md = [r.measured_decode for r in mine if r.measured_decode > 0]
    mp = [r.measured_prompt for r in mine if r.measured_prompt > 0]
    return Correction(
        decode_factor=statistics.median(dec) if dec else 1.0,
        prompt_factor=statistics.median(pro) if pro else 1.0,
        runs=len(basis),
        model_runs=len(mine),
        measured_decode=statistics.median(md) if md else 0.0,
        measured_prompt=statistics.median(mp) if mp else 0.0,
        last=max((r.when for r in mine), default=0.0),
    )


def calibrated(prediction: SpeedPrediction, c: Correction) -> SpeedPrediction:
    """``prediction`` with this machine's correction and what it says."""
    if not c.known:
        return prediction
    return replace(
        prediction,
        calibrated_tps=prediction.expected_tps * c.decode_factor,
        calibrated_prompt_tps=prediction.prompt_tps * c.prompt_factor,
        calibration=describe(prediction, c),
    )


def describe(prediction: SpeedPrediction, c: Correction) -> str:
    """'measured here: ...' for a model run here, else the machine's correction."""
    if not c.known:
        return ""
    if c.model_runs:
        parts = []
        if c.measured_decode > 0:
            parts.append(f"{fmt_tps3(c.measured_decode)} tok/s decode")
        if c.measured_prompt > 0:
            parts.append(f"{fmt_tps3(c.measured_prompt)} tok/s prompt")
        when = time.strftime("%Y-%m-%d", time.localtime(c.last)) if c.last else "?"
        runs = "answer" if c.model_runs == 1 else "answers"
        text = f"measured here: {', '.join(parts)} (median of {c.model_runs} {runs}, last {when})"
        if prediction.expected_tps > 0 and c.decode_factor != 1.0:
            text += f"; the model predicts {fmt_tps3(prediction.expected_tps)}"
        return text
    return (
        f"measured here on other models: this machine runs at {c.decode_factor:.2f}x the "
        f"predicted decode speed ({c.runs} runs): about "
        f"{fmt_tps3(prediction.expected_tps * c.decode_factor)} tok/s"
    )


class SpeedTracker:
    """Compares what a launched engine measures with the prediction, and records it.

    ``hw``/``layout``/``plan`` are the launch's; ``store`` None records nothing.
    Runs on hardware from a file (another machine's) are compared but not recorded.
    """

    def __init__(
        self,
        hw: HardwareProfile,
        layout: ModelLayout,
        plan: LaunchPlan,
        store: CalibrationStore | None,
        *,
        threads: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.hw = hw
        self.layout = layout
        self.plan = plan
        self.store = store
        if threads is None:
            threads = int_value(plan.server_args, THREADS)
        self.threads = threads
        self._clock = clock

    def compare(self, m: MeasuredSpeed) -> Comparison:
        """The prediction for what was measured: its prompt length, and a context about
        as deep as the prompt plus half the answer."""
        depth = max(0, m.prompt_tokens) + max(0, m.decode_tokens) // 2
        s = predict_speed(
            self.hw,
            self.layout,
            self.plan.layers,
            self.plan.output_device,
            ctx=self.plan.ctx,
            depth=min(depth, self.plan.ctx),
            threads=self.threads,
            prompt_tokens=max(1, m.prompt_tokens),
            stream_miss=(
                self.plan.stream_bytes / max(self.layout.expert_bytes, 1)
                if self.plan.stream_bytes
                else 0.0
            ),
        )
        return Comparison(m, s.expected_tps, s.prompt_tps)

    def watch(
        self,
        url: str,
        api_key: str,
        on_comparison: Callable[[Comparison], None],
        *,
        pid: int | None = None,
    ) -> SpeedWatcher:
        """Read a running engine's counters (``metrics``) and, after each stretch of
        answers, record it and pass on its comparison (from the watcher's thread).  A
        measurement that cannot be kept is still shown: the server must not stop.
        ``pid``: the engine process k3desk started; the key goes to it alone, and the
        watcher ends with it."""

        def on_speed(m: MeasuredSpeed) -> None:
            try:
                c = self.record(m)
            except (OSError, ValueError) as exc:
                c = replace(self.compare(m), not_kept=str(exc))
            on_comparison(c)

        return SpeedWatcher(url, api_key, on_speed, pid=pid).start()

    def record(self, m: MeasuredSpeed) -> Comparison:
        c = self.compare(m)
        if self.store is not None and is_this_machine(self.hw) and m.useful:
            self.store.add(
                SpeedRecord(
                    when=self._clock(),
                    machine=machine_key(self.hw),
                    model=model_key(self.layout),
                    model_label=model_label(self.layout),
                    kind=self.plan.verdict,
                    threads=self.threads or self.plan.speed.threads,
                    predicted_decode=c.predicted_decode if m.decode_tps > 0 else 0.0,
                    predicted_prompt=c.predicted_prompt if m.prompt_tps > 0 else 0.0,
                    measured_decode=m.decode_tps,
                    measured_prompt=m.prompt_tps,
                    decode_tokens=m.decode_tokens,
                    prompt_tokens=m.prompt_tokens,
                )
            )
        return c


def calibrate_plan(
    store: CalibrationStore | None,
    hw: HardwareProfile,
    layout: ModelLayout,
    plan: LaunchPlan,
    since: float = 0.0,
) -> LaunchPlan:
    """``plan`` with its speed carrying this machine's correction from its runs since
    ``since`` (as it was without runs here, or for another machine's hardware file)."""
    if store is None:
        return plan
    c = store.correction(hw, layout, plan.verdict, since)
    return replace(plan, speed=calibrated(plan.speed, c)) if c.known else plan
